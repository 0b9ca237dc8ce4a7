"""How long one big chat body holds the proxy's event loop: /health latency, probed every
5 ms from another thread, while a body of N MB (10 kB messages) is proxied to a fast
upstream. A measurement, not a test.

    .venv/bin/python -m tests.benchmarks.big_body 60 16 1
"""

from __future__ import annotations

import json
import sys
import threading
import time

import httpx
from prometheus_client import CollectorRegistry

from proxy import config
from proxy.app import create_app
from proxy.background import serve
from tests.support.fake_upstream import FakeUpstream


def chat_body(megabytes: float) -> bytes:
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are an agent."}]
    for index in range(int(megabytes * 1e6 / 10_060)):
        messages.append({"role": "user", "content": "x" * 10_000 + str(index)})
        messages.append({"role": "assistant", "content": "ok"})
    return json.dumps({"model": "m", "messages": messages}).encode()


def measure(megabytes: float) -> str:
    body = chat_body(megabytes)
    latencies: list[float] = []
    done = threading.Event()
    with FakeUpstream(record=False) as upstream:
        overrides = {"upstream": upstream.url, "max_body_bytes": 128 << 20}
        app = create_app(config.load(overrides, environ={}), registry=CollectorRegistry())
        with serve(app) as url:

            def probe() -> None:
                with httpx.Client(base_url=url) as client:
                    while not done.is_set():
                        started = time.perf_counter()
                        client.get("/health")
                        latencies.append(time.perf_counter() - started)
                        done.wait(0.005)

            prober = threading.Thread(target=probe)
            prober.start()
            done.wait(0.3)
            started = time.perf_counter()
            reply = httpx.post(url + "/v1/chat/completions", content=body, timeout=120)
            took = time.perf_counter() - started
            done.wait(0.3)
            done.set()
            prober.join()
    latencies.sort()
    return (
        f"body {len(body) / 1e6:.0f} MB: status {reply.status_code}, request "
        f"{took * 1000:.0f} ms, /health max {latencies[-1] * 1000:.0f} ms, "
        f"p50 {latencies[len(latencies) // 2] * 1000:.1f} ms"
    )


if __name__ == "__main__":
    for size in sys.argv[1:] or ["60", "16", "1"]:
        print(measure(float(size)), flush=True)
