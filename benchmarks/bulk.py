"""transerve translate against the engine offline, and its peak memory at two input sizes.

    python benchmarks/bulk.py --data /work/main/data/de-en-sentences/train.tsv --sizes 5000 50000

Throughput: the first size's German sentences translated by the command (a subprocess, the model in-process)
and by Engine.translate over the whole list at once (sorted globally, batch 32: the best the engine does
offline), the same search options; the command's rate is its own summary line's (after the model loaded),
its wall time with start-up is shown too. The outputs are compared line by line. Memory: each size run by the
command alone, its peak RSS read from wait4 (the child's own ru_maxrss), with --memory-max-length (a short
output budget, the same at both sizes) so the larger size costs minutes, not an hour. Prints a Markdown
section naming the CPU."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import ROOT, cpu_name  # noqa: E402

OFFLINE = """
import sys, time, json
from service.inference.engine import Engine
from service.shared.text import split_sentences
lines = open(sys.argv[1], encoding="utf-8").read().split("\\n")[:-1]
engine = Engine(sys.argv[2], intra_op_threads=int(sys.argv[3]))
options = json.loads(sys.argv[4])
assert all(len(split_sentences(t)[0]) == 1 for t in lines), "one sentence a line, as the command sends them"
start, cpu = time.perf_counter(), time.process_time()
out = engine.translate(lines, source_lang="de", target_lang="en", max_length=engine.max_positions, **options)
wall = time.perf_counter() - start
open(sys.argv[5], "w", encoding="utf-8").write("".join(t.text + "\\n" for t in out))
print(json.dumps({"wall": wall, "tokens": sum(t.tokens for t in out)}))
"""


def run_child(cmd: list[str]) -> tuple[str, str, float, float, float]:
    """(stdout, stderr, wall seconds, peak RSS MiB, CPU seconds) of one child process."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{stderr[-2000:]}")
    return stdout, stderr, wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def command(src: Path, dst: Path, args, search: list[str]) -> list[str]:
    return [sys.executable, "-m", "service.cli", "translate", str(src), "-o", str(dst), "--model", args.model,
            "--threads", str(args.threads), "--progress", "lines", *search]


def summary_rate(stderr: str) -> float:
    """segments/s of the command's own summary line (the model load left out)."""
    return float(re.search(r"done: \S+ segments, ([\d.]+) segments/s", stderr).group(1))


def throughput(src: Path, tmp: Path, args) -> list[str]:
    """The command and the engine offline in turn, `rounds` times each (the machine is shared): the best wall rate
    of each, and segments per CPU second of the whole child (start-up and model load in both), which sharing the
    machine changes less."""
    import json

    search = ["--beam-size", str(args.beam_size)]
    n = len(src.read_text(encoding="utf-8").splitlines())
    rates, cpu, offline_rates, offline_cpu, offline_tokens = [], [], [], [], []
    for _ in range(args.rounds):
        _, err, _, _, seconds = run_child(command(src, tmp / "bulk.txt", args, search))
        rates.append(summary_rate(err))
        cpu.append(n / seconds)
        out, _, _, _, seconds = run_child([sys.executable, "-c", OFFLINE, str(src), args.model, str(args.threads),
                                           json.dumps({"beam_size": args.beam_size}), str(tmp / "offline.txt")])
        offline = json.loads(out)
        offline_rates.append(n / offline["wall"])
        offline_cpu.append(n / seconds)
        offline_tokens.append(offline["tokens"] / offline["wall"])
    same = (tmp / "bulk.txt").read_text(encoding="utf-8") == (tmp / "offline.txt").read_text(encoding="utf-8")

    def each(xs):
        return ", ".join(f"{x:.1f}" for x in xs)
    return [f"- throughput, {n} lines, beam {args.beam_size}, {args.rounds} alternating rounds; outputs "
            f"{'equal, line for line' if same else 'DIFFERENT'}",
            f"  - wall: command {each(rates)} segments/s (after its model load), engine offline "
            f"{each(offline_rates)} ({max(offline_tokens):.0f} tokens/s at best): best "
            f"**{max(rates) / max(offline_rates):.2f}x**",
            f"  - CPU: command {each(cpu)} segments per CPU second (the whole process), engine offline "
            f"{each(offline_cpu)}: best **{max(cpu) / max(offline_cpu):.2f}x**"]


def memory(data: list[str], tmp: Path, args) -> list[str]:
    lines, peaks = [], []
    for size in args.sizes:
        src = tmp / f"in-{size}.txt"
        src.write_text("".join(data[i % len(data)] + "\n" for i in range(size)), encoding="utf-8")
        _, err, wall, rss, _ = run_child(command(src, tmp / f"out-{size}.txt", args,
                                              ["--beam-size", str(args.beam_size), "--max-length",
                                               str(args.memory_max_length)]))
        peaks.append(rss)
        lines.append(f"- peak RSS, {size} lines (max_length {args.memory_max_length}): {rss:.0f} MiB "
                     f"({wall:.0f} s, {summary_rate(err):.0f} segments/s)")
    lines.append(f"- {args.sizes[-1]} lines / {args.sizes[0]} lines: **{peaks[-1] / peaks[0]:.3f}x** peak RSS")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, required=True, help="a TSV whose first column is German sentences")
    p.add_argument("--model", default="models/de-en")
    p.add_argument("--sizes", type=int, nargs=2, default=[5000, 50000])
    p.add_argument("--beam-size", type=int, default=1)
    p.add_argument("--memory-max-length", type=int, default=4)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--rounds", type=int, default=2, help="throughput: rounds of command and engine in turn")
    args = p.parse_args()
    from service.shared.text import split_sentences

    data = [line.split("\t")[0] for line in args.data.read_text(encoding="utf-8").splitlines() if line.strip()]
    data = [t for t in data if len(split_sentences(t)[0]) == 1]     # one sentence a line: the engine's unit
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        src = tmp / "throughput.txt"
        src.write_text("".join(t + "\n" for t in data[: args.sizes[0]]), encoding="utf-8")
        out = [f"## transerve translate vs the engine offline ({cpu_name()}, {os.cpu_count()} cores, "
               f"threads {args.threads or 'all'}, load average {os.getloadavg()[0]:.1f} at the start)", ""]
        out += throughput(src, tmp, args) + memory(data, tmp, args)
    print("\n".join(out))


if __name__ == "__main__":
    main()
