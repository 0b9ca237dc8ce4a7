"""Ask for usage in every stream, so the engine's token counts reach the metrics."""

from __future__ import annotations

from typing import Any


def request_usage(request: dict[str, Any]) -> dict[str, Any] | None:
    """The request with ``stream_options.include_usage`` set, or None if the client already
    asked for usage (then its stream is left exactly as it is, usage chunk included)."""
    options = request.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return None
    options = dict(options) if isinstance(options, dict) else {}
    options["include_usage"] = True
    return {**request, "stream_options": options}
