"""The replay's command line: options, defaults, and light imports at parse time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proxy import cli
from proxy.replay import command, profiles
from proxy.replay.progress import Progress
from tests.support.clock import Clock


def parse(*argv: str):
    return cli.build_parser().parse_args(["replay", *argv])


def test_defaults() -> None:
    config = command.to_config(parse("--traces", "t.jsonl", "--target", "http://e"))
    assert config.traces == Path("t.jsonl") and config.synthetic is None
    assert (config.profile, config.concurrency, config.tool_latency) == ("faithful", 1, 0.0)
    assert config.reset_cache is None and config.compare is None and config.max_tokens is None


def test_compare_resets_the_target_cache_unless_told_otherwise() -> None:
    base = ("--synthetic", "4", "--target", "http://e", "--compare", "http://p")
    assert command.to_config(parse(*base)).reset_cache == "http://e"
    assert command.to_config(parse(*base, "--reset-cache", "http://x")).reset_cache == "http://x"
    assert command.to_config(parse(*base, "--no-reset-cache")).reset_cache is None


@pytest.mark.parametrize(
    "argv",
    [
        ("--target", "http://e"),  # no conversations
        ("--traces", "t", "--synthetic", "3", "--target", "http://e"),
        ("--traces", "t"),  # no target
        ("--traces", "t", "--target", "http://e", "--profile", "nope"),
        ("--traces", "t", "--target", "http://e", "--concurrency", "0"),
        ("--traces", "t", "--target", "http://e", "--tool-latency", "-1"),
    ],
)
def test_bad_options_are_refused(argv: tuple[str, ...], capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse(*argv)
    assert exit_.value.code == 2


def test_every_profile_is_offered(capsys) -> None:
    with pytest.raises(SystemExit):
        parse("--help")
    offered = capsys.readouterr().out
    assert all(name in offered for name in profiles.PROFILES)
    for name in profiles.PROFILES:
        assert parse("--synthetic", "1", "--target", "u", "--profile", name).profile == name


def test_parsing_loads_no_http_client_plotting_or_generator() -> None:
    code = (
        "import sys; from proxy import cli; cli.build_parser(); "
        "print([m for m in ('httpx', 'matplotlib', 'proxy.replay.runner', "
        "'proxy.replay.synthetic') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


class Stream:
    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


def test_progress_line_is_throttled_and_ends_with_a_newline() -> None:
    clock, stream = Clock(0.0), Stream()
    progress = Progress("direct", 4, stream, enabled=True, interval=1.0, clock=clock)  # type: ignore[arg-type]
    progress.advance()
    clock.now = 0.5
    progress.advance(error=True)  # too soon: not shown
    clock.now = 1.5
    progress.advance()
    progress.advance()  # the last one is always shown
    progress.close()
    lines = stream.text.split("\r")[1:]
    assert lines[0] == "direct: 1/4 steps (25%), 0.0 s"
    assert lines[1] == "direct: 3/4 steps (75%), 1 errors, 1.5 s"
    assert lines[-1] == "direct: 4/4 steps (100%), 1 errors, 1.5 s\n"


def test_progress_disabled_writes_nothing() -> None:
    stream = Stream()
    progress = Progress("x", 2, stream, enabled=False)  # type: ignore[arg-type]
    progress.advance()
    progress.advance()
    progress.close()
    assert stream.text == ""


def test_long_synthetic_sessions_and_trim_budget() -> None:
    config = command.to_config(
        parse(
            "--synthetic",
            "2",
            "--steps",
            "120",
            "--target",
            "u",
            "--profile",
            "client-trim",
            "--trim-tokens",
            "9000",
        )
    )
    assert (config.synthetic, config.synthetic_steps, config.trim_tokens) == (2, 120, 9000)
    assert command.to_config(parse("--synthetic", "2", "--target", "u")).synthetic_steps is None


@pytest.mark.parametrize(
    "argv",
    [
        ("--traces", "t", "--steps", "100", "--target", "u"),
        ("--traces", "t", "--trim-tokens", "100", "--target", "u"),  # profile faithful
    ],
)
def test_options_that_do_not_go_together_end_with_status_2(argv, capsys) -> None:
    assert command.run(parse(*argv)) == 2
    assert "needs" in capsys.readouterr().err
