"""What batching buys the engine on this machine: a search's wall time and each sentence's share of it at growing
batch sizes, every search forced to the same number of steps, on one onnxruntime thread (one server worker's).

    python benchmarks/batch_cost.py                      # models/de-en, beam 4 and greedy, 16 steps
    python benchmarks/batch_cost.py --package P --steps 32 --beams 4

Why it matters for a running batch (docs/serving.md, "What the running batch can buy on a CPU"): at a fraction f
of the engine's saturation, a sentence shares each step with enough others that a sentence's cost is at most
1/f of the cheapest (the largest batch's); the search time at that batch over the time alone is the least
latency ratio any scheduler can reach there, before queueing and HTTP. The last lines print it for f = 0.5 and
0.75. Figures depend on the CPU and its load: the header names both.
"""

from __future__ import annotations

import argparse
import os
import time

from common import ROOT, cpu_name, pairs64


def search_ms(engine, ids: list[list[int]], options, repeat: int) -> float:
    """The fastest of `repeat` searches of `ids` in one batch, in ms."""
    best = float("inf")
    for _ in range(repeat + 1):                  # the first one warms up
        t0 = time.perf_counter()
        engine.search(ids, options)
        best = min(best, time.perf_counter() - t0)
    return best * 1000


def least_ratio(rows: list[tuple[int, float]], fraction: float) -> tuple[int, float]:
    """(batch, search time / time alone) of the smallest batch whose cost per sentence is at most 1/fraction of
    the cheapest: what a sentence waits at that fraction of saturation at best."""
    cheapest = min(ms / b for b, ms in rows)
    alone = rows[0][1]
    for b, ms in rows:
        if ms / b <= cheapest / fraction:
            return b, ms / alone
    return rows[-1][0], rows[-1][1] / alone


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--package", default=str(ROOT / "models" / "de-en"))
    p.add_argument("--steps", type=int, default=16, help="every search runs exactly this many steps")
    p.add_argument("--beams", default="4,1")
    p.add_argument("--batches", default="1,2,4,8,16,32")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)

    from service.inference.engine import Engine
    from service.shared.options import SearchOptions

    engine = Engine(args.package, intra_op_threads=1)
    ids = engine.source_ids([de for de, _ in pairs64()], "en")
    print(f"CPU: {cpu_name()}; load average {os.getloadavg()[0]:.2f}; {args.package}, 1 onnxruntime thread, "
          f"the tests' 64 Ding sentences, {args.steps} steps a search")
    for beam in (int(b) for b in args.beams.split(",")):
        options = SearchOptions(beam_size=beam, min_length=args.steps, max_length=args.steps, max_length_a=0,
                                max_length_b=args.steps, length_rule="ctranslate2")
        rows = [(b, search_ms(engine, ids[:b], options, args.repeat)) for b in map(int, args.batches.split(","))]
        print(f"\n| beam {beam}: batch | rows | search ms | ms a step | × alone | ms a sentence |")
        print("|---:|---:|---:|---:|---:|---:|")
        for b, ms in rows:
            print(f"| {b} | {b * beam} | {ms:.1f} | {ms / args.steps:.2f} | {ms / rows[0][1]:.1f} | {ms / b:.2f} |")
        for fraction in (0.5, 0.75):
            b, ratio = least_ratio(rows, fraction)
            print(f"- at {fraction:g} x saturation: a batch of {b} at least, a search {ratio:.1f}x its time alone")
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
