"""The Vercel AI SDK on node: runs tests/clients/node/tool_loop.mjs."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

NODE_DIR = Path(__file__).parent / "node"


def node() -> str | None:
    return shutil.which("node")


def run(base_url: str, model: str, *, stream: bool, api: str = "chat") -> str:
    if not (NODE_DIR / "node_modules").is_dir():
        raise RuntimeError(f"no node_modules: run `npm ci --prefix {NODE_DIR}`")
    mode = "stream" if stream else "non-stream"
    done = subprocess.run(
        [node() or "node", str(NODE_DIR / "tool_loop.mjs"), base_url, model, mode, api],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"tool_loop.mjs exited {done.returncode}:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout)
    ran = [r for step in result["steps"] for r in step["toolResults"]]
    if not ran:
        raise RuntimeError(f"the AI SDK ran no tool: {result}")
    return str(result["text"])


def run_on_responses(base_url: str, model: str, *, stream: bool) -> str:
    """The same loop with ``openai(model)`` of @ai-sdk/openai: the Responses API."""
    return run(base_url, model, stream=stream, api="responses")
