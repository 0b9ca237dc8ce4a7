"""deploy/kubernetes: the core resources against the Kubernetes schemas
(kubernetes-validate bundles them: no cluster, no network), the rest structurally."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from proxy import config
from proxy.config import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
SCHEMA_VERSION = "1.30.0"
NOT_IN_SCHEMAS = {"ServiceMonitor", "Kustomization"}  # CRD and kustomize's own file
SETTINGS_ENV = {ENV_PREFIX + f.name.upper() for f in dataclasses.fields(Settings)}


def documents(folder: Path = MANIFESTS) -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted(folder.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for doc in documents() if doc["kind"] == kind]


@pytest.mark.parametrize(
    "doc",
    [d for d in documents() if d["kind"] not in NOT_IN_SCHEMAS],
    ids=lambda d: f"{d['kind']}/{d['metadata']['name']}",
)
def test_valid_against_schema(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, SCHEMA_VERSION, strict=True)


def test_validator_rejects_a_broken_deployment() -> None:
    (deployment,) = by_kind("Deployment")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][1]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, SCHEMA_VERSION, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    (kustomization,) = by_kind("Kustomization")
    files = {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def proxy_container() -> dict[str, Any]:
    (deployment,) = by_kind("Deployment")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "prefill-proxy")


def test_sidecar_probes_ports_and_config() -> None:
    proxy = proxy_container()
    assert proxy["livenessProbe"]["httpGet"]["path"] == "/health"
    assert proxy["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert proxy["resources"]["requests"] and proxy["resources"]["limits"]
    assert not proxy["image"].endswith(":latest")
    (configmap,) = by_kind("ConfigMap")
    assert proxy["envFrom"][0]["configMapRef"]["name"] == configmap["metadata"]["name"]
    assert set(configmap["data"]) <= SETTINGS_ENV, set(configmap["data"]) - SETTINGS_ENV
    assert configmap["data"]["PREFILL_PROXY_UPSTREAM"].startswith("http://127.0.0.1:")
    port = str(proxy["ports"][0]["containerPort"])
    assert configmap["data"]["PREFILL_PROXY_PORT"] == port
    (deployment,) = by_kind("Deployment")
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == port


def test_services_reach_the_proxy_and_the_service_monitor_finds_them() -> None:
    (deployment,) = by_kind("Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    port_names = {
        p["name"] for c in deployment["spec"]["template"]["spec"]["containers"] for p in c["ports"]
    }
    services = {s["metadata"]["name"]: s for s in by_kind("Service")}
    for service in services.values():
        assert service["spec"]["selector"].items() <= pod_labels.items()
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names
    assert [p["targetPort"] for p in services["vllm"]["spec"]["ports"]] == ["proxy"]
    (monitor,) = by_kind("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    wanted = monitor["spec"]["selector"]["matchLabels"].items()
    matched = [s for s in services.values() if wanted <= s["metadata"]["labels"].items()]
    assert len(matched) == 1
    ports = {p["name"] for p in matched[0]["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports
    assert all(e["path"] == "/metrics" for e in monitor["spec"]["endpoints"])


def test_configmap_loads_as_settings() -> None:
    """The proxy starts with these values (a bad one is a SettingsError at start), and the
    compaction and warm-up settings it spells out are the defaults."""
    (configmap,) = by_kind("ConfigMap")
    settings = config.load(environ=configmap["data"])
    assert settings.compaction and settings.warmup
    assert settings.context_limit == 0  # vLLM's max_model_len
    defaults = Settings()
    for name in ("compaction_high", "compaction_soft", "compaction_window", "summary_wait"):
        assert config.env_name(name) in configmap["data"], name
        assert getattr(settings, name) == getattr(defaults, name), name


# -- gateway mode: deploy/kubernetes/gateway ---------------------------------------------

GATEWAY = MANIFESTS / "gateway"


def gateway(kind: str) -> list[dict[str, Any]]:
    return [doc for doc in documents(GATEWAY) if doc["kind"] == kind]


@pytest.mark.parametrize(
    "doc",
    [d for d in documents(GATEWAY) if d["kind"] not in NOT_IN_SCHEMAS],
    ids=lambda d: f"{d['kind']}/{d['metadata']['name']}",
)
def test_gateway_manifests_are_valid(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, SCHEMA_VERSION, strict=True)


def test_gateway_kustomization_lists_every_manifest() -> None:
    (kustomization,) = gateway("Kustomization")
    files = {p.name for p in GATEWAY.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def test_gateway_services_select_what_they_name() -> None:
    pods = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d["spec"]["template"]
        for d in gateway("Deployment")
    }
    assert set(pods) == {"proxy", "engine", "session-store"}

    def selected(selector: dict[str, str]) -> set[str]:
        return {
            name
            for name, pod in pods.items()
            if selector.items() <= pod["metadata"]["labels"].items()
        }

    services = {s["metadata"]["name"]: s for s in gateway("Service")}
    assert selected(services["vllm"]["spec"]["selector"]) == {"proxy"}  # clients: proxies
    assert selected(services["vllm-engines"]["spec"]["selector"]) == {"engine"}
    assert services["vllm-engines"]["spec"]["clusterIP"] == "None"  # one address per pod
    assert selected(services["prefill-proxy-valkey"]["spec"]["selector"]) == {"session-store"}
    (budget,) = gateway("PodDisruptionBudget")
    assert selected(budget["spec"]["selector"]["matchLabels"]) == {"proxy"}
    (configmap,) = gateway("ConfigMap")
    settings = config.load(environ=configmap["data"])
    assert set(configmap["data"]) <= SETTINGS_ENV
    assert settings.session_store == "redis" and settings.upstream_dns_refresh > 0
    assert settings.upstream == "http://vllm-engines:8000"
    assert settings.redis_url.startswith("redis://prefill-proxy-valkey:6379/")
    (proxy,) = pods["proxy"]["spec"]["containers"]
    assert proxy["envFrom"][0]["configMapRef"]["name"] == configmap["metadata"]["name"]
