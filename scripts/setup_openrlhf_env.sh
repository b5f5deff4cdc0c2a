#!/usr/bin/env bash
# Idempotent set-up of the optional OpenRLHF-on-CPU environment (a third venv, .venv-openrlhf): the real
# OpenRLHF 0.11.2 + DeepSpeed 0.19.6 + Ray training path of the openrlhf backend, for tests/integration_openrlhf
# and the API-contract tests of tests/test_gpu_seam.py. The project's .venv is not touched.
# Installs the lock requirements/openrlhf-cpu.txt without dependency resolution (it is complete; openrlhf's own
# metadata asks for flash-attn and vllm, which need CUDA or are not used on the CPU: docs/gpu.md), with
# DS_BUILD_OPS=0 (DeepSpeed compiles no C++ op at install; the CPU path needs none: cpu_compat.py), then drmas
# itself (editable, no dependencies). openrlhf ships a top-level `tests` package into site-packages; it is
# removed, so that nothing can import it in place of this repository's tests. Re-installs only when the lock,
# pyproject.toml or this script changed (~3 minutes and ~1.9 GB on first run).
# Usage: bash scripts/setup_openrlhf_env.sh
#        (then: .venv-openrlhf/bin/python -m pytest tests/integration_openrlhf)
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
  echo "[setup-openrlhf] installing $LOCK into $VENV (first run takes ~3 minutes, ~1.9 GB)"
  "$VENV/bin/python" -m pip install -q --upgrade pip setuptools wheel
  DS_BUILD_OPS=0 "$VENV/bin/python" -m pip install -q --no-deps -r "$LOCK"
  "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$ROOT"
  SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  rm -rf "$SITE/tests"
  "$VENV/bin/python" -c "from drmas.workers.openrlhf import cpu_compat; cpu_compat.apply()
import openrlhf.trainer.ray.ppo_actor, deepspeed, ray, torch, transformers, importlib.metadata as m
print('[setup-openrlhf] openrlhf', m.version('openrlhf'), 'deepspeed', deepspeed.__version__, 'ray', ray.__version__,
      'torch', torch.__version__, 'transformers', transformers.__version__)"
  echo "$WANT" > "$STAMP"
  echo "[setup-openrlhf] done"
fi
