"""prefill-proxy: an OpenAI-compatible proxy that makes vLLM's prefix cache hit for agents."""

__version__ = "0.1.0"
