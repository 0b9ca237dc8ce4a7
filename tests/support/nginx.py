"""nginx (Debian's nginx-light) as the load balancer a Kubernetes Service would be: each
request to a random backend (``random;``), streams unbuffered. One process, no daemon,
everything in a temporary folder."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from proxy.background import free_port, wait_ready
from tests.support.debian import require

CONFIG = """
daemon off;
master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream replicas {{
        random;
{servers}
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://replicas;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 300s;
            client_max_body_size 64m;
        }}
    }}
}}
"""


@contextlib.contextmanager
def balancer(backends: Sequence[str]) -> Iterator[str]:
    """A random load balancer in front of ``backends`` (http://host:port); yields its URL."""
    require({"nginx": "nginx-light"})  # fails naming the package when it is missing
    binary = shutil.which("nginx")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="nginx-") as folder:
        servers = "\n".join(f"        server {b.removeprefix('http://')};" for b in backends)
        config = Path(folder, "nginx.conf")
        config.write_text(CONFIG.format(dir=folder, servers=servers, port=port))
        process = subprocess.Popen(
            [str(binary), "-c", str(config), "-p", folder],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_ready(url + "/health", process, timeout=30)
            yield url
        finally:
            process.terminate()
            process.wait(10)
