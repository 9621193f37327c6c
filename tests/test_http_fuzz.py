"""The raw-socket HTTP fuzzer (benchmarks/http_fuzz.py, issue 54 item 2) against a real server for a bounded run:
every route, its requests broken as bytes (request lines, headers, lengths, chunked bodies, truncation,
pipelining, non-UTF-8); no 5xx, every unbroken request answered, no process of the server replaced, /health
answering within a second throughout, nothing raised in the server, and its memory near where it was. The bar's
10,000 cases run from benchmarks/ (benchmarks/results/http-fuzz.md).

The server serves the committed packages (models/de-en, models/lm-small; TRANSERVE_TEST_PACKAGE and
TRANSERVE_TEST_LM_PACKAGE name others): nothing to train."""

from __future__ import annotations

import os
import sys

import pytest

from conftest import ROOT, server_log, start_server, stop_server

sys.path.insert(0, str(ROOT / "benchmarks"))
import http_fuzz  # noqa: E402

PACKAGE = os.environ.get("TRANSERVE_TEST_PACKAGE") or str(ROOT / "models" / "de-en")
LM_PACKAGE = os.environ.get("TRANSERVE_TEST_LM_PACKAGE") or str(ROOT / "models" / "lm-small")
CASES, SECONDS = 600, 45


@pytest.fixture(scope="module")
def server():
    proc, url = start_server(PACKAGE, "--model", LM_PACKAGE, "--max-output-tokens", "16")
    yield proc, url
    stop_server(proc)


def test_the_cases_are_the_same_for_a_seed_and_reach_every_route():
    a = [http_fuzz.build(n, 5, 8000) for n in range(300)]
    assert [c.data for c in a] == [http_fuzz.build(n, 5, 8000).data for n in range(300)]
    assert {c.route for c in a} == {f"{m} {p}" for m, p, _, _ in http_fuzz.ROUTES}
    kinds = {m.split()[0] for c in a for m in c.mutations}
    assert {"method", "target", "version", "header", "length", "chunked", "body", "line_endings", "truncated",
            "pipelined", "half-closed"} <= kinds


def test_statuses_are_read_from_each_response_of_a_connection():
    raw = (b"HTTP/1.1 200 OK\r\ncontent-length: 20\r\n\r\nHTTP/1.1 500 inside\r\n"
           b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    assert http_fuzz.statuses(raw) == [200, 400]


def test_broken_requests_get_no_5xx_and_leave_the_server_as_it_was(server):
    proc, url = server
    http_fuzz.fuzz(url, cases=100, seed=2)                                    # warm-up: first allocations
    report = http_fuzz.fuzz(url, cases=CASES, seed=1, seconds=SECONDS, server_pid=proc.pid)
    summary = http_fuzz.describe(report)
    print(summary)
    assert report.cases >= 500, summary
    assert report.server_errors == [] and report.unanswered == [], summary
    assert sum(n for s, n in report.statuses.items() if s == 200) > 50, summary    # whole requests were served
    assert sum(n for s, n in report.statuses.items() if 400 <= s < 500) > 200, summary
    assert report.health_failures == [] and report.health_slowest_s <= 1.0, summary
    assert report.processes_before == report.processes_after and len(report.processes_before) >= 3, summary
    assert report.rss_after <= report.rss_before * 1.1, summary
    log = server_log(proc)
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-4000:]
