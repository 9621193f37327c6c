"""OpenTelemetry traces (issue 38 item 5; service/tracing.py, service/worker/traces.py): a real server exports
over OTLP/HTTP to a receiver in this test (127.0.0.1, the protobuf ExportTraceServiceRequest decoded with
opentelemetry-proto), one trace per request, its spans from the HTTP process and the inference worker linked
parent to child under the client's `traceparent`; the trace id in the answer's headers and the JSON access line;
nothing a client sends in a span. Off, tracing imports no SDK.

The server serves the committed packages (models/de-en, models/lm-small; TRANSERVE_TEST_PACKAGE and
TRANSERVE_TEST_LM_PACKAGE name others): nothing to train."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from conftest import ROOT, server_log, start_server, stop_server

PACKAGE = os.environ.get("TRANSERVE_TEST_PACKAGE") or str(ROOT / "models" / "de-en")
LM_PACKAGE = os.environ.get("TRANSERVE_TEST_LM_PACKAGE") or str(ROOT / "models" / "lm-small")
KEY = "trace-key-0001"
TEXTS = ["Das Haus ist klein.", "Guten Morgen, wie geht es dir?", "Wir gehen heute in den Park."]
PROMPT = "Das ist"


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver: every span it is sent, as a dict (ids in hex, the sender's process id)."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), ReceiverHandler)
        self.spans: list[dict] = []
        self.lock = threading.Lock()
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def by_trace(self, trace_id: str) -> list[dict]:
        with self.lock:
            return [s for s in self.spans if s["trace_id"] == trace_id]


class ReceiverHandler(BaseHTTPRequestHandler):
    def do_POST(self):
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                                ExportTraceServiceResponse)

        request = ExportTraceServiceRequest()
        request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
        spans = [span_dict(rs, span) for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]
        with self.server.lock:
            self.server.spans += spans
        body = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):   # quiet
        pass


def value(v):
    """An OTLP AnyValue as Python."""
    return getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None


def span_dict(resource_spans, span) -> dict:
    resource = {a.key: value(a.value) for a in resource_spans.resource.attributes}
    return {"trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(), "parent": span.parent_span_id.hex(),
            "name": span.name, "pid": resource["process.pid"], "service": resource["service.name"],
            "attributes": {a.key: value(a.value) for a in span.attributes},
            "events": [(e.name, {a.key: value(a.value) for a in e.attributes}) for e in span.events],
            "links": [link.span_id.hex() for link in span.links], "start": span.start_time_unix_nano,
            "end": span.end_time_unix_nano, "error": span.status.code == 2}


@pytest.fixture(scope="module")
def traced():
    """A server with --log-format json exporting its traces to a Receiver: (url, receiver, proc). Its workers
    wait up to 1 s for more requests after the first (--batch-timeout-ms), so that requests sent together are
    batched together."""
    receiver = Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
           "OTEL_SERVICE_NAME": "transerve-test", "OTEL_BSP_SCHEDULE_DELAY": "100"}
    proc, url = start_server(PACKAGE, "--model", LM_PACKAGE, "--api-keys", KEY, "--log-format", "json",
                             "--batch-timeout-ms", "1000", env=env)
    yield url, receiver, proc
    stop_server(proc)
    receiver.shutdown()


def traceparent() -> tuple[str, str, str]:
    """(header, trace id, span id): a client's sampled W3C trace context."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def wait_for(receiver: Receiver, trace_id: str, names: set[str], seconds: float = 20) -> list[dict]:
    """The trace's spans once every name in `names` is among them (the exporters send every 100 ms)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        spans = receiver.by_trace(trace_id)
        if names <= {s["name"] for s in spans}:
            return spans
        time.sleep(0.1)
    raise AssertionError(f"trace {trace_id}: {sorted(s['name'] for s in receiver.by_trace(trace_id))}, "
                         f"wanted {sorted(names)}")


TRANSLATE_SPANS = {"POST /translate", "transerve.admission", "transerve.queue", "transerve.batch",
                   "transerve.engine.search", "transerve.engine.encode"}


def test_one_trace_per_request_across_the_http_process_and_the_worker_under_the_clients_traceparent(traced):
    url, receiver, _ = traced
    sent = [traceparent() for _ in TEXTS]
    for (header, trace_id, _), text in zip(sent, TEXTS):
        r = httpx.post(url + "/translate", json={"text": text, "source_lang": "de", "target_lang": "en"},
                       headers={"Authorization": f"Bearer {KEY}", "traceparent": header}, timeout=60)
        assert r.status_code == 200 and r.headers["x-trace-id"] == trace_id, r.text
    for (_, trace_id, client_span), text in zip(sent, TEXTS):
        spans = wait_for(receiver, trace_id, TRANSLATE_SPANS)
        by_name = {s["name"]: s for s in spans}
        assert len(by_name) == len(spans), sorted(s["name"] for s in spans)   # each once: one request
        http = by_name["POST /translate"]
        assert http["parent"] == client_span and http["service"] == "transerve-test"
        assert http["attributes"]["http.response.status_code"] == 200 and http["attributes"]["transerve.key"]
        assert http["attributes"]["http.route"] == "/translate" and "url.path" not in http["attributes"]
        for name in ("transerve.admission", "transerve.queue", "transerve.batch"):
            assert by_name[name]["parent"] == http["span_id"], name
        search, encode = by_name["transerve.engine.search"], by_name["transerve.engine.encode"]
        assert search["parent"] == by_name["transerve.batch"]["span_id"] and encode["parent"] == search["span_id"]
        # Two processes: the HTTP process's spans and the worker's, in one trace.
        worker = by_name["transerve.batch"]["pid"]
        assert http["pid"] == by_name["transerve.admission"]["pid"] != worker
        assert {by_name[n]["pid"] for n in ("transerve.queue", "transerve.engine.search", "transerve.engine.encode")} \
            == {worker}
        # Steps are events of the search, not spans; the spans nest in time.
        steps = [e for e in search["events"] if e[0] == "step"]
        assert len(steps) >= 2 and search["attributes"]["transerve.steps"] == len(steps)
        assert http["start"] <= by_name["transerve.queue"]["start"] <= by_name["transerve.queue"]["end"] \
            <= search["start"] <= encode["start"] <= encode["end"] <= search["end"] <= http["end"]
        assert not any(s["error"] for s in spans)
        assert_nothing_sent_is_in(spans, text)


def test_requests_batched_together_share_one_search_linked_from_each_trace(traced):
    """An engine batch serves several requests, so several traces: its search span is in its first request's
    trace, under that request's batch span, and linked to the others' batch spans."""
    url, receiver, _ = traced
    sent = [traceparent() for _ in TEXTS]

    def send(args):
        (header, _, _), text = args
        return httpx.post(url + "/translate", json={"text": text, "source_lang": "de", "target_lang": "en"},
                          headers={"Authorization": f"Bearer {KEY}", "traceparent": header}, timeout=60)

    with cf.ThreadPoolExecutor(len(TEXTS)) as pool:
        assert [r.status_code for r in pool.map(send, zip(sent, TEXTS))] == [200] * len(TEXTS)
    batches = {trace_id: next(s for s in wait_for(receiver, trace_id, {"transerve.batch"})
                              if s["name"] == "transerve.batch") for _, trace_id, _ in sent}
    assert {b["attributes"]["transerve.batch_requests"] for b in batches.values()} == {len(TEXTS)}   # taken together
    deadline = time.monotonic() + 20
    while not (searches := [s for t in batches for s in receiver.by_trace(t)
                            if s["name"] == "transerve.engine.search"]):
        assert time.monotonic() < deadline, "no engine search span"
        time.sleep(0.1)
    (search,) = searches   # one engine batch for the three sentences, in one trace
    first = next(b for b in batches.values() if b["trace_id"] == search["trace_id"])
    assert search["parent"] == first["span_id"] and search["attributes"]["transerve.requests"] == len(TEXTS)
    assert sorted(search["links"]) == sorted(b["span_id"] for b in batches.values() if b is not first)


def test_a_request_without_traceparent_starts_its_own_trace_and_a_generation_is_traced_too(traced):
    url, receiver, _ = traced
    r = httpx.post(url + "/generate", json={"prompt": PROMPT, "max_new_tokens": 4, "seed": 1},
                   headers={"X-API-Key": KEY}, timeout=60)
    assert r.status_code == 200, r.text
    trace_id = r.headers["x-trace-id"]
    assert len(trace_id) == 32 and int(trace_id, 16)
    spans = wait_for(receiver, trace_id, {"POST /generate", "transerve.queue", "transerve.batch"})
    by_name = {s["name"]: s for s in spans}
    http, batch = by_name["POST /generate"], by_name["transerve.batch"]
    assert http["parent"] == "" and batch["parent"] == http["span_id"] and batch["pid"] != http["pid"]
    assert [e for e in batch["events"] if e[0] == "step"]   # the steps that brought it new text
    assert_nothing_sent_is_in(spans, PROMPT)


def test_a_refused_request_is_traced_by_its_error_type_and_the_json_log_carries_the_trace_id(traced):
    url, receiver, proc = traced
    header, trace_id, _ = traceparent()
    r = httpx.post(url + "/translate", json={"text": "Hallo", "source_lang": "de", "target_lang": "en"},
                   headers={"Authorization": "Bearer not-a-key", "traceparent": header, "X-Request-ID": "traced-401"})
    assert r.status_code == 401 and r.headers["x-trace-id"] == trace_id
    http = wait_for(receiver, trace_id, {"POST /translate"})[0]
    assert http["attributes"]["error.type"] == "unauthorized" and not http["error"]   # a 4xx is the client's
    assert_nothing_sent_is_in([http], "not-a-key")
    lines = [json.loads(line) for line in server_log(proc).splitlines() if line.strip()]
    access = [rec for rec in lines if rec["logger"] == "transerve.access" and rec["request_id"] == "traced-401"]
    assert [rec["trace_id"] for rec in access] == [trace_id]


def test_a_client_that_does_not_sample_its_trace_gets_no_spans_exported_but_its_trace_id(traced):
    """The default sampler, parentbased_always_on (OTEL_TRACES_SAMPLER), follows the client's sampled flag."""
    url, receiver, _ = traced
    header, trace_id, _ = traceparent()
    r = httpx.post(url + "/translate", json={"text": TEXTS[0], "source_lang": "de", "target_lang": "en"},
                   headers={"Authorization": f"Bearer {KEY}", "traceparent": header[:-2] + "00"}, timeout=60)
    assert r.status_code == 200 and r.headers["x-trace-id"] == trace_id
    sampled, sampled_id, _ = traceparent()   # a sampled request after it: once its spans are in, so would be these
    httpx.post(url + "/translate", json={"text": TEXTS[0], "source_lang": "de", "target_lang": "en"},
               headers={"Authorization": f"Bearer {KEY}", "traceparent": sampled}, timeout=60)
    wait_for(receiver, sampled_id, TRANSLATE_SPANS)
    time.sleep(0.5)
    assert receiver.by_trace(trace_id) == []


def assert_nothing_sent_is_in(spans: list[dict], text: str) -> None:
    """No attribute or event of these spans quotes the request's text or the key."""
    dump = json.dumps([[s["attributes"], s["events"]] for s in spans], default=str)
    assert text not in dump and KEY not in dump, dump


def test_off_by_default_tracing_imports_no_sdk():
    """No OTEL_* variable: a request's spans are NOOP, and neither the SDK's tracing nor an exporter is imported
    (in a process of its own: this one's may have imported them)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    code = """if True:
        import sys
        import service.server
        from service import tracing
        from service.worker.traces import WorkerTraces, carry
        assert not tracing.enabled()
        with tracing.child_span("x") as span:
            span.set(n=1)
        assert span is tracing.NOOP and span.trace_id is None
        payload = {}
        carry(payload)
        assert payload == {}
        loaded = [m for m in sys.modules if m.startswith(("opentelemetry.sdk.trace", "opentelemetry.exporter"))]
        assert not loaded, loaded
    """
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, timeout=120)
