"""Which paths the proxy forwards: an allow-list, matched after normalisation. No I/O.

By default the OpenAI routes vLLM serves and its token, model, version and health routes;
anything else (vLLM's development endpoints such as /reset_prefix_cache, its own
/metrics, which the proxy's shadows) is refused unless ``passthrough_paths`` lets it
through. A path with dot segments is never forwarded: URL libraries resolve them on the
way out, so ``/v1/../metrics`` would reach the upstream's ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Iterable

# vLLM 0.32's OpenAI-compatible routes (vllm/entrypoints/openai/api_server.py), and its
# token, model listing, version and health routes. "/x/*" allows what is under /x/.
DEFAULT_PATHS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/responses/*",
    "/v1/audio/transcriptions",
    "/v1/audio/translations",
    "/v1/models",
    "/v1/models/*",
    "/tokenize",
    "/detokenize",
    "/version",
    "/health",
)


class PathPolicy:
    """``forwards(path)``: the path (decoded, as ASGI gives it) may go upstream."""

    def __init__(self, extra: Iterable[str] = ()) -> None:
        patterns = (*DEFAULT_PATHS, *extra)
        self.everything = "*" in patterns
        self._exact = frozenset(p for p in patterns if not p.endswith("/*"))
        self._prefixes = tuple(p[:-1] for p in patterns if p.endswith("/*"))

    def refusal(self, path: str) -> str | None:
        """Why ``path`` is not forwarded, or None when it is."""
        if any(segment in (".", "..") for segment in path.split("/")):
            return f"the path {path!r} has dot segments"
        if self.everything or path in self._exact or path.startswith(self._prefixes):
            return None
        return f"the proxy does not forward {path} (the passthrough_paths setting allows more)"
