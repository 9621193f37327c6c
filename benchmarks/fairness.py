"""Fairness between requests in one inference worker: a one-word request's latency alone and beside
two maximal requests (issue 27: one worker, 64 texts x 341 characters at beam 16 held it 20 s, and a
one-word request behind two of them waited 18.5 s).

    python benchmarks/fairness.py                           # starts python -m service on models/de-en
    python benchmarks/fairness.py --tries 10 --out /tmp/fairness.json
    python benchmarks/fairness.py --texts 16 --server-arg=--request-timeout-s=600    # fixed large requests

Phases:
    alone    --tries one-word requests, one after another, nothing else running: p50, p95
    beside   two clients each post maximal requests back to back (64 texts of about 341 characters at
             beam 16: the issue's request, or the largest the server's cost bound accepts, found from
             its 413); meanwhile --tries one-word requests, one after another, a random pause apart
             (0.2-1 s, so they land at different points of the large requests' work): p50, p95, and
             how long each large request took

Nothing is asserted: figures depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from common import cpu_name, free_port, pairs64  # noqa: E402

SMALL = {"text": ["Hallo"], "source_lang": "de", "target_lang": "en"}


def large_texts(n: int, chars: int = 341) -> list[str]:
    """n texts of about `chars` characters each, of the tests' German sentences."""
    sentences = [de for de, _ in pairs64()]
    out, k = [], 0
    for _ in range(n):
        text = ""
        while len(text) < chars:
            text += (" " if text else "") + sentences[k % len(sentences)]
            k += 1
        out.append(text[:chars].rsplit(" ", 1)[0] + ".")
    return out


def post(url: str, body: dict, timeout: float = 600) -> tuple[int, dict, float]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, payload = r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        status, payload = e.code, json.loads(e.read() or b"{}")
    return status, payload, time.perf_counter() - t0


def maximal_request(url: str, beam: int) -> dict:
    """The issue's request (64 texts x 341 characters at beam 16), or as many of its texts as the
    server's cost bound accepts (read from the 413's limit and the cost its message names)."""
    n = 64
    while True:
        body = {"text": large_texts(n), "source_lang": "de", "target_lang": "en", "beam_size": beam}
        status, payload, _ = post(url, body)
        if status == 200:
            return body
        err = payload.get("error", {})
        cost = re.search(r"costs? (\d+)", err.get("message", ""))
        if status != 413 or n == 1 or not cost or "limit" not in err:
            raise SystemExit(f"the large request got {status}: {payload}")
        n = max(1, min(n - 1, n * int(err["limit"]) // int(cost.group(1))))


def quantiles(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"p50_ms": statistics.median(xs) * 1000, "p95_ms": xs[min(len(xs) - 1, int(0.95 * len(xs)))] * 1000,
            "min_ms": xs[0] * 1000, "max_ms": xs[-1] * 1000, "n": len(xs)}


def small_latencies(url: str, tries: int, pause: tuple[float, float]) -> list[float]:
    out = []
    for _ in range(tries):
        time.sleep(random.uniform(*pause))
        status, payload, seconds = post(url, SMALL)
        if status != 200:
            raise SystemExit(f"the one-word request got {status}: {payload}")
        out.append(seconds)
    return out


def beside(url: str, large: dict, tries: int) -> tuple[list[float], list[float]]:
    """One-word latencies while two clients keep maximal requests running; and the large requests' times."""
    stop, large_times = threading.Event(), []

    def client():
        while not stop.is_set():
            status, payload, seconds = post(url, large)
            if status != 200:
                raise SystemExit(f"a large request got {status}: {payload}")
            large_times.append(seconds)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.3)      # the second one queues behind the first, as in the issue
    small = small_latencies(url, tries, (0.2, 1.0))
    stop.set()
    for t in threads:
        t.join()
    return small, large_times


def start_server(model: str, port: int, extra: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "service", "--model", model, "--port", str(port), "--log-level", "warning", *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited: {proc.stderr.read()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit("the server did not become ready within 300 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/de-en")
    ap.add_argument("--tries", type=int, default=10)
    ap.add_argument("--beam", type=int, default=16, help="the large requests' beam size")
    ap.add_argument("--texts", type=int, default=0, help="the large requests' texts (0: 64, or as many as the "
                    "server's cost bound accepts); set it to compare servers on the same requests")
    ap.add_argument("--beside", action=argparse.BooleanOptionalAction, default=True,
                    help="--no-beside: the alone phase only (to compare two servers' one-word latency quickly)")
    ap.add_argument("--server-arg", action="append", default=[], help="passed to python -m service (repeatable)")
    ap.add_argument("--out", help="also write the JSON summary here")
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}/translate"
    proc = start_server(args.model, port, args.server_arg)
    try:
        small_latencies(url, 3, (0.0, 0.0))                               # warm-up
        alone = small_latencies(url, args.tries, (0.2, 1.0))
        large = {"text": large_texts(args.texts or 64), "beam_size": args.beam}
        small, large_times = [], []
        if args.beside:
            large = (maximal_request(url, args.beam) if not args.texts else
                     large | {"source_lang": "de", "target_lang": "en"})
            small, large_times = beside(url, large, args.tries)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    result = {"cpu": cpu_name(), "cores": os.cpu_count(), "command": " ".join([Path(sys.executable).name] + sys.argv),
              "large_request": {"texts": len(large["text"]), "chars_per_text": len(large["text"][0]),
                                "beam_size": args.beam},
              "alone": quantiles(alone), "beside_two_large": quantiles(small) if small else None,
              "large_request_latency": quantiles(large_times) if large_times else None}
    if small:
        result["ratio_p50"] = result["beside_two_large"]["p50_ms"] / result["alone"]["p50_ms"]
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
