"""The served path's cost in CPU time: the CPU seconds of the server's whole process tree (from /proc) per request,
which waiting for a shared CPU does not inflate, beside wall-clock tok/s. For comparing two checkouts on a busy
machine, alternating their order round by round:

    python benchmarks/served_cpu.py --tree /work/wt-before --tree . --rounds 4

Each round starts `python -m service` from each tree (its own code) on the same package (int8 models/de-en by
default, `--workers 2 --threads 1`), sends 32 sentences one at a time, then 256 at 32 concurrent clients (beam 4),
as requests of one sentence each, or of K with `--per-request K` (a list of K texts a request, 256 requests all
the same; `1,8` runs both, as issue 50's bar asks: each figure is then per request of K).
With --by-process it also says where the CPU of the loaded part went: each process of the server's tree (its
inference workers, LitServe's manager process, which no request crosses since 2026-12-01, the HTTP process) and the
client's own (this process: a keep-alive socket per client thread, common.KeepAlive), in CPU ms per request. --data
takes the sentences from a TSV's first column (default: the tests' 64 Ding sentences). Then the same requests'
sentences in tokens per CPU second: through the engine offline (sorted batches of 16, one thread; alone, then in as
many processes at once as the server has workers, the figure the ratios use, as the workers share the cores), and
through one worker's scheduler driven as the worker loop drives it (16 requests in flight, no HTTP, no queues: what
the running batch costs itself). The last lines are the ceiling these cores leave served: the engine's CPU per
request offline over that plus what the rest of the served path (HTTP process, manager, client) took, the most
served can reach against the offline engine on cores they share even with workers as cheap as it. With --by-process
each round is followed by the engine offline measured again (as many processes at once as workers), and the round's
own ratios use that figure: these machines' speed drifts by 30% within a run, and a ratio whose two sides were
measured minutes apart measured the drift as much as the server.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from common import ROOT, SERVER_PROCESS_GROUP, KeepAlive, cpu_name, free_port, pairs64

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


def by_process(before: dict[int, float], wall: float, requests: int, client_cpu: float) -> tuple[str, dict]:
    """Each process's CPU ms a request, as lines, and summed by role (the client's as "client")."""
    lines, split = [], {"client": client_cpu / requests * 1000}
    for pid, c0 in before.items():
        used = cpu_seconds_of(pid) - c0
        if used > 0.005:
            split[role(pid)] = split.get(role(pid), 0.0) + used / requests * 1000
            lines.append(f"  pid {pid} {role(pid)}: {used / requests * 1000:.2f} CPU ms/request, "
                         f"{used / wall * 100:.0f}% of a core")
    lines.append(f"  client (this process): {split['client']:.2f} CPU ms/request, "
                 f"{client_cpu / wall * 100:.0f}% of a core")
    return "\n".join(lines), split


def ceiling(split: dict, tokens_per_request: float, offline_rate: float) -> str:
    """What served could reach against the engine offline on the same cores if the inference workers were as
    cheap as the offline engine: everything else the served path runs (the HTTP process, LitServe's manager,
    the client, which share the cores here as in vs_ctranslate2.py's served row) comes on top of the engine's
    own CPU per request."""
    engine_ms = tokens_per_request / offline_rate * 1000
    rest = sum(ms for name, ms in split.items() if name != "inference worker")
    workers = split.get("inference worker", 0.0)
    return (f"served ceiling on these cores: the engine offline {engine_ms:.2f} CPU ms/request, the rest of the "
            f"served path {rest:.2f} (workers now {workers:.2f}, {engine_ms / workers:.2f}x the engine's "
            f"efficiency): at most {engine_ms / (engine_ms + rest):.2f}x the engine offline with the workers "
            f"as cheap as it, {engine_ms / (workers + rest):.2f}x as measured")


def per_request(sentences: list[str], k: int, requests: int = 256) -> list[list[str]]:
    """`requests` requests of k sentences each, taken from the sentences in turn (so that with k > 1 the 32
    clients still send 8 requests each, and both workers stay busy to the end)."""
    n = len(sentences)
    return [[sentences[(i * k + j) % n] for j in range(k)] for i in range(requests)]


def measure(tree: Path, args: argparse.Namespace, sentences: list[str], k: int = 1) -> tuple[str, dict, float]:
    """The round's report, CPU ms a request by role (--by-process, else {}) and output tokens a request, each
    request k of the sentences (a list of k texts). Each client thread sends over a keep-alive connection of its
    own (common.KeepAlive, as vs_ctranslate2.py's served row): httpx cost the client about 1.5 CPU ms a request on
    cores the server shares."""
    proc, url = start(tree, args.package, args.workers, args.threads)
    port = int(url.rsplit(":", 1)[1])
    body = {"source_lang": "de", "target_lang": "en", "beam_size": 4, "max_length": 32}
    own, connections = threading.local(), []

    def one(texts: list[str]) -> int:
        if not hasattr(own, "connection"):
            own.connection = KeepAlive("127.0.0.1", port)
            connections.append(own.connection)
        status, out = own.connection.post_json("/translate", body | {"text": texts if k > 1 else texts[0]})
        if status != 200:
            raise RuntimeError(f"/translate answered {status}: {out}")
        return sum(t["output_tokens"] for t in out["translations"])
    requests = per_request(sentences, k, args.requests)
    try:
        [one(r) for r in requests[:8]]                        # warm-up
        c0 = cpu_seconds(proc.pid)
        [one(r) for r in requests[:32]]
        alone = (cpu_seconds(proc.pid) - c0) / 32 * 1000
        each = {pid: cpu_seconds_of(pid) for pid in process_tree(proc.pid)}
        c0, t0, me = cpu_seconds(proc.pid), time.perf_counter(), os.times()
        with cf.ThreadPoolExecutor(32) as pool:
            tokens = sum(pool.map(one, requests))
        wall, used = time.perf_counter() - t0, cpu_seconds(proc.pid) - c0
        client = sum(os.times()[:2]) - sum(me[:2])
        lines, split = by_process(each, wall, len(requests), client) if args.by_process else ("", {})
    finally:
        for c in connections:
            c.close()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    report = (f"{tree}, {k} sentence{'s' if k > 1 else ''} a request: alone {alone:.1f} CPU ms/request; under load "
              f"{used / len(requests) * 1000:.1f} CPU ms/request, {tokens / used:.0f} tokens per server CPU s, "
              f"{tokens / wall:.0f} tok/s wall; load avg {os.getloadavg()[0]:.1f}" + (f"\n{lines}" if lines else ""))
    return report, split, tokens / len(requests)


def offline(package: Path, sentences: list[str], batch: int = 16, processes: int = 1) -> float:
    """The same requests' sentences through the engine offline, sorted by length, in batches of `batch` (32 clients
    over 2 workers: 16 each), one onnxruntime thread, in `processes` processes at once (the served workers' count:
    one a core, as they run, since two busy processes on two cores each take more CPU for the same work than one
    alone; issue 50's bar measures the engine so): output tokens per CPU second, their mean. Alone too, first."""
    alone = offline_rate(package, sentences, batch)
    print(f"offline (Engine.search, batch {batch}, 1 thread, sorted), alone: {alone:.0f} tokens per CPU s", flush=True)
    if processes == 1:
        return alone
    rates = side_by_side(package, sentences, processes, batch)
    rate = sum(rates) / len(rates)
    print(f"offline, {processes} processes at once (one a core, as the workers run): {rate:.0f} tokens per CPU s "
          f"({', '.join(f'{r:.0f}' for r in rates)})", flush=True)
    return rate


def side_by_side(package: Path, sentences: list[str], processes: int, batch: int = 16) -> list[float]:
    """Each process's rate (offline_rate) with `processes` of them running at once."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        return pool.starmap(offline_rate, [(package, sentences, batch)] * processes)


def offline_rate(package: Path, sentences: list[str], batch: int) -> float:
    """One process's output tokens per CPU second through Engine.search, the best of 2."""
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
    return best


def scheduled(package: Path, sentences: list[str], clients: int = 16, k: int = 1) -> float:
    """The same requests through one worker's scheduler in this process (service/worker/scheduler.py, as the
    worker loop drives it: no HTTP, no queues), `clients` requests in flight (32 clients over 2 workers: 16
    each), each answered request replaced by the next at once, each request k sentences: output tokens per CPU
    second, the best of 2.
    Against `offline`: what the running batch costs itself (encoding arrivals a few at a time, joining,
    the cache's relayout for rows at different positions)."""
    from service.config import Settings
    from service.inference.engine import Engine
    from service.shared.options import SearchOptions
    from service.worker.cancel import CancelBoard
    from service.worker.translate_scheduler import Job, TranslationScheduler, request_cost

    engine, options = Engine(package, intra_op_threads=1), SearchOptions(beam_size=4, max_length=32)
    ids_of = dict(zip(sentences, engine.source_ids(sentences, "en")))
    ids = [[ids_of[s] for s in texts] for texts in per_request(sentences, k)]

    def job(i: int) -> Job:
        return Job(str(i), engine.package.name, "de", "en", options, ids[i], [(j, j + 1) for j in range(len(ids[i]))],
                   [[] for _ in ids[i]], time.monotonic(), 0, request_cost(sum(map(len, ids[i])), 4))
    best = 0.0
    for _ in range(2):
        scheduler = TranslationScheduler({engine.package.name: engine}, CancelBoard(), Settings().max_batch_tokens)
        waiting = iter(range(clients, len(ids)))
        c0, tokens = time.process_time(), 0
        scheduler.admit({i: job(i) for i in range(clients)})
        while scheduler.busy:
            scheduler.step()
            answered = scheduler.take_finished()
            tokens += sum(len(h[0].tokens) for _, j in answered for h in j.hyps)
            scheduler.admit({i: job(i) for i in (next(waiting, None) for _ in answered) if i is not None})
        best = max(best, tokens / (time.process_time() - c0))
    print(f"scheduled (one worker's TranslationScheduler in this process, {clients} requests of {k} in flight, "
          f"1 thread): {best:.0f} tokens per CPU s", flush=True)
    return best


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
    p.add_argument("--requests", type=int, default=256, help="requests under load a round (default 256: about a "
                   "second of load on 2 cores; more for steadier per-process figures)")
    p.add_argument("--per-request", default="1", help="sentences a request, comma-separated runs (default 1; "
                   "issue 50's bar: 1,8)")
    args = p.parse_args(argv)
    trees = [t.resolve() for t in args.tree or [ROOT]]
    args.package = args.package.resolve()
    print(f"CPU: {cpu_name()}; package {args.package}", flush=True)
    sentences = ([line.split("\t")[0] for line in args.data.read_text(encoding="utf-8").splitlines()][:64]
                 if args.data else [de for de, _ in pairs64()])
    sizes = [int(k) for k in args.per_request.split(",")]
    splits = {}
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            for k in sizes:
                report, split, tokens_per_request = measure(tree, args, sentences, k)
                splits[tree, k] = split, tokens_per_request
                print(report, flush=True)
                if args.by_process:   # the machine's speed drifts within a run: the engine measured beside each round
                    rates = side_by_side(args.package, sentences, args.workers)
                    now = sum(rates) / len(rates)
                    print(f"  this round: engine offline just after, {now:.0f} tokens per CPU s; "
                          f"{ceiling(split, tokens_per_request, now)}", flush=True)
    if args.by_process:
        rate = offline(args.package, sentences, processes=args.workers)
        for k in sizes:
            scheduled(args.package, sentences, k=k)
            for tree in trees:
                print(f"{k} sentence{'s' if k > 1 else ''} a request, {tree}'s last round's "
                      f"{ceiling(*splits[tree, k], rate)}", flush=True)


if __name__ == "__main__":
    main()
