"""The HTTP process's own CPU a request, in one process and without the machine's noise: the server's ASGI app (every
middleware, the flavour's route, the Gateway's checks, quota and metrics) driven in this process, one request after
another, with the workers' round trip replaced by an answer ready at once. What it leaves out: uvicorn's parsing
and writes, and the requests' and answers' sockets (served_cpu.py --by-process measures the whole process under
load; this measures the part the framework and our code cost, steadily enough to compare two trees a few µs apart,
which served_cpu.py's per-process figures, moving 10-20% between rounds on these machines, cannot):

    python benchmarks/http_cost.py                      # /translate, one sentence a request
    python benchmarks/http_cost.py --tree /tmp/wt-before --tree .   # alternating, each tree in its own process
    python benchmarks/http_cost.py --profile out.txt    # and a cProfile of the loop, by cumulative time
    python benchmarks/http_cost.py --instructions --tree /tmp/wt-before --tree .

Each figure is the CPU µs a request (time.process_time) over --requests requests, the best of --repeats. Even so
it moved 30% between runs on the 2-core VMs here; --instructions counts instead what a request executes, under
valgrind's callgrind (the same count, whatever else the machine does): each tree is run twice, with 100 and with
100 + --requests requests, and the difference divided by --requests (start-up and warm-up cancel out). About a
minute a run at 500 requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, cpu_name, pairs64

ANSWER = {"translations": [{"text": "The house is on fire.", "score": -0.31, "alternatives": [], "input_tokens": 9,
                            "output_tokens": 7}],
          "model": "de-en", "source_lang": "de", "target_lang": "en",
          "timings": {"queue_ms": 0.2, "inference_ms": 14.1}}


def http_cost(requests: int, repeats: int, profile: str | None) -> float:
    """CPU µs a one-sentence /translate costs the app in this process (this tree's `service`), the best of repeats."""
    app, scope, body = translate_app()

    async def one() -> None:
        sent, todo = [], [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict:
            if todo:
                return todo.pop()
            await asyncio.sleep(3600)   # a client that stays (a disconnect would cancel the request)
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)

        await app(dict(scope), receive, send)
        if sent[0]["status"] != 200:
            raise RuntimeError(f"/translate answered {sent[0]['status']}: {sent[1].get('body', b'')[:300]!r}")

    async def run() -> float:
        for _ in range(200):   # warm-up: the middleware stack is built, caches filled
            await one()
        best = float("inf")
        for _ in range(repeats):
            c0 = time.process_time()
            for _ in range(requests):
                await one()
            best = min(best, (time.process_time() - c0) / requests * 1e6)
        return best

    if profile:
        import cProfile
        import pstats

        with cProfile.Profile() as p:
            best = asyncio.run(run())
        with open(profile, "w") as f:
            pstats.Stats(p, stream=f).sort_stats("cumulative").print_stats(60)
        return best
    return asyncio.run(run())


def translate_app() -> tuple:
    """The server's app with the workers' round trip answered at once, a /translate request's scope and its body."""
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp())
    sys.path.insert(0, os.environ.get("HTTP_COST_TREE", str(ROOT)))   # the tree measured, before common's ROOT
    from service.config import Settings
    from service.server import build_server

    server, gateway = build_server(Settings(models=[str(ROOT / "models" / "de-en")], log_level="warning"))

    async def answered(endpoint: str, payload: dict, request) -> dict:   # the workers' part, not measured here
        return json.loads(json.dumps(ANSWER))

    gateway.workers.call = answered
    gateway.workers.serves = lambda endpoint: True
    body = json.dumps({"text": pairs64()[0][0], "source_lang": "de", "target_lang": "en", "beam_size": 4,
                       "max_length": 32}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/translate", "raw_path": b"/translate", "query_string": b"", "root_path": "",
             "headers": [(b"host", b"127.0.0.1:8000"), (b"user-agent", b"bench"), (b"accept", b"*/*"),
                         (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000)}
    return server.app, scope, body


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", type=Path, action="append", help="a checkout whose service to measure (repeatable; "
                   "default: this one); trees alternate, each run in a process of its own")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--profile", help="write a cProfile of the loop here (this tree only)")
    p.add_argument("--instructions", action="store_true", help="instructions a request, counted by callgrind")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)   # a tree's own measurement, printed
    args = p.parse_args()
    if args.one:
        print(f"{http_cost(args.requests, args.repeats, args.profile):.1f}")
        return
    trees = args.tree or [ROOT]
    what = "instructions (callgrind)" if args.instructions else f"CPU µs, best of {args.repeats}"
    print(f"CPU: {cpu_name()}; POST /translate, one sentence, in process, workers' answer ready at once; "
          f"{args.requests} requests; {what} a request")
    order = [t for r in range(args.rounds) for t in (trees if r % 2 == 0 else trees[::-1])]
    for tree in order:
        if args.instructions:
            counts = [instructions(tree, n, 1) for n in (100, 100 + args.requests)]
            print(f"{tree}: {(counts[1] - counts[0]) / args.requests:,.0f} instructions a request", flush=True)
        else:
            print(f"{tree}: {one_tree(tree, args.requests, args.repeats, args.profile)} CPU µs a request", flush=True)


def one_tree(tree: Path, requests: int, repeats: int, profile: str | None = None, prefix: tuple = ()) -> str:
    """This script's --one for `tree`, in a process of its own (under `prefix`, e.g. valgrind): its last line."""
    out = subprocess.run([*prefix, sys.executable, __file__, "--one", "--requests", str(requests), "--repeats",
                          str(repeats)] + (["--profile", profile] if profile else []),
                         cwd=tree, env=os.environ | {"HTTP_COST_TREE": str(tree.resolve())}, capture_output=True,
                         text=True)
    if out.returncode:
        sys.exit(f"{tree}: {out.stderr[-2000:]}")
    return out.stdout.strip().splitlines()[-1] + (out.stderr if prefix else "")


def instructions(tree: Path, requests: int, repeats: int) -> int:
    """What `tree`'s --one with `requests` requests executes in all (start-up included), counted by callgrind."""
    with tempfile.TemporaryDirectory() as d:
        out = one_tree(tree, requests, repeats, prefix=("valgrind", "--tool=callgrind", f"--callgrind-out-file={d}/cg"))
    return int(out.rsplit("Collected : ", 1)[1].split()[0])

if __name__ == "__main__":
    main()
