"""A real Prometheus (Debian's `prometheus` package, with `promtool`): the alert rules
checked and unit-tested by promtool (deploy/prometheus/alerts_test.yml), and every query of
the Grafana board evaluated over Prometheus's HTTP API while it scrapes a proxy and a
simulator that agent traffic (replayed dev traces) went through."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from proxy.background import free_port, spawn, wait_ready
from tests.deploy.test_metrics_queries import METRIC, all_panels
from tests.support.debian import require

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus"
TOOLS = {"prometheus": "prometheus", "promtool": "prometheus"}
# Grafana's variables, as the board's defaults resolve them.
VARIABLES = {"$model": ".*", "$__rate_interval": "1m"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    require(TOOLS)
    return subprocess.run(
        ["promtool", *args], capture_output=True, text=True, timeout=120, cwd=RULES
    )


def test_promtool_checks_the_rules() -> None:
    result = promtool("check", "rules", "alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    result = promtool("test", "rules", "alerts_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    rules = yaml.safe_load((RULES / "alerts.yml").read_text())["groups"]
    alerts = {rule["alert"] for group in rules for rule in group["rules"]}
    cases = yaml.safe_load((RULES / "alerts_test.yml").read_text())["tests"]
    checks = [check for case in cases for check in case["alert_rule_test"]]
    firing = {c["alertname"] for c in checks if c["exp_alerts"]}
    quiet = {c["alertname"] for c in checks if not c["exp_alerts"]}
    assert alerts - firing == set(), "never tested firing"
    assert alerts - quiet == set(), "never tested not firing"


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> dict[str, Any]:
        reply = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10)
        body = reply.json()
        assert reply.status_code == 200 and body["status"] == "success", (expr, body)
        return dict(body["data"])

    def value(self, expr: str) -> float | None:
        result = self.query(expr)["result"]
        return float(result[0]["value"][1]) if result else None


def scrape_config(proxy: str, engine: str) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES / "alerts.yml")],
        "scrape_configs": [
            {"job_name": "prefill-proxy", "static_configs": [{"targets": [proxy]}]},
            {"job_name": "vllm", "static_configs": [{"targets": [engine]}]},
        ],
    }


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """Prometheus scraping a proxy and a simulator after four dev conversations (tool
    rounds of 0.3 s) went through them."""
    require(TOOLS)
    folder = tmp_path_factory.mktemp("prometheus")
    engine, proxy, web = free_port(), free_port(), free_port()
    engine_url, proxy_url = f"http://127.0.0.1:{engine}", f"http://127.0.0.1:{proxy}"
    config = folder / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config(f"127.0.0.1:{proxy}", f"127.0.0.1:{engine}")))
    with (
        spawn(["proxy", "sim", "--port", str(engine), "--speed", "50"], engine_url + "/health"),
        spawn(
            ["proxy", "serve", "--upstream", engine_url, "--port", str(proxy)],
            proxy_url + "/health",
        ),
        (folder / "prometheus.log").open("wb") as log,
    ):
        server = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{web}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_ready(f"http://127.0.0.1:{web}/-/ready", server)
            served = Prometheus(f"http://127.0.0.1:{web}")
            # Traffic starts after the first scrape and spans several, so rates see it grow.
            wait_until(served, 'sum(up{job=~"prefill-proxy|vllm"})', 2)
            replay = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "proxy",
                    "replay",
                    "--traces",
                    "dev",
                    "--limit",
                    "4",
                    "--concurrency",
                    "2",
                    "--tool-latency",
                    "0.3",
                    "--target",
                    proxy_url,
                ],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert replay.returncode == 0, replay.stderr[-3000:]
            wait_until(served, "sum(prefill_proxy_requests_total)", requests_served(proxy_url))
            yield served
        finally:
            server.terminate()
            server.wait(30)


def requests_served(proxy_url: str) -> float:
    text = httpx.get(proxy_url + "/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("prefill_proxy_requests_total{")
    )


def wait_until(prometheus: Prometheus, expr: str, value: float, timeout: float = 30) -> None:
    """Until ``expr`` has ``value`` in Prometheus (it scraped that state), bounded."""
    deadline = time.monotonic() + timeout
    while prometheus.value(expr) != value:
        assert time.monotonic() < deadline, f"{expr} did not reach {value}"
        time.sleep(0.2)


def panel_queries() -> dict[str, tuple[dict[str, Any], str]]:
    return {
        f"{panel['title']} / {target['refId']}": (panel, target["expr"])
        for panel in all_panels()
        for target in panel.get("targets", [])
    }


def resolved(expr: str) -> str:
    return re.sub(r"\$\w+", lambda m: VARIABLES[m.group(0)], expr)


def happened(prometheus: Prometheus, metric: str) -> bool:
    """Whether the metric counted anything: a counter's or a histogram's total above 0."""
    counted = re.sub(r"_(bucket|sum)$", "_count", metric)
    return bool(prometheus.value(f"sum({counted})"))


QUERIES = panel_queries()


@pytest.mark.parametrize("name", QUERIES)
def test_dashboard_query(prometheus: Prometheus, name: str) -> None:
    """Valid PromQL; returns data, or queries only events that did not happen in this
    traffic, and then its panel shows 0 rather than "No data"."""
    panel, expr = QUERIES[name]
    result = prometheus.query(resolved(expr))["result"]
    if any(math.isfinite(float(series["value"][1])) for series in result):
        return
    events = [m for m in METRIC.findall(expr) if m.startswith("prefill_proxy_")]
    assert events, f"no data for an engine query: {expr}"
    assert not any(happened(prometheus, m) for m in events), f"no data from counted events: {expr}"
    assert panel["fieldConfig"]["defaults"].get("noValue") == "0", (
        f"{panel['title']}: an event that did not happen shows 'No data', not 0"
    )


def test_traffic_reached_both_targets(prometheus: Prometheus) -> None:
    up = prometheus.query("up")["result"]
    assert {r["metric"]["job"]: r["value"][1] for r in up} == {"prefill-proxy": "1", "vllm": "1"}
    assert (prometheus.value("sum(prefill_proxy_prompt_tokens_total)") or 0) > 10_000
    assert (prometheus.value("sum(prefill_proxy_cached_prompt_tokens_total)") or 0) > 0
    assert (
        json.dumps(prometheus.query("ALERTS")["result"]) == "[]"
    )  # a healthy run alerts on nothing
