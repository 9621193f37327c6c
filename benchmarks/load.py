"""Load test of the real server with locust (headless): capacity, a steady soak, then 3x overload.

    pip install -e '.[load]'
    python benchmarks/load.py --soak-minutes 10 --out benchmarks/results/load-cpu.md
    python benchmarks/load.py --soak-minutes 1              # a quick look

It starts `python -m service` on the committed models/de-en (or --model), then runs four phases,
each with locust users posting one German sentence (the tests' 64 Ding sentences) to /translate:

    capacity   closed loop, --users users, no think time: the throughput the server sustains
    soak       an open rate of --soak-load x capacity for --soak-minutes; the server's memory (PSS of
               the process tree, so workers' shared pages count once) sampled every 10 s
    overload   --overload x capacity for --overload-seconds: the excess must be refused fast
               (429/503 with Retry-After), everything else answered, nothing else 5xx
    recovery   back to the soak rate: the service must answer everything again

It prints (and with --out writes) one table per phase: requests/s, p50/p95/p99 latency, error rate,
status counts; for the soak, memory over time and its growth after warm-up (the first minute, or
the first tenth of a shorter soak; the mean of the last minute's samples over the first minute's).
Nothing is asserted: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import gevent
import psutil
from locust import FastHttpUser, constant, constant_throughput, task
from locust.env import Environment

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from common import SERVER_PROCESS_GROUP, free_port, pairs64  # noqa: E402

SENTENCES = [de for de, _ in pairs64()]


class Translator(FastHttpUser):
    wait_time = constant(0)

    @task
    def translate(self):
        body = {"text": random.choice(SENTENCES), "source_lang": "de", "target_lang": "en"}
        with self.client.post("/translate", json=body, catch_response=True, name="translate") as r:
            r.success()  # statuses are judged by the phase, not by locust


class Phase:
    """Every answer of one phase: (status, seconds, has Retry-After)."""

    def __init__(self, name: str):
        self.name, self.rows, self.start, self.seconds = name, [], time.monotonic(), 0.0

    def on_request(self, response_time, response=None, exception=None, **_):
        status = getattr(response, "status_code", 0) or 0
        retry = bool(response is not None and response.headers and response.headers.get("retry-after"))
        self.rows.append((status if exception is None or status else 0, response_time / 1000, retry))

    def summary(self) -> dict:
        ok = sorted(s for st, s, _ in self.rows if st == 200)
        shed = [(s, r) for st, s, r in self.rows if st in (429, 503)]
        def q(xs, p):
            return xs[min(len(xs) - 1, int(p * len(xs)))] * 1000 if xs else float("nan")
        n = len(self.rows)
        return {"phase": self.name, "seconds": self.seconds, "requests": n, "rps": n / self.seconds,
                "ok_rps": len(ok) / self.seconds, "p50": q(ok, 0.5), "p95": q(ok, 0.95), "p99": q(ok, 0.99),
                "errors": sum(st != 200 for st, _, _ in self.rows) / max(1, n),
                "statuses": dict(Counter(st for st, _, _ in self.rows)),
                "shed_p99": q(sorted(s for s, _ in shed), 0.99),
                "shed_with_retry_after": sum(r for _, r in shed), "shed": len(shed),
                "other_5xx": sum(st >= 500 and st != 503 for st, _, _ in self.rows),
                "no_answer": sum(st == 0 for st, _, _ in self.rows)}


def tree_pss_mb(pid: int) -> float:
    total = 0
    try:
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            try:
                total += p.memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
    except psutil.NoSuchProcess:
        return float("nan")
    return total / 2**20


def run_phase(host: str, name: str, users: int, seconds: float, rate: float | None,
              sample=None) -> Phase:
    """`users` users for `seconds`; with `rate`, an open rate of `rate` requests/s in total."""
    phase = Phase(name)
    Translator.wait_time = constant_throughput(rate / users) if rate else constant(0)
    env = Environment(user_classes=[Translator], host=host)
    env.events.request.add_listener(phase.on_request)
    runner = env.create_local_runner()
    # Users start over 5 s, so their paced requests do not arrive in lock-step bursts.
    runner.start(users, spawn_rate=max(1.0, users / 5))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if sample:
            sample()
        gevent.sleep(min(10.0, max(0.0, end - time.monotonic())))
    runner.quit()
    phase.seconds = time.monotonic() - phase.start
    return phase

@dataclass
class LoadRun:
    """The four phases' answers, the rates they were run at, and the soak's memory samples (s, MB)."""

    phases: list[Phase]
    capacity: float
    soak_rate: float
    over_rate: float
    memory: list[tuple[float, float]]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(ROOT / "models" / "de-en"))
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--max-queue", type=int, default=64, help="the server's --max-queue (its shedding bound)")
    p.add_argument("--users", type=int, default=16, help="closed-loop users of the capacity phase")
    p.add_argument("--capacity-seconds", type=float, default=60)
    p.add_argument("--soak-minutes", type=float, default=10)
    p.add_argument("--soak-load", type=float, default=0.5, help="soak rate as a fraction of capacity")
    p.add_argument("--overload", type=float, default=3.0, help="overload rate as a multiple of capacity")
    p.add_argument("--overload-seconds", type=float, default=90)
    p.add_argument("--recovery-seconds", type=float, default=60)
    p.add_argument("--out", type=Path)
    return p.parse_args(argv)


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    """`python -m service` on a free port, in its own process group; -> the process and its base URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "service", "--model", args.model, "--port", str(port), "--threads",
           str(args.threads), "--max-queue", str(args.max_queue)]
    server = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              **SERVER_PROCESS_GROUP)
    return server, f"http://127.0.0.1:{port}"


def wait_ready(host: str, server: subprocess.Popen) -> None:
    import urllib.request          # here, as locust has monkey-patched ssl by now

    deadline = time.time() + 180
    while True:
        try:
            if urllib.request.urlopen(host + "/ready", timeout=2).status == 200:
                break
        except OSError:
            if time.time() > deadline or server.poll() is not None:
                raise SystemExit("the server did not become ready") from None
            time.sleep(0.5)


def run_phases(host: str, server: subprocess.Popen, args: argparse.Namespace) -> LoadRun:
    """Capacity (closed loop), then soak, overload and recovery at rates relative to it."""
    cap = run_phase(host, "capacity", args.users, args.capacity_seconds, None)
    capacity = cap.summary()["ok_rps"]
    print(f"capacity: {capacity:.1f} requests/s", flush=True)

    memory: list[tuple[float, float]] = []
    t0 = time.monotonic()
    soak_rate = args.soak_load * capacity
    users = max(4, int(soak_rate * 2))
    soak = run_phase(host, "soak", users, args.soak_minutes * 60, soak_rate,
                     sample=lambda: memory.append((time.monotonic() - t0, tree_pss_mb(server.pid))))
    over_rate = args.overload * capacity
    # Enough users that the offered rate holds while each waits out its own request.
    overload = run_phase(host, "overload", max(32, int(over_rate * 4)), args.overload_seconds, over_rate)
    recovery = run_phase(host, "recovery", users, args.recovery_seconds, soak_rate)
    return LoadRun([cap, soak, overload, recovery], capacity, soak_rate, over_rate, memory)


def memory_growth(memory: list[tuple[float, float]], soak_minutes: float) -> tuple[float, int, float]:
    """-> the warm-up (s), the k samples averaged at each end, and the growth of the last k over the first k."""
    warm = soak_minutes * 60 / 10 if soak_minutes < 10 else 60.0
    # Mean of the last minute against the first minute after warm-up: single samples jitter by a few %.
    after = [mb for t, mb in memory if t >= warm]
    k = max(1, min(6, len(after) // 2))
    growth = (sum(after[-k:]) / k) / (sum(after[:k]) / k) - 1 if len(after) >= 2 else float("nan")
    return warm, k, growth


def report(run: LoadRun, args: argparse.Namespace, argv) -> str:
    warm, k, growth = memory_growth(run.memory, args.soak_minutes)
    rows = [ph.summary() for ph in run.phases]
    lines = [f"- command: `python benchmarks/load.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
             f"- date: {datetime.date.today()}; machine: {platform.machine()}, {os.cpu_count()} logical CPUs; "
             f"server: `python -m service --model {args.model} --threads {args.threads} --max-queue {args.max_queue}`",
             f"- model: {args.model}; one sentence per request, beam 4; capacity {run.capacity:.1f} requests/s; "
             f"soak at {run.soak_rate:.1f}/s, overload at {run.over_rate:.1f}/s offered", "",
             "| phase | s | requests | req/s | answered 200/s | p50 ms | p95 ms | p99 ms | non-200 | statuses |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['phase']} | {r['seconds']:.0f} | {r['requests']} | {r['rps']:.1f} | {r['ok_rps']:.1f} | "
                     f"{r['p50']:.0f} | {r['p95']:.0f} | {r['p99']:.0f} | {r['errors']:.1%} | "
                     f"{', '.join(f'{k}: {v}' for k, v in sorted(r['statuses'].items()))} |")
    over, recovery, soak = rows[2], rows[3], rows[1]
    lines += ["", f"- overload: {over['shed']} requests refused (429/503), {over['shed_with_retry_after']} of them "
              f"with Retry-After, p99 {over['shed_p99']:.0f} ms to the refusal; other 5xx: {over['other_5xx']}; "
              f"no answer: {over['no_answer']}",
              f"- recovery: {recovery['errors']:.1%} non-200, p50 {recovery['p50']:.0f} ms "
              f"(soak p50 {soak['p50']:.0f} ms)",
              "- soak memory (PSS of the server's processes, MB), every ~10 s: "
              + ", ".join(f"{mb:.0f}" for _, mb in run.memory),
              f"- soak memory growth after warm-up ({warm:.0f} s), the mean of the last {k} samples over the "
              f"first {k}: {growth:+.1%}"]
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    server, host = start_server(args)
    try:
        wait_ready(host, server)
        run = run_phases(host, server, args)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    text = report(run, args, argv)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("# Load test (CPU)\n\n" + text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
