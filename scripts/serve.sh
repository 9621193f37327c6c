#!/usr/bin/env bash
# Sets up a serving-only virtual environment (no torch) and serves the embedded model packages.
# Extra arguments go to `python -m service` (e.g. --port 9000 --host 0.0.0.0).
# pip runs only when the environment is new or when pyproject.toml or the install lines below changed (a
# stamp in the environment holds their hash): a second start needs no package index.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-serve}
PY="$VENV/bin/python"
install() {
  "$PY" -m pip install --progress-bar off --upgrade pip || return
  # The client extra too, so the README's SDK snippet runs in this environment (httpx; no torch); files, so
  # `transerve translate` reads every format here (polib).
  "$PY" -m pip install --progress-bar off -e ".[serve,client,files]" || return
}
STAMP="$VENV/.transerve-install"
want=$({ sha256sum <pyproject.toml; declare -f install; } | sha256sum | cut -d' ' -f1)
if [[ ! -x $PY || $(cat "$STAMP" 2>/dev/null) != "$want" ]]; then
  [[ -x $PY ]] || python3 -m venv "$VENV"
  echo "serve.sh: installing into $VENV (pip's output: $VENV/install.log)" >&2
  if ! install >"$VENV/install.log" 2>&1; then
    tail -n 30 "$VENV/install.log" >&2
    echo "serve.sh: the install failed; pip's whole output is in $VENV/install.log" >&2
    exit 1
  fi
  echo "$want" >"$STAMP"
fi
# Both embedded packages: translation (POST /translate) and generation (POST /generate).
export TRANSERVE_MODELS=${TRANSERVE_MODELS:-${TRANSERVE_MODEL:-models/de-en,models/lm-small}}
exec "$PY" -m service "$@"
