#!/usr/bin/env bash
# The whole test suite from a fresh checkout: installs what it needs, then runs pytest.
# Extra arguments go to pytest (e.g. -m "not vllm" for a quick loop without real vLLM).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
echo "== installing prefill-proxy and its test tools into .venv"
.venv/bin/pip install --quiet --disable-pip-version-check -e ".[test,clients]" \
  --constraint deploy/docker/constraints.txt  # the versions the image ships
if command -v node >/dev/null && command -v npm >/dev/null; then
  echo "== the Vercel AI SDK for the client tests (tests/clients/node)"
  npm ci --prefix tests/clients/node --silent --no-audit --no-fund
fi

echo "== vLLM CPU build (own virtualenv), the tiny test model and SmolLM2-135M-Instruct"
bash tests/vllm/install.sh
"${PREFILL_PROXY_VLLM_VENV:-$HOME/.cache/prefill-proxy/vllm-venv}/bin/python" tests/vllm/build_model.py
"${PREFILL_PROXY_VLLM_VENV:-$HOME/.cache/prefill-proxy/vllm-venv}/bin/python" tests/vllm/build_smollm.py

echo "== podman, runc, debootstrap, prometheus for the deploy tests (Debian packages, when missing)"
bash tests/deploy/install_tools.sh

echo "== lint"
.venv/bin/ruff check proxy tests
.venv/bin/mypy proxy

echo "== tests"
exec .venv/bin/python -m pytest "$@"
