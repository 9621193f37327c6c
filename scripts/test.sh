#!/usr/bin/env bash
# Sets up a virtual environment with everything the tests need (the CPU build of torch, so pip never pulls
# CUDA wheels) and runs the test suite; arguments go to pytest.
# pip runs only when the environment is new or when pyproject.toml or the install lines below changed (a
# stamp in the environment holds their hash): a second run needs no package index.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
install() {
  "$PY" -m pip install --progress-bar off --upgrade pip || return
  # torch from PyTorch's CPU index: PyPI's torch==2.13.0 is the CUDA build with gigabytes of nvidia-*
  # packages. PyPI stays an index (torch's dependencies; torch itself where the PyTorch index cannot be
  # reached, as on our CI machines, which have a local CPU wheel). Where both are found pip takes
  # 2.13.0+cpu: a local version sorts after the bare one. --retries 2 --timeout 15: an unreachable index
  # costs seconds per install instead of pip's 5 retries per page (measured in docs/training.md's Install).
  "$PY" -m pip install --progress-bar off torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
    --extra-index-url https://pypi.org/simple --retries 2 --timeout 15 || return
  "$PY" -m pip install --progress-bar off -e ".[dev]" || return
}
STAMP="$VENV/.transerve-install"
want=$({ sha256sum <pyproject.toml; declare -f install; } | sha256sum | cut -d' ' -f1)
if [[ ! -x $PY || $(cat "$STAMP" 2>/dev/null) != "$want" ]]; then
  [[ -x $PY ]] || python3 -m venv "$VENV"
  echo "test.sh: installing into $VENV (pip's output: $VENV/install.log)" >&2
  if ! install >"$VENV/install.log" 2>&1; then
    tail -n 30 "$VENV/install.log" >&2
    echo "test.sh: the install failed; pip's whole output is in $VENV/install.log" >&2
    exit 1
  fi
  if grep -q "Retrying.*/whl/cpu/" "$VENV/install.log"; then
    echo "test.sh: https://download.pytorch.org/whl/cpu could not be reached; torch came from the other indexes" >&2
  fi
  echo "test.sh: $("$PY" -c 'import torch; print("torch", torch.__version__)')" >&2
  echo "$want" >"$STAMP"
fi
# Debian packages for the tests that drive tools pip does not install, below: only as root, with apt-get, and
# not with TRANSERVE_APT=0. Without them those tests skip, each saying what it lacks.
can_apt() { [[ ${TRANSERVE_APT:-1} != 0 ]] && command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; }
# promtool (Debian's prometheus package) checks the /metrics exposition and the alert rules, and the prometheus
# server scrapes a served model in the dashboards' test; without them those tests skip.
if ! command -v promtool >/dev/null && can_apt; then
  (apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1; }) \
    || echo "warning: could not install promtool; its test will be skipped" >&2
fi
# redis-server (Debian's package) is the shared store of the keys' limits in tests/test_tenants.py, started
# there on 127.0.0.1 by the test itself; without it those tests skip.
if ! command -v redis-server >/dev/null && can_apt; then
  (apt-get install -y -q --no-install-recommends redis-server >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends redis-server >/dev/null 2>&1; }) \
    || echo "warning: could not install redis-server; the shared-limits tests will be skipped" >&2
fi
# jemalloc (Debian's libjemalloc2), the allocator CPU training runs under (docs/training.md): tests/test_jemalloc.py
# preloads it into a process of its own; without it that test skips.
if [[ ! -e /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 ]] && can_apt; then
  (apt-get install -y -q --no-install-recommends libjemalloc2 >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends libjemalloc2 >/dev/null 2>&1; }) \
    || echo "warning: could not install libjemalloc2; its test will be skipped" >&2
fi
# Debian's chromium and its chromedriver run the translate page in a headless browser (tests/test_ui.py,
# driven by selenium from the dev extra); without them, as without root, those tests skip and say why.
if ! { command -v chromium && command -v chromedriver; } >/dev/null && can_apt; then
  (apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null 2>&1; }) \
    || echo "warning: could not install chromium/chromium-driver; the browser tests will be skipped" >&2
fi
# The image test (tests/test_deploy.py) builds the CPU image with buildah on a debootstrapped Debian
# base and serves from it: minutes of downloads and disk, little CPU. With no arguments it runs in
# a second pytest beside the main one; TRANSERVE_IMAGE_TEST=0 skips it, =1 forces it into the main run.
IMAGE=${TRANSERVE_IMAGE_TEST:-auto}
if [[ $IMAGE != 0 ]] && ! { command -v buildah && command -v debootstrap; } >/dev/null && can_apt; then
  (apt-get install -y -q --no-install-recommends buildah debootstrap >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends buildah debootstrap >/dev/null 2>&1; }) \
    || echo "warning: could not install buildah/debootstrap; the image test will be skipped" >&2
fi
# The whole suite runs in two pytest processes (pytest-xdist), a test file each at a time: most of its wall time is
# servers starting, timers running out and clients waiting, so on 2 cores two files at once took 589 s where one
# took 956 (both beside a nice-19 training job). TRANSERVE_TEST_PROCESSES=0 runs it in one process; with
# arguments (some tests) it runs in one unless they say -n. A test process that dies (a native crash) fails the run
# at once, named in the summary: xdist's default restarts it and sends it the same file again, and once (CI,
# 2026-12-01, an abort from a heap corrupted by lm_batch.py's prompts' read) the run then hung with both idle.
PARALLEL=()
if [[ $# == 0 && ${TRANSERVE_TEST_PROCESSES:-2} != 0 ]]; then
  PARALLEL=(-n "${TRANSERVE_TEST_PROCESSES:-2}" --dist loadfile --max-worker-restart 0)
fi
if [[ $IMAGE == auto && $# == 0 ]]; then
  IMAGE_TEST=tests/test_deploy.py::test_cpu_image_builds_runs_and_translates
  IMAGE_LOG=$(mktemp)
  # The committed package is baked in, so this run trains nothing and leaves the CPU to the suite.
  TRANSERVE_IMAGE_TEST=1 TRANSERVE_TEST_PACKAGE=${TRANSERVE_TEST_PACKAGE:-models/de-en} \
    "$PY" -m pytest -q -p no:cacheprovider "$IMAGE_TEST" >"$IMAGE_LOG" 2>&1 &
  IMAGE_PID=$!
  rc=0
  TRANSERVE_IMAGE_TEST=0 "$PY" -m pytest -q "${PARALLEL[@]}" || rc=$?
  image_rc=0
  wait "$IMAGE_PID" || image_rc=$?
  echo "--- $IMAGE_TEST (run beside the suite) ---"
  cat "$IMAGE_LOG"
  rm -f "$IMAGE_LOG"
  # pytest's 5 (nothing collected) never happens here; a skip (tools missing, not root) is rc 0.
  exit $(( rc != 0 ? rc : image_rc ))
fi
[[ $IMAGE == auto ]] && export TRANSERVE_IMAGE_TEST=1
exec "$PY" -m pytest -q "${PARALLEL[@]}" "$@"
