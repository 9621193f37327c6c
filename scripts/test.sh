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
# promtool (Debian's prometheus package) checks the /metrics exposition; without it that test skips.
if ! command -v promtool >/dev/null && command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
  (apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1; }) \
    || echo "warning: could not install promtool; its test will be skipped" >&2
fi
# buildah and debootstrap only for the opt-in image test (TRANSERVE_IMAGE_TEST=1, see deploy/README.md).
if [[ ${TRANSERVE_IMAGE_TEST:-0} == 1 ]] && ! { command -v buildah && command -v debootstrap; } >/dev/null \
   && command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
  (apt-get install -y -q --no-install-recommends buildah debootstrap >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends buildah debootstrap >/dev/null 2>&1; }) \
    || echo "warning: could not install buildah/debootstrap; the image test will be skipped" >&2
fi
exec "$PY" -m pytest -q "$@"
