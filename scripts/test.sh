#!/usr/bin/env bash
# Sets up a virtual environment with everything the tests need (CPU torch pinned, so pip never pulls
# CUDA wheels) and runs the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
if [[ ! -x "$VENV/bin/python" ]]; then
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q torch==2.13.0
"$PY" -m pip install -q -e ".[dev]"
exec "$PY" -m pytest -q "$@"
