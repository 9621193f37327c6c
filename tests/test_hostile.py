"""Hostile and odd requests against a real server (127.0.0.1, the tiny translation and generation
packages): a lone UTF-16 surrogate beside valid requests fails alone, on every batch path; the gauges
come back to idle; bodies over the limit are refused before they are read; every error the service or
the stack under it produces has the documented JSON shape. And, without a server, a worker hook that
raises for one request fails that request alone, and every failure line names the request as request_id= only."""

import asyncio
import concurrent.futures as cf
import json
import logging
import re
import socket
import time
from types import SimpleNamespace
from urllib.parse import urlsplit

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import pairs64, read_answer, server_log, start_server, stop_server
from service.client import AsyncClient, BadRequestError, Client

PAIRS = dict(pairs64())
DE = list(PAIRS)[:20]
LIMIT = 100_000          # --max-payload-bytes of this module's server
SURROGATE = "Hal\ud800lo"  # a lone surrogate: JSON "\ud800" without its pair


@pytest.fixture(scope="module")
def server(tiny_package, tiny_lm_package):
    proc, url = start_server(tiny_package, "--model", str(tiny_lm_package), "--batch-timeout-ms", "100",
                             "--max-batch-size", "32", "--max-payload-bytes", str(LIMIT),
                             "--max-output-tokens", "16")
    yield SimpleNamespace(url=url, proc=proc)
    stop_server(proc)


def post_raw(url: str, path: str, body: dict, stream: bool = False) -> tuple[int, str, dict]:
    """(status, content type, JSON body or the SSE events as {"events": [...]}). json.dumps escapes
    a lone surrogate as \\ud800, as a JavaScript client would send it."""
    content, headers = json.dumps(body).encode(), {"content-type": "application/json"}
    with httpx.stream("POST", url + path, content=content, headers=headers, timeout=60) as r:
        r.read()
        ctype = r.headers.get("content-type", "")
        if ctype.startswith("text/event-stream"):
            return r.status_code, ctype, {"events": [json.loads(x[6:]) for x in r.text.splitlines()
                                                     if x.startswith("data: ")]}
        return r.status_code, ctype, r.json()


def concurrently(url: str, path: str, bodies: list[dict]) -> list[tuple[int, str, dict]]:
    with cf.ThreadPoolExecutor(len(bodies)) as ex:
        return list(ex.map(lambda b: post_raw(url, path, b), bodies))


def metrics(url: str) -> dict[tuple, float]:
    """(name, *sorted label pairs but pid) -> value, summed over processes."""
    out: dict[tuple, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in family.samples:
            key = (s.name, *sorted((k, v) for k, v in s.labels.items() if k != "pid"))
            out[key] = out.get(key, 0.0) + s.value
    return out


def errors(url: str, endpoint: str) -> dict[str, float]:
    return {dict(k[1:])["kind"]: v for k, v in metrics(url).items()
            if k[0] == "transerve_errors_total" and dict(k[1:]).get("endpoint") == endpoint}


def assert_idle(url: str) -> None:
    """Every queue-depth and in-flight series back at 0 (a leak stays up: polled for a few seconds)."""
    deadline = time.time() + 5
    while True:
        busy = {k: v for k, v in metrics(url).items()
                if k[0] in ("transerve_queue_depth_requests", "transerve_requests_in_flight") and v != 0}
        if not busy or time.time() > deadline:
            break
        time.sleep(0.2)
    assert not busy, busy
    names = {k[0] for k in metrics(url)}
    assert {"transerve_queue_depth_requests", "transerve_requests_in_flight"} <= names


# --- a lone surrogate fails alone, on every batch path -----------------------------------------------

def test_a_lone_surrogate_beside_20_translations_fails_alone(server):
    good = [{"text": s, "source_lang": "de", "target_lang": "en", "beam_size": 2} for s in DE]
    alone = [post_raw(server.url, "/translate", b)[2]["translations"][0]["text"] for b in good]
    bads = [{"text": SURROGATE, "source_lang": "de", "target_lang": "en"},
            {"text": ["Das geht zu weit.", SURROGATE], "source_lang": "de", "target_lang": "en"}]
    before = errors(server.url, "translate")
    for round_ in range(10):
        results = concurrently(server.url, "/translate", good + [bads[round_ % 2]])
        assert [r[0] for r in results] == [200] * 20 + [422], [r[2] for r in results if r[0] != 200]
        assert [r[2]["translations"][0]["text"] for r in results[:20]] == alone
        err = results[20][2]
        assert err["error"]["type"] == "invalid_request" and "surrogate" in err["error"]["message"], err
        assert err["request_id"] and ("text[1]" in err["error"]["message"]) == (round_ % 2 == 1)
    after = errors(server.url, "translate")
    assert after["validation"] - before["validation"] == 10
    assert after["overload"] == before["overload"] and after["internal"] == before["internal"]
    assert_idle(server.url)


@pytest.mark.parametrize("stream", [False, True])
def test_a_lone_surrogate_beside_20_generations_fails_alone(server, stream):
    halves = [" ".join(s.split()[:2]) for s in DE]
    good = [{"prompt": h, "max_new_tokens": 4, "temperature": 0, "stream": stream} for h in halves]
    bads = [{"prompt": SURROGATE, "max_new_tokens": 4, "stream": stream},
            {"prompt": "Das", "stop": ["ok", SURROGATE], "max_new_tokens": 4, "stream": stream}]
    before = errors(server.url, "generate")
    for round_ in range(10):
        results = concurrently(server.url, "/generate", good + [bads[round_ % 2]])
        assert [r[0] for r in results] == [200] * 20 + [422], [r[2] for r in results if r[0] != 200]
        for _, ctype, body in results[:20]:
            if stream:
                assert ctype.startswith("text/event-stream") and body["events"][-1]["type"] == "done", body
            else:
                assert body["choices"][0]["finish_reason"] in ("stop", "length"), body
        _, ctype, err = results[20]
        assert ctype == "application/json" and err["error"]["type"] == "invalid_request"
        assert "surrogate" in err["error"]["message"] and err["request_id"]
        assert ("stop[1]" if round_ % 2 else "prompt") in err["error"]["message"]
    after = errors(server.url, "generate")
    assert after["validation"] - before["validation"] == 10
    assert after["overload"] == before["overload"] and after["internal"] == before["internal"]
    assert_idle(server.url)


def test_a_lone_surrogate_beside_20_libretranslate_requests_fails_alone(server):
    good = [{"q": s, "source": "de", "target": "en"} for s in DE]
    alone = [post_raw(server.url, "/libretranslate/translate", b)[2]["translatedText"] for b in good]
    before = errors(server.url, "libretranslate")
    for _ in range(10):
        results = concurrently(server.url, "/libretranslate/translate",
                               good + [{"q": SURROGATE, "source": "de", "target": "en"}])
        assert [r[0] for r in results] == [200] * 20 + [400]
        assert [r[2]["translatedText"] for r in results[:20]] == alone
        err = results[20][2]
        assert list(err) == ["error"] and "surrogate" in err["error"], err   # LibreTranslate's shape
    after = errors(server.url, "libretranslate")
    assert after["validation"] - before["validation"] == 10 and after["overload"] == before["overload"]
    assert_idle(server.url)


# --- bodies over the limit: refused before they are read -----------------------------------------------

def raw_exchange(url: str, head: bytes, chunks=(), timeout: float = 10) -> tuple[int, dict, bytes, float]:
    """Sends `head` (request line and headers) and then `chunks` until the server answers; reads the
    answer. (status, headers, body, seconds to the answer)."""
    u = urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=timeout) as s:
        t0 = time.monotonic()
        s.sendall(head)
        for chunk in chunks:
            s.sendall(chunk)
            s.settimeout(0.02)   # stop sending once the answer is there (the server stops reading)
            try:
                data = s.recv(65536, socket.MSG_PEEK)
            except (TimeoutError, BlockingIOError):
                data = b""
            finally:
                s.settimeout(timeout)
            if data:
                break
        status, headers, body = read_answer(s)
        return status, headers, body, time.monotonic() - t0


def request_head(path: str, *headers: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            + "".join(h + "\r\n" for h in headers) + "\r\n").encode()


@pytest.mark.parametrize("stream", [False, True])
def test_generation_clients_that_leave_at_once_give_their_places_back(server, stream):
    """30 clients send a generation request and close the connection without reading a byte: each gives
    back its queue place and in-flight count, and the server keeps serving."""
    body = json.dumps({"prompt": "Das", "max_new_tokens": 16, "temperature": 0, "stream": stream}).encode()
    head = request_head("/generate", f"Content-Length: {len(body)}")
    for _ in range(30):
        with socket.create_connection((urlsplit(server.url).hostname, urlsplit(server.url).port)) as conn:
            conn.sendall(head + body)
    assert_idle(server.url)
    assert post_raw(server.url, "/generate", {"prompt": "Das", "max_new_tokens": 4})[0] == 200


def test_an_answer_sent_before_the_body_is_whole_reaches_a_client_that_asked_for_the_close(server):
    """A route that refuses without reading the body (/v1/chat/completions) answers while the body is still on its way;
    the connection closes after the answer (Connection: close), and the rest of the body, read by no one, made the
    kernel reset it: the client lost the 400 it had been sent (found by benchmarks/http_fuzz.py). The rest is read and
    dropped once the answer is out, so the client reads its 400."""
    body = json.dumps({"model": "lm-small", "messages": [{"role": "user", "content": "Hallo " * 2000}]}).encode()
    head = request_head("/v1/chat/completions", f"Content-Length: {len(body)}", "Connection: close")
    u = urlsplit(server.url)
    for _ in range(5):
        with socket.create_connection((u.hostname, u.port), timeout=10) as conn:
            conn.sendall(head + body[:100])
            time.sleep(0.05)                              # the answer is sent now, the body not yet whole
            for i in range(100, len(body), 1000):
                conn.sendall(body[i:i + 1000])
                time.sleep(0.002)
            status, _, answer = read_answer(conn)
        assert status == 400 and b"chat_not_supported" in answer


@pytest.mark.parametrize("path,endpoint", [("/translate", "translate"), ("/generate", "generate"),
                                           ("/v1/completions", "completions"),
                                           ("/libretranslate/translate", "libretranslate"),
                                           ("/libretranslate/detect", "detect")])
def test_a_client_that_leaves_mid_body_is_client_closed_not_our_failure(server, path, endpoint):
    """A client that closes its connection with its body cut short gets no answer, and counts as 499
    `client_closed`: not as a 500 `internal` (the alert that means a bug), nor a 400 for a body it never
    finished, and no traceback in the log."""
    key = ("transerve_requests_total", ("endpoint", endpoint), ("status", "499"))
    before, errors_before = metrics(server.url), errors(server.url, endpoint)
    u = urlsplit(server.url)
    with socket.create_connection((u.hostname, u.port)) as conn:
        conn.sendall(request_head(path, "Content-Length: 100") + b"{")
    deadline = time.time() + 10
    while metrics(server.url).get(key, 0) == before.get(key, 0) and time.time() < deadline:
        time.sleep(0.05)
    after = metrics(server.url)
    assert after.get(key, 0) - before.get(key, 0) == 1, {k: v for k, v in after.items() if endpoint in str(k)}
    changed = {kind: n - errors_before.get(kind, 0) for kind, n in errors(server.url, endpoint).items()
               if n != errors_before.get(kind, 0)}
    assert changed == {"client_closed": 1}, changed
    log = server_log(server.proc)
    assert "unhandled error" not in log and "Traceback" not in log, log[-4000:]


@pytest.mark.parametrize("path", ["/translate", "/generate", "/libretranslate/translate"])
def test_a_declared_content_length_over_the_limit_is_answered_at_once(server, path):
    """Content-Length: 1000000000000 and a few bytes: 413 without waiting for the rest (it used to
    hold the connection until the client gave up)."""
    status, headers, body, seconds = raw_exchange(
        server.url, request_head(path, "Content-Length: 1000000000000") + b'{"text": "Hallo"')
    assert status == 413 and seconds < 5, (status, seconds)
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    err = json.loads(body)
    if path.startswith("/libretranslate/"):
        assert list(err) == ["error"] and str(LIMIT) in err["error"]
    else:
        assert err["error"]["type"] == "payload_too_large" and err["error"]["limit"] == LIMIT
        assert err["request_id"] == headers["x-request-id"]


@pytest.mark.parametrize("path", ["/translate", "/libretranslate/translate"])
def test_a_chunked_body_is_counted_as_it_is_read(server, path):
    chunk = b'{"text": "' + b"a" * 8_000
    chunks = [b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(3 * LIMIT // len(chunk))] + [b"0\r\n\r\n"]
    status, headers, body, seconds = raw_exchange(server.url, request_head(path, "Transfer-Encoding: chunked"),
                                                  chunks)
    assert status == 413 and headers["content-type"] == "application/json", (status, body)
    err = json.loads(body)
    limit = err["error"] if path.startswith("/libretranslate/") else err["error"]["limit"]
    assert str(LIMIT) in str(limit), err
    # Under the limit, a chunked body is read as usual.
    good = json.dumps({"text": DE[0], "source_lang": "de", "target_lang": "en"}).encode()
    r = httpx.post(server.url + "/translate", content=iter([good[:10], good[10:]]),
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 200 and "content-length" not in r.request.headers


# --- every error in the documented shape ----------------------------------------------------------------

@pytest.mark.parametrize("content,fragment", [
    (b'{"text": "Hal\xff\xfelo", "source_lang": "de", "target_lang": "en"}', "UTF-8"),
    (b"[" * 10_000 + b"]" * 10_000, "nested too deeply"),
    (b'{"text": ' + b"[" * 10_000 + b"]" * 10_000 + b', "source_lang": "de", "target_lang": "en"}', "nested"),
])
def test_a_body_that_is_not_json_gets_400_in_the_error_shape(server, content, fragment):
    for path in ("/translate", "/generate"):
        r = httpx.post(server.url + path, content=content, headers={"content-type": "application/json"}, timeout=60)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["type"] == "invalid_json" and fragment in r.json()["error"]["message"], r.text
        assert r.json()["request_id"] == r.headers["x-request-id"]
    r = httpx.post(server.url + "/libretranslate/translate", content=content,
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400 and fragment in r.json()["error"], r.text


JSON_BODIES = {"/translate": {"text": DE[0], "source_lang": "de", "target_lang": "en"},
               "/generate": {"prompt": "Das", "max_new_tokens": 2},
               "/v1/completions": {"model": "tiny-lm", "prompt": "Das", "max_tokens": 2},
               "/libretranslate/translate": {"q": DE[0], "source": "de", "target": "en"},
               "/libretranslate/detect": {"q": DE[0]}}


@pytest.mark.parametrize("path", list(JSON_BODIES))
@pytest.mark.parametrize("ctype,taken", [(None, False), ("text/plain", False), ("application/json", True),
                                         ("application/json; charset=utf-8", True),
                                         ("application/vnd.example+json", True),
                                         ("application/x-www-form-urlencoded", False)])
def test_one_content_type_rule_per_api_flavour(server, path, ctype, taken):
    """Ours and OpenAI's: a JSON body declared as JSON, anything else a 400 in the route's shape.
    LibreTranslate's, as LibreTranslate reads them: JSON declared as JSON, or a form (a JSON body
    declared as a form is a form without q)."""
    head = {} if ctype is None else {"content-type": ctype}
    r = httpx.post(server.url + path, content=json.dumps(JSON_BODIES[path]).encode(), headers=head, timeout=60)
    assert r.status_code == (200 if taken else 400), r.text
    if taken:
        return
    if path.startswith("/libretranslate/"):
        form = ctype == "application/x-www-form-urlencoded"
        assert ("missing q" if form else "Content-Type: application/json") in r.json()["error"], r.text
        r = httpx.post(server.url + path, data=JSON_BODIES[path], timeout=60)   # the fields as a form
        assert r.status_code == 200, r.text
    elif path.startswith("/v1/"):
        assert r.json()["error"]["code"] == "invalid_json" and "Content-Type" in r.json()["error"]["message"]
    else:
        assert r.json()["error"]["type"] == "invalid_json" and "Content-Type" in r.json()["error"]["message"]


def test_an_empty_prompt_starts_a_new_text_where_an_empty_text_is_422(server):
    """The README's rule: /translate refuses empty text (422), LibreTranslate an empty q (400), and the
    generation routes take an empty prompt."""
    status, _, body = post_raw(server.url, "/generate", {"prompt": "", "max_new_tokens": 3})
    assert status == 200 and body["choices"][0]["tokens"] >= 1, body
    r = httpx.post(server.url + "/v1/completions", json={"model": "tiny-lm", "prompt": "", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 0, r.text
    for text in ("", "  "):
        status, _, body = post_raw(server.url, "/translate", {"text": text, "source_lang": "de", "target_lang": "en"})
        assert status == 422 and "empty" in body["error"]["message"], body
    status, _, body = post_raw(server.url, "/libretranslate/translate", {"q": "", "source": "de", "target": "en"})
    assert status == 400 and "missing q" in body["error"], body


def test_405_keeps_its_allow_header(server):
    r = httpx.get(server.url + "/translate")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["error"]["type"] == "method_not_allowed" and r.json()["request_id"]
    r = httpx.put(server.url + "/health")
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD" and r.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/health", "/ready", "/languages", "/info"])
def test_head_is_answered_by_every_get_route(server, path):
    """Uptime checkers send HEAD: a GET route's status and headers, no body."""
    get, head = httpx.get(server.url + path), httpx.head(server.url + path)
    assert head.status_code == get.status_code == 200 and head.content == b"", head
    assert head.headers["content-type"] == get.headers["content-type"]
    assert head.headers["content-length"] == get.headers["content-length"]
    r = httpx.head(server.url + "/translate")
    assert r.status_code == 405 and r.headers["allow"] == "POST" and r.content == b""


def test_405_and_404_count_as_validation_errors_not_internal_ones(server):
    """transerve_errors_total{kind="internal"} is what the dashboard calls a bug: a wrong method is not one."""
    before = errors(server.url, "translate")
    for _ in range(3):
        assert httpx.get(server.url + "/translate").status_code == 405
    after = errors(server.url, "translate")
    assert after["validation"] - before["validation"] == 3 and after["internal"] == before["internal"]


def test_a_lone_surrogate_in_a_key_gets_the_surrogate_message(server):
    for path, body in (("/translate", {"text": "Hallo", "source_lang": "de", "target_lang": "en"}),
                       ("/generate", {"prompt": "Das"})):
        status, _, err = post_raw(server.url, path, body | {"Hal\ud800lo": 1})
        assert status == 422 and err["error"]["type"] == "invalid_request", err
        assert "lone UTF-16 surrogate" in err["error"]["message"] and "field name" in err["error"]["message"], err


@pytest.mark.parametrize("given,echoed", [("req-1_a.b:c/d", True), ("x" * 128, True), ("x" * 129, False),
                                          ("two words", False), ("caf\u00e9", False), ("", False)])
def test_x_request_id_is_echoed_only_when_short_and_printable(server, given, echoed):
    r = httpx.post(server.url + "/translate", json={"text": 5}, headers={"X-Request-ID": given.encode()})
    rid = r.headers["x-request-id"]
    assert r.json()["request_id"] == rid and (rid == given) == echoed, rid
    if not echoed:
        assert len(rid) == 32 and int(rid, 16) >= 0   # a new id (uuid4 hex)


def test_a_request_uvicorn_cannot_parse_gets_400_json(server):
    status, headers, body, _ = raw_exchange(server.url, request_head("/translate", "Content-Length: -1") + b"{}")
    assert status == 400 and headers["content-type"] == "application/json"
    err = json.loads(body)
    assert err["error"]["type"] == "invalid_http" and "Content-Length" in err["error"]["message"]
    assert err["request_id"] == headers["x-request-id"]
    assert httpx.get(server.url + "/health").text == "ok"


def test_litserve_info_is_gone(server):
    r = httpx.get(server.url + "/litserve/info")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
    assert httpx.get(server.url + "/info").status_code == 200
    assert "/litserve/info" not in httpx.get(server.url + "/openapi.json").json()["paths"]


# --- LibreTranslate's routes: its field names, UTF-8 forms, no lone surrogate -----------------------------

def libre(url: str, path: str, **kwargs) -> tuple[int, str]:
    """(status, the error's message, or the answer's text). json= is sent escaped (a lone surrogate as \\ud800)."""
    if "json" in kwargs:
        kwargs = {"content": json.dumps(kwargs.pop("json")).encode(), "headers": {"content-type": "application/json"}}
    r = httpx.post(url + path, timeout=60, **kwargs)
    if r.status_code < 400:
        return r.status_code, r.text
    assert list(r.json()) == ["error"], r.text   # LibreTranslate's shape
    return r.status_code, r.json()["error"]


@pytest.mark.parametrize("form", [
    b"q=Hal\xff\xfelo&source=de&target=en",           # bytes that are no UTF-8
    b"q=Hal%FF%FElo&source=de&target=en",               # ... %-escaped
    b"q=Hal%ED%A0%80lo&source=de&target=en",            # a lone surrogate (U+D800), UTF-8-encoded and %-escaped
    b"q=Hal\xed\xa0\x80lo&source=de&target=en",        # ... as raw bytes
])
def test_a_libretranslate_form_that_is_not_utf8_gets_400_as_json_does(server, form):
    status, err = libre(server.url, "/libretranslate/translate", content=form,
                        headers={"content-type": "application/x-www-form-urlencoded"})
    assert status == 400 and "UTF-8" in err, err
    status, err = libre(server.url, "/libretranslate/detect", content=form,
                        headers={"content-type": "application/x-www-form-urlencoded"})
    assert status == 400 and "UTF-8" in err, err
    multipart = {"q": (None, form.split(b"&")[0][2:]), "source": (None, b"de"), "target": (None, b"en")}
    if b"%" not in form:
        status, err = libre(server.url, "/libretranslate/translate", files=multipart)
        assert status == 400 and "UTF-8" in err, err
    json_body = b'{"q": "' + form.split(b"&")[0][2:] + b'", "source": "de", "target": "en"}'
    if b"%" not in form:
        assert libre(server.url, "/libretranslate/translate", content=json_body,
                     headers={"content-type": "application/json"})[0] == 400


def test_a_libretranslate_form_in_utf8_is_translated_as_its_json(server):
    text = "Grüße aus Köln."
    want = libre(server.url, "/libretranslate/translate", json={"q": text, "source": "de", "target": "en"})
    assert want[0] == 200
    for form in (f"q={text}&source=de&target=en".encode(), b"q=Gr%C3%BC%C3%9Fe+aus+K%C3%B6ln.&source=de&target=en"):
        got = libre(server.url, "/libretranslate/translate", content=form,
                    headers={"content-type": "application/x-www-form-urlencoded"})
        assert got == want, (got, want)
    got = libre(server.url, "/libretranslate/translate", files={"q": (None, text), "source": (None, "de"),
                                                               "target": (None, "en")})
    assert got == want, (got, want)


def test_libretranslate_detect_refuses_a_lone_surrogate(server):
    for q, where in ((SURROGATE, "q has"), (["Guten Morgen.", SURROGATE], "q[1] has")):
        status, err = libre(server.url, "/libretranslate/detect", json={"q": q})
        assert status == 400 and where in err and "lone UTF-16 surrogate" in err, err
    assert libre(server.url, "/libretranslate/detect", json={"q": "Guten Morgen, wie geht es dir?"})[0] == 200


@pytest.mark.parametrize("body,named", [
    ({"q": ["Das geht.", "  "]}, "q[1] is empty"),
    ({"q": SURROGATE}, "q has a lone UTF-16 surrogate"),
    ({"q": 5}, "q."),
    ({"q": ["Das geht.", "x" * 10_001]}, "q[1] has 10001 characters"),
    ({"source": "d!"}, "source:"),
    ({"target": "E"}, "target:"),
])
def test_libretranslate_errors_name_its_fields(server, body, named):
    status, err = libre(server.url, "/libretranslate/translate", json={"q": "Das", "source": "de", "target": "en"}
                        | body)
    assert status in (400, 413) and named in err, err
    assert not any(ours in err.replace("Unicode text", "") for ours in ("text", "source_lang", "target_lang")), err


# --- the SDK: a lone surrogate is the server's 422, raised as the SDK's own error ---------------------------

def test_the_sdk_raises_its_own_error_for_a_lone_surrogate(server):
    with Client(server.url) as c:
        assert c.translate("Grüße.", source_lang="de", target_lang="en").translations[0].text   # UTF-8 as before
        with pytest.raises(BadRequestError, match="text\\[1\\] has a lone UTF-16 surrogate") as e:
            c.translate(["Das geht.", SURROGATE], source_lang="de", target_lang="en")
        assert e.value.status_code == 422 and e.value.request_id
        with pytest.raises(BadRequestError, match="prompt has a lone UTF-16 surrogate"):
            c.generate(SURROGATE, max_new_tokens=4)
        with pytest.raises(BadRequestError, match="surrogate"):
            c.stream(SURROGATE, max_new_tokens=4)

    async def run():
        async with AsyncClient(server.url) as c:
            with pytest.raises(BadRequestError, match="text has a lone UTF-16 surrogate"):
                await c.translate(SURROGATE, source_lang="de", target_lang="en")
            with pytest.raises(BadRequestError, match="surrogate"):
                async with c.stream(SURROGATE, max_new_tokens=4):
                    pass
    asyncio.run(run())


# --- the schema says what is accepted ---------------------------------------------------------------------

def test_min_new_tokens_over_max_new_tokens_is_422_naming_a_valid_value(server):
    status, _, err = post_raw(server.url, "/generate", {"prompt": "Das", "min_new_tokens": 10, "max_new_tokens": 5})
    assert status == 422 and err["error"]["type"] == "invalid_request"
    assert "min_new_tokens=5" in err["error"]["message"], err


def test_beam_search_with_sampling_options_is_in_the_schema_and_refused(server):
    schema = httpx.get(server.url + "/openapi.json").json()["components"]["schemas"]["GenerateRequest"]
    assert schema["if"]["properties"]["beam_size"] == {"minimum": 2}
    assert schema["then"]["properties"]["top_k"] == {"const": 0}
    for extra in ({"temperature": 0.5}, {"top_k": 5}, {"top_p": 0.9}):
        status, _, err = post_raw(server.url, "/generate", {"prompt": "Das", "beam_size": 2} | extra)
        assert status == 422 and "beam search does not sample" in err["error"]["message"], err
    status, _, _ = post_raw(server.url, "/generate", {"prompt": "Das", "beam_size": 2, "temperature": 0,
                                                      "max_new_tokens": 3})
    assert status == 200


def test_the_same_language_returns_the_text_unchanged(server):
    texts = ["Das geht zu weit.", "  zwei  Leerzeichen\nund eine Zeile  "]
    status, _, body = post_raw(server.url, "/translate", {"text": texts, "source_lang": "de", "target_lang": "de"})
    assert status == 200 and [t["text"] for t in body["translations"]] == texts
    assert body["model"] == "identity" and all(t["score"] == 0.0 and t["output_tokens"] == 0
                                               for t in body["translations"])
    status, _, body = post_raw(server.url, "/translate", {"text": "Hello", "source_lang": "en", "target_lang": "en"})
    assert status == 200 and body["translations"][0]["text"] == "Hello"
    status, _, err = post_raw(server.url, "/translate", {"text": "Salut", "source_lang": "fr", "target_lang": "fr"})
    assert status == 400 and "available pairs: de-en" in err["error"]["message"]
    status, _, body = post_raw(server.url, "/libretranslate/translate", {"q": texts, "source": "de", "target": "de"})
    assert status == 200 and body == {"translatedText": texts}
    status, _, err = post_raw(server.url, "/libretranslate/translate", {"q": "x", "source": "fr", "target": "fr"})
    assert status == 400 and "available pairs" in err["error"]


def test_nothing_raised_in_the_server(server):
    assert_idle(server.url)
    log = server_log(server.proc)
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-4000:]


# --- without a server: a worker hook that raises fails its own request only ---------------------------

class Exploding:
    """An engine that fails on the text "boom" (tokenizing) and on token 99 (detokenizing); its generations fail
    to join with top_k 7, get token 99 with top_k 9, and fail in their search with top_k 11."""
    eos_id, max_positions, task, directions = 3, 64, "generation", ["de-en"]

    def source_ids(self, texts, target_lang):
        if "boom" in texts:
            raise TypeError("List elements must be str or bytes")
        return [[99, 3] if t == "bad-out" else [5, 6, 3] for t in texts]

    def prompt_ids(self, texts):
        return [[2] + ids[:-1] for ids in self.source_ids(texts, "")]

    def search(self, src_ids, options, terms=None):
        return [[SimpleNamespace(tokens=ids[:-1], score=-1.0)] for ids in src_ids]

    def writable(self, ch):                       # every character: nothing kept as written (kept_spans.py)
        return True

    def running_batch(self, group):
        return OneStepBatch()

    def encode_sources(self, src_ids, options):
        return SimpleNamespace(src_ids=src_ids, answer=self.search(src_ids, options))

    def detokenize(self, ids):
        return self.piece_text(ids)

    def piece_text(self, ids):
        if 99 in ids:
            raise ValueError("no such piece")
        return "x" * len(ids)

    def generation_batch(self):
        return SteppedBatch()


class OneStepBatch:
    """RunningBatch's interface over Exploding's searches, which end at their first step with their answer."""

    def __init__(self):
        self.members = []

    @property
    def rows(self):
        return sum(len(m.row_source) for m in self.members)

    def step(self):
        for m in self.members:
            m.want, m.result = None, m.answer
        ended, self.members = self.members, []
        return ended

    def join(self, encoded, options, sizes):
        """A member a request: `sizes` requests' sources in turn."""
        members, row = [], 0
        for n in sizes:
            members.append(SimpleNamespace(want="a step", row_source=list(range(n)), error=None, result=None,
                                           answer=encoded.answer[row:row + n]))
            row += n
        self.members += members
        return members

    def leave(self, member):
        self.members.remove(member)

    def close(self):
        self.members = []


class SteppedBatch:
    """LmBatch's interface over Exploding's canned tokens: each step gives every member its next token."""

    def __init__(self):
        self.members, self.call_rows = [], []

    @property
    def rows(self):
        return sum(m.rows for m in self.members)

    def join(self, prompts, options, seeds=None, cancel=None):
        if options.top_k == 7:
            raise RuntimeError("engine failure")
        tokens = (99 if options.top_k == 9 else 5, 5, 3)
        member = SimpleNamespace(steps=iter(tokens), rows=len(prompts), step=None, error=None, result=None,
                                 fails=options.top_k == 11)
        self.members.append(member)
        return member

    def step(self):
        ended = []
        for m in self.members:
            if m.fails:
                m.error = RuntimeError("search failed")
                ended.append(m)
                continue
            tok = next(m.steps)
            m.step = SimpleNamespace(sentence=list(range(m.rows)), tokens=[tok] * m.rows)
            if tok == Exploding.eos_id:
                m.result = []
                ended.append(m)
        self.call_rows = [self.rows]
        for m in ended:
            self.leave(m)
        return ended

    def leave(self, member):
        if member in self.members:
            self.members.remove(member)

    def close(self):
        self.members = []


def translated(texts: list[str], request_ids: list[str]) -> tuple[list, list[dict]]:
    """(the jobs decode_request made, each one's answer) of a TranslateAPI over Exploding."""
    from service.worker.cancel import CancelBoard
    from service.config import Settings
    from service.worker.translate_api import TranslateAPI
    from service.http.gateway import translate_payload
    from service.shared.schemas import TranslateRequest

    api = TranslateAPI(Settings(), CancelBoard())
    api.use_engines({"m": Exploding()})
    jobs = [api.decode_request(translate_payload(TranslateRequest(text=t, source_lang="de", target_lang="en"), [t],
                                                 Settings().max_output_tokens) | {"request_id": rid})
            for t, rid in zip(texts, request_ids)]
    return jobs, [api.encode_response(j) for j in api.scheduler.run(dict(enumerate(jobs))).values()]


def generated(requests: list[dict], request_ids: list[str]) -> list[list[dict]]:
    """Each request's events from a GenerateAPI over Exploding, driven as the worker loop drives it."""
    from service.worker.cancel import CancelBoard
    from service.config import Settings
    from service.worker.generate_api import GenerateAPI
    from service.http.gateway import generate_payload
    from service.shared.schemas import GenerateRequest

    api = GenerateAPI(Settings(), CancelBoard())
    api.use_engines({"m": Exploding()})
    jobs = [api.decode_request(generate_payload(GenerateRequest(**r), Settings().max_output_tokens)
                               | {"number": n + 1, "request_id": rid})
            for n, (r, rid) in enumerate(zip(requests, request_ids))]
    events = [[] for _ in jobs]
    api.scheduler.admit(dict(enumerate(jobs)))
    while True:
        for j, job, _ in api.scheduler.take_progress():
            if event := api.encode_response(job):
                events[j].append(event)
        if not api.scheduler.busy:
            break
        api.scheduler.step()
    return events


def test_a_translation_hook_that_raises_fails_only_its_request():
    from service.worker.scheduler import Failure
    from service.worker.translate_scheduler import Job

    texts = ("a", "boom", "bad-out", "b")   # fine, decode_request raises, encode_response raises, fine
    jobs, out = translated(texts, [""] * 4)
    assert [type(j) for j in jobs] == [Job, Failure, Job, Job]
    for o in out[1:3]:
        assert o["status"] == 500 and o["error"]["type"] == "internal_error", o
    assert [o["translations"][0]["text"] for o in (out[0], out[3])] == ["xx", "xx"]


FAILING_GENERATIONS = [{"prompt": "boom"},                                        # decode_request raises
                       {"prompt": "ok", "top_k": 7, "max_new_tokens": 8},         # its engine group raises
                       {"prompt": "ok", "top_k": 9, "max_new_tokens": 8},         # its first token has no text
                       {"prompt": "ok", "top_k": 11, "max_new_tokens": 8}]        # its search fails


def test_a_generation_hook_that_raises_fails_only_its_request():
    ok = {"prompt": "ok", "temperature": 0, "max_new_tokens": 8}
    events = generated([ok, *FAILING_GENERATIONS[:3], ok], [""] * 5)
    for j in (1, 2, 3):
        assert events[j][-1] == {"error": {"type": "internal_error", "message": events[j][-1]["error"]["message"]},
                                 "status": 500}, events[j]
    for j in (0, 4):
        assert events[j][-1]["done"]["choices"][0]["finish_reason"] == "stop", events[j]
        assert "".join(p["text"] for e in events[j] for p in e["pieces"]) == "xx"


def test_a_request_failing_in_the_worker_is_logged_by_its_request_id_only_as_request_id(caplog):
    """The client chose its X-Request-ID: written as `request_id=` and no other way (tests/test_client_data.py's
    rule), by every failure line of both schedulers (a hook that raises, a generation that cannot start, fails in
    its search or cannot be decoded)."""
    caplog.set_level(logging.ERROR, logger="transerve")
    rids = [f"rid{i}x" for i in range(6)]
    _, out = translated(["boom", "bad-out"], rids[:2])
    events = generated(FAILING_GENERATIONS, rids[2:])
    assert all(o["status"] == 500 for o in out) and all(e[-1]["status"] == 500 for e in events), (out, events)
    text = "\n".join(r.getMessage() for r in caplog.records)
    for rid in rids:
        at = [m.start() for m in re.finditer(rid, text)]
        assert at and all(text[:i].endswith("request_id=") for i in at), (rid, text)
