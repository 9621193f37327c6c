"""Where the graphs run: onnxruntime's providers (CUDA when asked or found, else CPU), what really runs, and the
sessions, made by a session factory that the engine takes as an argument (a benchmark passes its own).

    probe_device("models/de-en", "auto")      # "cuda" or "cpu", before any worker starts
    Engine(path, open_session=my_factory)     # my_factory(path, session_options, providers) -> InferenceSession
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import onnxruntime as ort

from ..shared.package import INT8_DEFAULT_WEIGHT_BITS, load_package

log = logging.getLogger(__name__)

# (graph file, session options, providers in order of preference) -> a session of that graph
SessionFactory = Callable[[str, ort.SessionOptions, list[str]], ort.InferenceSession]


class DeviceError(RuntimeError):
    """device=cuda was asked for and onnxruntime's CUDA provider is not the one running."""


def session_options(intra_op_threads: int = 0, inter_op_threads: int = 1, *, spin_wait: bool = False,
                    int8_weight_bits: int = INT8_DEFAULT_WEIGHT_BITS) -> ort.SessionOptions:
    """`spin_wait=False` (the default) makes idle intra-op threads sleep instead of busy-waiting for the
    next operator. Spinning took the cores the HTTP process needed, and even alone it did not pay: on 2
    threads, one sentence at beam 4 took 19.2 ms spinning against 17.0 ms not, and batch 32 ran at the
    same speed (benchmarks/results/vs-ctranslate2-cpu.md). `int8_weight_bits`: the package's (model.json's
    "weight_bits"; 8 where it has none): 7-bit weights need no widening (model/quantize.py)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = intra_op_threads       # 0 = one per physical core
    so.inter_op_num_threads = inter_op_threads
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if not spin_wait:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if widens_int8(int8_weight_bits):
        # Widen to 16 bits first, as exact as VNNI. Only there: on a VNNI CPU the answers are the same with and
        # without it (models/de-en, 64 sentences, greedy and beam 4: equal tokens and scores) and it cost 25-35%
        # of the CPU time (AMD EPYC with AVX-512 VNNI, 2026-11-27). It takes effect at ORT_ENABLE_EXTENDED and
        # above only (measured: the unoptimised graph still saturates).
        so.add_session_config_entry("session.x64quantprecision", "1")
    return so


def widens_int8(weight_bits: int = INT8_DEFAULT_WEIGHT_BITS) -> bool:
    """Whether the engine's sessions widen int8 products here: on CPUs where they saturate, for weights of more
    than 7 bits (2 x 255 x 63 = 32,130 fits 16 bits; model/quantize.py)."""
    return weight_bits > 7 and int8_products_saturate()


def int8_products_saturate(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether onnxruntime's uint8 x int8 products saturate on this CPU: on x86 CPUs without VNNI (AVX2, AVX-512
    without VNNI) it multiplies with VPMADDUBSW, whose 16-bit pair sums saturate: 64 products of 255 (zero
    point 128) by 127 came out as 8,160 instead of 1,032,256, and the tiny model's int8 encoder drifted 7.5%
    from fp32 instead of < 5% (AMD EPYC with AVX2 only). An x86 CPU whose flags cannot be read counts as one
    without VNNI: the exact path is the safe one."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return False
    try:
        flags = next((line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), "").split()
    except OSError:
        return True
    return not {"avx512_vnni", "avx_vnni", "amx_int8"} & set(flags)


def open_session(path: str, options: ort.SessionOptions, providers: list[str]) -> ort.InferenceSession:
    """The engine's session factory. On the CPU, onnxruntime's SkipLayerNormalization kernel (what its fusion
    makes of residual Add, bias Add and LayerNormalization) took 5x as long as the three operators unfused,
    e.g. 170 against 34 us for a (128, 1, 256) beam-4 step; without the fusion int8 beam 4 batch 32 ran 14%
    faster, greedy 18% (onnxruntime 1.31, benchmarks/results/int8-graph.md). CUDA keeps it."""
    disabled = [] if providers[0] == "CUDAExecutionProvider" else ["SkipLayerNormFusion"]
    return ort.InferenceSession(path, options, providers=providers, disabled_optimizers=disabled)


def pick_providers(device: str) -> list[str]:
    """"auto": CUDA when onnxruntime has it and a GPU answers, else CPU. "cpu" or "cuda" force one.
    What the wheel was built with is only a wish: Engine checks what its sessions really run on."""
    available = ort.get_available_providers()
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {device!r}")
    if device == "cuda" and "CUDAExecutionProvider" not in available:
        raise DeviceError(f"device=cuda but onnxruntime {ort.__version__} has no CUDAExecutionProvider, only "
                          f"{available}: install onnxruntime-gpu (pip install -e '.[gpu]')")
    if device in ("auto", "cuda") and "CUDAExecutionProvider" in available:
        preload_cuda_libraries()
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def preload_cuda_libraries() -> None:
    """Loads CUDA and cuDNN from the nvidia-* pip packages (PyTorch's) where they are installed, so the
    CUDA provider finds them without LD_LIBRARY_PATH; where they are not, the system's are used."""
    try:
        ort.preload_dlls()
    except Exception as e:  # older onnxruntime, or no nvidia-* packages: the loader's paths decide
        log.debug("onnxruntime.preload_dlls(): %s", e)


def missing_cuda_libraries() -> list[str]:
    """The libraries onnxruntime's CUDA provider links that the loader cannot find (ldd's "not found"), the
    nvidia-* wheels' folders included, where preload_cuda_libraries found them (ldd runs in a process of its
    own, which sees only LD_LIBRARY_PATH)."""
    provider = Path(ort.__file__).parent / "capi" / "libonnxruntime_providers_cuda.so"
    if not provider.exists() or shutil.which("ldd") is None:
        return []
    wheels = sorted(str(d) for d in (Path(ort.__file__).parent.parent / "nvidia").glob("*/lib"))
    path = ":".join(wheels + [p for p in [os.environ.get("LD_LIBRARY_PATH", "")] if p])
    out = subprocess.run(["ldd", str(provider)], capture_output=True, text=True, timeout=30,
                         env=dict(os.environ, LD_LIBRARY_PATH=path)).stdout
    return [line.split()[0] for line in out.splitlines() if "not found" in line]


def running_device(session: ort.InferenceSession, device: str, wanted: list[str]) -> str:
    """"cuda" or "cpu": the provider the session really runs on. onnxruntime falls back to CPU with only a
    log line when the CUDA provider cannot load (CUDA or cuDNN missing or of another major version, no
    GPU); for device="cuda" that is an error, for "auto" a warning."""
    if session.get_providers()[0] == "CUDAExecutionProvider":
        return "cuda"
    if "CUDAExecutionProvider" not in wanted:
        return "cpu"
    if device == "cuda":
        missing = missing_cuda_libraries()
        why = (f"the loader cannot find {', '.join(missing)}" if missing
               else "its libraries load, so no GPU answered (check nvidia-smi) or ldd is missing")
        raise DeviceError(f"device=cuda but onnxruntime {ort.__version__}'s CUDA provider did not load ({why}); "
                          f"the session runs on {session.get_providers()}. onnxruntime's error above names the "
                          "CUDA and cuDNN major versions it needs (deploy/README.md: the GPU image)")
    log.warning("onnxruntime's CUDA provider did not load; serving on CPU (onnxruntime's error above says why)")
    return "cpu"


def probe_device(package: str | Path, device: str) -> str:
    """"cuda" or "cpu": where `package`'s engines will run, found by loading its decoder graph once (the
    HTTP process asks before it starts workers, so device=cuda without a working CUDA provider stops the
    server with DeviceError's message rather than with workers that fail to start)."""
    providers = pick_providers(device)
    if providers[0] != "CUDAExecutionProvider":
        return "cpu"
    session = ort.InferenceSession(str(load_package(package).file("decoder.onnx")), providers=providers)
    return running_device(session, device, providers)
