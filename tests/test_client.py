"""The client SDK on its own: what it imports, how it retries, how it parses streams. The server it talks to
here is a script answered in-process through httpx.MockTransport (the SDK's `transport=`): the real service
cannot be made to answer 503, time out or break a stream on cue. One test sends to a real port on 127.0.0.1
where nothing listens; test_service.py and test_generate_service.py drive the SDK against the real service."""

import asyncio
import json
import subprocess
import sys

import httpx
import pytest

from conftest import ROOT, free_port
from service.client import (MAX_RETRY_WAIT_S, APIConnectionError, APIError, APIResponseValidationError,
                            APIStatusError, APIStreamError, APITimeoutError, AsyncClient, AsyncTextStream,
                            BadRequestError, Client, GenerateResult, GlossaryResult, InternalServerError,
                            OverloadedError, TextStream)

URL = "http://transerve.test"       # never resolved: the mock transport answers

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


class Sse(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A scripted response body, one chunk per event (a dict as an SSE `data:` line, bytes as they are), for
    Client and AsyncClient alike; unread until the client reads it, as a body off a socket is. fail: raised
    after the events, as httpx's transport raises a reset connection (httpx.ReadError) or a silent one
    (httpx.ReadTimeout). hold: reading past the events is a test failure (the client was to close first).
    .closed says whether the client closed the body, which is what closes the connection under httpx's
    HTTP transport."""

    def __init__(self, *events, fail=None, hold=False):
        self.events, self.fail, self.hold, self.closed = events, fail, hold, False

    def _chunks(self):
        return [e if isinstance(e, bytes) else f"data: {json.dumps(e)}\n\n".encode() for e in self.events]

    def _after(self):
        if self.fail is not None:
            raise self.fail
        if self.hold:
            raise AssertionError("the client read past the held events instead of closing the stream")

    def __iter__(self):
        yield from self._chunks()
        self._after()

    async def __aiter__(self):
        for chunk in self._chunks():
            yield chunk
        self._after()

    def close(self):
        self.closed = True

    async def aclose(self):
        self.closed = True


class Scripted:
    """Answers each request with the next (status, body, headers) of a script, or raises the next
    exception of it as a transport would (httpx.ConnectError, httpx.ReadTimeout); records each call's
    (path, JSON body, headers). MockTransport serves Client and AsyncClient alike. JSON bodies are streamed
    too (httpx.Response(json=...) would come already read): a client that forgot to read one would fail."""

    def __init__(self, *script):
        self.script, self.calls = list(script), []
        self.transport = httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.calls.append((request.url.path, json.loads(request.content) if request.content else None,
                           request.headers))
        step = self.script.pop(0) if self.script else (500, {}, {})
        if isinstance(step, Exception):
            raise step
        status, payload, headers = step
        if isinstance(payload, Sse):
            return httpx.Response(status, headers={"content-type": "text/event-stream", **headers}, stream=payload)
        return httpx.Response(status, headers={"content-type": "application/json", **headers},
                              stream=Sse(json.dumps(payload).encode()))

    def client(self, **kwargs) -> Client:
        return Client(URL, transport=self.transport, **kwargs)

    def async_client(self, **kwargs) -> AsyncClient:
        return AsyncClient(URL, transport=self.transport, **kwargs)


@pytest.fixture
def sleeps(monkeypatch):
    """The delays the clients wait between retries, recorded instead of slept: backoff is asserted
    exactly, and costs no time."""
    delays = []

    async def asleep(seconds):
        delays.append(seconds)

    monkeypatch.setattr("service.client.time.sleep", delays.append)
    monkeypatch.setattr("service.client.asyncio.sleep", asleep)
    return delays


def overloaded(retry_after="0"):
    return 503, {"error": {"type": "overloaded", "message": "queue full", "limit": 2}, "request_id": "r1"}, \
        {"Retry-After": retry_after, "X-Request-Id": "r1"}


def test_client_imports_neither_torch_nor_onnxruntime_nor_litserve():
    """The `client` extra is httpx and pydantic: the SDK must import with nothing else there."""
    code = (
        "import sys, importlib.abc\n"
        "BLOCKED = {'torch', 'onnxruntime', 'litserve', 'numpy', 'sentencepiece', 'prometheus_client', 'fastapi',"
        " 'model'}\n"
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


def test_503_is_retried_after_retry_after_then_succeeds(sleeps):
    srv = Scripted(overloaded("2"), overloaded("3"), (200, OK, {}))
    with srv.client(max_retries=2, api_key="k") as c:
        r = c.translate("Das geht zu weit.", source_lang="de", target_lang="en", beam_size=2)
    assert r.translations[0].text == "That goes too far." and r.model == "m"
    assert len(srv.calls) == 3 and sleeps == [2.0, 3.0]        # the server's Retry-After
    path, body, headers = srv.calls[-1]
    assert path == "/translate" and body == {"text": "Das geht zu weit.", "source_lang": "de",
                                             "target_lang": "en", "beam_size": 2}
    assert headers["Authorization"] == "Bearer k"


def test_retries_give_up_with_the_status_error_and_its_request_id(sleeps):
    srv = Scripted(overloaded(), overloaded(), overloaded())
    with srv.client(max_retries=1) as c, pytest.raises(OverloadedError) as e:
        c.translate("x", source_lang="de", target_lang="en")
    assert len(srv.calls) == 2 and sleeps == [0.0]
    assert e.value.status_code == 503 and e.value.request_id == "r1" and e.value.limit == 2
    assert e.value.retry_after == 0


def test_a_retry_after_over_the_longest_wait_is_raised_at_once_not_cut_short(sleeps):
    """A day's character limit says hours: retrying after 10 s would only get the same 429 again."""
    srv = Scripted(overloaded("40"), (200, OK, {}))
    with srv.client(max_retries=2) as c, pytest.raises(OverloadedError) as e:
        c.translate("x", source_lang="de", target_lang="en")
    assert len(srv.calls) == 1 and sleeps == [] and e.value.retry_after == 40 > MAX_RETRY_WAIT_S


@pytest.mark.parametrize("header, wait", [
    ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),      # an HTTP date (RFC 9110), here in the past
    ("-1", 1.0), ("nan", 1.0), ("soon", 1.0),    # unreadable: the default second
])
def test_a_retry_after_of_any_form_is_read_or_replaced_never_a_valueerror(header, wait, sleeps):
    srv = Scripted(overloaded(header), (200, OK, {}))
    with srv.client(max_retries=1) as c:
        assert c.translate("x", source_lang="de", target_lang="en").model == "m"
    assert sleeps == [wait]


def test_the_error_body_is_the_servers_and_a_missing_message_is_the_status_phrase(sleeps):
    srv = Scripted(overloaded("0"), overloaded("0"), (400, {"error": {"type": "x"}}, {}))
    with srv.client(max_retries=1) as c:
        with pytest.raises(OverloadedError) as e:
            c.translate("x", source_lang="de", target_lang="en")
        assert e.value.body == {"error": {"type": "overloaded", "message": "queue full", "limit": 2},
                                "request_id": "r1"}
        with pytest.raises(BadRequestError) as e:
            c.translate("x", source_lang="de", target_lang="en")
    assert e.value.message == "Bad Request" and str(e.value) == "400: Bad Request" and e.value.retry_after is None


@pytest.mark.parametrize("body, calls", [
    ("<html>a proxy's page</html>", ("translate", "languages", "info")),
    ({"foo": 1}, ("translate", "languages")), ([1], ("translate", "languages", "info")),
])
def test_an_answer_that_is_not_the_apis_is_a_response_validation_error(body, calls, sleeps):
    srv = Scripted(*[(200, body, {})] * len(calls))
    with srv.client() as c:
        for name in calls:
            call = getattr(c, name)
            with pytest.raises(APIResponseValidationError) as e:
                call("x", source_lang="de", target_lang="en") if name == "translate" else call()
            assert e.value.status_code == 200
    assert len(srv.calls) == len(calls) and sleeps == []


def test_a_redirect_is_an_error_naming_where_not_a_json_error(sleeps):
    srv = Scripted(*[(302, "", {"location": "https://transerve.test/generate"})] * 2)
    with srv.client() as c:
        for call in (lambda: c.translate("x", source_lang="de", target_lang="en"), lambda: c.stream("x")):
            with pytest.raises(APIStatusError) as e:
                call()
            assert e.value.status_code == 302 and "https://transerve.test/generate" in e.value.message


def test_a_connection_not_made_in_time_is_retried_and_the_longest_wait_is_the_callers(sleeps):
    srv = Scripted(httpx.ConnectTimeout("connect"), httpx.PoolTimeout("pool"), overloaded("40"), (200, OK, {}))
    with srv.client(max_retries=3, max_retry_wait_s=60) as c:
        assert c.translate("x", source_lang="de", target_lang="en").model == "m"
    assert sleeps == [0.5, 1.0, 40.0]


def test_a_base_url_without_a_scheme_is_refused_at_once():
    for cls in (Client, AsyncClient):
        with pytest.raises(ValueError, match="http:// or https://"):
            cls("127.0.0.1:8000")


def test_a_post_cut_after_it_was_sent_is_not_retried_a_get_is(sleeps):
    """A read error may come after the server ran the request (and charged its key): only a GET goes again."""
    srv = Scripted(httpx.ReadError(""), httpx.RemoteProtocolError("server disconnected"), [{"code": "de"}])
    with srv.client(max_retries=2) as c:
        with pytest.raises(APIConnectionError, match="POST /translate: ReadError"):
            c.translate("x", source_lang="de", target_lang="en")
        assert len(srv.calls) == 1 and sleeps == []
        srv.script[-1] = (200, [{"code": "de", "name": "German", "targets": ["en"]}], {})
        assert [lang.code for lang in c.languages()] == ["de"]
    assert len(srv.calls) == 3 and sleeps == [0.5]


def test_the_errors_pickle_with_their_fields():
    import pickle

    error = OverloadedError("m", status_code=429, request_id="r", body={"error": {"type": "t", "limit": 3}},
                            retry_after=4.0)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is OverloadedError and str(again) == str(error)
    assert (again.status_code, again.request_id, again.type, again.limit, again.retry_after) == (429, "r", "t", 3, 4.0)


@pytest.mark.parametrize("status, cls", [(422, BadRequestError), (500, InternalServerError)])
def test_other_errors_are_not_retried(status, cls, sleeps):
    srv = Scripted((status, {"error": {"type": "t", "message": "m"}, "request_id": "r9"}, {}))
    with srv.client(max_retries=3) as c, pytest.raises(cls) as e:
        c.translate("x", source_lang="de", target_lang="en")
    assert len(srv.calls) == 1 and e.value.status_code == status and e.value.request_id == "r9" and sleeps == []
    assert isinstance(e.value, APIError) and e.value.type == "t" and e.value.message == "m"


def test_connection_errors_are_retried_with_backoff(sleeps):
    """A real connection to a port on 127.0.0.1 where nothing listens: refused, as a down server is."""
    with Client(f"http://127.0.0.1:{free_port()}", max_retries=3) as c, pytest.raises(APIConnectionError) as e:
        c.translate("x", source_lang="de", target_lang="en")
    assert sleeps == [0.5, 1.0, 2.0] and not isinstance(e.value, APITimeoutError)


def test_a_connection_error_then_an_answer_succeeds(sleeps):
    srv = Scripted(httpx.ConnectError("connection refused"), (200, OK, {}))
    with srv.client(max_retries=2) as c:
        assert c.translate("x", source_lang="de", target_lang="en").model == "m"
    assert len(srv.calls) == 2 and sleeps == [0.5]


def test_timeouts_are_not_retried(sleeps):
    """The server may have run a request it did not answer in time: sending it again could run it twice."""
    srv = Scripted(httpx.ReadTimeout("timed out"), (200, OK, {}))
    with srv.client(max_retries=2, timeout=3.0) as c, pytest.raises(APITimeoutError, match="within 3.0 s"):
        c.translate("x", source_lang="de", target_lang="en")
    assert len(srv.calls) == 1 and sleeps == []


def test_async_client_retries_the_same_way(sleeps):
    srv = Scripted(overloaded("1"), httpx.ConnectError("refused"), (200, OK, {}))

    async def run():
        async with srv.async_client(max_retries=2) as c:
            return await c.translate(["Das geht zu weit."], source_lang="de", target_lang="en")

    r = asyncio.run(run())
    assert r.translations[0].output_tokens == 5 and len(srv.calls) == 3 and sleeps == [1.0, 1.0]
    assert srv.calls[0][1]["text"] == ["Das geht zu weit."]


def test_async_timeouts_and_status_errors_are_not_retried(sleeps):
    srv = Scripted(httpx.ReadTimeout("timed out"),
                   (422, {"error": {"type": "t", "message": "m"}}, {"X-Request-Id": "r3"}))

    async def run():
        async with srv.async_client(max_retries=2) as c:
            with pytest.raises(APITimeoutError):
                await c.translate("x", source_lang="de", target_lang="en")
            with pytest.raises(BadRequestError) as e:
                await c.generate("x")
            return e.value

    error = asyncio.run(run())
    assert len(srv.calls) == 2 and sleeps == [] and error.status_code == 422 and error.request_id == "r3"


GLOSSED = OK | {"translations": [OK["translations"][0] | {"text": "The purchase order came.", "glossary": [
    {"source": "Auftrag", "target": "purchase order", "held": True}]}]}


def test_a_glossary_goes_as_source_target_objects_whatever_its_shape_and_comes_back_per_translation():
    srv = Scripted((200, GLOSSED, {}), (200, GLOSSED, {}), (200, OK, {}), (200, GLOSSED, {}))
    sent = [{"source": "Auftrag", "target": "purchase order"}, {"source": "Haus", "target": "building"}]
    with srv.client() as c:
        r = c.translate("Der Auftrag kam.", source_lang="de", target_lang="en",
                        glossary={"Auftrag": "purchase order", "Haus": "building"})
        c.translate("x", source_lang="de", target_lang="en",
                    glossary=[("Auftrag", "purchase order"), {"source": "Haus", "target": "building"}])
        plain = c.translate("x", source_lang="de", target_lang="en", glossary={})     # empty: none, not sent
        with pytest.raises(TypeError, match="glossary entry 2: a .source, target. pair"):
            c.translate("x", source_lang="de", target_lang="en", glossary=[("a", "b"), ("c",)])
        c.translate("x", source_lang="de", target_lang="en", glossary_id="0" * 32)          # a stored one
    assert r.translations[0].glossary == [GlossaryResult(source="Auftrag", target="purchase order", held=True)]
    assert [body.get("glossary") for _, body, _ in srv.calls[:3]] == [sent, sent, None]
    assert "glossary_id" not in srv.calls[0][1] and srv.calls[3][1]["glossary_id"] == "0" * 32
    assert plain.translations[0].glossary is None


def test_async_client_sends_a_glossary_the_same_way_and_a_refused_one_is_a_bad_request():
    refused = (400, {"error": {"type": "invalid_glossary", "message": "glossary entry 1: its target term is empty"}},
               {})
    srv = Scripted((200, GLOSSED, {}), refused)

    async def run():
        async with srv.async_client() as c:
            r = await c.translate(["Der Auftrag kam."], source_lang="de", target_lang="en", beam_size=2,
                                  glossary=[("Auftrag", "purchase order")])
            with pytest.raises(BadRequestError) as e:
                await c.translate("x", source_lang="de", target_lang="en", glossary={"Haus": " "})
            return r, e.value

    r, error = asyncio.run(run())
    assert r.translations[0].glossary[0].held and r.translations[0].text == "The purchase order came."
    assert srv.calls[0][1] == {"text": ["Der Auftrag kam."], "source_lang": "de", "target_lang": "en",
                               "beam_size": 2, "glossary": [{"source": "Auftrag", "target": "purchase order"}]}
    assert srv.calls[1][1]["glossary"] == [{"source": "Haus", "target": " "}]      # the server checks the terms
    assert error.type == "invalid_glossary" and "entry 1" in error.message


# --- text generation --------------------------------------------------------------------------------

def test_generate_parses_the_result_and_sends_only_the_options_given():
    srv = Scripted((200, GENERATED, {}))
    with srv.client() as c:
        r = c.generate("Das ist", temperature=0.0, stop=".", max_new_tokens=8, seed=None)
    assert isinstance(r, GenerateResult) and r.text == " ein Test" and r.model == "g"
    assert r.choices[0].finish_reason == "stop" and r.choices[0].tokens == 2
    assert r.usage.prompt_tokens == 3 and r.usage.completion_tokens == 2 and r.timings.first_token_ms == 4.0
    path, body, headers = srv.calls[0]
    assert path == "/generate" and body == {"prompt": "Das ist", "temperature": 0.0, "stop": ["."],
                                            "max_new_tokens": 8, "stream": False}
    assert headers["Accept"] == "application/json"


def test_text_goes_as_utf8_and_a_lone_surrogate_escaped_for_the_server_to_refuse():
    """httpx's json= raises UnicodeEncodeError for a lone surrogate; the SDK sends it escaped, as a JavaScript
    client does, and the server's 422 is the SDK's BadRequestError (test_hostile.py: against the real server).
    Other text goes as UTF-8, as compact as before."""
    sent = []

    def handle(request: httpx.Request) -> httpx.Response:
        sent.append((request.content, request.headers["content-type"], request.headers["accept"]))
        return httpx.Response(422, json={"error": {"type": "invalid_request", "message": "lone surrogate"},
                                         "request_id": "r9"})

    with Client(URL, transport=httpx.MockTransport(handle)) as c:
        for text in ("Grüße", "Hal\ud800lo"):
            with pytest.raises(BadRequestError, match="lone surrogate"):
                c.translate(text, source_lang="de", target_lang="en")
        with pytest.raises(BadRequestError, match="lone surrogate"):
            c.stream("Hal\ud800lo")
    assert sent[0][0] == '{"text":"Grüße","source_lang":"de","target_lang":"en"}'.encode()
    assert sent[1][0] == b'{"text":"Hal\\ud800lo","source_lang":"de","target_lang":"en"}'
    assert sent[2][0] == b'{"prompt":"Hal\\ud800lo","stream":true}' and sent[2][2] == "text/event-stream"
    assert [ctype for _, ctype, _ in sent] == ["application/json"] * 3


def test_generate_rejects_an_unknown_option_before_sending():
    srv = Scripted()
    with srv.client() as c, pytest.raises(TypeError, match="max_tokens"):
        c.generate("x", max_tokens=3)
    assert srv.calls == []


def test_generate_retries_503_then_succeeds(sleeps):
    srv = Scripted(overloaded(), (200, GENERATED, {}))
    with srv.client(max_retries=2) as c:
        assert c.generate("Das ist").text == " ein Test"
    assert len(srv.calls) == 2 and sleeps == [0.0]


def test_stream_yields_the_pieces_in_order_then_the_done_event_with_the_whole_text():
    events = [b": keep-alive\n\n", token(" ein"), token(" klei"), token("ner"), DONE]
    srv = Scripted((200, Sse(*events), {"X-Request-Id": "r5"}))
    with srv.client() as c:
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


def test_stream_parses_events_split_across_lines_and_chunks():
    """A `data:` field over several lines is one event, joined by newlines; an event may arrive in pieces,
    and the last one may end without its blank line; other sequences' tokens and unknown events are
    not text of sequence 0."""
    events = [b'data: {"type": "token",\ndata: "text": " ein"}\n\n', b'data: {"type": "tok', b'en", "text": "e"}\n',
              b"\n", token(" other", index=1), b'event: x\nid: 1\ndata: {"type": "ping"}\n\n',
              b"data: " + json.dumps(DONE).encode()]
    srv = Scripted((200, Sse(*events), {}))
    with srv.client() as c, c.stream("x") as s:
        assert list(s) == [" ein", "e"]
    assert s.result.text == " eine"


@pytest.mark.parametrize("event", [{"type": "token", "index": "zero", "text": "x"},
                                   dict(DONE, choices=["x"]), dict(DONE, usage=None)])
def test_an_event_the_client_cannot_read_is_a_stream_error(event, sleeps):
    srv = Scripted((200, Sse(token(" ein"), event), {"X-Request-Id": "r8"}))
    with srv.client() as c, pytest.raises(APIStreamError) as e:
        with c.stream("Das ist") as s:
            list(s)
    assert e.value.type == "invalid_event" and e.value.request_id == "r8" and sleeps == []


def test_a_stream_answered_with_something_else_than_events_is_a_response_validation_error():
    srv = Scripted((200, GENERATED, {}), (200, GENERATED, {}))
    with srv.client() as c, pytest.raises(APIResponseValidationError, match="not server-sent events"):
        c.stream("Das ist")

    async def run():
        async with srv.async_client() as c:
            async with c.stream("Das ist"):
                pass
    with pytest.raises(APIResponseValidationError, match="not server-sent events"):
        asyncio.run(run())


def test_an_error_event_raises_with_the_request_id_and_is_not_retried(sleeps):
    error = {"type": "error", "error": {"type": "internal_error", "message": "the worker failed"}}
    srv = Scripted((200, Sse(token(" ein"), error), {"X-Request-Id": "r7"}), (200, Sse(token("x"), DONE), {}))
    pieces = []
    with srv.client(max_retries=2) as c, pytest.raises(APIStreamError) as e:
        with c.stream("Das ist") as s:
            for piece in s:
                pieces.append(piece)
    assert pieces == [" ein"] and s.result is None and len(srv.calls) == 1 and sleeps == []
    assert isinstance(e.value, APIError) and e.value.status_code is None
    assert e.value.type == "internal_error" and e.value.message == "the worker failed"
    assert e.value.request_id == "r7"


def test_an_event_that_is_not_json_is_a_stream_error():
    srv = Scripted((200, Sse(token("a"), b"data: {not json\n\n", DONE), {"X-Request-Id": "r6"}))
    with srv.client() as c, pytest.raises(APIStreamError, match="not JSON") as e:
        list(c.stream("x"))
    assert e.value.type == "invalid_event" and e.value.request_id == "r6"


def test_a_stream_that_ends_without_its_done_event_is_a_connection_error():
    srv = Scripted((200, Sse(token(" ein")), {}))
    with srv.client() as c, pytest.raises(APIConnectionError, match="done event"):
        list(c.stream("Das ist"))


def test_a_stream_that_breaks_off_is_a_connection_error_and_is_not_retried(sleeps):
    body = Sse(token(" ein"), fail=httpx.ReadError("connection reset by peer"))
    srv = Scripted((200, body, {}), (200, Sse(token("x"), DONE), {}))
    pieces = []
    with srv.client(max_retries=2) as c, pytest.raises(APIConnectionError, match="broke off") as e:
        for piece in c.stream("Das ist"):
            pieces.append(piece)
    assert pieces == [" ein"] and not isinstance(e.value, APITimeoutError)
    assert len(srv.calls) == 1 and sleeps == [] and body.closed


def test_a_stream_that_stops_sending_is_a_timeout():
    srv = Scripted((200, Sse(token(" ein"), fail=httpx.ReadTimeout("timed out")), {}))
    with srv.client() as c, c.stream("x") as s:
        assert next(s) == " ein"
        with pytest.raises(APITimeoutError, match="no event within the timeout"):
            next(s)


def test_stream_retries_503_before_it_begins(sleeps):
    srv = Scripted(overloaded(), overloaded(), (200, Sse(token("a"), token("b"), DONE), {}))
    with srv.client(max_retries=2) as c, c.stream("x") as s:
        assert "".join(s) == "ab" and s.result.text == "ab"
    assert len(srv.calls) == 3 and sleeps == [0.0, 0.0]


def test_stream_errors_before_it_begins_are_status_errors(sleeps):
    srv = Scripted((422, {"error": {"type": "invalid_request", "message": "top_p"}, "request_id": "r2"}, {}))
    with srv.client(max_retries=2) as c, pytest.raises(BadRequestError) as e:
        c.stream("x", top_p=0.0)
    assert e.value.status_code == 422 and e.value.request_id == "r2" and e.value.message == "top_p"
    assert len(srv.calls) == 1 and sleeps == []


def test_closing_a_stream_early_closes_the_connection():
    sse = Sse(token(" ein"), token(" Test"), hold=True)
    srv = Scripted((200, sse, {}))
    with srv.client() as c:
        with c.stream("Das ist") as s:
            first = next(s)
        assert first == " ein"
        assert sse.closed, "the client did not close the response"
        assert list(s) == [] and s.result is None       # nothing more is read after close


def test_stream_refuses_several_sequences_before_sending():
    srv = Scripted()
    with srv.client() as c, pytest.raises(ValueError, match="generate"):
        c.stream("x", num_return_sequences=2)
    with pytest.raises(ValueError, match="generate"):
        srv.async_client().stream("x", num_return_sequences=2)
    assert srv.calls == []


def test_async_generate_and_stream(sleeps):
    sse = Sse(token(" ein"), token(" Test"), hold=True)
    srv = Scripted(overloaded(), (200, GENERATED, {}), overloaded(),
                   (200, Sse(token(" ein"), token(" Test"), DONE), {"X-Request-Id": "r4"}), (200, sse, {}))

    async def run():
        async with srv.async_client(max_retries=2) as c:
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

    r, pieces, s, first, early = asyncio.run(run())
    assert r.text == " ein Test" and srv.calls[1][1] == {"prompt": "Das ist", "top_k": 5, "stream": False}
    assert pieces == [" ein", " Test"] and s.result.text == " ein Test" and s.result.choices[0].tokens == 3
    assert s.request_id == "r4" and srv.calls[3][2]["Accept"] == "text/event-stream"
    assert first == " ein" and early.result is None
    assert sse.closed, "the client did not close the response"
    assert len(srv.calls) == 5 and sleeps == [0.0, 0.0]


def test_async_stream_error_event_raises():
    error = {"type": "error", "error": {"type": "timeout", "message": "too slow"}}
    srv = Scripted((200, Sse(error), {"X-Request-Id": "r8"}))

    async def run():
        async with srv.async_client() as c:
            return [p async for p in c.stream("x")]

    with pytest.raises(APIStreamError) as e:
        asyncio.run(run())
    assert e.value.type == "timeout" and e.value.request_id == "r8" and str(e.value) == "timeout: too slow"


def test_async_stream_errors_before_it_begins_are_status_errors(sleeps):
    srv = Scripted((413, {"error": {"type": "too_large", "message": "prompt", "limit": 9}}, {"X-Request-Id": "r2"}))

    async def run():
        async with srv.async_client(max_retries=2) as c:
            with pytest.raises(APIError) as e:
                await c.stream("x")
            return e.value

    error = asyncio.run(run())
    assert error.status_code == 413 and error.limit == 9 and error.request_id == "r2" and error.message == "prompt"
    assert len(srv.calls) == 1 and sleeps == []


@pytest.mark.parametrize("fail, error, match", [
    (httpx.ReadError("connection reset by peer"), APIConnectionError, "broke off"),
    (httpx.ReadTimeout("timed out"), APITimeoutError, "no event within the timeout")])
def test_async_stream_that_breaks_off_or_stalls_is_not_retried(fail, error, match, sleeps):
    body = Sse(token(" ein"), fail=fail)
    srv = Scripted((200, body, {}))

    async def run():
        pieces = []
        async with srv.async_client(max_retries=2) as c:
            with pytest.raises(error, match=match) as e:
                async for piece in c.stream("x"):
                    pieces.append(piece)
        return pieces, e.value

    pieces, raised = asyncio.run(run())
    assert pieces == [" ein"] and len(srv.calls) == 1 and sleeps == [] and body.closed
    assert isinstance(raised, APITimeoutError) == (error is APITimeoutError)
