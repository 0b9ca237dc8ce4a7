"""deploy/compose: the stack's files exist and point at each other."""

from __future__ import annotations

from pathlib import Path

import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "deploy" / "compose"


def images_pinned_and_mounts_present(stack: dict) -> None:
    for service in stack.values():
        assert ":" in service["image"] and not service["image"].endswith(":latest")
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE / source).exists(), source


def test_stack_wires_proxy_prometheus_and_grafana() -> None:
    stack = yaml.safe_load((COMPOSE / "compose.yaml").read_text())["services"]
    assert set(stack) == {"vllm", "proxy", "prometheus", "grafana"}
    assert stack["proxy"]["environment"]["PREFILL_PROXY_UPSTREAM"] == "http://vllm:8000"
    assert (COMPOSE / stack["proxy"]["build"]["context"] / "Dockerfile").exists()
    images_pinned_and_mounts_present(stack)
    prometheus = yaml.safe_load((COMPOSE / "prometheus" / "prometheus.yml").read_text())
    targets = {
        t
        for job in prometheus["scrape_configs"]
        for c in job["static_configs"]
        for t in c["targets"]
    }
    assert targets == {"proxy:8080", "vllm:8000"}
    assert prometheus["rule_files"] == ["/etc/prometheus/alerts.yml"]
    provisioning = COMPOSE / "grafana" / "provisioning"
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert source["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "prefill-proxy.yml").read_text())[
        "providers"
    ]
    assert any(
        v.endswith(":" + provider["options"]["path"] + "/prefill-proxy.json:ro")
        for v in stack["grafana"]["volumes"]
    )


def test_the_gateway_variant_wires_two_proxies_to_two_engines_and_one_store() -> None:
    stack = yaml.safe_load((COMPOSE / "compose.gateway.yaml").read_text())["services"]
    assert {"vllm-a", "vllm-b", "valkey", "proxy-a", "proxy-b", "balancer"} <= set(stack)
    from proxy import config

    for name in ("proxy-a", "proxy-b"):
        settings = config.load(environ=stack[name]["environment"])
        assert settings.upstreams == ("http://vllm-a:8000", "http://vllm-b:8000")
        assert settings.session_store == "redis" and "//valkey:6379" in settings.redis_url
    gpus = [
        stack[name]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
        for name in ("vllm-a", "vllm-b")
    ]
    assert gpus == [["0"], ["1"]]  # one GPU each
    images_pinned_and_mounts_present(stack)
    conf = (COMPOSE / "nginx" / "gateway.conf").read_text()
    assert "random;" in conf and "server proxy-a:8080;" in conf and "server proxy-b:8080;" in conf
    prometheus = yaml.safe_load((COMPOSE / "prometheus" / "gateway.yml").read_text())
    targets = {
        t
        for job in prometheus["scrape_configs"]
        for c in job["static_configs"]
        for t in c["targets"]
    }
    assert targets == {"proxy-a:8080", "proxy-b:8080", "vllm-a:8000", "vllm-b:8000"}
