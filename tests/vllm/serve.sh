#!/usr/bin/env bash
# Serve a model with vLLM (CPU build) in the foreground, with the flags the prefill-proxy tests rely on.
set -euo pipefail

if [[ $# -lt 2 ]]; then
    echo "usage: $0 MODEL_DIR PORT [extra vLLM args...]" >&2
    exit 2
fi
MODEL_DIR="$1" PORT="$2"
shift 2
VENV="${PREFILL_PROXY_VLLM_VENV:-$HOME/.cache/prefill-proxy/vllm-venv}"
[[ -x "$VENV/bin/python" ]] || { echo "no vLLM venv at $VENV: run tests/vllm/install.sh" >&2; exit 1; }
[[ -f "$MODEL_DIR/config.json" ]] || { echo "no model at $MODEL_DIR: run tests/vllm/build_model.py" >&2; exit 1; }

export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"  # GiB of KV cache
export VLLM_ENABLE_V1_MULTIPROCESSING=0  # engine in-process: faster start, less memory
export VLLM_ENFORCE_STRICT_TOOL_CALLING=0  # let tool_choice required/named use structured outputs
export VLLM_SERVER_DEV_MODE=1  # /reset_prefix_cache: benchmarks and tests start runs cold
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
unset PYTHONPATH PYTHONHOME
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1

# `python -m` rather than the `vllm` script, which fails under the vllm-cpu package name.
# --block-size must be a multiple of 32 on CPU.
exec "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
    --model "$MODEL_DIR" --served-model-name tiny-qwen2 \
    --host 127.0.0.1 --port "$PORT" \
    --dtype float32 --enforce-eager --max-model-len 16384 --block-size 32 \
    --enable-prefix-caching --enable-prompt-tokens-details \
    --enable-auto-tool-choice --tool-call-parser hermes \
    --structured-outputs-config '{"backend":"xgrammar","disable_any_whitespace":true}' \
    "$@"
