"""Real uvicorn servers on loopback ports for the tests (the package's own helper)."""

from proxy.background import listening_socket, serve

__all__ = ["listening_socket", "serve"]
