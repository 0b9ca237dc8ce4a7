"""deploy/helm/prefill-proxy: rendered with Helm's own engine (helm-python-sdk binds Helm's Go
SDK: no helm binary, no cluster), the output validated against the Kubernetes schemas."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import helm_python as helm  # the test extra installs it: never skip, fail if it is missing
import kubernetes_validate
import pytest
import yaml

from tests.deploy.test_kubernetes import NOT_IN_SCHEMAS, SCHEMA_VERSION, SETTINGS_ENV

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "prefill-proxy"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
OVERRIDES: dict[str, Any] = {
    "proxy": {
        "upstream": "http://vllm.other:8000",
        "rewrite": False,
        "disabledRewrites": ["restore_history", "move_volatile"],
        "sessions": {"enabled": False, "max": 500, "ttl": 120.5},
        "volatilePatterns": [r"\d{4}-\d\d-\d\d"],
        "timeouts": {"read": 30, "total": 0},
        "extraEnv": {"PREFILL_PROXY_MODEL_LABEL_LIMIT": 64},
    },
    "vllm": {"port": 9000, "extraArgs": ["--max-model-len=32768"]},
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus"}},
    "scrapeAnnotations": False,
    "nodeSelector": {"nvidia.com/gpu.present": "true"},
}


def render(values: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    with helm.Chart.load(str(CHART)) as chart:
        files = chart.render(values, name="demo", namespace="llm")
    notes = files.pop("prefill-proxy/templates/NOTES.txt")
    docs = [d for text in files.values() for d in yaml.safe_load_all(text) if d]
    return docs, notes


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def env(docs: list[dict[str, Any]]) -> dict[str, str]:
    return one(docs, "ConfigMap")["data"]


@pytest.fixture(scope="module")
def default() -> tuple[list[dict[str, Any]], str]:
    return render({})


@pytest.fixture(scope="module")
def custom() -> tuple[list[dict[str, Any]], str]:
    return render(OVERRIDES)


def test_chart_metadata_and_lint() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "prefill-proxy"
    assert chart["version"] and chart["appVersion"] == VALUES["image"]["tag"]
    assert helm.lint(str(CHART))["errors"] == []


def test_every_value_referenced_in_templates_exists() -> None:
    refs = {
        ref
        for path in (CHART / "templates").iterdir()
        for ref in re.findall(r"\.Values((?:\.\w+)+)", path.read_text())
    }
    assert refs
    for ref in sorted(refs):
        node: Any = VALUES
        for key in ref.strip(".").split("."):
            assert isinstance(node, dict) and key in node, f".Values{ref} not in values.yaml"
            node = node[key]


@pytest.mark.parametrize("case", ["default", "custom"])
def test_rendered_manifests_are_valid(case: str, request: pytest.FixtureRequest) -> None:
    docs, _ = request.getfixturevalue(case)
    kinds = sorted(d["kind"] for d in docs)
    monitor = ["ServiceMonitor"] if case == "custom" else []
    assert kinds == sorted(["ConfigMap", "Deployment", "Service", "Service", *monitor])
    for doc in docs:
        if doc["kind"] not in NOT_IN_SCHEMAS:
            kubernetes_validate.validate(doc, SCHEMA_VERSION, strict=True)


def test_defaults_match_the_plain_manifests(default: tuple[list[dict[str, Any]], str]) -> None:
    docs, notes = default
    data = env(docs)
    assert set(data) <= SETTINGS_ENV, set(data) - SETTINGS_ENV
    assert data["PREFILL_PROXY_UPSTREAM"] == "http://127.0.0.1:8000"
    assert data["PREFILL_PROXY_REWRITE"] == "true"
    assert data["PREFILL_PROXY_DISABLED_REWRITES"] == ""
    assert data["PREFILL_PROXY_SESSION_MAX"] == "10000"
    assert data["PREFILL_PROXY_KEEPALIVE_EXPIRY"] == "4"
    plain = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "configmap.yaml").read_text())
    assert plain["data"].items() <= data.items()
    pod = one(docs, "Deployment")["spec"]["template"]
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    proxy, vllm = sorted(pod["spec"]["containers"], key=lambda c: c["name"] != "prefill-proxy")
    assert proxy["envFrom"][0]["configMapRef"]["name"] == one(docs, "ConfigMap")["metadata"]["name"]
    assert proxy["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert "--enable-prompt-tokens-details" in vllm["args"]
    assert "Rewrites: on." in notes


def test_values_reach_the_settings(custom: tuple[list[dict[str, Any]], str]) -> None:
    docs, notes = custom
    data = env(docs)
    assert set(data) <= SETTINGS_ENV, set(data) - SETTINGS_ENV
    assert data["PREFILL_PROXY_UPSTREAM"] == "http://vllm.other:8000"
    assert data["PREFILL_PROXY_REWRITE"] == "false"
    assert data["PREFILL_PROXY_DISABLED_REWRITES"] == "restore_history,move_volatile"
    assert data["PREFILL_PROXY_SESSIONS"] == "false"
    assert data["PREFILL_PROXY_SESSION_MAX"] == "500"
    assert float(data["PREFILL_PROXY_SESSION_TTL"]) == 120.5
    assert data["PREFILL_PROXY_VOLATILE_PATTERNS"] == r"\d{4}-\d\d-\d\d"
    assert data["PREFILL_PROXY_READ_TIMEOUT"] == "30"
    assert data["PREFILL_PROXY_TOTAL_TIMEOUT"] == "0"
    assert data["PREFILL_PROXY_MODEL_LABEL_LIMIT"] == "64"
    pod = one(docs, "Deployment")["spec"]["template"]
    assert "prometheus.io/scrape" not in pod["metadata"]["annotations"]
    (vllm,) = [c for c in pod["spec"]["containers"] if c["name"] == "vllm"]
    assert "--port=9000" in vllm["args"] and "--max-model-len=32768" in vllm["args"]
    assert "off (passthrough)" in notes


def test_sidecar_upstream_follows_the_vllm_port() -> None:
    docs, _ = render({"vllm": {"port": 9000}})
    assert env(docs)["PREFILL_PROXY_UPSTREAM"] == "http://127.0.0.1:9000"


def test_placeholders_are_in_values_but_not_rendered(default: Any, custom: Any) -> None:
    assert {"contextLimit", "highWatermark", "softWatermark", "window"} <= VALUES["budgets"].keys()
    assert {"enabled", "maxConcurrent"} <= VALUES["warmup"].keys()
    for docs, _ in (default, custom):
        assert not [k for k in env(docs) if re.search("BUDGET|WATERMARK|WARMUP|WINDOW", k)]


def test_service_monitor_finds_the_metrics_service(custom: Any) -> None:
    docs, _ = custom
    monitor = one(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    wanted = monitor["spec"]["selector"]["matchLabels"].items()
    services = [d for d in docs if d["kind"] == "Service"]
    (matched,) = [s for s in services if wanted <= s["metadata"]["labels"].items()]
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {
        p["name"] for p in matched["spec"]["ports"]
    }
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    for service in services:
        assert service["spec"]["selector"].items() <= pod_labels.items()
