"""The served path's cost in CPU time: the CPU seconds of the server's whole process tree (from /proc) per request,
which waiting for a shared CPU does not inflate, beside wall-clock tok/s. For comparing two checkouts on a busy
machine, alternating their order round by round:

    python benchmarks/served_cpu.py --tree /work/wt-before --tree . --rounds 4

Each round starts `python -m service` from each tree (its own code) on the same package (int8 models/de-en by
default, `--workers 2 --threads 1`), sends 32 sentences one at a time, then 256 at 32 concurrent clients (beam 4).
With --by-process it also says where the CPU of the loaded part went: each process of the server's tree (its
inference workers, LitServe's manager process that carries its queues, the HTTP process) and the client's own
(this process: httpx in 32 threads), in CPU ms per request. --data takes the sentences from a TSV's first column
(default: the tests' 64 Ding sentences); the last line is then the engine's own figure for the same requests'
sentences offline, in tokens per CPU second, beside the served tokens per server CPU second.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from common import ROOT, SERVER_PROCESS_GROUP, cpu_name, free_port, pairs64

TICK = os.sysconf("SC_CLK_TCK")


def process_tree(root: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kids.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [root], [root]
    while todo:
        for kid in kids.get(todo.pop(), []):
            out.append(kid)
            todo.append(kid)
    return out


def cpu_seconds(root: int) -> float:
    """User + system CPU seconds of every live process in root's tree."""
    return sum(cpu_seconds_of(pid) for pid in process_tree(root))


def cpu_seconds_of(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def start(tree: Path, package: Path, workers: int, threads: int) -> tuple[subprocess.Popen, str]:
    import httpx

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "service", "--model", str(package), "--port", str(port),
                             "--workers", str(workers), "--threads", str(threads), "--device", "cpu",
                             "--max-batch-size", "32"], cwd=tree, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, **SERVER_PROCESS_GROUP)
    url = f"http://127.0.0.1:{port}"
    for _ in range(360):
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGTERM)
    raise RuntimeError(f"the service from {tree} did not become ready")


def role(pid: int) -> str:
    """What a process of the server's tree is: LitServe spawns its inference workers and forks the HTTP process
    and the manager (whose threads serve each connection to its queues: the most threads of the forks)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        threads = len(list(Path(f"/proc/{pid}/task").iterdir()))
    except OSError:
        return "gone"
    if b"spawn_main" in cmd:
        return "inference worker"
    if b"resource_tracker" in cmd:
        return "resource tracker"
    return f"forked ({threads} threads)"


def by_process(before: dict[int, float], wall: float, requests: int, client_cpu: float) -> str:
    lines = []
    for pid, c0 in before.items():
        used = cpu_seconds_of(pid) - c0
        if used > 0.005:
            lines.append(f"  pid {pid} {role(pid)}: {used / requests * 1000:.2f} CPU ms/request, "
                         f"{used / wall * 100:.0f}% of a core")
    lines.append(f"  client (this process): {client_cpu / requests * 1000:.2f} CPU ms/request, "
                 f"{client_cpu / wall * 100:.0f}% of a core")
    return "\n".join(lines)


def measure(tree: Path, args: argparse.Namespace, sentences: list[str]) -> str:
    import httpx

    proc, url = start(tree, args.package, args.workers, args.threads)
    body = {"source_lang": "de", "target_lang": "en", "beam_size": 4, "max_length": 32}
    try:
        with httpx.Client(timeout=120, limits=httpx.Limits(max_connections=32)) as client:
            def one(text: str) -> int:
                r = client.post(url + "/translate", json=body | {"text": text})
                r.raise_for_status()
                return r.json()["translations"][0]["output_tokens"]
            [one(t) for t in sentences[:8]]                       # warm-up
            c0 = cpu_seconds(proc.pid)
            [one(t) for t in sentences[:32]]
            alone = (cpu_seconds(proc.pid) - c0) / 32 * 1000
            each = {pid: cpu_seconds_of(pid) for pid in process_tree(proc.pid)}
            c0, t0, me = cpu_seconds(proc.pid), time.perf_counter(), os.times()
            with cf.ThreadPoolExecutor(32) as pool:
                tokens = sum(pool.map(one, sentences * 4))
            wall, used = time.perf_counter() - t0, cpu_seconds(proc.pid) - c0
            client = sum(os.times()[:2]) - sum(me[:2])
            split = by_process(each, wall, 4 * len(sentences), client) if args.by_process else ""
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    return (f"{tree}: alone {alone:.1f} CPU ms/request; under load {used / (4 * len(sentences)) * 1000:.1f} CPU "
            f"ms/request, {tokens / used:.0f} tokens per server CPU s, {tokens / wall:.0f} tok/s wall; "
            f"load avg {os.getloadavg()[0]:.1f}" + (f"\n{split}" if split else ""))


def offline(package: Path, sentences: list[str], batch: int = 16) -> str:
    """The same requests' sentences through the engine in this process, sorted by length, in batches of `batch`
    (32 clients over 2 workers: 16 each), one onnxruntime thread: output tokens per CPU second, the best of 2."""
    from service.inference.engine import Engine
    from service.shared.options import SearchOptions

    engine, options = Engine(package, intra_op_threads=1), SearchOptions(beam_size=4, max_length=32)
    ids = sorted(engine.source_ids(sentences * 4, "en"), key=len)
    best = 0.0
    for _ in range(2):
        c0, tokens = time.process_time(), 0
        for i in range(0, len(ids), batch):
            tokens += sum(len(h[0].tokens) for h in engine.search(ids[i:i + batch], options))
        best = max(best, tokens / (time.process_time() - c0))
    return f"offline (Engine.search, batch {batch}, 1 thread, sorted): {best:.0f} tokens per CPU s"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", type=Path, action="append", help="a checkout to serve from (repeatable; default: "
                   "this one)")
    p.add_argument("--package", type=Path, default=ROOT / "models" / "de-en")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--by-process", action="store_true", help="where the loaded part's CPU went, process by process")
    p.add_argument("--data", type=Path, help="sentences: a TSV's first column, the first 64 (default: the tests' 64)")
    args = p.parse_args(argv)
    trees = [t.resolve() for t in args.tree or [ROOT]]
    args.package = args.package.resolve()
    print(f"CPU: {cpu_name()}; package {args.package}", flush=True)
    sentences = ([line.split("\t")[0] for line in args.data.read_text(encoding="utf-8").splitlines()][:64]
                 if args.data else [de for de, _ in pairs64()])
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            print(measure(tree, args, sentences), flush=True)
    if args.by_process:
        print(offline(args.package, sentences), flush=True)


if __name__ == "__main__":
    main()
