"""The GPU image's parts agree: the CUDA and cuDNN the GPU lock installs (nvidia-* wheels, named by the locked
onnxruntime-gpu's own cuda and cudnn extras) are the ones its CUDA provider needs (else onnxruntime prints
"Require cuDNN 9.* and CUDA 13.*" and runs on the CPU), the image needs no CUDA base, and the CPU image runs
the same onnxruntime version and the same other dependencies, so what CI tests is what the GPU nodes run.

What the provider needs comes from deploy/docker/onnxruntime-gpu-needs.yaml, written from the wheel by
`bash scripts/gpu-wheels.sh record`: it names the wheel's sha256, so moving the lock without
rewriting it fails here. Which nvidia-* wheel ships which library is PROVIDES below; tests read both from
PyPI (the wheels' METADATA, build info and RECORD, a few HTTP range requests, never the gigabytes) and skip,
saying why, where PyPI cannot be reached.
"""

from __future__ import annotations

import json
import re
import tomllib
import urllib.error
import urllib.request
import zipfile

import pytest
import yaml
from packaging.requirements import Requirement

from conftest import ROOT

DOCKER = ROOT / "deploy" / "docker"
NEEDS = DOCKER / "onnxruntime-gpu-needs.yaml"
# A CUDA base image tag: the GPU image needs none (its CUDA and cuDNN are wheels in the venv).
CUDA_BASE = re.compile(r"nvidia/cuda:\d+\.\d+")
# The host's driver, mounted by the NVIDIA container toolkit at run time: never in the image.
DRIVER = "libcuda.so.1"
# Where each library the CUDA provider loads comes from: (locked nvidia-* package, its folder in
# site-packages). onnxruntime.preload_dlls() opens nvidia/cu13/lib/* and nvidia/cudnn/lib/* (CUDA 13
# wheels share one folder); the engine calls it before the first session. The soname's major is the
# package's major. Read from the wheels' RECORD (test_pypi_wheels_ship_the_libraries checks it) and
# from the built image (deploy/README.md, "GPU image").
PROVIDES = {
    "libcudart.so.13": ("nvidia-cuda-runtime", "nvidia/cu13/lib"),
    "libcublas.so.13": ("nvidia-cublas", "nvidia/cu13/lib"),
    "libcublasLt.so.13": ("nvidia-cublas", "nvidia/cu13/lib"),
    "libcurand.so.10": ("nvidia-curand", "nvidia/cu13/lib"),
    "libcufft.so.12": ("nvidia-cufft", "nvidia/cu13/lib"),
    "libnvrtc.so.13": ("nvidia-cuda-nvrtc", "nvidia/cu13/lib"),
    "libcudnn.so.9": ("nvidia-cudnn-cu13", "nvidia/cudnn/lib"),
}


def read(path) -> str:
    return path.read_text(encoding="utf-8")


def pins(lock: str) -> dict[str, str]:
    return {n.lower(): v for n, v in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) \\$", lock, flags=re.M)}


def lock_hashes(lock: str, name: str) -> set[str]:
    block = re.search(rf"^{re.escape(name)}==\S+ \\\n((?:    --hash=sha256:\w+(?: \\)?\n?)+)", lock, flags=re.M)
    assert block, f"{name} is not in the lock"
    return set(re.findall(r"sha256:(\w+)", block.group(1)))


@pytest.fixture(scope="module")
def needs() -> dict:
    return yaml.safe_load(read(NEEDS))


def major(version: str) -> int:
    return int(version.split(".")[0])


def check_record(needs: dict, gpu_lock: str) -> None:
    version = pins(gpu_lock)["onnxruntime-gpu"]
    assert needs["version"] == version and needs["sha256"] in lock_hashes(gpu_lock, "onnxruntime-gpu"), (
        f"{NEEDS.name} is of onnxruntime-gpu {needs['version']}, the lock pins {version}: "
        "run bash scripts/gpu-wheels.sh record")
    # The image's Python (Ubuntu 24.04: CPython 3.12) on x86_64 installs this very wheel.
    assert re.fullmatch(rf"onnxruntime_gpu-{re.escape(version)}-cp312-cp312-manylinux_\d+_\d+_x86_64\.whl",
                        needs["wheel"]), needs["wheel"]


def check_gpu_libraries(needs: dict, gpu_lock: str) -> None:
    """The GPU lock pins every package of the provider's cuda and cudnn extras at a version their
    specifiers accept, and those packages ship every library the provider links (but the driver) and
    cuDNN, at the major it was linked against."""
    locked = pins(gpu_lock)
    for req in (Requirement(r) for extra in ("cuda", "cudnn") for r in needs["extras"][extra]):
        assert req.name in locked, f"the GPU lock has no {req.name} ({req}): onnxruntime-gpu[cuda,cudnn] in " \
                                   "pyproject.toml's gpu extra, then bash scripts/lock.sh"
        assert req.specifier.contains(locked[req.name]), f"the GPU lock pins {req.name}=={locked[req.name]}, " \
                                                         f"the provider needs {req}"
    runtime = tuple(int(x) for x in locked["nvidia-cuda-runtime"].split(".")[:2])
    built = tuple(int(x) for x in needs["build_cuda"].split("."))
    assert runtime >= built, f"the provider was built with CUDA {built}, the lock has the runtime {runtime}"
    # cuDNN is opened at run time, not linked: its major is the one its extra names (~=9.0).
    (cudnn,) = Requirement(needs["extras"]["cudnn"][0]).specifier
    wanted = [n for n in needs["needed"] if n != DRIVER] + [f"libcudnn.so.{major(cudnn.version)}"]
    for soname in wanted:
        assert soname in PROVIDES, f"no locked package known to ship {soname}"
        package, _ = PROVIDES[soname]
        assert package in locked, f"{soname} comes from {package}, which the GPU lock does not pin"
        assert major(locked[package]) == int(soname.rsplit(".", 1)[1]), \
            f"the provider needs {soname}, the lock's {package}=={locked[package]} ships another major"


def test_cpu_and_gpu_images_run_the_same_onnxruntime():
    cpu = pins(read(DOCKER / "requirements-serve.lock"))["onnxruntime"]
    gpu = pins(read(DOCKER / "requirements-gpu.lock"))["onnxruntime-gpu"]
    assert cpu == gpu, f"CPU image onnxruntime {cpu}, GPU image onnxruntime-gpu {gpu}: pin both to one version"
    extras = tomllib.loads(read(ROOT / "pyproject.toml"))["project"]["optional-dependencies"]
    assert f"onnxruntime=={cpu}" in extras["serve"] and f"onnxruntime-gpu[cuda,cudnn]=={gpu}" in extras["gpu"], \
        "pyproject.toml's pins and the locks disagree: run bash scripts/lock.sh"


def test_the_locks_differ_only_in_onnxruntime_and_the_cuda_libraries():
    cpu = pins(read(DOCKER / "requirements-serve.lock"))
    gpu = pins(read(DOCKER / "requirements-gpu.lock"))
    cpu.pop("onnxruntime")
    gpu.pop("onnxruntime-gpu")
    assert cpu == {n: v for n, v in gpu.items() if not n.startswith("nvidia-")}


def test_the_record_is_of_the_locked_wheel(needs):
    check_record(needs, read(DOCKER / "requirements-gpu.lock"))


def test_the_gpu_lock_has_the_cuda_and_cudnn_the_provider_needs(needs):
    check_gpu_libraries(needs, read(DOCKER / "requirements-gpu.lock"))


def test_the_gpu_image_is_built_on_the_cpu_images_base():
    """CUDA comes with the venv, so a CUDA base would add a second copy of the libraries, and a base of
    another Ubuntu another Python than the locks are compiled for."""
    for path in (ROOT / "Dockerfile", ROOT / "deploy" / "README.md"):
        assert not CUDA_BASE.search(read(path)), f"{path.name} names a CUDA base image"


def moved(lock: str, name: str, version: str) -> str:
    return re.sub(rf"^{re.escape(name)}==\S+ ", f"{name}=={version} ", lock, flags=re.M)


def dropped(lock: str, name: str) -> str:
    return re.sub(rf"^{re.escape(name)}==\S+ \\\n(    --hash=\S+(?: \\)?\n)+", "", lock, flags=re.M)


@pytest.mark.parametrize("change, error", [
    (lambda lock: moved(lock, "nvidia-cublas", "12.9.1.4"), "nvidia-cublas==12.9.1.4 ships another major"),
    (lambda lock: moved(lock, "nvidia-cuda-runtime", "12.9.79"), "nvidia-cuda-runtime~=13.0"),
    (lambda lock: moved(lock, "nvidia-cudnn-cu13", "8.9.7.29"), "nvidia-cudnn-cu13~=9.0"),
    (lambda lock: dropped(lock, "nvidia-cudnn-cu13"), "no nvidia-cudnn-cu13"),
    (lambda lock: dropped(lock, "nvidia-cublas"), "nvidia-cublas, which the GPU lock does not pin"),
])
def test_the_library_check_fails_on_a_wrong_lock(needs, change, error):
    lock = change(read(DOCKER / "requirements-gpu.lock"))
    assert lock != read(DOCKER / "requirements-gpu.lock")
    with pytest.raises(AssertionError, match=re.escape(error)):
        check_gpu_libraries(needs, lock)


def test_the_record_check_fails_when_the_lock_moves(needs):
    lock = read(DOCKER / "requirements-gpu.lock")
    moved = re.sub(r"^onnxruntime-gpu==\S+ ", "onnxruntime-gpu==9.9.9 ", lock, flags=re.M)
    with pytest.raises(AssertionError, match="gpu-wheels.sh record"):
        check_record(needs, moved)
    rehashed = lock.replace(needs["sha256"], "0" * 64)
    with pytest.raises(AssertionError, match="gpu-wheels.sh record"):
        check_record(needs, rehashed)


# --- the record against PyPI ---------------------------------------------------------------------
class RangeFile:
    """A remote file read by HTTP range requests in 64 KiB blocks, so zipfile reads a wheel's central
    directory and small members without downloading the wheel."""

    BLOCK = 1 << 16

    def __init__(self, url: str, size: int):
        self.url, self.size, self.pos, self.blocks = url, size, 0, {}

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: 0, 1: self.pos, 2: self.size}[whence] + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def seekable(self) -> bool:
        return True

    def block(self, i: int) -> bytes:
        if i not in self.blocks:
            last = min(self.size, (i + 1) * self.BLOCK) - 1
            req = urllib.request.Request(self.url, headers={"Range": f"bytes={i * self.BLOCK}-{last}"})
            with urllib.request.urlopen(req, timeout=30) as r:
                if r.status != 206:
                    pytest.skip(f"{self.url} answered {r.status} to a range request: it would send the whole wheel")
                self.blocks[i] = r.read()
        return self.blocks[i]

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        out = b"".join(self.block(i) for i in range(self.pos // self.BLOCK, (end - 1) // self.BLOCK + 1)) \
            if end > self.pos else b""
        skip = self.pos % self.BLOCK
        data = out[skip:skip + end - self.pos]
        self.pos = end
        return data


def pypi_index(name: str) -> dict:
    url = f"https://pypi.org/simple/{name}/"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            return json.load(r)
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        pytest.skip(f"PyPI unreachable ({e}): the record is checked against the lock only")


def test_pypi_metadata_of_the_locked_wheel_matches_the_record(needs):
    index = pypi_index("onnxruntime-gpu")
    files = {f["filename"]: f for f in index["files"]}
    assert needs["wheel"] in files, f"PyPI has no {needs['wheel']}"
    wheel = files[needs["wheel"]]
    assert wheel["hashes"]["sha256"] == needs["sha256"], "PyPI's wheel is not the one recorded"
    try:
        with zipfile.ZipFile(RangeFile(wheel["url"], wheel["size"])) as z:
            metadata = z.read(f"onnxruntime_gpu-{needs['version']}.dist-info/METADATA").decode()
            info = z.read("onnxruntime/capi/build_and_package_info.py").decode()
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        pytest.skip(f"files.pythonhosted.org unreachable ({e})")
    extras: dict[str, list[str]] = {}
    for req, extra in re.findall(r'^Requires-Dist: (.+); extra == "(cuda|cudnn)"$', metadata, flags=re.M):
        extras.setdefault(extra, []).append(req)
    assert extras == needs["extras"]
    assert re.search(r"^cuda_version = '(.+)'$", info, flags=re.M).group(1) == needs["build_cuda"]


def test_pypi_wheels_ship_the_libraries(needs):
    """Each locked nvidia-* wheel (the x86_64 one the lock's hashes allow) ships PROVIDES' libraries
    where preload_dlls() looks, read from its RECORD."""
    lock = read(DOCKER / "requirements-gpu.lock")
    locked = pins(lock)
    for package in sorted({p for p, _ in PROVIDES.values()}):
        allowed = lock_hashes(lock, package)
        files = [f for f in pypi_index(package)["files"]
                 if f["hashes"]["sha256"] in allowed and f["filename"].endswith("_x86_64.whl")]
        assert len(files) == 1, f"{package}=={locked[package]}: {[f['filename'] for f in files]}"
        try:
            with zipfile.ZipFile(RangeFile(files[0]["url"], files[0]["size"])) as z:
                record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
                shipped = {line.split(",")[0] for line in z.read(record).decode().splitlines()}
        except (urllib.error.URLError, TimeoutError, OSError) as e:
            pytest.skip(f"files.pythonhosted.org unreachable ({e})")
        for soname, (owner, folder) in PROVIDES.items():
            if owner == package:
                assert f"{folder}/{soname}" in shipped, f"{files[0]['filename']} has no {folder}/{soname}"
