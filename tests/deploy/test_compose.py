"""deploy/compose: the stack's files exist and point at each other."""

from __future__ import annotations

from pathlib import Path

import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "deploy" / "compose"


def test_stack_wires_proxy_prometheus_and_grafana() -> None:
    stack = yaml.safe_load((COMPOSE / "compose.yaml").read_text())["services"]
    assert set(stack) == {"vllm", "proxy", "prometheus", "grafana"}
    assert stack["proxy"]["environment"]["PREFILL_PROXY_UPSTREAM"] == "http://vllm:8000"
    assert (COMPOSE / stack["proxy"]["build"]["context"] / "Dockerfile").exists()
    for service in stack.values():
        assert ":" in service["image"] and not service["image"].endswith(":latest")
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE / source).exists(), source
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
