"""The replay over real loopback sockets: against the fake upstream, straight and through
the proxy, from the command line down to the JSON it writes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from proxy import cli
from proxy.replay import report, request, synthetic, traces
from proxy.replay.records import Run
from proxy.replay.runner import (
    Options,
    Replayer,
    discover_model,
    make_client,
    reset_prefix_cache,
)
from tests.support.fake_upstream import USAGE, FakeUpstream
from tests.support.servers import listening_socket, serve
from tests.unit.test_replay_traces import DEV

CONVERSATIONS = traces.load(DEV, limit=3)
STEPS = [s for c in CONVERSATIONS for s in traces.steps(c)]


def replay(url: str, client: httpx.AsyncClient | None = None, **options: object) -> Run:
    async def go() -> Run:
        async with client or make_client(2, 30) as http:
            replayer = Replayer(http, url, Options(model="fake", **options))  # type: ignore[arg-type]
            return await replayer.run(CONVERSATIONS)

    return asyncio.run(go())


def chat_bodies(upstream: FakeUpstream) -> list[dict]:
    return [json.loads(r.body) for r in upstream.received if r.path == "/v1/chat/completions"]


def test_every_step_is_sent_as_recorded_and_measured(fake_upstream: FakeUpstream) -> None:
    run = replay(fake_upstream.url, concurrency=2)
    assert [(r.conversation, r.step) for r in run.steps] == [
        (s.conversation.id, s.index) for s in STEPS
    ]
    for record, step in zip(run.steps, STEPS, strict=True):
        assert record.error is None and record.status == 200
        assert (record.prompt_tokens, record.cached_tokens) == (
            USAGE["prompt_tokens"],
            USAGE["prompt_tokens_details"]["cached_tokens"],
        )
        assert record.messages == len(step.messages)
        assert 0 < record.ttft_s <= record.e2e_s < run.wall_s  # type: ignore[operator]
    sent = {json.dumps(b["messages"]): b for b in chat_bodies(fake_upstream)}
    assert len(sent) == len(STEPS)
    for step in STEPS:
        body = sent[json.dumps(step.messages)]
        assert body[request.REPLY_FIELD] == step.reply
        assert body["tools"] == step.conversation.tools
        assert body["stream_options"] == {"include_usage": True}
        assert "parallel_tool_calls" not in body


def test_http_errors_are_recorded_and_the_run_goes_on(fake_upstream: FakeUpstream) -> None:
    client = httpx.AsyncClient(headers={"x-fault": "status-503"})
    run = replay(fake_upstream.url, client)
    assert len(run.steps) == len(STEPS)
    assert {(r.status, r.error) for r in run.steps} == {(503, "fake 503")}


def test_an_unreachable_server_is_an_error_on_each_step() -> None:
    with listening_socket() as sock:
        port = sock.getsockname()[1]
    run = replay(f"http://127.0.0.1:{port}")
    assert len(run.steps) == len(STEPS)
    assert all(r.status is None and r.error.startswith("ConnectError") for r in run.steps)  # type: ignore[union-attr]


def write_traces(path: Path, count: int) -> Path:
    path.write_text("".join(line for line in DEV.open().readlines()[:count]))
    return path


def test_command_line_writes_tables_json_and_plot(
    fake_upstream: FakeUpstream, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace_file = write_traces(tmp_path / "two.jsonl", 2)
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    argv = ["replay", "--traces", str(trace_file), "--target", fake_upstream.url]
    argv += ["--json", str(out), "--plot", str(png), "--profile", "mixed", "--max-tokens", "5"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr()
    assert "| cached share | 80.0% |" in printed.out
    assert "| step | requests | TTFT p50 | cached share |" in printed.out
    assert "no reasoning" in printed.err  # the note of the mixed profile
    document = json.loads(out.read_text())
    steps = traces.count_steps(traces.load(trace_file))
    assert document["summary"]["requests"] == len(document["steps"]) == steps
    assert document["config"]["model"] == "fake"  # found at /v1/models
    assert document["config"]["profile"] == "mixed"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bodies = chat_bodies(fake_upstream)
    assert {b["max_tokens"] for b in bodies} == {5}
    assert all(b["messages"][0]["content"].startswith("Current date and time:") for b in bodies)


def test_compare_runs_direct_then_through_the_proxy_each_from_a_reset_cache(
    fake_upstream: FakeUpstream, start_proxy, tmp_path: Path, capsys
) -> None:
    proxy = start_proxy(fake_upstream.url)
    out = tmp_path / "compare.json"
    argv = ["replay", "--synthetic", "3", "--seed", "7", "--target", fake_upstream.url]
    argv += ["--compare", proxy.url, "--json", str(out)]
    assert cli.main(argv) == 0
    document = json.loads(out.read_text())
    assert set(document) == {"direct", "proxy"}
    steps = traces.count_steps(synthetic.conversations(3, seed=7))
    for label in ("direct", "proxy"):
        assert document[label]["summary"]["requests"] == steps
        assert document[label]["summary"]["errors"] == 0
    assert document["proxy"]["config"]["url"] == proxy.url
    assert document["direct"]["summary"]["cached_share"] == pytest.approx(
        document["proxy"]["summary"]["cached_share"]
    )
    paths = [r.path for r in fake_upstream.received if r.method == "POST"]
    resets = [i for i, path in enumerate(paths) if path == "/reset_prefix_cache"]
    assert resets == [0, 1 + steps]  # before each run
    assert "| metric | direct | proxy | proxy - direct |" in capsys.readouterr().out
    labels = {"route": "/v1/chat/completions", "model": "fake", "status": "200"}
    assert proxy.sample("prefill_proxy_requests_total", **labels) == steps


def test_no_server_no_model(tmp_path: Path, capsys) -> None:
    with listening_socket() as sock:
        port = sock.getsockname()[1]
    argv = ["replay", "--synthetic", "1", "--target", f"http://127.0.0.1:{port}"]
    assert cli.main(argv) == 2
    assert "cannot find a model" in capsys.readouterr().err


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    """The project's simulator, fast: prefix-cache figures are what these tests read."""
    from proxy.sim.app import create_sim_app
    from proxy.sim.config import SimConfig

    with serve(create_sim_app(SimConfig(speed=1000.0))) as url:
        yield url


def replay_summary(url: str, profile: str, *, engine: str | None = None) -> dict:
    """A replay at ``url``, from a reset cache (``engine``'s, when ``url`` is a proxy)."""

    async def go() -> dict:
        async with make_client(2, 30) as http:
            await reset_prefix_cache(http, engine or url)
            model = await discover_model(http, url)
            replayer = Replayer(http, url, Options(model=model, profile=profile))
            run = await replayer.run(CONVERSATIONS)
        return report.summarize(run.steps, run.wall_s)

    return asyncio.run(go())


def test_profiles_against_the_simulator(sim_url: str) -> None:
    faithful = replay_summary(sim_url, "faithful")
    assert faithful["errors"] == 0 and faithful["requests"] == len(STEPS)
    assert faithful["cached_share_after_first_step"] > 0.9  # append-only history hits
    again = replay_summary(sim_url, "faithful")  # from a reset cache: the same figures
    tokens = ("prompt_tokens", "cached_tokens", "cached_share_after_first_step")
    assert [again[k] for k in tokens] == [faithful[k] for k in tokens]
    timestamped = replay_summary(sim_url, "timestamped")
    assert timestamped["prompt_tokens"] > faithful["prompt_tokens"]  # the clock line
    assert timestamped["cached_share"] < 0.05  # the prefix breaks at the first block
    reordered = replay_summary(sim_url, "reordered-tools")
    assert reordered["prompt_tokens"] == faithful["prompt_tokens"]
    assert reordered["cached_share"] < faithful["cached_share"] - 0.3


def test_the_proxy_restores_the_ideal_prefix_on_the_simulator(sim_url: str, start_proxy) -> None:
    """Straight at the engine, a mixed client (clock in the system prompt, reordered tools,
    re-serialized arguments) breaks the prefix every step; through the proxy it caches as
    well as a faithful client sent straight. A faithful client loses nothing by the proxy."""
    proxy = start_proxy(sim_url)
    ideal = replay_summary(sim_url, "faithful")
    mixed = replay_summary(sim_url, "mixed")
    faithful_proxied = replay_summary(proxy.url, "faithful", engine=sim_url)
    mixed_proxied = replay_summary(proxy.url, "mixed", engine=sim_url)
    for summary in (ideal, mixed, faithful_proxied, mixed_proxied):
        assert summary["errors"] == 0 and summary["requests"] == len(STEPS)
    share = "cached_share_after_first_step"
    assert mixed[share] < 0.05
    assert mixed_proxied[share] > ideal[share] - 0.02
    assert faithful_proxied[share] > ideal[share] - 0.005


def test_many_interleaved_conversations_sharing_a_system_prompt(sim_url: str, start_proxy) -> None:
    """No client sends a session id: 16 conversations (three domains, each sharing its
    system prompt and tools) in flight 8 at a time must still each be recognised, so that
    every one keeps its own prefix through the proxy."""
    proxy = start_proxy(sim_url)
    conversations = traces.load(DEV, limit=16)

    async def run(url: str, profile: str) -> dict:
        async with make_client(8, 60) as http:
            await reset_prefix_cache(http, sim_url)
            model = await discover_model(http, url)
            options = Options(model=model, profile=profile, concurrency=8)
            result = await Replayer(http, url, options).run(conversations)
        return report.summarize(result.steps, result.wall_s)

    ideal = asyncio.run(run(sim_url, "faithful"))
    proxied = asyncio.run(run(proxy.url, "mixed"))
    assert proxied["errors"] == 0 and proxied["requests"] == ideal["requests"]
    share = "cached_share_after_first_step"
    assert proxied[share] > ideal[share] - 0.02
    breaks = {
        reason: proxy.sample("prefill_proxy_prefix_breaks_total", reason=reason)
        for reason in ("new_session", "none", "history_rewritten", "system_changed")
    }
    assert breaks["new_session"] == len(conversations)
    assert breaks["none"] == proxied["requests"] - len(conversations)


def test_evicted_blocks_are_told_apart_from_a_rewritten_history(start_proxy) -> None:
    """Eight conversations at once, through the proxy, on an engine with room for all of
    them and on one whose KV cache holds about two: the proxy sees no prefix break either
    way (every step after the first is 'none'), but only on the small engine do far fewer
    tokens come from the cache than it expected: the engine evicted them."""
    from proxy.sim.app import create_sim_app
    from proxy.sim.config import SimConfig

    conversations = traces.load(DEV, limit=8)
    labels = {"route": "/v1/chat/completions", "model": "sim-model"}

    def cached_over_expected(capacity: int) -> float:
        config = SimConfig(speed=1000.0, capacity_tokens=capacity, max_model_len=16_000)
        with serve(create_sim_app(config)) as engine:
            # The longest of these reach 12k tokens: no compaction at this 16k context, which
            # would break prefixes on purpose (and count them as such); no warm-ups, which
            # bring evicted blocks back (what this test must see is the eviction).
            proxy = start_proxy(engine, compaction=False, warmup=False)

            async def run() -> dict:
                async with make_client(8, 60) as http:
                    options = Options(model="sim-model", profile="faithful", concurrency=8)
                    result = await Replayer(http, proxy.url, options).run(conversations)
                return report.summarize(result.steps, result.wall_s)

            summary = asyncio.run(run())
        assert summary["errors"] == 0
        none = proxy.sample("prefill_proxy_prefix_breaks_total", reason="none")
        assert none == summary["requests"] - len(conversations)
        expected = proxy.sample("prefill_proxy_expected_cached_prompt_tokens_total", **labels)
        return proxy.sample("prefill_proxy_cached_prompt_tokens_total", **labels) / expected

    # How the eight interleave moves the small engine's share (0.85-0.90 seen, 1.06 on
    # the roomy one): compared with the roomy one, not with a fixed figure.
    roomy = cached_over_expected(400_000)
    assert roomy > 0.95
    assert cached_over_expected(16_000) < roomy - 0.1
