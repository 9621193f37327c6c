#!/usr/bin/env bash
# Regenerates the image's hash-pinned dependency locks, deploy/docker/requirements-{serve,gpu}.lock,
# for the oldest Python and glibc an image is built on: Debian bookworm's CPython 3.11.2 and glibc 2.36, the
# image test's base (the shipped image, Ubuntu 24.04, has CPython 3.12 and glibc 2.39, so what installs on the
# older installs there too; redis needs async-timeout below CPython 3.11.3). Versions follow the test venv
# (.venv, made by scripts/test.sh) where it has the package, so the image runs what the tests ran.
#
#   bash scripts/lock.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
python3 -m venv "$tools/venv"
"$tools/venv/bin/pip" install --quiet uv 2>/dev/null
constraints=()
if [ -x .venv/bin/pip ]; then
  # onnxruntime comes from pyproject.toml's pin alone: a venv made before the pin moved must not win, or
  # the CPU lock would drift from the GPU lock (onnxruntime-gpu has no such venv to follow).
  .venv/bin/pip freeze --exclude-editable | grep -v '@ file' | grep -viE '^onnxruntime(-gpu)?==' \
    > "$tools/tested.txt"
  constraints=(-c "$tools/tested.txt")
  pinned=$(grep -oE '"onnxruntime==[^"]+"' pyproject.toml | tr -d '"')
  tested=$(.venv/bin/pip freeze | grep -iE '^onnxruntime==' || true)
  if [ "$pinned" != "$tested" ]; then
    echo "warning: .venv runs ${tested:-no onnxruntime}, the images $pinned: pip install $pinned" >&2
  fi
fi
for extra in serve gpu; do
  out=deploy/docker/requirements-$extra.lock
  {
    echo "# The serving image's dependencies (extra \"$extra\"), pinned with hashes; pip installs them"
    echo "# with --require-hashes. Regenerate with: bash scripts/lock.sh"
    "$tools/venv/bin/uv" pip compile pyproject.toml --extra "$extra" --generate-hashes --no-header --no-annotate \
      --python-version 3.11.2 --python-platform x86_64-manylinux_2_36 --index-url https://pypi.org/simple \
      --quiet "${constraints[@]}"
  } > "$out"
  # litserve asks for uvicorn[standard]: pip 23.0 (Debian bookworm's, the image test's) in --require-hashes mode
  # takes a pin of the bare name as no pin of the extra once a newer uvicorn is published ("all requirements must
  # have their versions pinned"), so the extra is pinned by name.
  sed -i 's/^uvicorn==/uvicorn[standard]==/' "$out"
  echo "wrote $out ($(grep -c '==' "$out") packages)"
done
