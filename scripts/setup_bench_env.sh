#!/usr/bin/env bash
# The environment of benchmarks/bench_vs_trl.py: .venv-bench with TRL (the `bench` extra of pyproject.toml)
# on top of the main .venv's packages, so both trainers run on the very same torch (==2.13.0, the CPU
# wheel) and transformers. The main job and CI never use it. Needs the main .venv (scripts/setup_env.sh).
# Usage: bash scripts/setup_bench_env.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MAIN="${DRMAS_VENV:-$ROOT/.venv}"
BENCH="${DRMAS_BENCH_VENV:-$ROOT/.venv-bench}"
[ -x "$MAIN/bin/python" ] || { echo "[bench-setup] no $MAIN: run scripts/setup_env.sh first" >&2; exit 1; }
source "$ROOT/scripts/venv_lib.sh"
ensure_venv "$BENCH" "$MAIN/bin/python" bench-setup
# the main environment's site-packages behind the bench environment's own: site.addsitedir also runs that
# directory's own .pth files, among them the editable install's, so `import drmas` works in .venv-bench too
"$MAIN/bin/python" -c "import site; print(f'import site; site.addsitedir({site.getsitepackages()[0]!r})')" \
  > "$("$BENCH/bin/python" -c "import site; print(site.getsitepackages()[0])")/drmas_main_venv.pth"
# TRL and what it needs beyond the main environment; torch and transformers are found there and kept
"$BENCH/bin/python" -m pip install -q "trl==1.16.0" "torch==2.13.0"
"$BENCH/bin/python" -c "import torch, transformers, trl; print('[bench-setup] torch', torch.__version__, \
'transformers', transformers.__version__, 'trl', trl.__version__)"
