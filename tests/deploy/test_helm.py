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

from proxy import config
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
        "contextLimit": 32768,
        "compaction": {
            "enabled": False,
            "highWatermark": 0.8,
            "softWatermark": 0.5,
            "window": 0.2,
            "elideAfterSteps": 6,
            "elideMinTokens": 0,
            "summary": {
                "maxTokens": 1024,
                "wait": 0.5,
                "timeout": 60,
                "url": "http://summarizer.llm.svc:8000",
                "model": "qwen-small",
            },
        },
        "warmup": {
            "enabled": False,
            "maxInflight": 8,
            "maxWaiting": 2,
            "maxProxyInflight": 32,
            "priority": 1,
        },
        "engineBlockSize": 32,
        "parallelToolCalls": False,
        "batchingInstruction": True,
        "fanout": {"hold": 0, "minTokens": 4096},
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


def test_defaults_are_the_proxys_defaults(default: tuple[list[dict[str, Any]], str]) -> None:
    """values.yaml mirrors proxy.config.Settings: every rendered setting but the listen
    address loads to its default, so the chart changes nothing a user did not ask for."""
    docs, notes = default
    data = env(docs)
    loaded = config.load(environ=data)
    defaults = config.Settings()
    differ = {
        name
        for name in (f.name for f in config.fields())
        if config.env_name(name) in data and getattr(loaded, name) != getattr(defaults, name)
    }
    assert differ == {"host"}, differ
    for setting in ("context_limit", "compaction", "compaction_high", "summarizer_url", "warmup"):
        assert config.env_name(setting) in data, setting
    (vllm,) = [
        c
        for c in one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
        if c["name"] == "vllm"
    ]
    assert not [a for a in vllm["args"] if "scheduling-policy" in a]
    assert "Compaction: on, at 0.75 of vLLM's max_model_len." in notes
    assert "Warm-up: on (at most 4 at once)." in notes


def test_compaction_and_warmup_values_reach_the_settings(custom: Any) -> None:
    docs, notes = custom
    loaded = config.load(environ=env(docs))
    assert loaded.context_limit == 32768
    assert loaded.compaction is False
    assert (loaded.compaction_high, loaded.compaction_soft, loaded.compaction_window) == (
        0.8,
        0.5,
        0.2,
    )
    assert (loaded.elide_after_steps, loaded.elide_min_tokens) == (6, 0)
    assert (loaded.summary_max_tokens, loaded.summary_wait, loaded.summary_timeout) == (
        1024,
        0.5,
        60.0,
    )
    assert loaded.summarizer_url == "http://summarizer.llm.svc:8000"
    assert loaded.summarizer_model == "qwen-small"
    assert loaded.warmup is False
    assert (
        loaded.warmup_max_inflight,
        loaded.warmup_max_waiting,
        loaded.warmup_max_proxy_inflight,
        loaded.warmup_priority,
    ) == (8, 2, 32, 1)
    assert loaded.engine_block_size == 32
    assert loaded.parallel_tool_calls is False and loaded.batching_instruction is True
    assert (loaded.fanout_hold, loaded.fanout_min_tokens) == (0.0, 4096)
    assert "Compaction: off. Warm-up: off." in notes


def vllm_args(values: dict[str, Any]) -> list[str]:
    docs, _ = render(values)
    containers = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    (vllm,) = [c for c in containers if c["name"] == "vllm"]
    return list(vllm["args"])


def test_warmup_priority_switches_vllm_to_priority_scheduling() -> None:
    """vLLM rejects a request's priority unless it runs --scheduling-policy priority."""
    assert "--scheduling-policy=priority" in vllm_args({"proxy": {"warmup": {"priority": 1}}})
    off = {"proxy": {"warmup": {"priority": 1, "enabled": False}}}
    assert not [a for a in vllm_args(off) if "scheduling-policy" in a]
    own = {
        "proxy": {"warmup": {"priority": 1}},
        "vllm": {"extraArgs": ["--scheduling-policy=fcfs"]},
    }
    assert [a for a in vllm_args(own) if "scheduling-policy" in a] == ["--scheduling-policy=fcfs"]


@pytest.mark.parametrize(
    "compaction",
    [
        {"softWatermark": 0.9},  # above high
        {"window": 0.7},  # above soft
        {"highWatermark": 1.2},
        {"window": 0},
    ],
)
def test_watermarks_out_of_order_fail_the_render(compaction: dict[str, float]) -> None:
    """The proxy would refuse to start (SettingsError); the chart says so at install."""
    with pytest.raises(helm.HelmRenderError, match=r"proxy\.compaction: need 0 < window"):
        render({"proxy": {"compaction": compaction}})


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes' label selector: matchLabels and matchExpressions (In, NotIn)."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        present = labels.get(expression["key"]) in expression["values"]
        if present != (expression["operator"] == "In"):
            return False
    return True


def test_service_monitor_finds_the_metrics_service(custom: Any) -> None:
    docs, _ = custom
    monitor = one(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    services = [d for d in docs if d["kind"] == "Service"]
    (matched,) = [
        s for s in services if selects(monitor["spec"]["selector"], s["metadata"]["labels"])
    ]
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {
        p["name"] for p in matched["spec"]["ports"]
    }
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    for service in services:
        assert service["spec"]["selector"].items() <= pod_labels.items()


GATEWAY: dict[str, Any] = {"mode": "gateway", "gateway": {"proxyReplicas": 3, "engines": 4}}


def deployments(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d
        for d in docs
        if d["kind"] == "Deployment"
    }


def pods_selected(docs: list[dict[str, Any]], selector: dict[str, Any]) -> set[str]:
    return {
        component
        for component, d in deployments(docs).items()
        if selects(selector, d["spec"]["template"]["metadata"]["labels"])
    }


def test_gateway_mode_renders_proxies_engines_and_a_store() -> None:
    docs, _ = render(GATEWAY)
    for doc in docs:
        if doc["kind"] not in NOT_IN_SCHEMAS:
            kubernetes_validate.validate(doc, SCHEMA_VERSION, strict=True)
    pods = deployments(docs)
    assert set(pods) == {"proxy", "engine", "session-store"}
    assert pods["proxy"]["spec"]["replicas"] == 3 and pods["engine"]["spec"]["replicas"] == 4
    containers = {
        name: [c["name"] for c in d["spec"]["template"]["spec"]["containers"]]
        for name, d in pods.items()
    }
    assert containers == {
        "proxy": ["prefill-proxy"],
        "engine": ["vllm"],
        "session-store": ["valkey"],
    }
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    client = services["demo-prefill-proxy"]
    assert pods_selected(docs, {"matchLabels": client["spec"]["selector"]}) == {"proxy"}
    engines = services["demo-prefill-proxy-engines"]
    assert engines["spec"]["clusterIP"] == "None"
    assert pods_selected(docs, {"matchLabels": engines["spec"]["selector"]}) == {"engine"}
    (budget,) = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert pods_selected(docs, budget["spec"]["selector"]) == {"proxy"}
    loaded = config.load(environ=env(docs))
    assert loaded.upstream == "http://demo-prefill-proxy-engines.llm.svc.cluster.local:8000"
    assert loaded.upstream_dns_refresh == 10 and loaded.session_store == "redis"
    valkey = services["demo-prefill-proxy-valkey"]
    assert loaded.redis_url == f"redis://{valkey['metadata']['name']}:6379/0"
    assert pods_selected(docs, {"matchLabels": valkey["spec"]["selector"]}) == {"session-store"}


def test_gateway_mode_with_an_existing_store_and_its_secret() -> None:
    external = {**GATEWAY, "gateway": {"sessionStore": {"url": "rediss://redis.infra:6380/2"}}}
    docs, _ = render(external)
    assert "session-store" not in deployments(docs)
    assert config.load(environ=env(docs)).redis_url == "rediss://redis.infra:6380/2"
    secret = {**GATEWAY, "gateway": {"sessionStore": {"urlSecret": {"name": "llm-redis"}}}}
    docs, _ = render(secret)
    assert "session-store" not in deployments(docs)
    (proxy,) = deployments(docs)["proxy"]["spec"]["template"]["spec"]["containers"]
    (variable,) = proxy["env"]
    assert variable["name"] == "PREFILL_PROXY_REDIS_URL"
    assert variable["valueFrom"]["secretKeyRef"] == {"name": "llm-redis", "key": "url"}


def test_gateway_service_monitor_scrapes_proxies_and_engines() -> None:
    docs, _ = render({**GATEWAY, "serviceMonitor": {"enabled": True}})
    monitor = one(docs, "ServiceMonitor")
    services = [d for d in docs if d["kind"] == "Service"]
    matched = [s for s in services if selects(monitor["spec"]["selector"], s["metadata"]["labels"])]
    ports = {p["name"] for s in matched for p in s["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == ports == {"proxy", "vllm"}
    scraped = set().union(
        *(pods_selected(docs, {"matchLabels": s["spec"]["selector"]}) for s in matched)
    )
    assert scraped == {"proxy", "engine"}


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(Exception, match="mode must be sidecar or gateway"):
        render({"mode": "mesh"})


def leaves(node: Any, path: str) -> list[str]:
    if isinstance(node, dict):
        return [leaf for key, value in node.items() for leaf in leaves(value, f"{path}.{key}")]
    return [path]


def test_readme_documents_the_compaction_and_warmup_values() -> None:
    readme = (CHART / "README.md").read_text()
    proxy = VALUES["proxy"]
    documented = [
        *leaves(proxy["compaction"], "proxy.compaction"),
        *leaves(proxy["warmup"], "proxy.warmup"),
        *leaves(proxy["fanout"], "proxy.fanout"),
        *(f"proxy.{key}" for key in ("contextLimit", "engineBlockSize", "parallelToolCalls")),
        "proxy.batchingInstruction",
    ]
    missing = [value for value in documented if f"`{value}`" not in readme]
    assert not missing, missing
