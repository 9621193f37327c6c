"""What an API key protects (service/http/auth.py, README "API keys"): every route but the probes and the
language lists, unknown ones included, whatever the body (401 with WWW-Authenticate before the body is
read; LibreTranslate's routes read theirs only for its api_key field); /docs, /openapi.json and /info too
unless --public-docs; /metrics on the main port too, or on its own port with no key (--metrics-port, for
the cluster's scraper). LitServe's own routes are not served."""

import json
import socket
from urllib.parse import urlsplit

import httpx
import pytest

from conftest import free_port, start_server, stop_server

KEY = {"Authorization": "Bearer s3cret"}
GUARDED = ("/docs", "/openapi.json", "/info")
CHALLENGE = 'Bearer realm="transerve"'
INVALID = 'Bearer realm="transerve", error="invalid_token"'   # a key given, not known
LIMIT = 20_000          # --max-payload-bytes of the keyed server
TRANSLATE = {"text": "Guten Morgen.", "source_lang": "de", "target_lang": "en"}
LIBRE = {"q": "Guten Morgen.", "source": "de", "target": "en"}
FORM = "application/x-www-form-urlencoded"


@pytest.fixture(scope="module")
def keyed(tiny_package):
    metrics_port = free_port()
    proc, url = start_server(tiny_package, "--api-keys", "s3cret", "--metrics-port", str(metrics_port),
                             "--max-payload-bytes", str(LIMIT))
    yield url, f"http://127.0.0.1:{metrics_port}"
    stop_server(proc)


def test_probes_and_language_lists_stay_open_and_the_rest_needs_the_key(keyed):
    url, _ = keyed
    for path in ("/health", "/ready", "/languages", "/libretranslate/languages"):
        assert httpx.get(url + path).status_code == 200, path
    for path in GUARDED:
        r = httpx.get(url + path)
        assert r.status_code == 401 and r.json()["error"]["type"] == "unauthorized", (path, r.text)
        r = httpx.get(url + path, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == INVALID, path   # not valid credentials
        assert httpx.get(url + path, headers=KEY).status_code == 200, path
    assert httpx.get(url + "/info", headers={"X-API-Key": "s3cret"}).json()["settings"]["auth"] is True


# Without a key, each of these gets 401, where a keyed request gets the status after the colon: the key is
# checked before the body is validated, the method or the path looked up, or the size counted.
UNKEYED = [
    ("POST", "/translate", {"json": {"text": 5}}),                                          # 422
    ("POST", "/translate", {"content": b'{"text": ', "headers": {"content-type": "application/json"}}),  # 400
    ("POST", "/translate", {"json": TRANSLATE | {"text": "a" * LIMIT}}),                    # 413
    ("POST", "/generate", {"json": {"prompt": 5}}),                                         # 422
    ("GET", "/translate", {}),                                                              # 405
    ("GET", "/no/such/route", {}),                                                          # 404
    ("POST", "/libretranslate/translate", {"json": {"q": 5}}),                              # 400
    ("POST", "/libretranslate/translate", {"content": b"{", "headers": {"content-type": "application/json"}}),
    ("POST", "/libretranslate/translate", {"content": b"q=Hal\xfflo&source=de&target=en", "headers": {
        "content-type": FORM}}),                                                            # 400 (not UTF-8)
    ("POST", "/libretranslate/translate", {"json": LIBRE | {"api_key": 5}}),                # no key: a number
    ("POST", "/libretranslate/detect", {"json": {"q": 5}}),                                 # 400
    ("GET", "/libretranslate/translate", {}),                                               # 405
]


@pytest.mark.parametrize("method,path,kwargs", UNKEYED, ids=[f"{m} {p} {i}" for i, (m, p, _) in enumerate(UNKEYED)])
def test_an_unkeyed_request_gets_401_with_a_challenge_whatever_its_body(keyed, method, path, kwargs):
    url, _ = keyed
    r = httpx.request(method, url + path, **kwargs)
    assert r.status_code == 401 and r.headers["www-authenticate"] == CHALLENGE, (r.status_code, r.text)
    if path.startswith("/libretranslate/"):
        assert list(r.json()) == ["error"] and "API key" in r.json()["error"], r.text   # LibreTranslate's shape
    else:
        assert r.json()["error"]["type"] == "unauthorized" and r.json()["request_id"] == r.headers["x-request-id"]
    keyed_kwargs = kwargs | {"headers": kwargs.get("headers", {}) | KEY}
    wrong_kwargs = kwargs | {"headers": kwargs.get("headers", {}) | {"X-API-Key": "wrong"}}
    assert httpx.request(method, url + path, **wrong_kwargs).status_code == 401
    keyed_status = httpx.request(method, url + path, **keyed_kwargs).status_code
    assert keyed_status in (400, 404, 405, 413, 422), keyed_status   # what the key opens: the request's own error


def test_a_libretranslate_key_in_the_body_is_checked_before_any_other_field(keyed):
    url, _ = keyed
    r = httpx.post(url + "/libretranslate/translate", json={"q": 5, "api_key": "wrong"})
    assert r.status_code == 401 and r.json() == {"error": "invalid API key"}
    assert r.headers["www-authenticate"] == INVALID
    r = httpx.post(url + "/libretranslate/translate", json=LIBRE | {"q": 5, "api_key": "s3cret"})
    assert r.status_code == 400 and r.json()["error"].startswith("q"), r.text     # now the fields: q is no text
    r = httpx.post(url + "/libretranslate/translate", data=LIBRE | {"api_key": "s3cret"})
    assert r.status_code == 200 and r.json()["translatedText"], r.text
    # A form not UTF-8 elsewhere: its api_key still decides 401 before the 400 names the form.
    for key, status in (("s3cret", 400), ("wrong", 401)):
        r = httpx.post(url + "/libretranslate/detect", content=f"q=Hal%FFlo&api_key={key}".encode(),
                       headers={"content-type": FORM})
        assert r.status_code == status, r.text
    r = httpx.post(url + "/libretranslate/detect", json={"q": "Guten Morgen, wie geht es dir?"}, headers=KEY)
    assert r.status_code == 200 and r.json()[0]["language"] == "de"


def status_of(url: str, head: bytes, body: bytes = b"") -> int:
    """The status of a request sent as raw bytes: httpx refuses to send a header value that ends in whitespace,
    which is what this asks of the server."""
    u = urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(head.replace(b"\n", b"\r\n") + b"Connection: close\r\n\r\n" + body)
        answer = b""
        while part := s.recv(65536):
            answer += part
    return int(answer.split(b" ", 2)[1])


@pytest.mark.parametrize("header", [b"X-API-Key: s3cret\t", b"X-API-Key: s3cret ", b"X-API-Key:\t s3cret \t",
                                    b"Authorization: Bearer s3cret ", b"Authorization: Bearer  s3cret\t",
                                    b"Authorization: bearer s3cret"])
def test_a_key_with_whitespace_around_it_in_its_header_is_the_key(keyed, header):
    """HTTP does not count the whitespace around a field's value as part of it (RFC 9110 section 5.5): operators
    paste keys with a trailing space or tab."""
    url, _ = keyed
    assert status_of(url, b"GET /info HTTP/1.1\nHost: test\n" + header + b"\n") == 200
    body = json.dumps(LIBRE).encode()
    head = b"POST /libretranslate/translate HTTP/1.1\nHost: test\nContent-Type: application/json\n" \
           b"Content-Length: %d\n%s\n" % (len(body), header)
    assert status_of(url, head, body) == 200
    wrong = header.replace(b"s3cret", b"s3cre")
    assert status_of(url, b"GET /info HTTP/1.1\nHost: test\n" + wrong + b"\n") == 401


def test_metrics_have_their_own_port_without_a_key_and_leave_the_main_one(keyed):
    url, metrics = keyed
    r = httpx.get(metrics + "/metrics")
    assert r.status_code == 200 and "transerve_model_info" in r.text
    assert httpx.get(metrics + "/translate").status_code == 404          # that port serves /metrics only
    assert httpx.get(url + "/metrics", headers=KEY).status_code == 404   # nor is it on the main port


def test_litserve_routes_are_not_served(keyed):
    url, _ = keyed
    for path in ("/litserve/info", "/"):
        assert httpx.get(url + path, headers=KEY).status_code == 404, path


def test_public_docs_open_docs_and_info_and_metrics_on_the_main_port_need_the_key(tiny_package):
    proc, url = start_server(tiny_package, "--api-keys", "s3cret", "--public-docs")
    try:
        for path in GUARDED:
            assert httpx.get(url + path).status_code == 200, path
        assert httpx.get(url + "/metrics").status_code == 401
        assert "transerve_model_info" in httpx.get(url + "/metrics", headers=KEY).text
        r = httpx.post(url + "/translate", json=TRANSLATE)
        assert r.status_code == 401 and r.headers["www-authenticate"] == CHALLENGE
    finally:
        stop_server(proc)
