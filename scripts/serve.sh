#!/usr/bin/env bash
# Sets up a serving-only virtual environment (no torch) and serves the embedded model packages.
# Extra arguments go to `python -m service` (e.g. --port 9000 --host 0.0.0.0).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-serve}
if [[ ! -x "$VENV/bin/python" ]]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
# The client extra too, so the README's SDK snippet runs in this environment (httpx; no torch).
"$VENV/bin/python" -m pip install -q -e ".[serve,client]"
# Both embedded packages: translation (POST /translate) and generation (POST /generate).
export TRANSERVE_MODELS=${TRANSERVE_MODELS:-${TRANSERVE_MODEL:-models/de-en,models/lm-small}}
exec "$VENV/bin/python" -m service "$@"
