"""Nothing a client sends outlives its request (issue 54 item 1): a distinct secret planted in every part of a
request (its method, path, query, every header, JSON and form fields, a file's name and content, its API key,
`tracestate`) on every route, against a real server with traces exported to a receiver in this test, once with keys
and JSON logs, once without keys and with text logs; then every log line, every exported span (the OTLP payloads
as received, byte for byte) and the whole `/metrics` text are searched for every secret: none is found.

The one value a client chooses that is written down is its X-Request-ID (1 to 128 printable characters), the request's
id, so that a client or an ingress finds its request in the log (docs/serving.md, "What is logged"): the test plants
one and checks that it is found only as that request's id.

The server serves the committed packages (models/de-en, models/lm-small; TRANSERVE_TEST_PACKAGE and
TRANSERVE_TEST_LM_PACKAGE name others): nothing to train."""

from __future__ import annotations

import io
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest

from conftest import server_log, start_server, stop_server
from test_tracing import LM_PACKAGE, PACKAGE, Receiver, ReceiverHandler, traceparent


class RawReceiver(Receiver):
    """A Receiver that also keeps every export's body as sent: whatever a span carries (attributes, events, links,
    its trace state, its resource) is in those bytes."""

    def __init__(self):
        super().__init__()
        self.RequestHandlerClass = RawHandler
        self.payloads: list[bytes] = []


class RawHandler(ReceiverHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with self.server.lock:
            self.server.payloads.append(body)
        self.rfile = io.BytesIO(body)
        super().do_POST()


@dataclass
class Planted:
    """The secrets of one run, each named by where it was planted; `request_ids` are the X-Request-IDs sent."""
    secrets: dict[str, str] = field(default_factory=dict)
    request_ids: set[str] = field(default_factory=set)

    def new(self, where: str) -> str:
        s = "zq" + secrets.token_hex(8)           # lower case: found in a lower-cased haystack too
        self.secrets[s] = where
        return s


@dataclass
class Run:
    url: str
    proc: object
    receiver: RawReceiver
    key: str | None              # the key the server accepts (itself a planted secret), or None: no keys
    json_logs: bool
    planted: Planted
    metrics_text: str = ""                                   # /metrics after every request
    schema_routes: set[str] = field(default_factory=set)     # the paths of /openapi.json


def start(keys: bool, json_logs: bool) -> Run:
    receiver = RawReceiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    planted = Planted()
    key = planted.new("the server's API key") if keys else None
    env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
           "OTEL_SERVICE_NAME": "transerve-test", "OTEL_BSP_SCHEDULE_DELAY": "100"}
    extra = ["--model", LM_PACKAGE, "--log-format", "json" if json_logs else "text"]
    proc, url = start_server(PACKAGE, *extra, *(["--api-keys", key] if key else []), env=env)
    return Run(url, proc, receiver, key, json_logs, planted)


@pytest.fixture(scope="module", params=["keys, JSON logs", "no keys, text logs"])
def run(request):
    keys = request.param.startswith("keys")
    r = start(keys=keys, json_logs=keys)
    try:
        yield r
    finally:
        stop_server(r.proc)
        r.receiver.shutdown()
        r.receiver.server_close()


# --- the requests ------------------------------------------------------------------------------------------
def headers(run: Run, where: str) -> dict:
    """Every header a client may send, each with a secret of its own, a sampled traceparent (its trace id is the
    client's to choose and is the trace's id) with a secret tracestate, the key if the server has keys."""
    p = run.planted
    tp, _, _ = traceparent()
    h = {"User-Agent": p.new(f"{where}: User-Agent"), "Referer": f"https://{p.new(f'{where}: Referer')}.example/",
         "Cookie": f"session={p.new(f'{where}: Cookie')}", "X-Planted": p.new(f"{where}: X-Planted"),
         "X-Forwarded-For": p.new(f"{where}: X-Forwarded-For"),
         "Origin": f"https://{p.new(f'{where}: Origin')}.example",
         "Accept-Language": p.new(f"{where}: Accept-Language"), "traceparent": tp,
         "tracestate": f"vendor={p.new(f'{where}: tracestate')}",
         "X-Forwarded-Host": f"{p.new(f'{where}: X-Forwarded-Host')}.example",
         "Host": f"{p.new(f'{where}: Host')}.example"}     # the download link is built from it: in the answer only
    h["X-Request-ID"] = "rid" + secrets.token_hex(8)
    if run.key:
        h["Authorization"] = f"Bearer {run.key}"
    else:   # a key sent to a server without keys is not read, and not written down either
        h["Authorization"] = f"Bearer {p.new(f'{where}: an unasked-for key')}"
    return h


def query(run: Run, where: str) -> dict:
    return {"q": run.planted.new(f"{where}: the query"), run.planted.new(f"{where}: a query name"): "1"}


def send(client: httpx.Client, run: Run, method: str, path: str, **kwargs) -> httpx.Response:
    """The request, every part planted; its X-Request-ID noted when the answer carries it back (the app took it:
    a request uvicorn refuses before the app, an unknown method, gets an id of the server's own)."""
    where = f"{method} {path}"
    sent = headers(run, where) | kwargs.pop("headers", {})
    r = client.request(method, path, params=query(run, where), headers=sent, **kwargs)
    if r.headers.get("x-request-id") == sent["X-Request-ID"]:
        run.planted.request_ids.add(sent["X-Request-ID"])
    return r


def requests_of(run: Run) -> list[tuple[str, str, dict]]:
    """(method, path, httpx arguments) of a request to every route, the bodies' fields planted too; each JSON route
    also once with its fields' values refused (an error message that quotes a value stays in its answer)."""
    s = run.planted.new
    key = {"api_key": run.key} if run.key else {}
    return [
        ("POST", "/translate", {"json": {"text": [f"Das Haus {s('/translate text')}.", s("/translate text 2")],
                                         "source_lang": "de", "target_lang": "en"}}),
        ("POST", "/translate", {"json": {"text": s("/translate text, refused"), "source_lang": s("/translate source"),
                                         "target_lang": s("/translate target"), s("/translate field name"): 1}}),
        ("POST", "/translate", {"content": b'{"text": "' + s("/translate, malformed JSON").encode() + b'"',
                                "headers": {"Content-Type": "application/json"}}),
        ("POST", "/generate", {"json": {"prompt": f"Das ist {s('/generate prompt')}", "max_new_tokens": 3}}),
        ("POST", "/generate", {"json": {"prompt": s("/generate prompt, refused"), "max_new_tokens": s("/generate n"),
                                        "model": s("/generate model")}}),
        ("POST", "/generate", {"json": {"prompt": f"Das {s('/generate streamed prompt')}", "max_new_tokens": 3,
                                        "stream": True}}),
        ("GET", "/languages", {}),
        ("POST", "/v1/completions", {"json": {"model": "lm-small", "prompt": f"Das {s('/v1/completions prompt')}",
                                              "max_tokens": 3, "user": s("/v1/completions user")}}),
        ("POST", "/v1/completions", {"json": {"model": "lm-small", "prompt": f"Das {s('/v1/completions stream')}",
                                              "max_tokens": 3, "stream": True}}),
        ("POST", "/v1/completions", {"json": {"model": s("/v1/completions model"), "prompt": s("/v1 prompt 2")}}),
        ("POST", "/v1/chat/completions", {"json": {"model": s("chat model"), "messages": [
            {"role": "user", "content": s("chat content")}]}}),
        ("GET", "/v1/models", {}),
        ("GET", f"/v1/models/{s('/v1/models/{model} path')}", {}),
        ("GET", "/v1/models/lm-small", {}),
        ("POST", "/libretranslate/translate", {"json": {"q": f"Guten Morgen {s('libretranslate q')}",
                                                        "source": "de", "target": "en", **key}}),
        ("POST", "/libretranslate/translate", {"data": {"q": f"Guten Tag {s('libretranslate form q')}",
                                                        "source": "auto", "target": "en", "format": "html", **key}}),
        ("POST", "/libretranslate/translate", {"data": {"q": s("libretranslate q, refused"),
                                                        "source": s("libretranslate source"), "target": "en",
                                                        **key}}),
        ("POST", "/libretranslate/detect", {"data": {"q": f"Das Haus ist {s('detect q')}", s("form field name"): "1",
                                                     **key}}),
        ("GET", "/libretranslate/languages", {}),
        ("GET", "/libretranslate/frontend/settings", {}),
        ("GET", f"/libretranslate/download_file/{s('download path')}.txt", {}),
        ("POST", "/libretranslate/translate_file", {"data": {"source": "de", "target": "en", **key,
                                                             s("a file form's field name"): "1"}, "files": {
            "file": (f"{s('file name')}.txt", f"Das Haus {s('file content')}.\n".encode(), s("part content type"),
                     {"X-Part": s("a part's header")})}}),
        ("POST", "/libretranslate/translate_file", {"data": {"source": "de", "target": "en", **key}, "files": {
            "file": (f"{s('file name, refused')}.{s('file extension')}", s("file content 2").encode())}}),
        ("POST", "/glossaries", {"json": {"name": s("glossary name"), "source_lang": "de", "target_lang": "en",
                                          "entries": [{"source": "Haus", "target": s("glossary target term")},
                                                      {"source": s("glossary source term"), "target": "x"}]}}),
        ("POST", "/glossaries", {"json": {"name": s("glossary name, refused"), "source_lang": "de",
                                          "target_lang": s("glossary target_lang"),
                                          "entries": f"{s('glossary TSV')}\t{s('glossary TSV 2')}\tx\n"}}),
        ("GET", "/glossaries", {}),
        ("GET", f"/glossaries/{s('glossary id path')}", {}),
        ("GET", f"/glossaries/{s('glossary id path, entries')}/entries", {}),
        ("DELETE", f"/glossaries/{s('glossary id path, deleted')}", {}),
        ("POST", "/translate", {"json": {"text": s("/translate text, glossary_id"), "source_lang": "de",
                                         "target_lang": "en", "glossary_id": s("/translate glossary_id")}}),
        *deepl_requests(run),
        # Model control's admin routes (api/admin.py): no admin keys file here, so 403 before any body is read
        ("GET", "/admin/models", {}),
        ("POST", "/admin/models", {"json": {"path": s("admin package path"), "version": s("admin version")}}),
        *(("POST", f"/admin/models/{what}", {"json": {"name": s(f"admin {what} name"), "share": 0.5}})
          for what in ("canary", "promote", "rollback", "unload")),
        ("GET", "/ui", {}), ("GET", "/docs", {}), ("GET", "/redoc", {}), ("GET", "/docs/oauth2-redirect", {}),
        ("GET", "/health", {}), ("HEAD", "/health", {}), ("GET", "/ready", {}), ("GET", "/info", {}),
        ("GET", "/usage", {}), ("GET", "/openapi.json", {}),
        ("GET", f"/{s('an unknown path')}/{s('an unknown path, deeper')}", {}),
        ("POST", f"/translate/{s('a known path, longer')}", {"json": {}}),
        ("DELETE", "/translate", {}),
        (s("a method").upper(), "/translate", {}),
    ]


def deepl_requests(run: Run) -> list[tuple[str, str, dict]]:
    """DeepL's routes (api/deepl.py, deepl_documents.py), their fields planted; the key as DeepL's clients send it."""
    s = run.planted.new
    auth = {"headers": {"Authorization": f"DeepL-Auth-Key {run.key}"}} if run.key else {}
    return [
        ("POST", "/deepl/v2/translate", {"json": {"text": [f"Das Haus {s('deepl text')}."], "target_lang": "EN-US",
                                                  "context": s("deepl context")}, **auth}),
        ("POST", "/deepl/v2/translate", {"data": {"text": f"<p>Guten Tag {s('deepl form text')}</p>",
                                                  "target_lang": "EN-GB", "tag_handling": "html"}}),
        ("POST", "/deepl/v2/translate", {"json": {"text": [s("deepl text, refused")],
                                                  "target_lang": s("deepl target_lang")}}),
        ("GET", "/deepl/v2/languages", {}), ("POST", "/deepl/v2/usage", {}),
        ("GET", "/deepl/v2/glossary-language-pairs", {}),
        ("POST", "/deepl/v2/glossaries", {"json": {"name": s("deepl glossary name"), "source_lang": "de",
                                                   "target_lang": "en", "entries_format": "tsv",
                                                   "entries": f"Haus\t{s('deepl glossary term')}\n"}}),
        ("GET", "/deepl/v2/glossaries", {}),
        ("GET", f"/deepl/v2/glossaries/{s('deepl glossary id path')}", {}),
        ("GET", f"/deepl/v2/glossaries/{s('deepl glossary id path, entries')}/entries", {}),
        ("DELETE", f"/deepl/v2/glossaries/{s('deepl glossary id path, deleted')}", {}),
        ("POST", "/deepl/v2/document", {"data": {"target_lang": "EN-US", "source_lang": "DE"}, "files": {
            "file": (f"{s('deepl file name')}.txt", f"Das Haus {s('deepl file content')}.\n".encode())}}),
        ("POST", f"/deepl/v2/document/{s('deepl document id path')}", {"json": {
            "document_key": s("deepl document_key, unknown")}}),
        ("POST", f"/deepl/v2/document/{s('deepl document id path, result')}/result", {"json": {
            "document_key": s("deepl document_key, result")}}),
    ]


def use_document(client: httpx.Client, run: Run, answer: dict) -> None:
    """A DeepL document job (its id and key are secrets its client holds) polled until done and downloaded."""
    document_id, key = answer["document_id"], answer["document_key"]
    run.planted.secrets[document_id], run.planted.secrets[key] = "a document's id", "a document's key"
    path, deadline = f"/deepl/v2/document/{document_id}", time.time() + 60
    while (r := send(client, run, "POST", path, json={"document_key": key})).json()["status"] != "done":
        assert r.status_code == 200 and r.json()["status"] in ("queued", "translating") and time.time() < deadline
        time.sleep(0.2)
    d = send(client, run, "POST", path + "/result", json={"document_key": key})
    assert d.status_code == 200 and d.content, d.text[:300]


def exercise(run: Run) -> None:
    """Every request of requests_of, and the translated file's download link (its token and name are secrets a
    client holds); with keys, each route once more with a wrong key (itself a secret) and once with none."""
    with httpx.Client(base_url=run.url, timeout=60) as client:
        for method, path, kwargs in requests_of(run):
            r = send(client, run, method, path, **kwargs)
            assert r.status_code < 500, (method, path, r.status_code, r.text[:300])
            if path.endswith("translate_file") and r.status_code == 200:
                link = r.json()["translatedFileUrl"]
                run.planted.secrets[link.rsplit("/", 1)[1].split(".", 1)[0]] = "the download token"
                d = send(client, run, "GET", httpx.URL(link).path)
                assert d.status_code == 200 and d.content, d.text[:300]
            if (method, path) == ("POST", "/glossaries") and r.status_code == 201:
                use_glossary(client, run, r.json()["glossary_id"])
            if (method, path) == ("POST", "/deepl/v2/document"):
                assert r.status_code == 200, r.text[:300]
                use_document(client, run, r.json())
            if (method, path) == ("POST", "/deepl/v2/glossaries") and r.status_code == 201:
                run.planted.secrets[r.json()["glossary_id"]] = "a DeepL glossary's id"
                assert send(client, run, "DELETE", f"/deepl/v2/glossaries/{r.json()['glossary_id']}").status_code \
                    == 204
        if run.key:
            for path in ("/translate", "/libretranslate/translate", "/v1/completions", "/metrics"):
                wrong = {"Authorization": f"Bearer {run.planted.new(f'a wrong key on {path}')}"}
                assert send(client, run, "POST", path, json={}, headers=wrong).status_code in (401, 403, 405)
                bare = headers(run, path)
                del bare["Authorization"]
                assert client.post(path, json={}, headers=bare, params=query(run, path)).status_code in (401, 403,
                                                                                                         405)
        auth = {"Authorization": f"Bearer {run.key}"} if run.key else {}
        metrics = client.get("/metrics", headers=auth)
        assert metrics.status_code == 200
        run.metrics_text = metrics.text
        run.schema_routes = set(client.get("/openapi.json", headers=auth).json()["paths"])


def use_glossary(client: httpx.Client, run: Run, glossary_id: str) -> None:
    """A stored glossary (its id a secret its key holds) read, used by a translation and deleted."""
    run.planted.secrets[glossary_id] = "a glossary's id"
    text = f"Das Haus {run.planted.new('/translate text, a stored glossary')}."
    for method, path, kwargs in (("GET", f"/glossaries/{glossary_id}", {}),
                                 ("GET", f"/glossaries/{glossary_id}/entries", {}),
                                 ("POST", "/translate", {"json": {"text": text, "source_lang": "de",
                                                                  "target_lang": "en", "glossary_id": glossary_id}}),
                                 ("DELETE", f"/glossaries/{glossary_id}", {})):
        r = send(client, run, method, path, **kwargs)
        assert r.status_code in (200, 204), (method, path, r.text[:300])


def spans_exported(run: Run, seconds: float = 10) -> bytes:
    """Every export the receiver got, once the server's exporters have sent what they held (every 100 ms)."""
    time.sleep(1.0)
    deadline, seen = time.monotonic() + seconds, -1
    while time.monotonic() < deadline:
        with run.receiver.lock:
            n = len(run.receiver.payloads)
        if n == seen:
            break
        seen = n
        time.sleep(1.0)
    with run.receiver.lock:
        return b"\n".join(run.receiver.payloads)


def found(secret: str, haystacks: dict[str, str]) -> list[str]:
    return [name for name, text in haystacks.items() if secret in text]


def test_no_secret_a_client_sends_is_in_a_log_line_a_span_or_a_metric(run):
    exercise(run)
    log = server_log(run.proc)
    spans = spans_exported(run).decode("utf-8", errors="replace")
    haystacks = {"the log": log.lower(), "the spans": spans.lower(), "/metrics": run.metrics_text.lower()}
    assert len(run.planted.secrets) > 150
    leaks = {where: found(secret, haystacks) for secret, where in run.planted.secrets.items()}
    leaks = {where: places for where, places in leaks.items() if places}
    assert not leaks, sorted(f"{where} -> {', '.join(places)}" for where, places in leaks.items())
    # The run was seen: the access lines and the spans are there, with their routes as templates.
    lines = [line for line in log.splitlines() if "/libretranslate/download_file" in line]
    assert lines and all("/libretranslate/download_file/{filename}" in line for line in lines), lines[:3]
    assert "POST /translate" in spans and "(unmatched)" in log
    # The inference workers' own lines are in the log searched, in either format (a spawned worker configures its
    # logging as the main process was told to; in text it once left them to Python's last resort, warnings only).
    assert "worker ready" in log
    # Every route of the API's schema was asked (and the hidden ones: /v1/chat/completions, /ui, /docs, /metrics).
    access = re.compile(r"transerve\.access: [A-Z]+ (\S+) \d{3} ")
    routes = {json.loads(line)["route"] for line in log.splitlines() if line.startswith('{"') and '"route"' in line} \
        | {m.group(1) for m in access.finditer(log)}
    assert run.schema_routes - routes == set()
    assert {"/v1/chat/completions", "/ui", "/docs", "/redoc", "/metrics", "/openapi.json"} <= routes


def test_a_client_request_id_is_written_only_as_its_request_id(run):
    log = server_log(run.proc)
    if not run.planted.request_ids:
        exercise(run)
        log = server_log(run.proc)
    for rid in run.planted.request_ids:
        at = [m.start() for m in re.finditer(re.escape(rid), log)]
        assert at, rid                                        # every request has its access line
        for i in at:
            before = log[max(0, i - 16):i]
            assert before.endswith('"request_id": "') or before.endswith("request_id="), log[i - 200:i + 50]
    if run.json_logs:
        for line in log.splitlines():
            if line.startswith("{"):
                json.loads(line)
