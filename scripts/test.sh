#!/usr/bin/env bash
# The test command: sets up the environment (idempotent), then runs the whole suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k advantages`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
# pytest exits 5 when it collected no tests; that is a failure here like any other non-zero code.
exec "$ROOT/.venv/bin/python" -m pytest "$@"
