"""Where a package's answers on CUDA part from the CPU's: the encoder's outputs, then whole searches.

    python benchmarks/cuda_agreement.py --package /tmp/de-en-fp32 --package /tmp/de-en-fp16     # on a GPU machine

For each package: its encoder on the CPU and on CUDA over the same padded batch of 8 (largest difference of each
output, and row 0 alone against batched on CUDA); then greedy and beam 4 searches of --sentences sentences, alone
and in batches of 8, on the CPU and on CUDA (with TF32 on, onnxruntime's CUDA default, and off), each counted
against the first package's searches alone on the CPU, and on CUDA once more reading each step's whole distribution
(`Engine.search_top_k = False`: the graph's TopK output not read, the search picks from its log_probs). On the
CPU an fp16 package writes fp32's tokens; a CUDA row that does not, while the encoder agrees, puts the difference
in the decoder's CUDA kernels or in how the engine feeds them (benchmarks/results/gpu-h200.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from service.inference import device  # noqa: E402
from service.inference.engine import Engine  # noqa: E402
from service.shared.options import SearchOptions  # noqa: E402

def session_without_tf32(path: str, options: ort.SessionOptions, providers: list[str]) -> ort.InferenceSession:
    """The engine's session factory (Engine(open_session=...)) with the CUDA provider's TF32 off, onnxruntime's
    default on for fp32 MatMul; device.open_session disables no optimizer on CUDA either."""
    if providers[0] != "CUDAExecutionProvider":
        return device.open_session(path, options, providers)
    return ort.InferenceSession(path, options, providers=[("CUDAExecutionProvider", {"use_tf32": "0"}), *providers[1:]])


# (where, batch size, TF32, the graph's TopK read) of each row of searches
RUNS = (("cpu", 1, True, True), ("cpu", 8, True, True), ("cuda", 1, True, True), ("cuda", 8, True, True),
        ("cuda", 1, False, True), ("cuda", 8, False, True), ("cuda", 1, True, False), ("cuda", 8, True, False))


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float32) - b.astype(np.float32)).max())


def encoder_lines(package: Path, texts: list[str], target: str) -> str:
    ids = Engine(package, device="cpu").source_ids(texts[:8], target)
    width = max(map(len, ids))
    src = np.array([i + [0] * (width - len(i)) for i in ids], dtype=np.int64)
    path = str(package / "encoder.onnx")
    cpu = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"src_ids": src})
    gpu_session = ort.InferenceSession(path, providers=["CUDAExecutionProvider"])
    gpu = gpu_session.run(None, {"src_ids": src})
    alone = gpu_session.run(None, {"src_ids": src[:1, :len(ids[0])]})
    return (f"{package} encoder, CPU against CUDA, largest difference per output: "
            f"{', '.join(f'{max_diff(a, b):.2g}' for a, b in zip(cpu, gpu))} (values up to "
            f"{float(np.abs(cpu[0]).max()):.3g}); CUDA row 0 alone against batched: "
            f"{max_diff(alone[0][0], gpu[0][0][:, :len(ids[0])]):.2g}")


def searches(package: Path, where: str, beam: int, size: int, texts: list[str], target: str,
             tf32: bool = True, top_k: bool = True) -> list[list[int]]:
    engine = Engine(package, device=where, open_session=device.open_session if tf32 else session_without_tf32)
    engine.search_top_k = top_k
    ids = engine.source_ids(texts, target)
    options = SearchOptions(beam_size=beam, max_length_a=0, max_length_b=32, max_length=32)
    return [h[0].tokens for s in range(0, len(ids), size) for h in engine.search(ids[s:s + size], options)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--package", type=Path, action="append", required=True, help="translation packages; the first "
                   "one's searches alone on the CPU are the reference")
    p.add_argument("--sentences", type=int, default=16, help="the tests' Ding sentences searched (default 16)")
    p.add_argument("--target", default="en")
    args = p.parse_args()
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        sys.exit(f"onnxruntime {ort.__version__} has no CUDAExecutionProvider here: this compares CUDA with the CPU")
    rows = (ROOT / "tests" / "fixtures" / "pairs64.tsv").read_text(encoding="utf-8").splitlines()
    texts = [row.split("\t")[0] for row in rows[:args.sentences]]
    for package in args.package:
        print(encoder_lines(package, texts, args.target), flush=True)
    for beam in (1, 4):
        reference = searches(args.package[0], "cpu", beam, 1, texts, args.target)
        for package in args.package:
            for where, size, tf32, top_k in RUNS:
                t0 = time.perf_counter()
                got = searches(package, where, beam, size, texts, args.target, tf32, top_k)
                same = sum(a == b for a, b in zip(reference, got))
                print(f"beam {beam} {package} {where:4} batch {size} tf32 {'on ' if tf32 else 'off'}"
                      f"{'' if top_k else ', whole distribution'}: "
                      f"{same}/{len(texts)} as the reference ({time.perf_counter() - t0:.2f} s); first: {got[0][:12]}",
                      flush=True)


if __name__ == "__main__":
    main()
