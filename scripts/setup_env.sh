#!/usr/bin/env bash
# Idempotent set-up of the CPU environment: a .venv with the locked requirements and drmas installed
# in editable mode. Re-installs only when requirements/cpu.txt or pyproject.toml changed.
# Usage: source scripts/setup_env.sh   (or bash scripts/setup_env.sh)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DRMAS_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
source "$ROOT/scripts/venv_lib.sh"
ensure_venv "$VENV" "$PY" setup
STAMP="$VENV/.drmas-setup-stamp"
WANT="$(inputs_hash "$ROOT/requirements/cpu.txt" "$ROOT/pyproject.toml")"
if ! stamp_is "$STAMP" "$WANT"; then
  echo "[setup] installing locked requirements into $VENV (first run takes ~2 minutes)"
  "$VENV/bin/python" -m pip install -q --upgrade pip setuptools wheel
  "$VENV/bin/python" -m pip install -q -r "$ROOT/requirements/cpu.txt"
  "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$ROOT"
  echo "$WANT" > "$STAMP"
  echo "[setup] done"
fi
