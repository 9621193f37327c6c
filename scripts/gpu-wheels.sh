#!/usr/bin/env bash
# Gets the locked onnxruntime-gpu onto a GPU spot machine that has no package index and carries in at most
# 64 MiB a job. The 255 MB wheel cannot travel as is: its CUDA provider (284 MB unpacked) is mostly
# kernels for six GPU architectures, each kernel a zstd level-19 frame. `prepare` keeps the Python module
# and the provider, keeps the kernels of the target architectures only (sm_90: H100 and H200) as raw
# cubins, which compress together far better than one frame at a time, and writes one archive into
# .gpu-wheels/ (git-ignored). `gpu` runs on the machine: it redoes the level-19 frames with the same
# libzstd (1.5.7, in the carried zstandard wheel), which gives back NVIDIA's bytes, checks the rebuilt
# provider's sha256, and proves CUDAExecutionProvider loads and computes. Every job that wants it runs
# `gpu` first, since a machine can come back bare between jobs (2 min on 2 cores, less on 16).
#
#   bash scripts/gpu-wheels.sh prepare   # here: download, strip, compress into .gpu-wheels/
#   bash scripts/gpu-wheels.sh gpu       # on the GPU machine, carrying .gpu-wheels; then, in the same job:
#   PYTHONPATH=/tmp/ort-gpu/site python3 ...   # imports onnxruntime-gpu ahead of the preinstalled CPU one
#   bash scripts/gpu-wheels.sh record    # rewrites deploy/docker/onnxruntime-gpu-needs.yaml from the wheel
#
# ARCHS (default 90) lists the SASS architectures kept: kernels of the others are zeroed, so the provider
# only runs on those GPUs. ARCHS=all keeps the wheel's exact provider, but does not fit one carry.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.gpu-wheels
WORK=${GPU_WHEELS_WORK:-/tmp/transerve-gpu-wheels}
DEST=${ORT_GPU_DIR:-/tmp/ort-gpu}
ARCHS=${ARCHS:-90}
# The machine's Python, the one with PyTorch and its nvidia-* packages.
PYTHON=${PYTHON:-python3}
PY_TAG=cp312
CARRY_LIMIT=$((64 * 1024 * 1024))
# zstandard 0.25.0 bundles libzstd 1.5.7, the version whose level 19 reproduces the provider's frames.
# Its x86_64 Linux wheels for CPython 3.10 to 3.14: the tool venv here may be another Python than cp312.
ZSTD_REQ="zstandard==0.25.0 \
  --hash=sha256:4b6d83057e713ff235a12e73916b6d356e3084fd3d14ced499d84240f3eecee0 \
  --hash=sha256:9300d02ea7c6506f00e627e287e0492a5eb0371ec1670ae852fefffa6164b072 \
  --hash=sha256:5a56ba0db2d244117ed744dfa8f6f5b366e14148e00de44723413b2f3938a902 \
  --hash=sha256:8e735494da3db08694d26480f1493ad2cf86e99bdd53e8e9771b2752a5c0246a \
  --hash=sha256:e09bb6252b6476d8d56100e8147b803befa9a12cea144bbe629dd508800d1ad0"

ort_version() {
  sed -n 's/^onnxruntime-gpu==\([^ ]*\) .*/\1/p' deploy/docker/requirements-gpu.lock
}

# The wheel, fetched by pip with the lock's hashes, so what is stripped is what the image installs.
fetch_wheel() {
  local version
  version=$(ort_version)
  mkdir -p "$WORK/dl"
  python3 -m venv "$WORK/venv" >/dev/null 2>&1 || true
  "$WORK/venv/bin/pip" install --quiet --require-hashes -r <(echo "$ZSTD_REQ")
  awk -v v="onnxruntime-gpu==$version" '$1 == v {p = 1} p {print} p && !/\\$/ {exit}' \
    deploy/docker/requirements-gpu.lock > "$WORK/ort.req"
  "$WORK/venv/bin/pip" download --quiet --no-deps --only-binary=:all: --require-hashes --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 -d "$WORK/dl" -r "$WORK/ort.req"
  WHEEL=$(ls "$WORK"/dl/onnxruntime_gpu-"$version"-"$PY_TAG"-"$PY_TAG"-manylinux_*_x86_64.whl)
}

case ${1:-} in
prepare)
  fetch_wheel
  rm -rf "$OUT" "$WORK/pack" && mkdir -p "$OUT" "$WORK/pack"
  "$WORK/venv/bin/pip" download --quiet --no-deps --only-binary=:all: --require-hashes --python-version 3.12 \
    --implementation cp --platform manylinux_2_17_x86_64 -d "$OUT" -r <(echo "$ZSTD_REQ")
  "$WORK/venv/bin/python" - "$WHEEL" "$WORK/pack" "$ARCHS" <<'PY'
"""Unpacks what the Python module needs, splits the CUDA provider into a skeleton and raw cubins,
and proves here that level 19 rebuilds the kept frames byte for byte."""
import concurrent.futures as cf
import hashlib
import json
import multiprocessing
import os
import struct
import sys
import zipfile

import zstandard

wheel, pack, archs = sys.argv[1], sys.argv[2], sys.argv[3]
PROVIDER = "onnxruntime/capi/libonnxruntime_providers_cuda.so"
# Neither is loaded by the Python module: the C API library and the TensorRT provider.
SKIP = ("onnxruntime/capi/libonnxruntime.so.", "onnxruntime/capi/libonnxruntime_providers_tensorrt.so")


def fatbin_entries(elf: bytes):
    """(offset, payload size, arch) of every kernel image in .nv_fatbin (container layout as cuobjdump
    reads it: 16-byte blob headers, then entries whose header holds kind, sizes and SM version)."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx][4]
    section = next(h for h in headers if elf[names + h[0]:elf.index(b"\0", names + h[0])] == b".nv_fatbin")
    pos, end = section[4], section[4] + section[5]
    while pos < end:
        magic, _, header_size, size = struct.unpack_from("<IHHQ", elf, pos)
        if magic != 0xBA55ED50:
            pos += 8
            continue
        entry, blob_end = pos + header_size, pos + header_size + size
        while entry < blob_end:
            _, _, entry_header, padded = struct.unpack_from("<HHIQ", elf, entry)
            payload, = struct.unpack_from("<I", elf, entry + 16)
            arch, = struct.unpack_from("<I", elf, entry + 28)
            yield entry + entry_header, payload, padded, arch
            entry += entry_header + padded
        pos = blob_end


def frame(raw: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=19, write_checksum=False, write_content_size=True).compress(raw)


site = os.path.join(pack, "site")
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name != PROVIDER and not name.startswith(SKIP):
            z.extract(name, site)
    elf = bytearray(z.read(PROVIDER))
original = hashlib.sha256(elf).hexdigest()
keep = None if archs == "all" else {int(a) for a in archs.split(",")}
kept, raws, sizes = [], [], {}
decompress = zstandard.ZstdDecompressor().decompress
for offset, payload, padded, arch in list(fatbin_entries(elf)):
    sizes[arch] = sizes.get(arch, 0) + padded
    if keep is None or arch in keep:
        raw = decompress(bytes(elf[offset:offset + payload]))
        kept.append((offset, payload, bytes(elf[offset:offset + payload])))
        raws.append(raw)
    elf[offset:offset + padded] = bytes(padded)
skeleton = bytes(elf)
for (offset, payload, frame_bytes) in kept:
    elf[offset:offset + payload] = frame_bytes
with cf.ProcessPoolExecutor(mp_context=multiprocessing.get_context("fork")) as pool:
    rebuilt = list(pool.map(frame, raws, chunksize=8))
bad = sum(r != k[2] for r, k in zip(rebuilt, kept))
if bad:
    sys.exit(f"{bad} of {len(kept)} kernel frames differ at level 19: zstandard's libzstd is not the one NVIDIA used")
with open(os.path.join(pack, "skeleton.so"), "wb") as f:
    f.write(skeleton)
with open(os.path.join(pack, "cubins.bin"), "wb") as f:
    for raw in raws:
        f.write(raw)
manifest = {
    "wheel": os.path.basename(wheel),
    "archs": archs,
    "provider_sha256": hashlib.sha256(elf).hexdigest(),
    "wheel_provider_sha256": original,
    "entries": [[offset, payload, len(raw)] for (offset, payload, _), raw in zip(kept, raws)],
}
with open(os.path.join(pack, "manifest.json"), "w") as f:
    json.dump(manifest, f)
print("kernels by SASS arch (MB, as zstd frames):", {a: round(s / 1e6, 1) for a, s in sorted(sizes.items())})
print(f"kept {len(kept)} frames ({sum(p for _, p, _ in kept) / 1e6:.1f} MB), "
      f"raw {sum(map(len, raws)) / 1e6:.1f} MB, all rebuilt byte for byte at level 19")
PY
  version=$(ort_version)
  archive="$OUT/onnxruntime-gpu-$version-$PY_TAG-sm${ARCHS//,/_}.tar.zst"
  # --long=31: the cubins of one kernel family repeat across files far apart in the stream.
  tar -C "$WORK/pack" -cf - manifest.json skeleton.so cubins.bin site | zstd -q -19 --long=31 -T0 -o "$archive"
  (cd "$OUT" && sha256sum -- * > SHA256SUMS)
  ls -l "$OUT"
  total=$(du -cb "$OUT"/* | tail -1 | cut -f1)
  echo "$OUT: $total bytes (one job carries $CARRY_LIMIT)"
  if ((total > CARRY_LIMIT)); then
    echo "too big for one carry: keep fewer ARCHS" >&2
    exit 1
  fi
  ;;
gpu)
  [ -f "$OUT/SHA256SUMS" ] || { echo "no $OUT/: run prepare here and carry $OUT" >&2; exit 1; }
  (cd "$OUT" && sha256sum --quiet -c SHA256SUMS)
  "$PYTHON" - "$OUT" "$DEST" <<'PY'
"""Unpacks the archive, rebuilds the provider's kernel frames and links the CUDA libraries that
PyTorch's nvidia-* packages installed where onnxruntime.preload_dlls() looks for them."""
import concurrent.futures as cf
import glob
import hashlib
import importlib.util
import json
import multiprocessing
import os
import shutil
import sys
import tarfile
import zipfile

src, dest = sys.argv[1], sys.argv[2]
tag = "cp%d%d" % sys.version_info[:2]
archive, = glob.glob(os.path.join(src, "onnxruntime-gpu-*.tar.zst"))
if f"-{tag}-" not in archive:
    sys.exit(f"{archive} is for another Python than this {tag}")
done = os.path.join(dest, "site", ".verified")
stamp = hashlib.sha256(open(archive, "rb").read()).hexdigest()
if os.path.exists(done) and open(done).read() == stamp:
    print(f"{dest}/site already holds {os.path.basename(archive)}")
    sys.exit(0)
shutil.rmtree(dest, ignore_errors=True)
tools = os.path.join(dest, "tools")
with zipfile.ZipFile(glob.glob(os.path.join(src, f"zstandard-*-{tag}-*.whl"))[0]) as z:
    z.extractall(tools)
sys.path.insert(0, tools)
import zstandard  # noqa: E402

build = os.path.join(dest, "build")
with open(archive, "rb") as f, zstandard.ZstdDecompressor(max_window_size=2**31).stream_reader(f) as r:
    with tarfile.open(fileobj=r, mode="r|") as t:
        t.extractall(build, filter="data")
manifest = json.load(open(os.path.join(build, "manifest.json")))
elf = bytearray(open(os.path.join(build, "skeleton.so"), "rb").read())
raws, pos = [], 0
with open(os.path.join(build, "cubins.bin"), "rb") as f:
    cubins = f.read()
for _, _, size in manifest["entries"]:
    raws.append(cubins[pos:pos + size])
    pos += size


def frame(raw: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=19, write_checksum=False, write_content_size=True).compress(raw)


with cf.ProcessPoolExecutor(mp_context=multiprocessing.get_context("fork")) as pool:
    for (offset, payload, _), data in zip(manifest["entries"], pool.map(frame, raws, chunksize=8)):
        assert len(data) == payload, "a rebuilt frame has another size: not libzstd 1.5.7"
        elf[offset:offset + payload] = data
if hashlib.sha256(elf).hexdigest() != manifest["provider_sha256"]:
    sys.exit("the rebuilt CUDA provider differs from the one prepared: not libzstd 1.5.7")
site = os.path.join(dest, "site")
os.rename(os.path.join(build, "site"), site)
with open(os.path.join(site, "onnxruntime", "capi", "libonnxruntime_providers_cuda.so"), "wb") as f:
    f.write(elf)
shutil.rmtree(build)
# preload_dlls() looks in <site>/nvidia/{cu13,cudnn}/lib: point that at PyTorch's.
spec = importlib.util.find_spec("nvidia")
if spec and spec.submodule_search_locations:
    os.symlink(list(spec.submodule_search_locations)[0], os.path.join(site, "nvidia"))
else:
    print("warning: no nvidia-* packages here; the CUDA libraries must be on LD_LIBRARY_PATH", file=sys.stderr)
print(f"onnxruntime-gpu in {site} (kernels for sm_{manifest['archs']})")
with open(done + ".pending", "w") as f:
    f.write(stamp)
PY
  PYTHONPATH="$DEST/site" "$PYTHON" - "$DEST" <<'PY'
"""CUDAExecutionProvider must be the session's first provider and compute what the CPU computes, on
kernels from the rebuilt provider (MatMul goes to cuBLAS; Add and Softmax are onnxruntime's own)."""
import os
import struct
import sys

import numpy as np
import onnxruntime as ort

dest = sys.argv[1]
assert ort.__file__.startswith(dest), f"imported {ort.__file__}, not the unpacked onnxruntime-gpu"
ort.preload_dlls()


def field(number: int, payload) -> bytes:
    """One protobuf field: varint for ints, length-delimited for bytes (no onnx package needed)."""
    def varint(n: int) -> bytes:
        out = b""
        while True:
            out += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
            n >>= 7
            if not n:
                return out
    if isinstance(payload, int):
        return varint(number << 3) + varint(payload)
    payload = payload.encode() if isinstance(payload, str) else payload
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def value(name: str, *dims) -> bytes:
    shape = b"".join(field(1, field(1, d)) for d in dims)
    return field(1, name) + field(2, field(1, field(1, 1) + field(2, shape)))


rng = np.random.default_rng(0)
w = rng.standard_normal((64, 32), dtype=np.float32)
b = rng.standard_normal(32, dtype=np.float32)
graph = (field(1, field(1, "x") + field(1, "w") + field(2, "xw") + field(4, "MatMul"))
         + field(1, field(1, "xw") + field(1, "b") + field(2, "z") + field(4, "Add"))
         + field(1, field(1, "z") + field(2, "y") + field(4, "Softmax"))
         + field(2, "check")
         + field(5, b"".join(field(1, d) for d in w.shape) + field(2, 1) + field(8, "w") + field(9, w.tobytes()))
         + field(5, field(1, 32) + field(2, 1) + field(8, "b") + field(9, b.tobytes()))
         + field(11, value("x", 8, 64)) + field(12, value("y", 8, 32)))
model = field(1, 8) + field(7, graph) + field(8, field(2, 17))
x = rng.standard_normal((8, 64), dtype=np.float32)
gpu = ort.InferenceSession(model, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
print("onnxruntime", ort.__version__, "session providers:", gpu.get_providers())
assert gpu.get_providers()[0] == "CUDAExecutionProvider", "CUDAExecutionProvider did not load"
cpu = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
diff = float(np.abs(gpu.run(None, {"x": x})[0] - cpu.run(None, {"x": x})[0]).max())
print(f"CUDA against CPU: max abs difference {diff:.2e}")
# TF32, the CUDA provider's default for fp32 MatMul on Ampere and newer, rounds the inputs to 10 mantissa bits:
# 1.66e-3 on an H200 (2026-11-28). A wrong kernel is off by far more on outputs of at most 1.
assert diff < 1e-2, diff
libs = sorted({line.split()[-1] for line in open("/proc/self/maps")
               if any(k in line for k in ("libcudart", "libcublas", "libcudnn.so", "libcurand", "providers_cuda"))})
print("loaded:", *libs, sep="\n  ")
pending = os.path.join(dest, "site", ".verified.pending")
if os.path.exists(pending):
    os.rename(pending, pending.removesuffix(".pending"))
PY
  echo "ok: PYTHONPATH=$DEST/site python3 ... imports onnxruntime-gpu with CUDA"
  ;;
record)
  fetch_wheel
  rm -rf "$WORK/record" && mkdir -p "$WORK/record"
  unzip -q -o "$WHEEL" -d "$WORK/record" 'onnxruntime/capi/libonnxruntime_providers_cuda.so' \
    'onnxruntime/capi/build_and_package_info.py' '*.dist-info/METADATA'
  version=$(ort_version)
  out=deploy/docker/onnxruntime-gpu-needs.yaml
  {
    echo "# What onnxruntime-gpu's CUDA provider needs from the GPU image, read from the wheel the GPU lock"
    echo "# pins, so tests/test_gpu_image.py can hold the GPU lock's nvidia-* wheels to it without a 255 MB download."
    echo "# Rewritten by: bash scripts/gpu-wheels.sh record"
    echo "package: onnxruntime-gpu"
    echo "version: \"$version\""
    echo "wheel: $(basename "$WHEEL")"
    echo "sha256: $(sha256sum "$WHEEL" | cut -d' ' -f1)"
    echo "# cuda_version in onnxruntime/capi/build_and_package_info.py: the toolkit it was built with."
    built=$(sed -n "s/^cuda_version = '\(.*\)'/\1/p" "$WORK/record/onnxruntime/capi/build_and_package_info.py")
    echo "build_cuda: \"$built\""
    echo "# readelf -d capi/libonnxruntime_providers_cuda.so: linked, so they must be found when it loads."
    echo "needed:"
    readelf -d "$WORK/record/onnxruntime/capi/libonnxruntime_providers_cuda.so" \
      | sed -n 's/.*(NEEDED).*\[\(lib\(cu\|nv\)[^]]*\)\]/  - \1/p'
    echo "# Requires-Dist of its cuda and cudnn extras: cuDNN, cuFFT and NVRTC are opened at run time."
    echo "extras:"
    awk -F'; extra == ' '/^Requires-Dist: .*; extra == "cud(a|nn)"$/ {
      gsub(/"/, "", $2); sub(/^Requires-Dist: /, "", $1)
      if ($2 != last) print "  " $2 ":"; last = $2; print "    - \"" $1 "\""
    }' "$WORK"/record/*.dist-info/METADATA
  } > "$out"
  echo "wrote $out"
  ;;
*)
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
  ;;
esac
