"""Serving load benchmark: the real server under open-loop (Poisson) and closed-loop load, as vLLM's
benchmark_serving measures a server, for /translate and streamed /generate.

    python benchmarks/serving.py --out benchmarks/results/serving-cpu.md --title "main at abc1234"
    python benchmarks/serving.py --layouts 2x1 --endpoints translate --seconds 10     # a quick look
    python benchmarks/serving.py --url http://127.0.0.1:8000 --endpoints generate     # a server already up
    python benchmarks/serving.py --server-dir /tmp/before ...    # the server of another checkout, same client

For each layout (--layouts, WORKERSxTHREADS: `python -m service --workers W --threads T`, on 127.0.0.1, both
committed packages, models/de-en and models/lm-small, or --model) and each endpoint:

    closed loop   N clients (--concurrency, default 1, 8 and 32), each sending its next request as soon as
                  its last is answered, for --seconds. 1 client is "alone": one request at a time. The most
                  requests/s of these runs is the saturation rate.
    open loop     requests sent at random times, whether or not earlier ones are answered (a Poisson
                  process: exponential gaps; --burstiness B draws them from a gamma distribution of shape B
                  instead, as vLLM's --burstiness), at --rates times the saturation rate (default 0.25, 0.5,
                  0.75, 1.0 and 1.5: up to and past saturation) for --seconds each; every request sent is
                  waited for.

Requests: one sentence each, in turn, from the first column of --data (default: the German side of
tests/fixtures/pairs64.tsv, the tests' 64 Ding sentences). /translate: de->en, beam --beam-size (4).
/generate: the sentence as the prompt, `stream: true` (server-sent events), --max-new-tokens pieces
(min_new_tokens the same, so every request writes as many: vLLM's ignore_eos), sampled (temperature 1)
with the request's number as its seed.

Figures (vLLM's definitions; percentiles numpy's, linear): req/s and output tok/s are the requests
answered 200 and the output tokens they report (/translate: output_tokens, eos excluded; /generate:
usage.completion_tokens) over the time from the first request sent to the last answer; latency is
request sent to its answer's last byte; time to first token (TTFT), from sending to the first token
event; inter-token latency (ITL), between consecutive token events of a stream, all streams pooled;
time per output token (TPOT), a stream's (latency - TTFT) / (tokens - 1). `lag` is how late the open loop
sent its requests on average (the client shares the CPUs: a large lag means the offered rate was not
offered). Statuses other than 200 (e.g. 503 once --max-queue requests wait, 408 when a starved client sent
its headers too slowly) and requests with no answer (named by the client's exception, e.g. a connection the
server closed beyond its --max-connections) are counted, not timed. `load 1 min` is the load average as each
run ended: on a shared machine it says which figures other processes disturbed. `client waited %` is the time
the client's threads spent runnable but waiting for a CPU (Linux's schedstat), as a share of the run: where it
is large, the figures include the client's own wait behind the server, which a client on another machine does
not have (benchmarks/common.py's SERVER_PROCESS_GROUP says when it was).

Every table names the CPU (model name, AVX-512/VNNI flags), its cores and the load average. The client runs
on the same machine as the server (httpx, asyncio, one process, one connection per client: see Connections):
on a small machine it takes some of the CPU the server would have.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import shlex
import signal
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

import httpx
import numpy as np

from common import ROOT, SERVER_PROCESS_GROUP, cpu_facts, describe_cpu, free_port, pairs64

ENDPOINTS = ("translate", "generate")
OPEN_LOOP_CONNECTIONS = 64   # made before an open loop starts (more are made when more requests are in flight)


@dataclass
class Result:
    """One request as the client saw it (perf_counter seconds)."""
    status: int
    sent: float
    latency: float = 0.0
    tokens: int = 0
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    lag: float = 0.0                      # open loop: how late it was sent
    error: str = ""                       # status 0: the client's exception (the connection failed or closed)


@dataclass
class Run:
    """One load run: its label, its results, and its wall time (first sent to last answered)."""
    mode: str
    load: str
    results: list[Result]
    wall: float
    client_wait: float = 0.0              # seconds the client's threads waited for a CPU (run_queue_wait)


Send = Callable[[httpx.AsyncClient, int], Awaitable[Result]]


def run_queue_wait() -> float:
    """Seconds this process's threads have waited, runnable, for a CPU (/proc/self/task/*/schedstat; 0 where there
    is none). A thread that ended takes its share with it: the client's threads live as long as the run."""
    total = 0
    for task in Path("/proc/self/task").glob("*/schedstat"):
        try:
            total += int(task.read_text().split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


def read_texts(data: Path | None) -> list[str]:
    if data is None:
        return [de for de, _ in pairs64()]
    return [line.split("\t")[0] for line in data.read_text(encoding="utf-8").splitlines() if line.strip()]


def translate_sender(url: str, texts: list[str], beam: int) -> Send:
    async def send(client: httpx.AsyncClient, i: int) -> Result:
        body = {"text": texts[i % len(texts)], "source_lang": "de", "target_lang": "en", "beam_size": beam}
        r = Result(0, time.perf_counter())
        try:
            answer = await client.post(url + "/translate", json=body)
        except httpx.HTTPError as e:
            r.error = type(e).__name__
            return r
        r.status, r.latency = answer.status_code, time.perf_counter() - r.sent
        if r.status == 200:
            r.tokens = answer.json()["translations"][0]["output_tokens"]
        return r
    return send


async def read_stream(answer: httpx.Response, r: Result) -> None:
    """The token events' times into r (TTFT, ITL) and the done event's token count."""
    last = None
    async for line in answer.aiter_lines():
        if not line.startswith("data: "):
            continue
        now, event = time.perf_counter(), json.loads(line[6:])
        if event.get("type") == "token":
            if last is None:
                r.ttft = now - r.sent
            else:
                r.itl.append(now - last)
            last = now
        elif event.get("type") == "done":
            r.tokens = event["usage"]["completion_tokens"]
        elif event.get("type") == "error":
            r.status = 500


def generate_sender(url: str, texts: list[str], new_tokens: int) -> Send:
    async def send(client: httpx.AsyncClient, i: int) -> Result:
        body = {"prompt": texts[i % len(texts)], "max_new_tokens": new_tokens, "min_new_tokens": new_tokens,
                "seed": i, "stream": True}
        r = Result(0, time.perf_counter())
        try:
            async with client.stream("POST", url + "/generate", json=body) as answer:
                r.status = answer.status_code
                if r.status == 200:
                    await read_stream(answer, r)
                else:
                    await answer.aread()
        except httpx.HTTPError as e:
            r.status, r.error = 0, type(e).__name__
        r.latency = time.perf_counter() - r.sent
        return r
    return send


async def closed_loop(send: Send, clients: int, seconds: float) -> Run:
    """`clients` clients, each sending its next request when its last is answered, until `seconds` are over."""
    counter = iter(range(10**9))
    results: list[Result] = []
    async with Connections() as connections:
        own = [connections.take() for _ in range(clients)]
        t0, waited = time.perf_counter(), run_queue_wait()
        end = t0 + seconds

        async def one_client(client: httpx.AsyncClient) -> None:
            while time.perf_counter() < end:
                results.append(await send(client, next(counter)))
        await asyncio.gather(*(one_client(c) for c in own))
        wall, waited = time.perf_counter() - t0, run_queue_wait() - waited
    return Run("closed", f"{clients} client{'s' * (clients > 1)}", results, wall, waited)


def arrival_times(rate: float, seconds: float, burstiness: float, seed: int) -> np.ndarray:
    """Send times (s from the start) of an open loop at `rate` requests/s on average: gaps drawn from a gamma
    distribution of shape `burstiness` and mean 1/rate (shape 1: exponential, a Poisson process)."""
    rng = np.random.default_rng(seed)
    n = max(1, int(round(rate * seconds)))
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    return np.cumsum(gaps) - gaps[0]


async def open_loop(send: Send, rate: float, seconds: float, burstiness: float, seed: int = 0) -> Run:
    """Requests sent at arrival_times(), each whether or not the earlier ones are answered; waits for all."""
    times = arrival_times(rate, seconds, burstiness, seed)
    async with Connections() as connections:
        connections.give(*[connections.take() for _ in range(min(len(times), OPEN_LOOP_CONNECTIONS))])
        t0, waited = time.perf_counter(), run_queue_wait()

        async def at(i: int, when: float) -> Result:
            await asyncio.sleep(max(0.0, t0 + when - time.perf_counter()))
            client = connections.take()
            try:
                r = await send(client, i)
            finally:
                connections.give(client)
            r.lag = r.sent - (t0 + when)
            return r
        results = await asyncio.gather(*(at(i, float(w)) for i, w in enumerate(times)))
        wall, waited = time.perf_counter() - t0, run_queue_wait() - waited
    return Run("open", f"{rate:.2f} req/s", list(results), wall, waited)


class Connections:
    """Clients of one connection each, as many as requests in flight: a closed-loop client keeps its own, an open-loop
    request takes an idle one (a new one when none is). One httpx.AsyncClient for all costs O(connections) per
    request in its pool (httpcore matches every waiting request against every connection): at 128 closed-loop
    clients it took 15.9 CPU ms a request and most of a core, against 2.6 ms for a client per connection, and
    the server, its workers niced below the client, answered 59 req/s instead of 189 (one machine, 2 cores)."""

    def __init__(self):
        self.idle: list[httpx.AsyncClient] = []
        self.made: list[httpx.AsyncClient] = []
        self.tls = ssl.create_default_context()     # shared: a context of its own costs each client milliseconds

    def take(self) -> httpx.AsyncClient:
        if self.idle:
            return self.idle.pop()
        client = httpx.AsyncClient(timeout=httpx.Timeout(600.0), verify=self.tls,
                                   limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))
        self.made.append(client)
        return client

    def give(self, *clients: httpx.AsyncClient) -> None:
        self.idle += clients

    async def __aenter__(self) -> "Connections":
        return self

    async def __aexit__(self, *exc) -> None:
        await asyncio.gather(*(c.aclose() for c in self.made))


def percentiles(xs: list[float]) -> tuple[float, float, float]:
    """p50, p95, p99 in ms (nan when there is nothing)."""
    if not xs:
        return (float("nan"),) * 3
    return tuple(float(v) * 1000 for v in np.percentile(np.asarray(xs), [50, 95, 99]))


def summarize(run: Run) -> dict:
    ok = [r for r in run.results if r.status == 200]
    statuses: dict[str, int] = {}
    for r in run.results:
        what = str(r.status) if r.status else f"no answer ({r.error})"
        statuses[what] = statuses.get(what, 0) + 1
    tpot = [(r.latency - r.ttft) / (r.tokens - 1) for r in ok if r.ttft is not None and r.tokens > 1]
    return {"mode": run.mode, "load": run.load, "sent": len(run.results), "ok": len(ok),
            "other": ", ".join(f"{s}: {n}" for s, n in sorted(statuses.items()) if s != "200") or "-",
            "req_s": len(ok) / run.wall, "tok_s": sum(r.tokens for r in ok) / run.wall,
            "latency": percentiles([r.latency for r in ok]),
            "ttft": percentiles([r.ttft for r in ok if r.ttft is not None]),
            "itl": percentiles([x for r in ok for x in r.itl]), "tpot": percentiles(tpot),
            "lag_ms": 1000 * float(np.mean([r.lag for r in run.results])) if run.mode == "open" else 0.0,
            "client_wait_pct": 100 * run.client_wait / run.wall, "loadavg": os.getloadavg()[0]}


def fmt(values: tuple[float, float, float]) -> str:
    return " / ".join("-" if v != v else f"{v:,.0f}" if v >= 100 else f"{v:.1f}" for v in values)


def table(rows: list[dict], generation: bool) -> list[str]:
    head = "| mode | load | sent | 200 | other statuses | req/s | output tok/s | latency p50 / p95 / p99 ms |"
    rule = "|---|---|---:|---:|---|---:|---:|---:|"
    if generation:
        head += " TTFT p50 / p95 / p99 ms | ITL p50 / p95 / p99 ms | TPOT p50 / p95 / p99 ms |"
        rule += "---:|---:|---:|"
    lines = [head + " send lag ms | client waited % | load 1 min |", rule + "---:|---:|---:|"]
    for r in rows:
        line = (f"| {r['mode']} | {r['load']} | {r['sent']} | {r['ok']} | {r['other']} | {r['req_s']:.1f} | "
                f"{r['tok_s']:,.0f} | {fmt(r['latency'])} |")
        if generation:
            line += f" {fmt(r['ttft'])} | {fmt(r['itl'])} | {fmt(r['tpot'])} |"
        lines.append(line + (f" {r['lag_ms']:.1f} |" if r["mode"] == "open" else " - |")
                     + f" {r['client_wait_pct']:.1f} | {r['loadavg']:.1f} |")
    return lines


def bar_lines(endpoint: str, rows: list[dict]) -> list[str]:
    """issue 36's bars, where this run measured what they compare: p50 at 0.75 x saturation over p50 alone;
    generation: TTFT p50 at 8 streams over a stream alone."""
    alone = next((r for r in rows if r["load"] == "1 client"), None)
    if alone is None:
        return []
    out = []
    at75 = next((r for r in rows if r.get("fraction") == 0.75), None)
    if at75 is not None:
        out.append(f"- open loop at 0.75 x saturation ({at75['load']}): latency p50 {at75['latency'][0]:.1f} ms, "
                   f"{at75['latency'][0] / alone['latency'][0]:.2f}x its p50 alone ({alone['latency'][0]:.1f} ms)")
    eight = next((r for r in rows if r["load"] == "8 clients"), None)
    if endpoint == "generate" and eight is not None:
        out.append(f"- 8 concurrent streams: TTFT p50 {eight['ttft'][0]:.1f} ms, "
                   f"{eight['ttft'][0] / alone['ttft'][0]:.2f}x a stream alone ({alone['ttft'][0]:.1f} ms)")
    return out


async def measure(endpoint: str, send: Send, args: argparse.Namespace) -> list[dict]:
    """Closed loops (saturation: the most req/s), then open loops at fractions of it."""
    await closed_loop(send, 4, args.warmup_seconds)          # warm-up, not reported
    rows = []
    for n in args.concurrency:
        rows.append(summarize(await closed_loop(send, n, args.seconds)))
        print(f"  {endpoint} closed {n}: {rows[-1]['req_s']:.1f} req/s", flush=True)
    saturation = max(r["req_s"] for r in rows)
    for k, fraction in enumerate(args.rates):
        run = await open_loop(send, fraction * saturation, args.seconds, args.burstiness, seed=k)
        run.load = f"{fraction:g} x sat. = {fraction * saturation:.1f} req/s"
        rows.append(summarize(run) | {"fraction": fraction})
        print(f"  {endpoint} open {run.load}: {rows[-1]['req_s']:.1f} req/s, "
              f"p50 {rows[-1]['latency'][0]:.0f} ms", flush=True)
    for r in rows:
        r["saturation"] = saturation
    return rows


def start_server(args: argparse.Namespace, workers: int, threads: int) -> tuple[subprocess.Popen, str, list[str]]:
    """`python -m service` on a free port of 127.0.0.1, in its own process group: (process, URL, command)."""
    port = free_port()
    cmd = [sys.executable, "-m", "service", *[a for m in args.model for a in ("--model", m)], "--host", "127.0.0.1",
           "--port", str(port), "--workers", str(workers), "--threads", str(threads), *args.server_arg]
    proc = subprocess.Popen(cmd, cwd=args.server_dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            **SERVER_PROCESS_GROUP)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return proc, url, cmd
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    stop_server(proc)
    raise SystemExit(f"the server did not become ready: {' '.join(cmd)}")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)     # drains, then every process of the server ends
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def senders(url: str, args: argparse.Namespace) -> dict[str, Send]:
    texts = read_texts(args.data)
    return {"translate": translate_sender(url, texts, args.beam_size),
            "generate": generate_sender(url, texts, args.max_new_tokens)}


def server_layout(url: str) -> str:
    settings = httpx.get(url + "/info", timeout=10).json().get("settings", {})
    return f"{settings.get('workers', '?')} worker(s) x {settings.get('threads', '?')} thread(s)"


def measure_layout(args: argparse.Namespace, layout: str | None) -> list[str]:
    """Every endpoint on one server (started here for a layout, or --url): its Markdown section."""
    proc = None
    if layout:
        workers, threads = (int(x) for x in layout.split("x"))
        proc, url, cmd = start_server(args, workers, threads)
        what = f"`{' '.join(['python', *cmd[1:]])}`" + (f" in {args.server_dir}" if args.server_dir != ROOT else "")
    else:
        url, what = args.url.rstrip("/"), f"{args.url} (already running)"
    try:
        name = layout_name(layout, url)
        print(f"{name}: {what}", flush=True)
        lines = [f"### {name}", "", f"- server: {what}", ""]
        send = senders(url, args)
        for endpoint in args.endpoints:
            rows = asyncio.run(measure(endpoint, send[endpoint], args))
            lines += endpoint_section(endpoint, rows, args)
    finally:
        if proc is not None:
            stop_server(proc)
    return lines


def layout_name(layout: str | None, url: str) -> str:
    if layout:
        workers, threads = layout.split("x")
        return f"{workers} worker{'s' * (workers != '1')} x {threads} thread{'s' * (threads != '1')}"
    return server_layout(url)


def endpoint_section(endpoint: str, rows: list[dict], args: argparse.Namespace) -> list[str]:
    what = (f"/translate, one sentence a request, de->en, beam {args.beam_size}" if endpoint == "translate" else
            f"/generate, stream: true, one sentence as the prompt, {args.max_new_tokens} pieces, sampled")
    lines = [f"#### {what}", "", f"CPU: {describe_cpu(cpu_facts())}; load average (1 min) now "
             f"{os.getloadavg()[0]:.2f}. Saturation (most req/s of the closed loops): {rows[0]['saturation']:.1f} "
             "req/s.", ""]
    lines += table(rows, endpoint == "generate") + [""]
    bars = bar_lines(endpoint, rows)
    return lines + (bars + [""] if bars else [])


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="a server already running (its layout is read from /info); else one is started "
                   "per --layouts")
    p.add_argument("--layouts", default="2x1,1x2", help="WORKERSxTHREADS,... (default 2x1,1x2)")
    p.add_argument("--model", action="append", help="packages to serve (default models/de-en and models/lm-small)")
    p.add_argument("--server-arg", action="append", default=[], help="another argument for `python -m service` "
                   "(repeatable; --server-arg=--max-queue=1024)")
    p.add_argument("--server-dir", type=Path, default=ROOT, help="the checkout whose `python -m service` runs "
                   "(default this one): before and after measured with the same client (e.g. a `git archive` "
                   "of the commit before, models/ included)")
    p.add_argument("--endpoints", default="translate,generate")
    p.add_argument("--data", type=Path, help="TSV whose first column is the German text (default: the tests' 64 "
                   "Ding sentences)")
    p.add_argument("--concurrency", default="1,8,32", help="closed-loop clients, each a run (1: alone)")
    p.add_argument("--rates", default="0.25,0.5,0.75,1,1.5", help="open-loop rates as fractions of saturation")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps (1: Poisson)")
    p.add_argument("--seconds", type=float, default=15.0, help="length of each run (requests sent)")
    p.add_argument("--warmup-seconds", type=float, default=3.0)
    p.add_argument("--beam-size", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--title", default="", help="the results section's title (e.g. which commit)")
    p.add_argument("--note", default="", help="a line added under the title (e.g. what else ran)")
    p.add_argument("--out", type=Path, help="append the results to this Markdown file (created with a header)")
    args = p.parse_args(argv)
    args.model = args.model or ["models/de-en", "models/lm-small"]
    args.server_dir = args.server_dir.resolve()
    args.endpoints = [e for e in args.endpoints.split(",") if e]
    if set(args.endpoints) - set(ENDPOINTS):
        p.error(f"--endpoints: {', '.join(ENDPOINTS)}")
    args.concurrency = [int(x) for x in args.concurrency.split(",")]
    args.rates = [float(x) for x in args.rates.split(",")]
    return args


def commit_of(directory: Path) -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=directory, capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else "not a git checkout"


def header(args: argparse.Namespace, argv, started: float) -> list[str]:
    commit = commit_of(ROOT) + (f"; server from {args.server_dir} ({commit_of(args.server_dir)})"
                                if args.server_dir != ROOT else "")
    command = "python benchmarks/serving.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    return [f"## {args.title or 'Run'}", "", f"- command: `{command.strip()}`",
            f"- date: {datetime.datetime.now():%Y-%m-%d %H:%M}; commit {commit}; {platform.system()} "
            f"{platform.release()}; Python {platform.python_version()}, httpx {httpx.__version__}",
            f"- CPU: {describe_cpu(cpu_facts())}",
            f"- load average (1 min) at the start: {started:.2f}",
            *([f"- {args.note}"] if args.note else []),
            f"- each run {args.seconds:g} s of requests (then every answer awaited), after {args.warmup_seconds:g} s "
            f"of warm-up with 4 clients; open loop: gamma gaps of shape {args.burstiness:g}"
            + (" (Poisson)" if args.burstiness == 1 else ""), ""]


def main(argv=None) -> None:
    args = parse_args(argv)
    lines = header(args, argv, os.getloadavg()[0])
    for layout in ([None] if args.url else args.layouts.split(",")):
        lines += measure_layout(args, layout)
    lines.append(f"- load average (1 min) at the end: {os.getloadavg()[0]:.2f}")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        new = not args.out.exists()
        with args.out.open("a", encoding="utf-8") as f:
            where = "GPU" if "cuda" in args.server_arg else "CPU"     # --server-arg=--device --server-arg=cuda
            f.write((f"# Serving under load ({where}): benchmarks/serving.py\n\n" if new else "\n") + text)


if __name__ == "__main__":
    main()
