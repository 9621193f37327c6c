"""The GPU image's parts agree: the CUDA and cuDNN of the Dockerfile's GPU base are the ones the locked
onnxruntime-gpu's CUDA provider needs (else onnxruntime prints "Require cuDNN 9.* and CUDA 13.*" and runs
on the CPU), and the CPU image runs the same onnxruntime version, so what CI tests is what the GPU
nodes run.

What the provider needs comes from deploy/docker/onnxruntime-gpu-needs.yaml, written from the wheel by
`bash scripts/gpu-wheels.sh record`: it names the wheel's sha256, so moving the lock without
rewriting it fails here. One test reads the same facts from PyPI (the wheel's METADATA and build info,
a few HTTP range requests, never the 255 MB) and skips, saying why, where PyPI cannot be reached.
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

from conftest import ROOT

DOCKER = ROOT / "deploy" / "docker"
NEEDS = DOCKER / "onnxruntime-gpu-needs.yaml"
GPU_BASE = re.compile(r"nvidia/cuda:(\d+)\.(\d+)\.(\d+)-cudnn(\d*)-runtime-ubuntu(\d+\.\d+)")


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


def gpu_bases(text: str) -> set[tuple]:
    return set(GPU_BASE.findall(text))


def soname_major(needs: dict, lib: str) -> int:
    found = [n for n in needs["needed"] if n.startswith(f"{lib}.so.")]
    assert found, f"the provider links no {lib}: {needs['needed']}"
    return int(found[0].rsplit(".", 1)[1])


def extra_requirement(needs: dict, extra: str, package: str) -> tuple[int, int]:
    """The ~=X.Y of a package in an extra: X is the major the provider needs, Y the least minor."""
    for req in needs["extras"][extra]:
        m = re.fullmatch(rf"{re.escape(package)}~=(\d+)\.(\d+)", req)
        if m:
            return int(m.group(1)), int(m.group(2))
    raise AssertionError(f"no {package}~=X.Y in the {extra} extra: {needs['extras'][extra]}")


def check_record(needs: dict, gpu_lock: str) -> None:
    version = pins(gpu_lock)["onnxruntime-gpu"]
    assert needs["version"] == version and needs["sha256"] in lock_hashes(gpu_lock, "onnxruntime-gpu"), (
        f"{NEEDS.name} is of onnxruntime-gpu {needs['version']}, the lock pins {version}: "
        "run bash scripts/gpu-wheels.sh record")
    # The image's Python (Ubuntu 24.04: CPython 3.12) on x86_64 installs this very wheel.
    assert re.fullmatch(rf"onnxruntime_gpu-{re.escape(version)}-cp312-cp312-manylinux_\d+_\d+_x86_64\.whl",
                        needs["wheel"]), needs["wheel"]


def check_gpu_base(needs: dict, dockerfile: str) -> None:
    bases = gpu_bases(dockerfile)
    assert len(bases) == 1, f"the Dockerfile should document one GPU base, found {bases}"
    major, minor, _, cudnn, ubuntu = bases.pop()
    cuda = (int(major), int(minor))
    for lib in ("libcudart", "libcublas", "libcublasLt"):
        assert soname_major(needs, lib) == cuda[0], \
            f"the base has CUDA {cuda[0]}, the provider links {lib}.so.{soname_major(needs, lib)}"
    runtime = extra_requirement(needs, "cuda", "nvidia-cuda-runtime")
    assert cuda[0] == runtime[0] and cuda[1] >= runtime[1], f"CUDA {cuda} does not satisfy ~={runtime}"
    built = tuple(int(x) for x in needs["build_cuda"].split("."))
    assert cuda >= built, f"the provider was built with CUDA {built}, the base has {cuda}"
    # NVIDIA's tags named cuDNN's major up to cuDNN 8 ("cudnn8"); plain "cudnn" tags carry cuDNN 9.
    cudnn_major = int(cudnn) if cudnn else 9
    wanted = extra_requirement(needs, "cudnn", f"nvidia-cudnn-cu{cuda[0]}")
    assert cudnn_major == wanted[0], f"the base has cuDNN {cudnn_major}, the provider needs ~={wanted}"
    cpu_base = re.search(r"^ARG BASE_IMAGE=ubuntu:(\S+)$", dockerfile, flags=re.M).group(1)
    assert ubuntu == cpu_base, f"GPU base on Ubuntu {ubuntu}, CPU image on {cpu_base}: their Python would differ"


def test_cpu_and_gpu_images_run_the_same_onnxruntime():
    cpu = pins(read(DOCKER / "requirements-serve.lock"))["onnxruntime"]
    gpu = pins(read(DOCKER / "requirements-gpu.lock"))["onnxruntime-gpu"]
    assert cpu == gpu, f"CPU image onnxruntime {cpu}, GPU image onnxruntime-gpu {gpu}: pin both to one version"
    extras = tomllib.loads(read(ROOT / "pyproject.toml"))["project"]["optional-dependencies"]
    assert f"onnxruntime=={cpu}" in extras["serve"] and f"onnxruntime-gpu=={gpu}" in extras["gpu"], \
        "pyproject.toml's pins and the locks disagree: run bash scripts/lock.sh"


def test_the_record_is_of_the_locked_wheel(needs):
    check_record(needs, read(DOCKER / "requirements-gpu.lock"))


def test_the_gpu_base_has_the_cuda_and_cudnn_the_provider_needs(needs):
    check_gpu_base(needs, read(ROOT / "Dockerfile"))


def test_the_deploy_readme_builds_the_gpu_image_on_the_dockerfiles_base():
    assert gpu_bases(read(ROOT / "deploy" / "README.md")) == gpu_bases(read(ROOT / "Dockerfile"))


@pytest.mark.parametrize("base, error", [
    ("nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04", "the base has CUDA 12"),
    ("nvidia/cuda:13.0.2-cudnn8-runtime-ubuntu24.04", "the base has cuDNN 8"),
    ("nvidia/cuda:13.0.2-cudnn-runtime-ubuntu22.04", "Ubuntu 22.04"),
])
def test_the_base_check_fails_on_a_wrong_base(needs, base, error):
    dockerfile = GPU_BASE.sub(base, read(ROOT / "Dockerfile"))
    with pytest.raises(AssertionError, match=error):
        check_gpu_base(needs, dockerfile)


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


def pypi_wheel(name: str) -> dict:
    url = f"https://pypi.org/simple/{name}/"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            return json.load(r)
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        pytest.skip(f"PyPI unreachable ({e}): the record is checked against the lock only")


def test_pypi_metadata_of_the_locked_wheel_matches_the_record(needs):
    index = pypi_wheel("onnxruntime-gpu")
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
