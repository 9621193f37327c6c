"""A raw-socket HTTP fuzzer (issue 54 item 2): requests to every route, built as bytes and broken on purpose (the
request line's method, target and version; header names and values, duplicated, huge, folded, with bare LFs;
Content-Length and Transfer-Encoding that disagree; chunked bodies with bad sizes; bodies truncated, oversized or
not UTF-8; several requests pipelined on one connection), each sent on a socket of its own. A /health poller runs
beside it on a connection of its own. What a run must show: no 5xx, no process of the server replaced (a worker
restarted), /health answering within a second throughout, and the server's memory back near where it was.

    python benchmarks/http_fuzz.py --cases 10000                     # starts models/de-en and models/lm-small
    python benchmarks/http_fuzz.py --url http://127.0.0.1:8000 --cases 50000 --seed 7

tests/test_http_fuzz.py runs it for a bounded time in CI. Deterministic for a seed: a failing case is printed with
its number, and `--only N` sends that one again."""

from __future__ import annotations

import argparse
import json
import random
import re
import socket
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# One valid request per route: (method, path, content type, body). Every route of the app, the hidden ones too.
ROUTES = [
    ("POST", "/translate", "application/json", b'{"text": ["Das Haus ist klein."], "source_lang": "de", '
                                              b'"target_lang": "en", "max_length": 8}'),
    ("POST", "/generate", "application/json", b'{"prompt": "Das ist", "max_new_tokens": 3}'),
    ("POST", "/generate", "application/json", b'{"prompt": "Das ist", "max_new_tokens": 3, "stream": true}'),
    ("GET", "/languages", None, b""),
    ("POST", "/v1/completions", "application/json", b'{"model": "lm-small", "prompt": "Das", "max_tokens": 3}'),
    ("POST", "/v1/completions", "application/json",
     b'{"model": "lm-small", "prompt": "Das", "max_tokens": 3, "stream": true}'),
    ("POST", "/v1/chat/completions", "application/json", b'{"model": "lm-small", "messages": []}'),
    ("GET", "/v1/models", None, b""),
    ("GET", "/v1/models/lm-small", None, b""),
    ("POST", "/libretranslate/translate", "application/json", b'{"q": "Guten Morgen", "source": "de", "target": "en"}'),
    ("POST", "/libretranslate/translate", "application/x-www-form-urlencoded", b"q=Guten+Tag&source=auto&target=en"),
    ("POST", "/libretranslate/detect", "application/x-www-form-urlencoded", b"q=Das+Haus+ist+klein"),
    ("GET", "/libretranslate/languages", None, b""),
    ("GET", "/libretranslate/frontend/settings", None, b""),
    ("GET", "/libretranslate/download_file/0123456789abcdef.txt", None, b""),
    ("POST", "/libretranslate/translate_file", "multipart/form-data; boundary=XyZ",
     b'--XyZ\r\nContent-Disposition: form-data; name="source"\r\n\r\nde\r\n--XyZ\r\nContent-Disposition: form-data; '
     b'name="target"\r\n\r\nen\r\n--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a.txt"\r\n'
     b'Content-Type: text/plain\r\n\r\nDas Haus.\n\r\n--XyZ--\r\n'),
    ("GET", "/ui", None, b""), ("GET", "/docs", None, b""), ("GET", "/redoc", None, b""),
    ("GET", "/health", None, b""), ("GET", "/ready", None, b""), ("GET", "/info", None, b""),
    ("GET", "/usage", None, b""), ("GET", "/metrics", None, b""), ("GET", "/openapi.json", None, b""),
]
BAD_BYTES = [b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x00", b"\x7f", b"\r", b"\n", b"\x1b[31m", b"%",
             b"%zz", b"%00", b"\xe2\x80\xae", b" ", b"\t", b"\"", b"\\", b"{", b"\xf0\x9f\x98", b"\x80" * 3]
METHODS = [b"GET", b"POST", b"HEAD", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"TRACE", b"CONNECT", b"PROPFIND",
           b"get", b"P0ST", b"", b"G\xffT", b"X" * 300, b"POST POST"]
VERSIONS = [b"HTTP/1.1", b"HTTP/1.0", b"HTTP/0.9", b"HTTP/2.0", b"HTTP/1.2", b"HTTP/1", b"HTTP/1.1.1", b"http/1.1",
            b"HTTP/\xff", b"", b"HTTP/1.1 extra"]


@dataclass
class Request:
    """A request as parts (each mutable bytes) before it is written out."""
    method: bytes
    target: bytes
    version: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    chunks: list[bytes] | None = None     # chunked: each chunk's size line and data written as given
    terminator: bytes = b"\r\n"           # the line ending

    def bytes(self) -> bytes:
        t = self.terminator
        head = self.method + b" " + self.target + (b" " + self.version if self.version else b"") + t
        head += b"".join(k + b": " + v + t for k, v in self.headers) + t
        return head + (b"".join(self.chunks) if self.chunks is not None else self.body)


@dataclass
class Case:
    """What is sent, on one connection: `data` in `pieces` writes, then the write side closed or not."""
    number: int
    route: str
    mutations: list[str]
    data: bytes
    pieces: int = 1
    half_close: bool = False
    owed: int = 0                         # answers owed: its requests' count when none is broken, else 0


def base_request(route: tuple, port: int) -> Request:
    method, path, ctype, body = route
    headers = [(b"Host", f"127.0.0.1:{port}".encode()), (b"Connection", b"close")]
    if ctype:
        headers.append((b"Content-Type", ctype.encode()))
    if method in ("POST", "PUT", "PATCH") or body:
        headers.append((b"Content-Length", str(len(body)).encode()))
    return Request(method.encode(), path.encode(), b"HTTP/1.1", headers, body)


# --- the mutations: each takes (rng, request) and changes the request; `bool` says whether it stays whole -------
def m_method(rng, r):
    r.method = rng.choice(METHODS)


def m_target(rng, r):
    kind = rng.randrange(7)
    if kind == 0:
        r.target = r.target + b"?" + rng.choice(BAD_BYTES) * rng.randrange(1, 50)
    elif kind == 1:
        r.target = b"/" + b"a" * rng.choice([100, 5000, 70000])
    elif kind == 2:
        r.target = rng.choice([b"*", b"http://evil.example/translate", b"//translate", b"/../../etc/passwd",
                               b"/translate/..", b"/%2e%2e/%2e%2e", b"", b"translate", b"/translate#frag"])
    elif kind == 3:
        at = rng.randrange(len(r.target) + 1)
        r.target = r.target[:at] + rng.choice(BAD_BYTES) + r.target[at:]
    elif kind == 4:
        r.target = r.target + b"?" + b"&".join(b"k%d=v" % i for i in range(rng.choice([10, 1000, 10000])))
    elif kind == 5:
        r.target = r.target.upper()
    else:
        r.target = r.target + b"/" + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))


def m_version(rng, r):
    r.version = rng.choice(VERSIONS)


def m_header(rng, r):
    kind = rng.randrange(8)
    name = rng.choice([b"X-Fuzz", b"Content-Type", b"Authorization", b"Accept-Encoding", b"traceparent",
                       b"X-Request-ID", b"Cookie", b"Expect", b"Content-Encoding", b"Host", b"Connection"])
    if kind == 0:
        r.headers.append((name, rng.choice(BAD_BYTES) * rng.randrange(1, 30)))
    elif kind == 1:
        r.headers.append((b"X-Big", b"v" * rng.choice([8000, 70000, 1_100_000])))
    elif kind == 2:
        r.headers += [(b"X-Many-%d" % i, b"1") for i in range(rng.choice([100, 1000, 5000]))]
    elif kind == 3:
        r.headers.append((rng.choice([b"", b"Bad Name", b"N\xffme", b"X:Y", b"\x00", b" Leading"]), b"v"))
    elif kind == 4:
        r.headers.append((name, b"first") if rng.random() < 0.5 else (b"X-Folded", b"a\r\n  folded"))
    elif kind == 5:
        r.headers.append((name, rng.choice([b"gzip", b"br", b"100-continue", b"keep-alive", b"Bearer \xff",
                                            b"00-" + b"0" * 32 + b"-" + b"0" * 16 + b"-01", b"x" * 129,
                                            b"application/json; charset=latin-1", b"multipart/form-data"])))
    elif kind == 6:
        if r.headers:
            del r.headers[rng.randrange(len(r.headers))]
    else:
        rng.shuffle(r.headers)


def m_length(rng, r):
    """Content-Length and Transfer-Encoding that lie or disagree."""
    r.headers = [(k, v) for k, v in r.headers if k.lower() != b"content-length"]
    r.headers.append((b"Content-Length", rng.choice([b"-1", b"abc", b"1e3", b"99999999999999999999", b"0x10",
                                                     b" 5", b"5, 6", str(len(r.body) + 10).encode(),
                                                     str(max(0, len(r.body) - 3)).encode(), b""])))
    if rng.random() < 0.3:
        r.headers.append((b"Content-Length", str(len(r.body)).encode()))
    if rng.random() < 0.3:
        r.headers.append((b"Transfer-Encoding", rng.choice([b"chunked", b"gzip", b"chunked, gzip", b"identity",
                                                            b"xchunked", b"chunked\xff"])))


def m_chunked(rng, r):
    """The body sent chunked, its sizes sometimes wrong."""
    r.headers = [(k, v) for k, v in r.headers if k.lower() != b"content-length"]
    r.headers.append((b"Transfer-Encoding", b"chunked"))
    body, chunks = r.body, []
    while body:
        n = rng.randrange(1, max(2, len(body) + 1))
        piece, body = body[:n], body[n:]
        size = rng.choice([b"%x" % len(piece)] * 6 + [b"%x" % (len(piece) + 7), b"zz", b"-1", b"%x;ext=1" % len(piece),
                                                      b"FFFFFFFFFFFFFFFFFF", b"%X" % len(piece), b""])
        chunks.append(size + b"\r\n" + piece + b"\r\n")
    chunks.append(rng.choice([b"0\r\n\r\n"] * 4 + [b"", b"0\r\n", b"0\r\nX-Trailer: 1\r\n\r\n", b"1\r\nx\r\n"]))
    r.chunks = chunks


def m_body(rng, r):
    kind = rng.randrange(6)
    if kind == 0:
        r.body = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    elif kind == 1:
        at = rng.randrange(len(r.body) + 1)
        r.body = r.body[:at] + rng.choice(BAD_BYTES) + r.body[at:]
    elif kind == 2:
        r.body = b"[" * rng.choice([100, 10000, 100000]) + b"]" * rng.choice([0, 100])
    elif kind == 3:
        r.body = r.body * rng.choice([2, 500, 20000])
    elif kind == 4:
        r.body = b'{"text": "' + b"\\ud800" * rng.randrange(1, 5) + b'", "source_lang": "de", "target_lang": "en"}'
    else:
        r.body = b""
    for i, (k, _) in enumerate(r.headers):
        if k.lower() == b"content-length":
            r.headers[i] = (k, str(len(r.body)).encode())


def m_line_endings(rng, r):
    r.terminator = rng.choice([b"\n", b"\r", b"\r\r\n", b"\n\r"])


REQUEST_MUTATIONS = [m_method, m_target, m_version, m_header, m_length, m_chunked, m_body, m_line_endings]


def build(number: int, seed: int, port: int) -> Case:
    """Case `number` of a run with `seed`: the same bytes every time."""
    rng = random.Random(f"{seed}:{number}")
    route = ROUTES[number % len(ROUTES)]
    r = base_request(route, port)
    names = []
    for mutate in rng.sample(REQUEST_MUTATIONS, rng.choice([0, 1, 1, 1, 2, 2, 3])):
        mutate(rng, r)
        names.append(mutate.__name__[2:])
    data, case = r.bytes(), Case(number, f"{route[0]} {route[1]}", names, b"")
    whole = 0 if names else 1                                 # a broken request may owe nothing (a lying length)
    kind = rng.randrange(10)
    if kind == 0:                                             # truncated anywhere, then the write side closed
        data, whole = data[:rng.randrange(len(data))], 0
        case.mutations.append("truncated")
        case.half_close = True
    elif kind == 1:                                           # pipelined: more requests on one connection
        more = [base_request(ROUTES[rng.randrange(len(ROUTES))], port) for _ in range(rng.randrange(1, 4))]
        for m in [r, *more[:-1]]:                             # the last one asks for the close
            m.headers = [(k, b"keep-alive" if k == b"Connection" else v) for k, v in m.headers]
        data, whole = r.bytes() + b"".join(m.bytes() for m in more), whole * (1 + len(more))
        case.mutations.append(f"pipelined {1 + len(more)}")
    elif kind == 2:                                           # dribbled in many small writes
        case.pieces = rng.randrange(2, 12)
        case.mutations.append(f"{case.pieces} writes")
    elif kind == 3:                                           # the write side closed after a whole request: gone
        case.half_close, whole = True, 0
        case.mutations.append("half-closed")
    case.data, case.owed = data, whole
    return case


# --- sending ------------------------------------------------------------------------------------------------
STATUS = re.compile(rb"HTTP/1\.[01] (\d{3})")


def statuses(raw: bytes) -> list[int]:
    """The status of every response head in what a connection gave back, in order (bodies skipped by their
    Content-Length; a body of another framing is searched for the next head, which our bodies never hold)."""
    out, at = [], 0
    while (m := STATUS.search(raw, at)) is not None:
        out.append(int(m.group(1)))
        end = raw.find(b"\r\n\r\n", m.end())
        if end < 0:
            break
        length = re.search(rb"(?im)^content-length:\s*(\d+)\s*$", raw[m.end():end])
        at = end + 4 + (int(length.group(1)) if length else 0)
    return out


def send(host: str, port: int, case: Case, *, answer_s: float = 30, wait_s: float = 2,
         idle_s: float = 0.5) -> tuple[list[int], str]:
    """Sends a case and reads until the server closes the connection. A case that owes answers gets `answer_s`
    for all of them; a broken one `wait_s`, then the write side is closed (the server may be waiting for bytes a
    broken length promised) and `wait_s` more. Once bytes come, `idle_s` of silence ends the read (when nothing
    more is owed). (statuses, how it ended)."""
    raw, ended = bytearray(), "closed"
    deadline = time.monotonic() + answer_s
    try:
        with socket.create_connection((host, port), timeout=10) as sock:
            step = max(1, -(-len(case.data) // case.pieces))
            for i in range(0, len(case.data), step):
                sock.sendall(case.data[i:i + step])
                if case.pieces > 1:
                    time.sleep(0.002)
            if case.half_close:
                sock.shutdown(socket.SHUT_WR)
            ended = _read(sock, raw, answer_s if case.owed else wait_s, idle_s)
            while ended != "closed" and len(statuses(bytes(raw))) < case.owed and time.monotonic() < deadline:
                ended = _read(sock, raw, max(0.01, deadline - time.monotonic()), idle_s)
            if ended == "silent" and not case.half_close and not case.owed:
                sock.shutdown(socket.SHUT_WR)
                ended = "half-closed by us, then " + _read(sock, raw, wait_s, idle_s)
    except (ConnectionResetError, BrokenPipeError):
        ended = "reset"
    except OSError as e:                      # refused, timed out mid-write, not connected: said, not raised
        ended = f"{type(e).__name__}"
    got = statuses(bytes(raw))
    if len(got) < case.owed:
        ended = "no answer in time"
    return got, ended


def _read(sock: socket.socket, raw: bytearray, first_s: float, idle_s: float) -> str:
    """Reads into `raw` until the server closes ("closed"), nothing came in `first_s` ("silent") or nothing more
    in `idle_s` after the last bytes ("open, idle")."""
    wait = first_s if not raw else idle_s
    while True:
        sock.settimeout(wait)
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            return "open, idle" if raw else "silent"
        if not chunk:
            return "closed"
        raw += chunk
        wait = idle_s


class HealthPoller(threading.Thread):
    """GET /health every `every` seconds on a fresh connection: the slowest answer, and the failures."""

    def __init__(self, host: str, port: int, every: float = 0.25):
        super().__init__(daemon=True)
        self.host, self.port, self.every = host, port, every
        self.stop, self.slowest, self.polls, self.failures = threading.Event(), 0.0, 0, []

    def run(self):
        while not self.stop.wait(self.every):
            t0 = time.monotonic()
            try:
                with socket.create_connection((self.host, self.port), timeout=5) as s:
                    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    raw = b""
                    while chunk := s.recv(4096):
                        raw += chunk
                ok = raw.startswith(b"HTTP/1.1 200")
            except OSError as e:
                ok, raw = False, repr(e).encode()
            took = time.monotonic() - t0
            self.polls += 1
            self.slowest = max(self.slowest, took)
            if not ok:
                self.failures.append(raw[:100])


# --- the server's processes ---------------------------------------------------------------------------------
def tree(pid: int) -> dict[int, int]:
    """Every process under `pid` (itself included): pid -> resident bytes. A process's children are read from
    each of its threads (LitServe's monitor thread starts a replaced worker)."""
    out, todo = {}, [pid]
    while todo:
        p = todo.pop()
        try:
            rss = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{p}/status").read_text())
        except OSError:                       # ended meanwhile
            continue
        out[p] = int(rss.group(1)) * 1024 if rss else 0
        for children in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                todo += [int(c) for c in children.read_text().split()]
            except OSError:
                pass
    return out


@dataclass
class Report:
    cases: int = 0
    seconds: float = 0.0
    statuses: Counter = field(default_factory=Counter)
    endings: Counter = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)      # each 5xx: its case, mutations, statuses
    unanswered: list[str] = field(default_factory=list)         # whole requests that got no answer in time
    answers_owed: int = 0                                       # the whole requests' answers, all cases
    cases_owing: int = 0
    health_polls: int = 0
    health_slowest_s: float = 0.0
    health_failures: list = field(default_factory=list)
    processes_before: list[int] = field(default_factory=list)
    processes_after: list[int] = field(default_factory=list)
    rss_before: int = 0
    rss_after: int = 0


def fuzz(url: str, *, cases: int, seed: int, seconds: float | None = None, server_pid: int | None = None,
         first: int = 0) -> Report:
    """Cases first..first+cases-1 of `seed` (or as many as `seconds` allow), one at a time, with a HealthPoller."""
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    port = int(port)
    report = Report()
    if server_pid:
        before = tree(server_pid)
        report.processes_before, report.rss_before = sorted(before), sum(before.values())
    poller = HealthPoller(host, port)
    poller.start()
    t0 = time.monotonic()
    try:
        for n in range(first, first + cases):
            if seconds is not None and time.monotonic() - t0 > seconds:
                break
            case = build(n, seed, port)
            got, ended = send(host, port, case)
            report.cases += 1
            report.answers_owed += case.owed
            report.cases_owing += case.owed > 0
            report.statuses.update(got)
            report.endings[ended] += 1
            what = f"case {n} ({case.route}; {', '.join(case.mutations) or 'as is'}): {got} {ended}"
            if any(s >= 500 for s in got):
                report.server_errors.append(what)
            if ended == "no answer in time":
                report.unanswered.append(what)
    finally:
        report.seconds = time.monotonic() - t0
        poller.stop.set()
        poller.join()
    report.health_polls, report.health_slowest_s = poller.polls, poller.slowest
    report.health_failures = poller.failures
    if server_pid:
        time.sleep(2)                                    # what the last requests held is given back
        after = tree(server_pid)
        report.processes_after, report.rss_after = sorted(after), sum(after.values())
    return report


def describe(r: Report) -> str:
    lines = [f"- cases: {r.cases} in {r.seconds:.0f} s; statuses: "
             + ", ".join(f"{s}: {n}" for s, n in sorted(r.statuses.items())),
             "- connections ended: " + ", ".join(f"{k}: {n}" for k, n in r.endings.most_common()),
             f"- 5xx: {len(r.server_errors)}; cases whose whole requests were not all answered in 30 s: "
             f"{len(r.unanswered)} ({r.answers_owed} answers were owed, by {r.cases_owing} cases)",
             f"- /health: {r.health_polls} polls, slowest {r.health_slowest_s * 1000:.0f} ms, "
             f"{len(r.health_failures)} failed"]
    if r.processes_before:
        lines.append(f"- the server's processes: {len(r.processes_before)} before, the same after: "
                     f"{r.processes_before == r.processes_after}; resident memory {r.rss_before / 2**20:.0f} MiB "
                     f"before, {r.rss_after / 2**20:.0f} MiB after")
    return "\n".join(lines + [f"  {e}" for e in (r.server_errors + r.unanswered)[:20]])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="a running server (default: start one on models/de-en and models/lm-small)")
    p.add_argument("--cases", type=int, default=10000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--only", type=int, help="send case N alone, and print its bytes")
    p.add_argument("--warm-up", type=int, default=200, help="cases sent before the memory's first reading")
    p.add_argument("--package", default=str(ROOT / "models" / "de-en"))
    p.add_argument("--lm-package", default=str(ROOT / "models" / "lm-small"))
    p.add_argument("--server-args", default="--max-output-tokens 16", help="more flags for the server it starts")
    p.add_argument("--log", help="the started server's log file")
    args = p.parse_args()
    if args.url is not None:
        return run(args, args.url, None)
    from common import service

    with service([args.package, args.lm_package], args.server_args.split(), args.log) as (proc, url):
        run(args, url, proc.pid)


def run(args, url: str, pid: int | None) -> None:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    if args.only is not None:
        case = build(args.only, args.seed, int(port))
        print(case.route, case.mutations, repr(case.data[:2000]))
        print(send(host, int(port), case))
        return
    fuzz(url, cases=args.warm_up, seed=args.seed + 1)
    report = fuzz(url, cases=args.cases, seed=args.seed, server_pid=pid)
    print(f"`python benchmarks/http_fuzz.py --cases {args.cases} --seed {args.seed}` ({args.warm_up} cases of seed "
          f"{args.seed + 1} first, to warm up)")
    print(describe(report))
    print(json.dumps({"cases": report.cases, "5xx": len(report.server_errors),
                      "health_slowest_s": round(report.health_slowest_s, 3)}))
    if report.server_errors or report.unanswered or report.health_failures or report.health_slowest_s > 1:
        sys.exit(1)

if __name__ == "__main__":
    main()
