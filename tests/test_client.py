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
from service.client import (APIConnectionError, AsyncClient, BadRequestError, Client, InternalServerError,
                            OverloadedError)

OK = {"translations": [{"text": "That goes too far.", "score": -0.1, "alternatives": [], "input_tokens": 6,
                        "output_tokens": 5}],
      "model": "m", "source_lang": "de", "target_lang": "en",
      "timings": {"queue_ms": 1.0, "inference_ms": 2.0, "total_ms": 3.0}}


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
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

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
        "from service.schemas import TranslateResponse\n"
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
