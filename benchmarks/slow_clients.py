"""Slow clients against one server (issue 27's bar): thousands of connections that trickle their headers or
their body, /health probed beside them, then the oversized-body loop through urllib.

    python benchmarks/slow_clients.py                      # 2,000 connections, the server's defaults
    python benchmarks/slow_clients.py --connections 500 --out benchmarks/results/slow-clients.md

It starts `python -m service` on 127.0.0.1 with the committed models/de-en (or --model; --server-args
passes flags on, e.g. "--max-connections 4096"), opens --connections connections at once, a third of each
kind:

    silent    connects and sends nothing
    headers   a request line and part of a header, then one byte every --trickle-s
    body      headers with Content-Length: 99999 and 59 bytes of body, then one byte every --trickle-s

and a GET /health on a new connection every 0.1 s until every slow connection has been closed by the
server. It prints (and with --out writes) the probes' latencies, and for each kind how many were closed,
answered (408) or closed early by the connection cap, and the longest any stayed open, beside the timeout
docs/serving.md ("Slow clients") documents; the most connections open to the server's port at once (sampled
each second). Then 100 POSTs of 1-2 MB (over the 1 MB limit) through urllib, which writes the whole body
before it reads: how many read their 413 and how many broke (a reset or broken pipe). Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import resource
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from service.config import parse_settings  # noqa: E402
from common import SERVER_PROCESS_GROUP, cpu_name  # noqa: E402

HEADS = {
    "silent": b"",
    "headers": b"GET /health HTTP/1.1\r\nHost: bench\r\nX-Slow: ",
    "body": b"POST /translate HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: 99999\r\n"
            b'\r\n{"text": "Hallo", "source_lang": "de", "target_lang": "en", "x": "',
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=str(ROOT / "models" / "de-en"))
    p.add_argument("--connections", type=int, default=2000)
    p.add_argument("--trickle-s", type=float, default=1.0, help="a slow client's byte interval")
    p.add_argument("--server-args", default="", help="more flags for python -m service")
    p.add_argument("--oversized", type=int, default=100, help="urllib POSTs of 1-2 MB")
    p.add_argument("--out", help="also write the report here (markdown)")
    return p.parse_args(argv)


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "service", "--model", args.model, "--host", "127.0.0.1", "--port", str(port),
           "--threads", "1", *shlex.split(args.server_args)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            **SERVER_PROCESS_GROUP)
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2).status == 200:
                return proc, port
        except OSError:
            time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit("the server did not become ready")


async def slow_client(port: int, kind: str, trickle_s: float, give_up_s: float) -> tuple[str, float, bytes]:
    """(kind, seconds from connecting until the server closed the connection, what the server sent)."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t0 = loop.time()
    writer.write(HEADS[kind])

    async def trickle():
        while HEADS[kind]:
            await asyncio.sleep(trickle_s)
            writer.write(b"a")
            await writer.drain()

    sending = asyncio.ensure_future(trickle())
    got = b""
    try:
        async with asyncio.timeout(give_up_s):
            while chunk := await reader.read(65536):
                got += chunk
    except ConnectionError:
        pass
    except TimeoutError:
        got = b"(still open)"
    finally:
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        writer.close()
    return kind, loop.time() - t0, got


async def probe(port: int) -> float | str:
    """Seconds for GET /health on a new connection, or why it failed (over 1 s, an error, another answer)."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        async with asyncio.timeout(1.0):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /health HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
            answer = await reader.read()
            writer.close()
    except TimeoutError:
        return "no answer within 1 s"
    except OSError as e:
        return repr(e)
    return loop.time() - t0 if answer.startswith(b"HTTP/1.1 200") else repr(answer[:40])


def held_connections(port: int) -> int:
    """Established TCP connections whose local port is the server's (/proc/net/tcp: the server's side of
    each, accepted or waiting in its listen queue)."""
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, _, state = row.split()[1:4]
            n += state == "01" and int(local.rsplit(":", 1)[1], 16) == port
    return n


async def flood(args: argparse.Namespace, port: int) -> tuple[list, list, int]:
    """The slow clients and the probes beside them: (clients' results, probe latencies, most held)."""
    settings = parse_settings(shlex.split(args.server_args))
    give_up = 3 * max(settings.header_timeout_s, settings.body_timeout_s)
    kinds = [("silent", "headers", "body")[i % 3] for i in range(args.connections)]
    clients = [asyncio.ensure_future(slow_client(port, k, args.trickle_s, give_up)) for k in kinds]
    latencies: list = []
    most, sampled = 0, 0.0
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    while not all(c.done() for c in clients):
        latencies.append((loop.time() - t0, await probe(port)))
        if loop.time() - sampled >= 1.0:
            most, sampled = max(most, await asyncio.to_thread(held_connections, port)), loop.time()
        await asyncio.sleep(0.1)
    return [c.result() for c in clients], latencies, most


def oversized(url: str, tries: int) -> tuple[dict, list]:
    """`tries` POSTs of 1-2 MB through urllib: (status counts, the errors of those that broke)."""
    rng = random.Random(27)
    statuses: dict = {}
    broken = []
    for _ in range(tries):
        body = b'{"text": "' + b"a" * rng.randrange(1_000_000, 2_000_000) + b'"}'
        req = urllib.request.Request(url + "/translate", data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                status = r.status
        except urllib.error.HTTPError as e:
            status = e.code
        except (urllib.error.URLError, ConnectionError) as e:
            broken.append(repr(e))
            continue
        statuses[status] = statuses.get(status, 0) + 1
    return statuses, broken


def report(args, clients, latencies, most, statuses, broken, seconds) -> str:
    ok = sorted(x for _, x in latencies if not isinstance(x, str))
    failed = [f"{why} at {t:.1f} s" for t, why in latencies if isinstance(why, str)]
    q = (lambda f: f"{ok[min(len(ok) - 1, int(f * len(ok)))] * 1000:.0f} ms") if ok else (lambda f: "-")
    settings = parse_settings(shlex.split(args.server_args))
    timeout = {"silent": settings.header_timeout_s, "headers": settings.header_timeout_s,
               "body": settings.body_timeout_s}
    lines = [f"CPU: {cpu_name()} ({os.cpu_count()} cores); Python {platform.python_version()}",
             f"{args.connections} slow connections (a byte every {args.trickle_s:g} s), server flags: "
             f"{args.server_args or '(defaults)'}; {seconds:.1f} s until the server had closed them all",
             "", f"/health probes: {len(latencies)}, answered within 1 s: {len(ok)}, p50 {q(0.5)}, p99 {q(0.99)}, "
             f"max {q(1.0)}" + (f"; failed: {', '.join(failed)}" if failed else ""),
             f"most connections open to the server's port at once (sampled each second): {most}", "",
             "| kind | connections | closed by the server | answered 408 | closed before 0.8 x the timeout (cap) | "
             "open for (min / median / max) | documented timeout |", "|---|---|---|---|---|---|---|"]
    for kind in ("silent", "headers", "body"):
        mine = [(s, got) for k, s, got in clients if k == kind]
        closed = sorted(s for s, got in mine if got != b"(still open)")
        answered = sum(got.startswith(b"HTTP/1.1 408") for _, got in mine)
        early = sum(s < 0.8 * timeout[kind] for s in closed)
        spread = " / ".join(f"{closed[int(f * (len(closed) - 1))]:.2f}" for f in (0, 0.5, 1)) if closed else "-"
        lines.append(f"| {kind} | {len(mine)} | {len(closed)} | {answered} | {early} | {spread} s | "
                     f"{timeout[kind]:g} s |")
    lines += ["", f"oversized bodies through urllib ({args.oversized} POSTs of 1-2 MB): statuses "
              f"{dict(sorted(statuses.items()))}, broken: {len(broken)} {broken[:3] if broken else ''}"]
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))   # this process holds every slow connection
    if args.connections + 256 > hard:
        raise SystemExit(f"--connections {args.connections} needs more file descriptors than {hard}")
    proc, port = start_server(args)
    try:
        t0 = time.monotonic()
        clients, latencies, most = asyncio.run(flood(args, port))
        seconds = time.monotonic() - t0
        statuses, broken = oversized(f"http://127.0.0.1:{port}", args.oversized)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    text = report(args, clients, latencies, most, statuses, broken, seconds)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
