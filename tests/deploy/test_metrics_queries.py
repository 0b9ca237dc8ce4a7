"""Every metric the Grafana dashboard and the alert rules query exists: the proxy's on a
running proxy's /metrics, vLLM's on the simulator's metrics (vLLM's names); and every
label they filter or group by is one those metrics carry."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics import MetricWrapperBase

from proxy import config
from proxy.app import create_app
from proxy.metrics import Metrics
from proxy.sim.metrics import SimMetrics
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import serve

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
METRIC = re.compile(r"\b((?:prefill_proxy_|vllm:)[a-zA-Z0-9_:]+)")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)", re.MULTILINE)
SAMPLE_LABELS = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", re.MULTILINE)
SELECTOR = re.compile(r"((?:prefill_proxy_|vllm:)[a-zA-Z0-9_:]+)\{([^}]*)\}")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
# Sample names a family of each type exposes (prometheus_client, text format).
SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count", ""),
}
# Labels Prometheus attaches at scrape time (job, instance; pod and namespace from the
# Kubernetes service discovery or the ServiceMonitor), and the histogram bucket bound.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "container", "service"}


def all_panels() -> list[dict[str, Any]]:
    """Every panel, rows included, and the panels a collapsed row keeps inside it."""
    top = json.loads(DASHBOARD.read_text())["panels"]
    return [p for panel in top for p in (panel, *panel.get("panels", []))]


def dashboard_queries() -> dict[str, str]:
    return {
        f"{panel['title']} / {target['refId']}": target["expr"]
        for panel in all_panels()
        for target in panel.get("targets", [])
    }


def alert_queries() -> dict[str, str]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def exposed(text: str) -> set[str]:
    """Sample names, and the names a labelled family declares before its first child:
    `# HELP name_total` (prometheus_client writes it for a counter with no samples yet),
    and `# TYPE name histogram` (its name_bucket, name_sum and name_count)."""
    declared = re.findall(r"^# HELP (\S+)", text, re.MULTILINE)
    typed = {
        name + suffix
        for name, kind in re.findall(r"^# TYPE (\S+) (\w+)", text, re.MULTILINE)
        if kind in ("histogram", "summary")
        for suffix in SUFFIXES[kind]
    }
    return set(SAMPLE.findall(text)) | set(declared) | typed


def proxy_families() -> dict[str, tuple[set[str], str]]:
    """The proxy's sample names -> (label names, help text), from proxy.metrics.Metrics on
    a fresh registry (a labelled family has no samples, hence no labels on /metrics, until
    its first child)."""
    metrics = Metrics(CollectorRegistry())
    found: dict[str, tuple[set[str], str]] = {}
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase):
            labels = set(metric._labelnames)
            for suffix in SUFFIXES[str(metric._type)]:
                extra = {"le"} if suffix == "_bucket" else set()
                found[metric._name + suffix] = (labels | extra, metric._documentation)
    return found


def sample_labels(text: str) -> dict[str, set[str]]:
    """Sample names -> the label names their samples carry."""
    found: dict[str, set[str]] = {}
    for name, labels in SAMPLE_LABELS.findall(text):
        found.setdefault(name, set()).update(label for label, _, _ in MATCHER.findall(labels))
    return found


@pytest.fixture(scope="module")
def proxy_metrics() -> Iterator[set[str]]:
    """A stream and a non-stream request through the proxy, so labelled counters and
    histograms have children; then its /metrics."""
    with FakeUpstream() as upstream:
        settings = config.load({"upstream": upstream.url}, environ={})
        with serve(create_app(settings, registry=CollectorRegistry())) as url:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            with httpx.Client(base_url=url, timeout=10) as client:
                client.post("/v1/chat/completions", json=body).raise_for_status()
                stream = client.post("/v1/chat/completions", json={**body, "stream": True})
                stream.raise_for_status()
                failed = client.post(
                    "/v1/chat/completions", json=body, headers={"x-fault": "status-503"}
                )
                assert failed.status_code == 503
                yield exposed(client.get("/metrics").text)


def vllm_text() -> str:
    registry = CollectorRegistry()
    SimMetrics(registry, "m", max_model_len=1024, block_size=16, num_blocks=64)
    return generate_latest(registry).decode()


@pytest.fixture(scope="module")
def vllm_metrics() -> set[str]:
    return exposed(vllm_text())


@pytest.fixture(scope="module")
def families() -> dict[str, tuple[set[str], str]]:
    """Sample names -> (label names, help text): the proxy's and vLLM's (the simulator's
    samples; vLLM's help texts are not needed)."""
    vllm = {name: (labels, "") for name, labels in sample_labels(vllm_text()).items()}
    return {**vllm, **proxy_families()}


QUERIES = {**dashboard_queries(), **alert_queries()}


@pytest.mark.parametrize("query", QUERIES.values(), ids=QUERIES.keys())
def test_queried_metrics_exist(query: str, proxy_metrics: set[str], vllm_metrics: set[str]) -> None:
    names = METRIC.findall(query)
    assert names, "queries no known metric"
    for matchers in re.findall(r"\{([^}]*)\}", query):
        assert re.fullmatch(r'(\s*\w+\s*(=|!=|=~|!~)\s*"[^"]*"\s*,?)+', matchers), matchers
    missing = [n for n in names if n not in proxy_metrics | vllm_metrics]
    assert not missing, f"not on /metrics: {missing}"


# Labels whose values come from traffic (model names, routes, status codes), not from a
# fixed set the metric's help text lists.
OPEN_LABELS = {"model", "model_name", "route", "status", "transform"}


@pytest.mark.parametrize("query", QUERIES.values(), ids=QUERIES.keys())
def test_queried_labels_exist(query: str, families: dict[str, tuple[set[str], str]]) -> None:
    """Matchers and by/without clauses name labels the metrics carry (a typo there makes
    an empty panel or an alert that never fires); a literal value of a fixed-set label
    (kind="summary", outcome=~"failed|missing") is one the metric's help text lists."""
    names = [name for name in METRIC.findall(query) if name in families]
    for name, matchers in SELECTOR.findall(query):
        if name not in families:
            continue  # test_queried_metrics_exist reports it
        labels, help_text = families[name]
        for label, _, value in MATCHER.findall(matchers):
            assert label in labels | TARGET_LABELS, f"{name} has no label {label!r}"
            if label in OPEN_LABELS or not name.startswith("prefill_proxy_"):
                continue
            for alternative in value.split("|"):
                if re.fullmatch(r"\w+", alternative):
                    assert re.search(rf"\b{alternative}\b", help_text), (
                        f"{name}: {label}={alternative!r} is not a value its help text lists"
                    )
    grouped = {
        label.strip() for clause in GROUPING.findall(query) for label in clause.split(",")
    } - {""}
    carried = set().union(*(families[name][0] for name in names)) | TARGET_LABELS
    assert grouped <= carried, f"grouped by labels no queried metric has: {grouped - carried}"


def test_alert_rules_are_complete() -> None:
    """promtool is not on PyPI: structure and balanced brackets, checked here."""
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        assert group["name"] and group["rules"]
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in {"warning", "critical"}
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]
            assert re.fullmatch(r"\d+[smh]", rule.get("for", "0s")), rule["alert"]
            expr = rule["expr"]
            for open_, close in ("()", "[]", "{}"):
                assert expr.count(open_) == expr.count(close), rule["alert"]


def test_dashboard_covers_the_issue() -> None:
    queries = " ".join(dashboard_queries().values())
    for metric in (
        "prefill_proxy_time_to_first_token_seconds_bucket",
        "vllm:time_to_first_token_seconds_bucket",
        "prefill_proxy_cached_prompt_tokens_total",
        "prefill_proxy_computed_prompt_tokens_total",
        "prefill_proxy_decode_seconds_bucket",
        "prefill_proxy_prefix_breaks_total",
        "prefill_proxy_upstream_errors_total",
        "prefill_proxy_rewrite_failures_total",
        "prefill_proxy_session_errors_total",
        # compaction
        "prefill_proxy_compactions_total",
        "prefill_proxy_compaction_removed_tokens_total",
        "prefill_proxy_compacted_prompt_tokens_bucket",
        "prefill_proxy_summary_seconds_bucket",
        "prefill_proxy_summaries_total",
        "prefill_proxy_compaction_wait_seconds_bucket",
        "prefill_proxy_compaction_fallbacks_total",
        "prefill_proxy_context_overflows_total",
        # warm-up
        "prefill_proxy_warmups_total",
        "prefill_proxy_warmups_skipped_total",
        "prefill_proxy_warmup_seconds_bucket",
        "prefill_proxy_warmup_computed_tokens_total",
        "prefill_proxy_step_time_to_first_token_seconds_bucket",
        # round trips and fan-out
        "prefill_proxy_tool_calls_per_step_bucket",
        "prefill_proxy_steps_per_user_turn_bucket",
        "prefill_proxy_fanout_holds_total",
        "prefill_proxy_fanout_hold_seconds_bucket",
        # the proxy's own process: the collector stops its event loop
        "prefill_proxy_gc_pause_seconds_sum",
        "prefill_proxy_gc_pause_seconds_count",
    ):
        assert metric in queries, metric


def test_alerts_cover_compaction_and_warmup() -> None:
    queries = " ".join(alert_queries().values())
    for metric in (
        "prefill_proxy_context_overflows_total",
        "prefill_proxy_summaries_total",
        "prefill_proxy_warmups_total",
    ):
        assert metric in queries, metric


def test_dashboard_layout() -> None:
    """Ids unique, every query on the data source variable, panels inside the 24-column
    grid and none overlapping, each non-row panel under a row."""
    dashboard = json.loads(DASHBOARD.read_text())
    panels = all_panels()
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    assert dashboard["templating"]["list"][0]["name"] == "datasource"
    placed: list[tuple[int, int, int, int, str]] = []
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["y"] >= 0 and pos["w"] > 0 and pos["h"] > 0
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        for x, y, w, h, title in placed:
            overlap = (
                pos["x"] < x + w
                and x < pos["x"] + pos["w"]
                and pos["y"] < y + h
                and y < pos["y"] + pos["h"]
            )
            assert not overlap, f"{panel['title']} overlaps {title}"
        placed.append((pos["x"], pos["y"], pos["w"], pos["h"], panel["title"]))
    ordered = sorted(dashboard["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))
    assert ordered[0]["type"] == "row", "panels above the first row"
    for panel in panels:
        if panel["type"] == "row":
            assert panel["gridPos"]["w"] == 24 and not panel.get("targets")
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["description"] and panel["fieldConfig"]["defaults"]["unit"]
        refs = [target["refId"] for target in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]
            assert target["legendFormat"], panel["title"]
