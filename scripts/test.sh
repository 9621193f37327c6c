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
# The image test (tests/test_deploy.py) builds the CPU image with buildah on a debootstrapped Debian
# base and serves from it: minutes of downloads and disk, little CPU. With no arguments it runs in
# a second pytest beside the main one; TRANSERVE_IMAGE_TEST=0 skips it, =1 forces it into the main run.
IMAGE=${TRANSERVE_IMAGE_TEST:-auto}
if [[ $IMAGE != 0 ]] && ! { command -v buildah && command -v debootstrap; } >/dev/null \
   && command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
  (apt-get install -y -q --no-install-recommends buildah debootstrap >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends buildah debootstrap >/dev/null 2>&1; }) \
    || echo "warning: could not install buildah/debootstrap; the image test will be skipped" >&2
fi
if [[ $IMAGE == auto && $# == 0 ]]; then
  IMAGE_TEST=tests/test_deploy.py::test_cpu_image_builds_runs_and_translates
  IMAGE_LOG=$(mktemp)
  # The committed package is baked in, so this run trains nothing and leaves the CPU to the suite.
  TRANSERVE_IMAGE_TEST=1 TRANSERVE_TEST_PACKAGE=${TRANSERVE_TEST_PACKAGE:-models/de-en} \
    "$PY" -m pytest -q -p no:cacheprovider "$IMAGE_TEST" >"$IMAGE_LOG" 2>&1 &
  IMAGE_PID=$!
  rc=0
  TRANSERVE_IMAGE_TEST=0 "$PY" -m pytest -q || rc=$?
  image_rc=0
  wait "$IMAGE_PID" || image_rc=$?
  echo "--- $IMAGE_TEST (run beside the suite) ---"
  cat "$IMAGE_LOG"
  rm -f "$IMAGE_LOG"
  # pytest's 5 (nothing collected) never happens here; a skip (tools missing, not root) is rc 0.
  exit $(( rc != 0 ? rc : image_rc ))
fi
[[ $IMAGE == auto ]] && export TRANSERVE_IMAGE_TEST=1
exec "$PY" -m pytest -q "$@"
