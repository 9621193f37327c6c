#!/usr/bin/env bash
# A lent GPU's 15 minutes in two device calls (docs/gpu.md, "A session with a GPU"): issue 36's serving
# proof and the GPU benchmark first, then the training recipe continuing the default in the time left.
#
# One call cannot carry everything: onnxruntime-gpu (.gpu-wheels, 48.7 MB) and the committed packages (42 MB)
# are each most of the 64 MiB a call carries. So the first call carries onnxruntime-gpu and the serve wheels
# and installs them under /tmp; the second, on the same machine while it is still warm (30 s), carries the
# packages and the corpus and measures. The working tree travels in both, without models/: `pack` takes
# models/ out of git's index (ignored through .git/info/exclude, carried by name) and `restore` puts it back.
#
#   bash scripts/gpu-session.sh pack       # here: .whl (serve wheels), .gpu-data (corpus, xz); models/ untracked
#   device run, carry [.gpu-wheels, .whl]:             bash scripts/gpu-session.sh setup
#   device run at once, carry [models, .gpu-data]:     bash scripts/gpu-session.sh measure
#   (both run calls in one message, so the second starts as the first ends: a machine idle for 30 s is given back
#   bare, and a third call then finds neither onnxruntime-gpu nor the wheels; seen on 2026-11-28)
#   bash scripts/gpu-session.sh restore    # here: models/ tracked again
#
# `measure` runs each stage under its own limit inside BUDGET_S (default 540 s) and goes on when one fails;
# what it writes under $OUT, each file as its stage ends (so a call cut short brings back what was done):
# gpu-h200.md (benchmarks/gpu.py's report), serving-gpu.md (benchmarks/serving.py's tables), stages.log (every
# stage's output, appended as it runs, and the recipe's model card) and pieces/ (the recipe's checkpoint, JOIN.sh
# joins it): 7 files at most, as a device call brings back 8 (on 2026-12-04 per-stage logs made 12, and the
# four after the eighth, the checkpoint's pieces among them, stayed behind).
#
# The dry run on a CPU (tests/test_gpu_session.py): the same `measure` with DEVICE=cpu, tiny packages and a short
# budget; the CUDA-only stages fail there, and the script goes on past them as it would on a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-data/de-en-everyday}       # the corpus the default trains on (models/de-en/MODEL_CARD.md, docs/training.md)
# What `measure` measures and continues, and where (the dry run names tiny packages, the CPU and its temporary folder)
DEVICE=${DEVICE:-cuda}
PACKAGE=${PACKAGE:-models/de-en}
LM_PACKAGE=${LM_PACKAGE:-models/lm-small}
GPU_DATA=${GPU_DATA:-.gpu-data}         # pack's corpus: dev.tsv, test.tsv, meta.json, train.tsv.xz
WORK=${WORK:-/tmp}                      # measure's scratch: the fp16 and fp32 copies, the corpus, the recipe's run
SERVE_SECONDS=${SERVE_SECONDS:-4}       # benchmarks/serving.py's seconds a level
SERVE_CONCURRENCY=${SERVE_CONCURRENCY:-1,8,32,128}
AFTER_TRAINING_MINUTES=${AFTER_TRAINING_MINUTES:-1.5}   # the recipe's export, evaluations and pieces (37 s on the H200)
MIN_TRAINING_MINUTES=${MIN_TRAINING_MINUTES:-1}         # less time than this left for training: no recipe
RECIPE_MINUTES=${RECIPE_MINUTES:-}      # the recipe's budget at most (empty: all the time left, less 20 s)
RECIPE_OPTS=${RECIPE_OPTS:-}            # more model.recipe options (the dry run: --direction de-en --piece-mb 1)
TRAIN_OPTS=${TRAIN_OPTS:---max-tokens 25000 --eval-every 200 --eval-sentences 200 --save-every-minutes 2}
SITE=/tmp/site                          # the serve extra's wheels the machine lacks
ORT_SITE=/tmp/ort-gpu/site              # onnxruntime-gpu, unpacked by scripts/gpu-wheels.sh gpu
# What the device machine's image lacks of the gpu extra's lock (its python3 has torch, numpy, sentencepiece,
# prometheus-client, pyyaml, lxml, httpx, uvloop), at the versions deploy/docker/requirements-gpu.lock pins.
# fastapi 0.165 imports opentelemetry-api itself (its telemetry module); py3langid (4.6 MB, source=auto only) and
# OpenTelemetry's SDK and exporter (off unless OTEL_* is set) stay behind.
WHEELS="annotated-types fastapi fastapi-offline litserve pydantic pydantic-core typing-inspection python-multipart
  starlette uvicorn redis polib python-docx python-pptx xlsxwriter pyzmq python-dotenv httptools watchfiles
  websockets opentelemetry-api"

locked() {   # each of WHEELS as NAME==VERSION, the version the GPU lock pins (uvicorn[standard]==V as uvicorn==V)
  for name in $WHEELS; do
    grep -o "^$name\(\[[a-z,]*\]\)\?==[^ ]*" deploy/docker/requirements-gpu.lock | sed 's/\[[a-z,]*\]//' | grep . \
      || { echo "$name is not in the GPU lock" >&2; return 1; }
  done
}

pack() {
  [ -f .gpu-wheels/SHA256SUMS ] || bash scripts/gpu-wheels.sh prepare
  mkdir -p .whl
  local wheels
  wheels=$(locked) || exit
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d .whl $wheels || exit
  rm -rf .gpu-data && mkdir -p .gpu-data
  cp "$DATA"/dev.tsv "$DATA"/test.tsv "$DATA"/meta.json .gpu-data/
  xz -T0 -6 -c "$DATA"/train.tsv > .gpu-data/train.tsv.xz
  grep -qx '/models/' .git/info/exclude 2>/dev/null || echo '/models/' >> .git/info/exclude
  grep -qx '/.gpu-data/' .git/info/exclude || echo '/.gpu-data/' >> .git/info/exclude
  git rm -r -q --cached models
  du -cb $(git ls-files) | tail -1 | awk '{printf "tree without models/: %.1f MB\n", $1 / 1e6}'
  du -cb .gpu-wheels .whl | tail -1 | awk '{printf "first call carries: %.1f MB more\n", $1 / 1e6}'
  du -cb models .gpu-data | tail -1 | awk '{printf "second call carries: %.1f MB more\n", $1 / 1e6}'
}

restore() {
  git reset -q -- models
  sed -i '\#^/models/$#d' .git/info/exclude
  git status --short models
}

setup() {
  nvidia-smi -L
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    || exit
  bash scripts/gpu-wheels.sh gpu || exit
  PYTHONPATH=$ORT_SITE:$SITE python3 -c "import onnxruntime, litserve, fastapi, pydantic, service.server;
print('onnxruntime', onnxruntime.__version__, onnxruntime.get_available_providers());
print('litserve', litserve.__version__, 'pydantic', pydantic.__version__)"
}

measure() {
  local start budget log
  start=$(date +%s); budget=${BUDGET_S:-540}; log=$OUT/stages.log
  mkdir -p "$OUT/pieces"
  export PYTHONPATH=$ORT_SITE:$SITE PYTHONUNBUFFERED=1
  left() { echo $((budget - ($(date +%s) - start))); }
  stage() {   # stage NAME LIMIT_S command...: output in the log and on stdout, the status and time after it
    local name=$1 limit=$2 t0=$SECONDS
    shift 2
    ((limit <= $(left))) || limit=$(left)
    ((limit > 0)) || { echo "== $name: skipped, no time left"; return; }
    echo "== $name: limit ${limit} s, $(left) s left" | tee -a "$log"
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$log"
    echo "== $name: status ${PIPESTATUS[0]} after $((SECONDS - t0)) s" | tee -a "$log"
  }
  [ -d "$ORT_SITE" ] || echo "warning: $ORT_SITE is missing (a fresh machine, not the warm one setup ran on): no CUDA for onnxruntime"
  stage machine 20 sh -c 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc;
    python3 -c "import onnxruntime as o, torch; print(o.__version__, o.get_available_providers(), torch.__version__)"'
  stage gpu-bench 170 python3 benchmarks/gpu.py --package "$PACKAGE" --quick --device "$DEVICE" --out "$OUT/gpu-h200.md"
  local fp16=$WORK/de-en-fp16 fp32=$WORK/de-en-fp32 lm16=$WORK/lm-small-fp16
  stage copies 80 sh -c "python3 -m model.upgrade '$PACKAGE' --precision fp16 --out '$fp16' &&
    python3 -m model.upgrade '$LM_PACKAGE' --precision fp16 --out '$lm16' &&
    python3 -m model.upgrade '$PACKAGE' --precision fp32 --out '$fp32'"
  # Each attention operator alone, then the fp16 decoder step after step, on the CPU and on CUDA (2026-12-04: the
  # decoder's in-graph total length was what CUDA read wrongly; fed from the host it agrees).
  stage ops 60 python3 benchmarks/cuda_ops.py --decoder "$fp16/decoder.onnx"
  # Whole searches, CUDA against the CPU (wrong on 2026-11-28's H200 before the fix: benchmarks/results/gpu-h200.md).
  stage agreement 60 python3 benchmarks/cuda_agreement.py --package "$fp32" --package "$fp16"
  stage serving 130 python3 benchmarks/serving.py --model "$fp16" --model "$lm16" --layouts 1x0 \
    --server-arg=--device --server-arg="$DEVICE" --concurrency "$SERVE_CONCURRENCY" --rates 0.75 \
    --seconds "$SERVE_SECONDS" --warmup-seconds 1 --title "$DEVICE, fp16, one worker" --out "$OUT/serving-gpu.md"
  # The recipe: the default's run going on from its package on the GPU, in the time left (its --minutes count
  # from its own start; AFTER_TRAINING_MINUTES of them export, evaluate and cut the checkpoint into pieces: 37 s
  # and the pieces on the H200, 2026-11-28, where 2.5 left a minute unused).
  local minutes corpus=$WORK/data/corpus
  minutes=$(python3 -c "print(round(min(($(left) - 20) / 60, float('${RECIPE_MINUTES:-inf}')), 2))")
  mkdir -p "$corpus" && cp "$GPU_DATA"/dev.tsv "$GPU_DATA"/test.tsv "$GPU_DATA"/meta.json "$corpus"/ \
    && xz -dc "$GPU_DATA"/train.tsv.xz > "$corpus"/train.tsv
  if python3 -c "import sys; sys.exit(float('$minutes') < $AFTER_TRAINING_MINUTES + $MIN_TRAINING_MINUTES)"; then
    # shellcheck disable=SC2086
    stage recipe "$(($(left) - 5))" python3 -m model.recipe --data "$corpus" --out "$WORK/recipe" \
      --minutes "$minutes" --after-training-minutes "$AFTER_TRAINING_MINUTES" --bundle spot --piece-mb 16.5 \
      --pieces "$OUT/pieces" $RECIPE_OPTS -- --device "$DEVICE" --init-from "$PACKAGE" $TRAIN_OPTS
  else
    echo "== recipe: skipped, $minutes minutes left"
  fi
  cat "$WORK/recipe/MODEL_CARD.md" >> "$log" 2>/dev/null
  ls -la "$OUT" "$OUT/pieces"
}

case ${1:-} in
pack | restore | setup | measure) "$1" ;;
*) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
