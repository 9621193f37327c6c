"""Ray Data's throughput (service/bulk/ray_bridge.py) with 1 and 2 actors on this machine, beside transerve translate
on the same sentences.

    python benchmarks/ray_data.py --data /work/main/data/de-en-sentences/train.tsv --lines 5000

Each run is a child process of its own: a local Ray cluster of --cpus CPUs (ray.init(num_cpus=...)) translating the
sentences from memory (ray.data.from_items) with translate_dataset, every row taken back by the driver; or the bulk
command on the same lines as a text file. Wall time from the first row asked for to the last one back, so the
actors' start and their model loads are in it (as they are in a job); the command's own rate (after its model load)
is shown beside its wall time. The outputs are compared line by line with the command's. Prints a Markdown section
naming the CPU."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bulk import run_child, summary_rate  # noqa: E402
from benchmarks.common import ROOT, cpu_name  # noqa: E402

RAY = """
import json, sys, time
import ray
from service.bulk.ray_bridge import translate_dataset
src, model, beam, actors, cpus_per_actor, cpus, out = sys.argv[1:8]
lines = open(src, encoding="utf-8").read().split("\\n")[:-1]
ray.init(num_cpus=int(cpus), include_dashboard=False, log_to_driver=False,
         runtime_env={"env_vars": {"PYTHONPATH": sys.argv[8]}})
start = time.perf_counter()
ds = translate_dataset(ray.data.from_items([{"i": i, "text": t} for i, t in enumerate(lines)]), "text",
                       actors=int(actors), cpus_per_actor=int(cpus_per_actor), model=model, beam_size=int(beam))
rows = sorted(ds.take_all(), key=lambda r: r["i"])
wall = time.perf_counter() - start
open(out, "w", encoding="utf-8").write("".join(r["text"] + "\\n" for r in rows))
print(json.dumps({"wall": wall}))
"""


def ray_run(src: Path, out: Path, args, actors: int, cpus_per_actor: int) -> float:
    """Segments per second of one Ray Data run in a child process. Ray starts its workers at nice 15 (raylet's
    worker_niceness) where the command runs at the shell's: --worker-niceness 0 compares them on equal terms on a
    machine others use too."""
    if args.worker_niceness is not None:
        os.environ["RAY_worker_niceness"] = str(args.worker_niceness)
    stdout, *_ = run_child([sys.executable, "-c", RAY, str(src), args.model, str(args.beam_size), str(actors),
                            str(cpus_per_actor), str(args.cpus), str(out), str(ROOT)])
    return len(src.read_text(encoding="utf-8").splitlines()) / json.loads(stdout.splitlines()[-1])["wall"]


def bulk_run(src: Path, out: Path, args, threads: int) -> tuple[float, float]:
    """(segments/s after the model load, segments/s with start-up) of transerve translate."""
    _, err, wall, _, _ = run_child([sys.executable, "-m", "service.cli", "translate", str(src), "-o", str(out),
                                    "--model", args.model, "--threads", str(threads), "--beam-size",
                                    str(args.beam_size), "--progress", "lines"])
    return summary_rate(err), len(src.read_text(encoding="utf-8").splitlines()) / wall


RAY_SHAPES = ((1, 1), (2, 1), (1, 2))     # (actors, CPUs per actor)


def measure(data: list[str], tmp: Path, args) -> list[str]:
    """Every configuration once a round, `rounds` rounds (the machine is shared: the rates swing between rounds);
    each line lists a configuration's rounds and its best."""
    src = tmp / "in.txt"
    src.write_text("".join(t + "\n" for t in data), encoding="utf-8")
    bulk = {threads: [] for threads in (1, 2)}
    ray = {shape: [] for shape in RAY_SHAPES}
    same = True
    for _ in range(args.rounds):
        for threads in bulk:
            bulk[threads].append(bulk_run(src, tmp / f"bulk-{threads}.txt", args, threads))
        reference = (tmp / "bulk-1.txt").read_text(encoding="utf-8")
        for actors, cpus_per_actor in RAY_SHAPES:
            ray[actors, cpus_per_actor].append(ray_run(src, tmp / "ray.txt", args, actors, cpus_per_actor))
            same = same and (tmp / "ray.txt").read_text(encoding="utf-8") == reference

    def each(xs):
        return ", ".join(f"{x:.1f}" for x in xs)
    out = [f"- transerve translate, {t} thread(s): {each(r for r, _ in rs)} segments/s after its model load "
           f"(best **{max(r for r, _ in rs):.1f}**); with start-up {each(w for _, w in rs)}" for t, rs in bulk.items()]
    out += [f"- Ray Data, {a} actor(s) x {c} CPU: {each(rs)} segments/s, actors' start and model load in it (best "
            f"**{max(rs):.1f}**)" for (a, c), rs in ray.items()]
    return out + [f"- outputs: every Ray run's {'equal to' if same else 'DIFFERENT from'} the command's, line for line"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, required=True, help="a TSV whose first column is German sentences")
    p.add_argument("--model", default="models/de-en")
    p.add_argument("--lines", type=int, default=5000)
    p.add_argument("--beam-size", type=int, default=1)
    p.add_argument("--cpus", type=int, default=os.cpu_count(), help="the local Ray cluster's CPUs")
    p.add_argument("--rounds", type=int, default=1, help="rounds of every configuration in turn")
    p.add_argument("--worker-niceness", type=int, help="Ray's workers' nice value (Ray's default: 15)")
    args = p.parse_args()
    from service.shared.text import split_sentences

    data = [line.split("\t")[0] for line in args.data.read_text(encoding="utf-8").splitlines() if line.strip()]
    data = [t for t in data if len(split_sentences(t)[0]) == 1][: args.lines]   # one sentence a line
    out = [f"## Ray Data vs transerve translate ({cpu_name()}, {os.cpu_count()} cores, Ray cluster of {args.cpus} "
           f"CPUs, workers at nice {15 if args.worker_niceness is None else args.worker_niceness}, {len(data)} lines, "
           f"beam {args.beam_size}, load average {os.getloadavg()[0]:.1f} at the start)", ""]
    with tempfile.TemporaryDirectory() as d:
        out += measure(data, Path(d), args)
        out.append(f"- load average at the end: {os.getloadavg()[0]:.1f}")
    print("\n".join(out))


if __name__ == "__main__":
    main()
