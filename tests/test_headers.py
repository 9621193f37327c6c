"""A request's line and headers are bounded where they are read (service/http/uvicorn_bridge.py): over
--max-header-bytes (32 KiB) or --max-headers (100 fields) a request gets 431 at once, in the error shape, and
its connection closes; a 1 MB header is refused at once, and 16 connections each sending megabytes of headers
leave the server's memory where it was. Real server on 127.0.0.1, real sockets, the default limits."""

import json
import os
import select
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import httpx
import pytest

from conftest import descendants, read_answer, start_server, stop_server

MAX_BYTES, MAX_FIELDS = 32768, 100      # Settings' defaults, which this module's server keeps


@pytest.fixture(scope="module")
def server(request):
    """The tiny package with the default limits; TRANSERVE_TEST_PACKAGE=DIR reuses one exported earlier."""
    package = os.environ.get("TRANSERVE_TEST_PACKAGE") or request.getfixturevalue("tiny_package")
    proc, url = start_server(package)
    u = urlsplit(url)
    yield SimpleNamespace(url=url, proc=proc, host=u.hostname, port=u.port)
    stop_server(proc)


def exchange(server, head: bytes, timeout: float = 10) -> tuple[int, dict, dict | str, float]:
    """Sends `head` whole, then reads the answer: (status, headers, JSON body or text, seconds)."""
    with socket.create_connection((server.host, server.port), timeout=timeout) as s:
        t0 = time.monotonic()
        s.sendall(head)
        status, headers, body = read_answer(s)
        seconds = time.monotonic() - t0
    text = json.loads(body) if headers.get("content-type") == "application/json" else body.decode()
    return status, headers, text, seconds


def get(*fields: bytes) -> bytes:
    return b"GET /health HTTP/1.1\r\nHost: test\r\n" + b"".join(f + b"\r\n" for f in fields) + b"\r\n"


def test_a_1_mb_header_gets_431_at_once(server):
    status, headers, err, seconds = exchange(server, get(b"X-Big: " + b"a" * 1_000_000))
    assert status == 431 and seconds < 2, (status, seconds)
    assert headers["connection"] == "close" and err["request_id"] == headers["x-request-id"]
    assert err["error"]["type"] == "headers_too_large" and err["error"]["limit"] == MAX_BYTES, err
    assert "--max-header-bytes" in err["error"]["message"]
    assert httpx.get(server.url + "/health").text == "ok"


def test_headers_within_the_limits_are_served_and_one_more_byte_or_field_is_not(server):
    fill = [b"X-F%d: %s" % (i, b"a" * 200) for i in range(MAX_FIELDS - 1)]   # and Host: 100 fields, 21 kB
    assert exchange(server, get(*fill))[:1] == (200,)
    assert exchange(server, get(*fill, b"X-One-More: 1"))[0] == 431
    _, _, err, _ = exchange(server, get(*fill, b"X-One-More: 1"))
    assert err["error"]["limit"] == MAX_FIELDS and "--max-headers" in err["error"]["message"], err
    base = len(get(b"X-Big: "))
    assert exchange(server, get(b"X-Big: " + b"a" * (MAX_BYTES - base)))[:1] == (200,)   # exactly the limit
    assert exchange(server, get(b"X-Big: " + b"a" * (MAX_BYTES - base + 1)))[0] == 431
    # The bound is per request: a keep-alive connection's second request counts afresh.
    with socket.create_connection((server.host, server.port), timeout=10) as s:
        for _ in range(2):
            s.sendall(get(b"X-Big: " + b"a" * 20_000))
            answer = b""
            while not answer.endswith(b"ok"):
                answer += s.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200"), answer


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        total += int(status.split("VmRSS:", 1)[1].split()[0]) * 1024 if "VmRSS:" in status else 0
    return total


def send_headers(server, many: bool, total: int, out: list) -> None:
    """A request whose headers never end: `total` bytes of them, as one value or as many 8 kB fields, sent as
    fast as the server reads them, until they are all sent or the server answers; then its answer."""
    with socket.create_connection((server.host, server.port), timeout=20) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n" + (b"" if many else b"X-Big: "))
        chunk = b"X-Fill: " + b"a" * 8000 + b"\r\n" if many else b"a" * 8192
        sent = 0
        try:
            while sent < total:
                s.sendall(chunk)
                sent += len(chunk)
                if select.select([s], [], [], 0)[0]:
                    break   # answered (or closed)
            out.append(s.recv(65536))
        except OSError as e:
            out.append(repr(e).encode())


def test_16_connections_sending_megabytes_of_headers_leave_memory_flat(server):
    pids = [server.proc.pid, *descendants(server.proc.pid)]
    before = rss_bytes(pids)
    peak, answers = [before], []
    clients = [threading.Thread(target=send_headers, args=(server, i % 2 == 0, 8 * 2**20, answers))
               for i in range(16)]
    for c in clients:
        c.start()
    while any(c.is_alive() for c in clients):
        peak.append(rss_bytes(pids))
        time.sleep(0.02)
    grew = (max(peak) - before) / 2**20
    assert grew < 50, f"the server grew by {grew:.0f} MB"
    assert len(answers) == 16 and all(a.startswith(b"HTTP/1.1 431") for a in answers), [a[:40] for a in answers]
    assert httpx.get(server.url + "/health").text == "ok"
