"""The shipped Kubernetes sidecar pod for real: `podman kube play` of deploy/kubernetes'
ConfigMap and Deployment, through a test-only overlay (below) since the vLLM image cannot
be pulled here and this machine has no GPU.

The overlay changes only what cannot run here: the vLLM container runs `prefill-proxy sim`
(the proxy image plus the simulator, which the image leaves out: tests/support/podman.py),
with the same probes and volume; its GPU and 32 GiB requests are dropped, images are
local, and the pod uses the host network on free ports (the ConfigMap's PREFILL_PROXY_PORT
and PREFILL_PROXY_UPSTREAM follow).

What podman 4.3 (Debian bookworm) cannot play, and how the test covers it instead:
- `ports` with `hostNetwork`: it refuses any ("PortMappings can only be used with Bridge
  or slirp4netns networking"), so the overlay drops them and writes each probe's named
  port as its number, as the kubelet resolves it.
- Probes: podman turns a liveness probe into a `curl` healthcheck (not in the slim image)
  run by systemd timers (none here) and ignores readiness probes; the test sends each
  probe's HTTP GET itself, as the kubelet would.
- Services: not played. The client Service is checked by resolving its targetPort through
  the pod's named ports and sending the request there, where a Service forwards it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from proxy.background import free_port
from tests.support.podman import Build, Podman, build_engine_image, wait_until

MANIFESTS = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
GPU = "nvidia.com/gpu"


def shipped(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((MANIFESTS / name).read_text()) if doc]


def container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in pod_spec["containers"] if c["name"] == name]
    return found


def overlay(image: str, engine_image: str, ports: dict[str, int]) -> list[dict[str, Any]]:
    """The shipped ConfigMap and Deployment, changed only where this machine needs it;
    ``ports`` gives each named container port its number here."""
    (configmap,) = shipped("configmap.yaml")
    (deployment,) = shipped("deployment.yaml")
    configmap["data"]["PREFILL_PROXY_PORT"] = str(ports["proxy"])
    configmap["data"]["PREFILL_PROXY_UPSTREAM"] = f"http://127.0.0.1:{ports['vllm']}"
    spec = deployment["spec"]["template"]["spec"]
    spec["hostNetwork"] = True
    engine = container(spec, "vllm")
    assert GPU in engine["resources"]["limits"], "the overlay no longer matches the manifest"
    del engine["resources"]
    engine.update(
        image=engine_image,
        command=["prefill-proxy", "sim"],
        args=["--port", str(ports["vllm"]), "--served-model-name", "qwen", "--speed", "50"],
    )
    container(spec, "prefill-proxy")["image"] = image
    for entry in spec["containers"]:
        entry["imagePullPolicy"] = "Never"
        assert {p["name"] for p in entry.pop("ports")} <= set(ports)
        for probe in probes(entry).values():
            probe["httpGet"]["port"] = ports[probe["httpGet"]["port"]]
    return [configmap, deployment]


def probes(entry: dict[str, Any]) -> dict[str, dict[str, Any]]:
    kinds = ("startupProbe", "livenessProbe", "readinessProbe")
    return {kind: entry[kind] for kind in kinds if kind in entry}


def client_service_port(ports: dict[str, int]) -> int:
    """The port the client Service forwards to: its targetPort, a container port's name
    in the shipped Deployment."""
    (service, _) = shipped("service.yaml")
    assert service["metadata"]["name"] == "vllm" and "clusterIP" not in service["spec"]
    (port,) = service["spec"]["ports"]
    (deployment,) = shipped("deployment.yaml")
    spec = deployment["spec"]["template"]["spec"]
    named = {p["name"] for c in spec["containers"] for p in c["ports"]}
    assert port["targetPort"] in named
    return ports[port["targetPort"]]


@pytest.fixture(scope="module")
def pod(podman: Podman, image: Build, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    ports = {"vllm": free_port(), "proxy": free_port()}
    docs = overlay(image.image, build_engine_image(podman, image), ports)
    manifest = tmp_path_factory.mktemp("kube") / "sidecar.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    podman.run("kube", "down", str(manifest), check=False)
    podman.run("kube", "play", str(manifest), timeout=180)
    try:
        yield docs, ports
    finally:
        podman.run("kube", "down", str(manifest), check=False, timeout=120)


def pod_containers(podman: Podman) -> dict[str, dict[str, Any]]:
    """The played pod's containers by their manifest name (podman names them POD-NAME)."""
    listed = json.loads(podman.run("ps", "-a", "--pod", "--format", "json").stdout)
    return {
        entry["Names"][0].removeprefix(entry["PodName"] + "-"): entry
        for entry in listed
        if entry.get("PodName", "").startswith("vllm-pod") and not entry.get("IsInfra")
    }


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def test_the_pod_starts_both_containers(podman: Podman, pod: Any) -> None:
    containers = pod_containers(podman)
    assert set(containers) == {"vllm", "prefill-proxy"}, containers
    assert all(entry["State"] == "running" for entry in containers.values()), containers


def test_the_probes_pass(pod: Any) -> None:
    docs, _ = pod
    spec = docs[1]["spec"]["template"]["spec"]
    for entry in spec["containers"]:
        for kind, probe in probes(entry).items():
            url = f"http://127.0.0.1:{probe['httpGet']['port']}{probe['httpGet']['path']}"
            wait_until(lambda url=url: answers(url), f"{entry['name']} {kind} {url}")


def test_a_request_through_the_client_service_port_reaches_the_engine(pod: Any) -> None:
    _, ports = pod
    url = f"http://127.0.0.1:{client_service_port(ports)}"
    wait_until(lambda: answers(url + "/ready"), "the proxy ready behind the Service port")
    body = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] > 0
    assert "x-prefill-proxy-overhead-ms" in reply.headers  # it went through the proxy
    metrics = httpx.get(url + "/metrics", timeout=5).text
    assert 'prefill_proxy_requests_total{model="qwen",route="/v1/chat/completions"' in metrics


def test_the_proxy_keeps_the_manifest_security_context(podman: Podman, pod: Any) -> None:
    entry = pod_containers(podman)["prefill-proxy"]
    assert podman.run("exec", entry["Id"], "id", "-u").stdout.strip() == "10001"
    written = podman.run("exec", entry["Id"], "touch", "/probe", check=False)
    assert written.returncode != 0 and "Read-only file system" in written.stderr
