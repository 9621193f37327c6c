"""Decoding speed: the onnxruntime engine (fp32, int8, fp16 on a GPU) against the PyTorch reference.

    python benchmarks/decode.py --checkpoint runs/small --data data/de-en/test.tsv \
        --out benchmarks/results/decode-cpu.md

Exports the checkpoint to a package for each ort-* runtime in a temporary directory, then decodes the
same source sentences with every runtime, for each batch size and for greedy and beam-4 search, and
prints one table:

    runtime        which decoder: torch-nocache re-runs the whole decoder over the prefix every step
                   (the naive loop), torch-cache is model.decoding.TorchDecoder with its key/value cache,
                   ort-fp32 / ort-int8 / ort-int8-rows / ort-fp16 are service.inference.engine.Engine on a package:
                   ort-int8 is `model.export --quantize int8` (int8-static: constant activation scales
                   calibrated on text, model/quantize.py), ort-int8-rows `--quantize int8-rows` (each row's
                   scale at run time)
    tok/s          target tokens generated (eos included) per second of wall time
    p50 / p95 ms   latency of one batch: encode + search + detokenize, as a request of that size sees it

Every runtime gets the same thread count (--threads) and the same inputs, sorted by length into
batches as the service does. Nothing here is asserted: figures vary with the machine and its load,
so the command, the machine and the date are written next to them.

int8-static's calibration text: --calibration, else model.export's default (dev.tsv of the data the run
trained on, per its config.json), else dev.tsv beside --data, else --data itself (the measured sentences
among it); the report names it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]     # the repository, and tests/oracles.py (the baseline)

# (batch of source id lists) -> number of target tokens produced
DecodeFn = Callable[[list[list[int]]], int]


def torch_runtime(model, *, cached: bool, beam: int, settings: dict) -> DecodeFn:
    import torch

    from model.batching import pad
    from model.decoding import TorchDecoder
    from oracles import UncachedTorchDecoder          # tests/oracles.py, on sys.path above
    from service.shared.options import SearchOptions
    from service.shared.search import decode, finish, max_lengths

    cls = TorchDecoder if cached else UncachedTorchDecoder
    options = SearchOptions(beam_size=beam, **settings)

    @torch.no_grad()
    def run(batch: list[list[int]]) -> int:
        src = pad(batch)
        limits = max_lengths([len(s) for s in batch], a=settings["max_length_a"], b=settings["max_length_b"],
                             cap=settings["max_length"])
        hyps = [h[0] for h in finish(decode(cls(model, src), len(batch), options, bos_id=model.config.bos_id,
                                            eos_id=model.config.eos_id, max_length=limits))]
        return sum(len(h.tokens) + h.finished for h in hyps)

    return run


def engine_runtime(engine, *, beam: int, settings: dict) -> DecodeFn:
    from service.shared.options import SearchOptions

    opts = SearchOptions(beam_size=beam, **settings)

    def run(batch: list[list[int]]) -> int:
        hyps = [h[0] for h in engine.search(batch, opts)]
        for h in hyps:                      # the service detokenizes too; keep it in the timing
            engine.detokenize(h.tokens)
        return sum(len(h.tokens) + h.finished for h in hyps)

    return run


def measure(fn: DecodeFn, sources: list[list[int]], batch_size: int) -> dict:
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    batches = [[sources[i] for i in order[s:s + batch_size]] for s in range(0, len(order), batch_size)]
    fn(batches[0][:1])                       # warm-up: first-run allocations, thread pools
    latencies, tokens = [], 0
    t_all = time.perf_counter()
    for b in batches:
        t0 = time.perf_counter()
        tokens += fn(b)
        latencies.append((time.perf_counter() - t0) * 1000)
    wall = time.perf_counter() - t_all
    q = np.percentile(latencies, [50, 95])
    return {"tok_s": tokens / wall, "p50_ms": float(q[0]), "p95_ms": float(q[1]), "tokens": tokens,
            "sentences": len(sources), "batches": len(batches)}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, help="run directory from model.train")
    p.add_argument("--data", required=True, help="TSV of source sentences (first column, or by --direction)")
    p.add_argument("--direction", default=None, help="e.g. de-en (default: the model's first direction)")
    p.add_argument("--sentences", type=int, default=128, help="source sentences decoded per configuration")
    p.add_argument("--batch-sizes", default="1,8,32,64")
    p.add_argument("--beams", default="1,4", help="1 = greedy")
    p.add_argument("--runtimes", default="torch-nocache,torch-cache,ort-fp32,ort-int8",
                   help="any of torch-nocache, torch-cache, ort-fp32, ort-int8 (int8-static), ort-int8-rows, "
                        "ort-fp16 (GPU)")
    p.add_argument("--calibration", default=None, help="TSV that sets ort-int8's activation scales (default: "
                   "the dev split of the data the run trained on, else dev.tsv beside --data)")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads for torch and onnxruntime (0 = all cores)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--max-length-a", type=float, default=1.5)
    p.add_argument("--max-length-b", type=int, default=10)
    p.add_argument("--out", default=None, help="also write the table, command and machine to this Markdown file")
    return p.parse_args(argv)


@dataclass
class Inputs:
    """The checkpoint's model and what the table is measured on."""

    model: object
    info: dict
    direction: str
    sources: list[list[int]]
    threads: int


def load_inputs(args: argparse.Namespace) -> Inputs:
    """The checkpoint's model on --threads torch threads, and the first --sentences sources as ids."""
    import torch

    from model.corpus.tsv import read_pairs
    from model.evaluate import load_checkpoint

    threads = args.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    model, tok, info = load_checkpoint(args.checkpoint, args.device)
    directions = info.get("directions") or ["de-en"]
    direction = args.direction or directions[0]
    target_lang = direction.split("-")[1] if info.get("tagged") else None
    pairs = read_pairs(args.data, direction=direction)[: args.sentences]
    sources = [tok.source_ids(s, target_lang) for s, _ in pairs]
    return Inputs(model, info, direction, sources, threads)


def calibration_file(args: argparse.Namespace) -> tuple[Path, str]:
    """ort-int8's calibration text (see the module docstring) and how the report names it."""
    from model.export import dev_split, run_config

    if args.calibration:
        return Path(args.calibration), f"{args.calibration} (--calibration)"
    run = Path(args.checkpoint) if Path(args.checkpoint).is_dir() else Path(args.checkpoint).parent
    dev = dev_split(run_config(run))
    if dev is not None:
        return dev, f"{dev}, the dev split of the data the run trained on (model.export's default)"
    data = Path(args.data)
    beside = data.parent / "dev.tsv"
    if beside.is_file() and beside.resolve() != data.resolve():
        return beside, f"{beside}, beside --data"
    print(f"note: ort-int8 is calibrated on {data}, the measured sentences among it: neither the dev split of "
          "the run's data nor another dev.tsv beside --data is here", flush=True)
    return data, f"{data} itself (the measured sentences among it)"


# ort-* runtime -> model.export_package keywords
EXPORTS = {"fp32": {}, "int8": {"quantize": "int8"}, "int8-rows": {"quantize": "int8-rows"}, "fp16": {"fp16": True}}


def load_engines(args: argparse.Namespace, runtimes: list[str], tmp: Path, threads: int) -> tuple[dict, str | None]:
    """An Engine on a package exported into `tmp` for each ort-* runtime, and how ort-int8 was calibrated."""
    from model.export import export_package
    from service.inference.engine import Engine

    engines, calibrated = {}, None
    for rt in runtimes:
        if rt.startswith("ort-"):
            precision = rt[4:]
            if precision not in EXPORTS:
                raise SystemExit(f"unknown runtime {rt}: ort-{', ort-'.join(EXPORTS)}")
            pkg = tmp / precision
            kwargs = dict(EXPORTS[precision])
            if precision == "int8":
                kwargs["calibration"], calibrated = calibration_file(args)
            export_package(args.checkpoint, pkg, **kwargs)
            engines[rt] = Engine(pkg, device=args.device, intra_op_threads=threads)
    return engines, calibrated


TABLE_HEADER = ("| runtime | search | batch | tok/s | p50 ms | p95 ms | ×nocache |\n"
                "|---|---|---:|---:|---:|---:|---:|")


def measure_all(args: argparse.Namespace, inputs: Inputs, runtimes: list[str], engines: dict, beams: list[int],
                batch_sizes: list[int]) -> list[str]:
    """Every runtime at each beam and batch size: the table's rows, each printed as it is measured."""
    settings = dict(max_length_a=args.max_length_a, max_length_b=args.max_length_b, max_length=256)
    rows = []
    for beam in beams:
        for bs in batch_sizes:
            base = None
            for rt in runtimes:
                if rt.startswith("torch"):
                    fn = torch_runtime(inputs.model, cached=rt == "torch-cache", beam=beam, settings=settings)
                else:
                    fn = engine_runtime(engines[rt], beam=beam, settings=settings)
                r = measure(fn, inputs.sources, bs)
                if rt == "torch-nocache":
                    base = r["tok_s"]
                speedup = f"{r['tok_s'] / base:.1f}" if base else "–"
                search = "greedy" if beam == 1 else f"beam {beam}"
                line = (f"| {rt} | {search} | {bs} | {r['tok_s']:,.0f} | {r['p50_ms']:,.1f} | "
                        f"{r['p95_ms']:,.1f} | {speedup} |")
                rows.append(line)
                print(line, flush=True)
    return rows


def write_report(args: argparse.Namespace, argv, inputs: Inputs, rows: list[str], calibrated: str | None) -> None:
    import onnxruntime
    import torch

    cmd = "python benchmarks/decode.py " + " ".join(argv if argv is not None else sys.argv[1:])
    info, model = inputs.info, inputs.model
    text = (f"# Decoding speed\n\n"
            f"- command: `{cmd}`\n"
            f"- date: {datetime.date.today().isoformat()}\n"
            f"- machine: {machine()}, device {args.device}, {inputs.threads} threads\n"
            f"- versions: torch {torch.__version__}, onnxruntime {onnxruntime.__version__}\n"
            f"- model: {info['file']} (step {info.get('step')}), {inputs.direction}, "
            f"{sum(p.numel() for p in model.parameters()):,} parameters\n"
            f"- inputs: the first {len(inputs.sources)} sentences of {args.data}, sorted by length into batches; "
            f"max length {args.max_length_a} × source + {args.max_length_b}\n"
            + (f"- ort-int8: int8-static, calibrated on {calibrated}\n" if calibrated else "")
            + f"\n{TABLE_HEADER}\n" + "\n".join(rows) + "\n")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    inputs = load_inputs(args)
    runtimes = args.runtimes.split(",")
    beams = [int(b) for b in args.beams.split(",")]
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        engines, calibrated = load_engines(args, runtimes, Path(tmp), inputs.threads)
        if calibrated:
            print(f"ort-int8: int8-static, calibrated on {calibrated}", flush=True)
        print(TABLE_HEADER, flush=True)
        rows = measure_all(args, inputs, runtimes, engines, beams, batch_sizes)
    if args.out:
        write_report(args, argv, inputs, rows, calibrated)


if __name__ == "__main__":
    main()
