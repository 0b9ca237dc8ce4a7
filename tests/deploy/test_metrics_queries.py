"""Every metric the Grafana dashboard and the alert rules query exists: the proxy's on a
running proxy's /metrics, vLLM's on the simulator's metrics (vLLM's names)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from proxy import config
from proxy.app import create_app
from proxy.sim.metrics import SimMetrics
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import serve

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
METRIC = re.compile(r"\b((?:prefill_proxy_|vllm:)[a-zA-Z0-9_:]+)")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)", re.MULTILINE)


def dashboard_queries() -> dict[str, str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return {
        f"{panel['title']} / {target['refId']}": target["expr"]
        for panel in panels
        for target in panel["targets"]
    }


def alert_queries() -> dict[str, str]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def exposed(text: str) -> set[str]:
    """Sample names, and the names a labelled family declares before its first child
    (`# HELP name_total`: prometheus_client writes it for a counter with no samples yet)."""
    declared = re.findall(r"^# HELP (\S+)", text, re.MULTILINE)
    return set(SAMPLE.findall(text)) | set(declared)


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


@pytest.fixture(scope="module")
def vllm_metrics() -> set[str]:
    registry = CollectorRegistry()
    SimMetrics(registry, "m", max_model_len=1024, block_size=16, num_blocks=64)
    return exposed(generate_latest(registry).decode())


QUERIES = {**dashboard_queries(), **alert_queries()}


@pytest.mark.parametrize("query", QUERIES.values(), ids=QUERIES.keys())
def test_queried_metrics_exist(query: str, proxy_metrics: set[str], vllm_metrics: set[str]) -> None:
    names = METRIC.findall(query)
    assert names, "queries no known metric"
    for matchers in re.findall(r"\{([^}]*)\}", query):
        assert re.fullmatch(r'(\s*\w+\s*(=|!=|=~|!~)\s*"[^"]*"\s*,?)+', matchers), matchers
    missing = [n for n in names if n not in proxy_metrics | vllm_metrics]
    assert not missing, f"not on /metrics: {missing}"


def test_alert_rules_are_complete() -> None:
    """promtool is not on PyPI: structure and balanced brackets, checked here."""
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        assert group["name"] and group["rules"]
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in {"warning", "critical"}
            assert rule["annotations"]["summary"]
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
    ):
        assert metric in queries, metric
    ids = [panel["id"] for panel in json.loads(DASHBOARD.read_text())["panels"]]
    assert len(ids) == len(set(ids))
