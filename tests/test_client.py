"""The client SDK on its own: what it imports, and how it retries. The server it talks to here is a
scripted stdlib HTTP server on 127.0.0.1 (the real service cannot be made to answer 503 on cue);
test_service.py drives the SDK against the real service."""

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import ROOT
from service.client import (APIConnectionError, APIError, APIStreamError, AsyncClient, AsyncTextStream,
                            BadRequestError, Client, GenerateResult, InternalServerError, OverloadedError, TextStream)

OK = {"translations": [{"text": "That goes too far.", "score": -0.1, "alternatives": [], "input_tokens": 6,
                        "output_tokens": 5}],
      "model": "m", "source_lang": "de", "target_lang": "en",
      "timings": {"queue_ms": 1.0, "inference_ms": 2.0, "total_ms": 3.0}}


GENERATED = {"model": "g", "choices": [{"index": 0, "text": " ein Test", "finish_reason": "stop", "tokens": 2}],
             "usage": {"prompt_tokens": 3, "completion_tokens": 2},
             "timings": {"queue_ms": 1.0, "first_token_ms": 4.0, "total_ms": 5.0}}
DONE = {"type": "done", "model": "g", "choices": [{"index": 0, "finish_reason": "length", "tokens": 3}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 3},
        "timings": {"queue_ms": 1.0, "first_token_ms": 2.0, "total_ms": 6.0}}


def token(text, index=0):
    return {"type": "token", "index": index, "text": text}


class Sse:
    """A scripted text/event-stream body: each event a `data:` line (bytes are sent as they are). With
    hold, the server then keeps the connection open until the client closes it (seen in .disconnected)."""

    def __init__(self, *events, hold=False):
        self.events, self.hold, self.disconnected = events, hold, threading.Event()


class Scripted:
    """Answers POST /translate with the next (status, body, headers) of a script; records the calls."""

    def __init__(self, *script):
        self.script, self.calls = list(script), []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                owner.calls.append((self.path, json.loads(body), dict(self.headers)))
                status, payload, headers = owner.script.pop(0) if owner.script else (500, {}, {})
                if isinstance(payload, Sse):
                    return self.stream(status, payload, headers)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def stream(self, status, sse, headers):
                self.send_response(status)             # HTTP/1.0: the body ends when the connection does
                self.send_header("content-type", "text/event-stream")
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                for event in sse.events:
                    self.wfile.write(event if isinstance(event, bytes) else f"data: {json.dumps(event)}\n\n".encode())
                    self.wfile.flush()
                    time.sleep(0.01)
                if sse.hold:
                    self.connection.settimeout(10)
                    try:
                        while self.connection.recv(1024):
                            pass
                        sse.disconnected.set()     # recv() returned b"": the client closed the connection
                    except OSError:
                        sse.disconnected.set()

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def overloaded(retry_after="0"):
    return 503, {"error": {"type": "overloaded", "message": "queue full", "limit": 2}, "request_id": "r1"}, \
        {"Retry-After": retry_after, "X-Request-Id": "r1"}


def test_client_imports_neither_torch_nor_onnxruntime_nor_litserve():
    """The `client` extra is httpx and pydantic: the SDK must import with nothing else there."""
    code = (
        "import sys, importlib.abc\n"
        "BLOCKED = {'torch', 'onnxruntime', 'litserve', 'numpy', 'sentencepiece', 'prometheus_client', 'fastapi', 'model'}\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in BLOCKED:\n"
        "            raise ImportError(f'{name} is not in the client extra')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from service.client import Client, AsyncClient, APIStatusError\n"
        "from service.shared.schemas import TranslateResponse\n"
        "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_503_is_retried_after_retry_after_then_succeeds():
    srv = Scripted(overloaded(), overloaded(), (200, OK, {}))
    try:
        with Client(srv.url, max_retries=2, api_key="k") as c:
            r = c.translate("Das geht zu weit.", source_lang="de", target_lang="en", beam_size=2)
        assert r.translations[0].text == "That goes too far." and r.model == "m"
        assert len(srv.calls) == 3
        path, body, headers = srv.calls[-1]
        assert path == "/translate" and body == {"text": "Das geht zu weit.", "source_lang": "de",
                                                 "target_lang": "en", "beam_size": 2}
        assert headers["Authorization"] == "Bearer k"
    finally:
        srv.close()


def test_retries_give_up_with_the_status_error_and_its_request_id():
    srv = Scripted(overloaded(), overloaded(), overloaded())
    try:
        with Client(srv.url, max_retries=1) as c, pytest.raises(OverloadedError) as e:
            c.translate("x", source_lang="de", target_lang="en")
        assert len(srv.calls) == 2
        assert e.value.status_code == 503 and e.value.request_id == "r1" and e.value.limit == 2
        assert e.value.retry_after == 0
    finally:
        srv.close()


@pytest.mark.parametrize("status, cls", [(422, BadRequestError), (500, InternalServerError)])
def test_other_errors_are_not_retried(status, cls):
    srv = Scripted((status, {"error": {"type": "t", "message": "m"}, "request_id": "r9"}, {}))
    try:
        with Client(srv.url, max_retries=3) as c, pytest.raises(cls) as e:
            c.translate("x", source_lang="de", target_lang="en")
        assert len(srv.calls) == 1 and e.value.status_code == status and e.value.request_id == "r9"
    finally:
        srv.close()


def test_connection_errors_are_retried_with_backoff():
    with socket.socket() as s:             # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with Client(f"http://127.0.0.1:{port}", max_retries=2) as c, pytest.raises(APIConnectionError):
        c.translate("x", source_lang="de", target_lang="en")
    assert time.monotonic() - t0 >= 1.5      # 0.5 s + 1 s of backoff


def test_async_client_retries_the_same_way():
    srv = Scripted(overloaded(), (200, OK, {}))

    async def run():
        async with AsyncClient(srv.url, max_retries=2) as c:
            return await c.translate(["Das geht zu weit."], source_lang="de", target_lang="en")

    try:
        r = asyncio.run(run())
        assert r.translations[0].output_tokens == 5 and len(srv.calls) == 2
    finally:
        srv.close()


# --- text generation --------------------------------------------------------------------------------

def test_generate_parses_the_result_and_sends_only_the_options_given():
    srv = Scripted((200, GENERATED, {}))
    try:
        with Client(srv.url) as c:
            r = c.generate("Das ist", temperature=0.0, stop=".", max_new_tokens=8, seed=None)
        assert isinstance(r, GenerateResult) and r.text == " ein Test" and r.model == "g"
        assert r.choices[0].finish_reason == "stop" and r.choices[0].tokens == 2
        assert r.usage.prompt_tokens == 3 and r.usage.completion_tokens == 2 and r.timings.first_token_ms == 4.0
        path, body, headers = srv.calls[0]
        assert path == "/generate" and body == {"prompt": "Das ist", "temperature": 0.0, "stop": ["."],
                                                "max_new_tokens": 8, "stream": False}
        assert headers["Accept"] == "application/json"
    finally:
        srv.close()


def test_generate_rejects_an_unknown_option_before_sending():
    with Client("http://127.0.0.1:9") as c, pytest.raises(TypeError, match="max_tokens"):
        c.generate("x", max_tokens=3)


def test_generate_retries_503_then_succeeds():
    srv = Scripted(overloaded(), (200, GENERATED, {}))
    try:
        with Client(srv.url, max_retries=2) as c:
            assert c.generate("Das ist").text == " ein Test"
        assert len(srv.calls) == 2
    finally:
        srv.close()


def test_stream_yields_the_pieces_in_order_then_the_done_event_with_the_whole_text():
    events = [b": keep-alive\n\n", token(" ein"), token(" klei"), token("ner"), DONE]
    srv = Scripted((200, Sse(*events), {"X-Request-Id": "r5"}))
    try:
        with Client(srv.url) as c:
            with c.stream("Das ist", max_new_tokens=3) as s:
                assert isinstance(s, TextStream) and s.result is None
                pieces = list(s)
        assert pieces == [" ein", " klei", "ner"]
        assert s.request_id == "r5" and s.result.text == " ein kleiner" and s.result.model == "g"
        assert s.result.choices[0].finish_reason == "length" and s.result.choices[0].tokens == 3
        assert s.result.usage.completion_tokens == 3 and s.result.timings.total_ms == 6.0
        path, body, headers = srv.calls[0]
        assert path == "/generate" and body == {"prompt": "Das ist", "max_new_tokens": 3, "stream": True}
        assert headers["Accept"] == "text/event-stream"
    finally:
        srv.close()


def test_an_error_event_raises_with_the_request_id_and_is_not_retried():
    error = {"type": "error", "error": {"type": "internal_error", "message": "the worker failed"}}
    srv = Scripted((200, Sse(token(" ein"), error), {"X-Request-Id": "r7"}), (200, Sse(token("x"), DONE), {}))
    try:
        pieces = []
        with Client(srv.url, max_retries=2) as c, pytest.raises(APIStreamError) as e:
            with c.stream("Das ist") as s:
                for piece in s:
                    pieces.append(piece)
        assert pieces == [" ein"] and s.result is None and len(srv.calls) == 1
        assert isinstance(e.value, APIError) and e.value.status_code is None
        assert e.value.type == "internal_error" and e.value.message == "the worker failed" and e.value.request_id == "r7"
    finally:
        srv.close()


def test_a_stream_that_ends_without_its_done_event_is_a_connection_error():
    srv = Scripted((200, Sse(token(" ein")), {}))
    try:
        with Client(srv.url) as c, pytest.raises(APIConnectionError, match="done event"):
            list(c.stream("Das ist"))
    finally:
        srv.close()


def test_stream_retries_503_before_it_begins():
    srv = Scripted(overloaded(), overloaded(), (200, Sse(token("a"), token("b"), DONE), {}))
    try:
        with Client(srv.url, max_retries=2) as c, c.stream("x") as s:
            assert "".join(s) == "ab" and s.result.text == "ab"
        assert len(srv.calls) == 3
    finally:
        srv.close()


def test_stream_errors_before_it_begins_are_status_errors():
    srv = Scripted((422, {"error": {"type": "invalid_request", "message": "top_p"}, "request_id": "r2"}, {}))
    try:
        with Client(srv.url, max_retries=2) as c, pytest.raises(BadRequestError) as e:
            c.stream("x", top_p=0.0)
        assert e.value.status_code == 422 and e.value.request_id == "r2" and len(srv.calls) == 1
    finally:
        srv.close()


def test_closing_a_stream_early_closes_the_connection():
    sse = Sse(token(" ein"), token(" Test"), hold=True)
    srv = Scripted((200, sse, {}))
    try:
        with Client(srv.url) as c:
            with c.stream("Das ist") as s:
                first = next(s)
            assert first == " ein"
            assert sse.disconnected.wait(5), "the server did not see the connection close"
            assert list(s) == [] and s.result is None       # nothing more is read after close
    finally:
        srv.close()


def test_stream_refuses_several_sequences_before_sending():
    with Client("http://127.0.0.1:9") as c, pytest.raises(ValueError, match="generate"):
        c.stream("x", num_return_sequences=2)
    with pytest.raises(ValueError, match="generate"):
        AsyncClient("http://127.0.0.1:9").stream("x", num_return_sequences=2)


def test_async_generate_and_stream():
    sse = Sse(token(" ein"), token(" Test"), hold=True)
    srv = Scripted(overloaded(), (200, GENERATED, {}), overloaded(), (200, Sse(token(" ein"), token(" Test"), DONE), {}),
                   (200, sse, {}))

    async def run():
        async with AsyncClient(srv.url, max_retries=2) as c:
            r = await c.generate("Das ist", top_k=5)
            pieces = []
            async with c.stream("Das ist") as s:
                assert isinstance(s, AsyncTextStream)
                async for piece in s:
                    pieces.append(piece)
            early = await c.stream("Das ist")          # await sends it; the first piece, then close
            first = await early.__anext__()
            await early.aclose()
            return r, pieces, s, first, early

    try:
        r, pieces, s, first, early = asyncio.run(run())
        assert r.text == " ein Test" and srv.calls[1][1] == {"prompt": "Das ist", "top_k": 5, "stream": False}
        assert pieces == [" ein", " Test"] and s.result.text == " ein Test" and s.result.choices[0].tokens == 3
        assert first == " ein" and early.result is None
        assert sse.disconnected.wait(5)
        assert len(srv.calls) == 5
    finally:
        srv.close()


def test_async_stream_error_event_raises():
    error = {"type": "error", "error": {"type": "timeout", "message": "too slow"}}
    srv = Scripted((200, Sse(error), {"X-Request-Id": "r8"}))

    async def run():
        async with AsyncClient(srv.url) as c:
            return [p async for p in c.stream("x")]

    try:
        with pytest.raises(APIStreamError) as e:
            asyncio.run(run())
        assert e.value.type == "timeout" and e.value.request_id == "r8" and str(e.value) == "timeout: too slow"
    finally:
        srv.close()
