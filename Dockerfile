# prefill-proxy: the OpenAI-compatible proxy in front of vLLM, configured by PREFILL_PROXY_*
# environment variables (README "Configuration"). No network is needed at run time.
FROM python:3.11-slim

# tiktoken's own variable, so serve, sim and replay all find the baked encodings.
# DL3064 is a false positive: "TIKTOKEN" in a variable name is no secret.
# hadolint ignore=DL3064
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TIKTOKEN_CACHE_DIR=/opt/prefill-proxy/tiktoken

WORKDIR /src
COPY deploy/docker/constraints.txt ./deploy/docker/constraints.txt
COPY pyproject.toml README.md ./
COPY proxy ./proxy

# Dependencies pinned by the constraints file, the package itself from this checkout, then
# tiktoken's encodings from the bpe-openai package (sha256-checked), baked in so that no
# start ever tries to download them. provision() never raises, so load them to be sure.
# tests/deploy/test_dockerfile.py runs these same commands.
RUN pip install --no-cache-dir --constraint deploy/docker/constraints.txt . \
    && python -c "import tiktoken; from proxy.tokens import provision; provision(); [tiktoken.get_encoding(n) for n in ('cl100k_base', 'o200k_base')]" \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin prefill-proxy \
    && rm -rf /src

USER 10001
WORKDIR /

ENV PREFILL_PROXY_HOST=0.0.0.0 \
    PREFILL_PROXY_PORT=8080
EXPOSE 8080

# Liveness of the proxy itself; /ready (which also asks the upstream) is for orchestrators.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('PREFILL_PROXY_PORT', '8080') + '/health', timeout=2)"]

CMD ["prefill-proxy", "serve"]
