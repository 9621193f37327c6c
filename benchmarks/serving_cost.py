"""Serving cost of model packages side by side: engine throughput (beam 4, batch 32) and beam-4 latency of one
sentence at a time (batch 1), on the same sentences, in wall time and in CPU time.

    python benchmarks/serving_cost.py --package today=models/de-en --package wide=/tmp/wide-int8 \
        --data data/de-en-sentences/test.tsv --sentences 64 --rounds 3 --threads 1

For comparing model shapes (benchmarks/results/size-cpu.md): the packages are measured in turns, round after
round (each round measures every package once), and each figure is the best of the rounds, so that a shared
machine's load falls on all of them alike; the CPU-time columns (this process's, onnxruntime on --threads
threads) hardly depend on the load at all. The engine is service.inference.engine.Engine, as the service runs it
(SearchOptions' defaults but the beam size), detokenization included.

    tok/s          target tokens (eos included) per second, batches of --batch-size sentences sorted by length
    tok/CPU s      the same per CPU second
    b1 p50 ms      median latency of one sentence alone (encode, search, detokenize)
    b1 CPU ms      mean CPU milliseconds per sentence alone
    b1 tokens      mean target tokens per sentence (a model that writes longer outputs pays for them)
    b1 CPU ms/tok  b1 CPU ms / b1 tokens: the cost of a sentence's latency with its output length taken out
    × first        the ratios to the first package: b1 CPU ms, b1 CPU ms/tok, CPU seconds per token at batch 32
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.train_speed import cpu_name, publish  # noqa: E402


def run_batches(engine, batches: list[list[list[int]]], options) -> tuple[int, float, float, list[float]]:
    """-> (target tokens, wall s, CPU s, each batch's wall ms)."""
    tokens, each = 0, []
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for batch in batches:
        t = time.perf_counter()
        hyps = [h[0] for h in engine.search(batch, options)]
        for h in hyps:
            engine.detokenize(h.tokens)
        tokens += sum(len(h.tokens) + h.finished for h in hyps)
        each.append((time.perf_counter() - t) * 1000)
    return tokens, time.perf_counter() - wall0, time.process_time() - cpu0, each


def measure(engine, sources: list[list[int]], beam: int, batch_size: int, length: int = 0) -> dict:
    from service.shared.options import SearchOptions

    options = (SearchOptions(beam_size=beam, min_length=length, max_length_a=0.0, max_length_b=length)
               if length else SearchOptions(beam_size=beam))
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    batched = [[sources[i] for i in order[s:s + batch_size]] for s in range(0, len(order), batch_size)]
    tokens, wall, cpu, _ = run_batches(engine, batched, options)
    one_tokens, _, one_cpu, one_each = run_batches(engine, [[s] for s in sources], options)
    return {"tok_s": tokens / wall, "tok_cpu_s": tokens / cpu, "b1_p50_ms": float(np.median(one_each)),
            "b1_cpu_ms": one_cpu * 1000 / len(sources), "b1_tokens": one_tokens / len(sources)}


def parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--package", action="append", required=True, metavar="NAME=DIR", help="repeatable; the first is "
                   "the reference of the ratio columns")
    p.add_argument("--data", default="data/de-en-sentences/test.tsv")
    p.add_argument("--direction", default="de-en")
    p.add_argument("--sentences", type=int, default=64)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--length", type=int, default=0, help="every output this many tokens (eos banned before it, "
                   "the budget this long): each package's cost at the same output length, whatever its training "
                   "made it write (0: as it writes)")
    p.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    p.add_argument("--out", default=None, help="append the report (markdown) to this file")
    return p.parse_args(argv)


def best_of_rounds(args: argparse.Namespace, engines: dict, sources: dict) -> tuple[dict[str, dict], list[float]]:
    """Every package measured once a round, in turns; -> each one's best figures, the load after each round."""
    for name, e in engines.items():                  # warm-up: first-run allocations
        measure(e, sources[name][:2], args.beam, args.batch_size, args.length)
    best: dict[str, dict] = {}
    loads = []
    for _ in range(args.rounds):
        for name, e in engines.items():
            r = measure(e, sources[name], args.beam, args.batch_size, args.length)
            b = best.setdefault(name, r)
            for k in ("tok_s", "tok_cpu_s"):
                b[k] = max(b[k], r[k])
            for k in ("b1_p50_ms", "b1_cpu_ms"):
                b[k] = min(b[k], r[k])
        loads.append(os.getloadavg()[0])
    return best, loads


def report(args: argparse.Namespace, argv, n_texts: int, best: dict[str, dict], loads: list[float]) -> str:
    ref = best[next(iter(best))]
    rows = [f"| {name} | {b['tok_s']:,.0f} | {b['tok_cpu_s']:,.0f} | {b['b1_p50_ms']:,.1f} | {b['b1_cpu_ms']:,.1f} | "
            f"{b['b1_tokens']:.1f} | {b['b1_cpu_ms'] / b['b1_tokens']:.2f} | {b['b1_cpu_ms'] / ref['b1_cpu_ms']:.2f} | "
            f"{(b['b1_cpu_ms'] / b['b1_tokens']) / (ref['b1_cpu_ms'] / ref['b1_tokens']):.2f} | "
            f"{ref['tok_cpu_s'] / b['tok_cpu_s']:.2f} |" for name, b in best.items()]
    length = f", every output {args.length} tokens" if args.length else ""
    return "\n".join([
        f"`python benchmarks/serving_cost.py {' '.join(sys.argv[1:] if argv is None else argv)}`", "",
        f"CPU: {cpu_name()}; onnxruntime on {args.threads} thread(s); {args.direction}, the first {n_texts} "
        f"sentences of {args.data}; beam {args.beam}{length}; best of {args.rounds} rounds (packages in turns); "
        f"load average during the rounds {', '.join(f'{x:.1f}' for x in loads)}", "",
        f"| package | tok/s (batch {args.batch_size}) | tok/CPU s | b1 p50 ms | b1 CPU ms | b1 tokens | "
        "b1 CPU ms/tok | b1 CPU × first | b1 CPU/tok × first | batch CPU/tok × first |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|", *rows]) + "\n"


def main(argv=None) -> None:
    args = parse_args(argv)

    from model.corpus.tsv import read_pairs
    from service.inference.engine import Engine

    tgt_lang = args.direction.split("-")[1]
    texts = [s for s, _ in read_pairs(args.data, direction=args.direction)[: args.sentences]]
    engines = {}
    for spec in args.package:
        name, _, path = spec.rpartition("=")
        engines[name or Path(path).name] = Engine(path, device="cpu", intra_op_threads=args.threads)
    sources = {name: e.source_ids(texts, tgt_lang) for name, e in engines.items()}
    best, loads = best_of_rounds(args, engines, sources)
    publish(report(args, argv, len(texts), best, loads), args.out)


if __name__ == "__main__":
    main()
