"""Python client for the transerve HTTP API: `Client` (blocking) and `AsyncClient` (asyncio).

    from service.client import Client
    with Client("http://127.0.0.1:8000") as c:
        r = c.translate("Das geht zu weit.", source_lang="de", target_lang="en")
        print(r.translations[0].text)

        r = c.translate("Der Auftrag kam.", source_lang="de", target_lang="en", glossary={"Auftrag": "order"})
        print(r.translations[0].glossary)                         # [GlossaryResult(source=..., held=True)]

        g = c.generate("Die Datei wird", max_new_tokens=32, temperature=0.7, seed=1)
        print(g.text, g.choices[0].finish_reason, g.usage.completion_tokens)

        with c.stream("Die Datei wird", max_new_tokens=32) as s:   # server-sent events
            for piece in s:                                        # the text of sequence 0, piece by piece
                print(piece, end="", flush=True)
        print(s.result.choices[0].finish_reason)                  # the done event, with the whole text

    async with AsyncClient() as c:                                 # the same, awaited
        g = await c.generate("Die Datei wird")
        async with c.stream("Die Datei wird") as s:
            async for piece in s:
                ...

Leaving a stream early (closing it, or the `with` block) closes its connection, which stops the
generation on the server. Generation options left out take the server's defaults (see
`GenerateOptions`); only the ones given are sent.

Needs only the `client` extra (httpx, pydantic): importing it loads neither onnxruntime nor litserve.
Request building and response parsing live in `BaseClient` (and the stream parser `_EventParser`),
which do no I/O; the two clients only differ in how they send.

Transport: `transport=` is httpx's own argument, handed to the httpx client underneath: an
`httpx.BaseTransport` for `Client`, an `httpx.AsyncBaseTransport` for `AsyncClient`. None (the default)
is httpx's HTTP transport. Pass `httpx.HTTPTransport(proxy=..., limits=..., verify=...)` for connection
settings, or `httpx.MockTransport(handler)` to answer requests in-process (a test double). The client
takes a transport rather than a whole httpx client so that its base URL, timeout, headers and retries
stay its own: a second set on an injected client would compete with them.

    c = Client("http://translate.internal", transport=httpx.HTTPTransport(proxy="http://proxy:3128"))

Exceptions:

    TranserveError
    ├── APIConnectionError            the server was unreachable, or the connection broke (a stream's too)
    │   └── APITimeoutError           ... or did not answer in time (not retried: it may have run)
    └── APIError                      the server reported an error: .message, .type, .limit, .request_id, .body
        ├── APIStatusError            an error status (or a redirect, which the client does not follow);
        │   │                         .status_code, .retry_after (its Retry-After in seconds, or None)
        │   ├── BadRequestError       400, 422: the request is wrong (see .message)
        │   ├── AuthenticationError   401, 403
        │   ├── PayloadTooLargeError  413: over a limit (.limit says which value)
        │   ├── OverloadedError       429, 503: over a limit or queue full; .retry_after seconds (1 when not said)
        │   └── InternalServerError   500 and other 5xx, 504 (timed out in the queue)
        ├── APIStreamError            an error event after a stream began (status 200), or an event this client
        │                             cannot read: .status_code is None
        └── APIResponseValidationError  a success whose body is not what this API answers (a proxy's page, another
                                        service): .status_code, .body (its first 200 characters; None for
                                        a stream that is not server-sent events)

Retries (max_retries, default 2) happen only before a response is accepted, and only where the request
cannot have run: a connection that could not be made, in time or at all (a GET also after the connection broke),
and a 429 or 503, after its Retry-After (1 s when it says none; one over max_retry_wait_s, by default
MAX_RETRY_WAIT_S = 10 s, is raised at once: the caller decides whether to wait that long). A POST whose
connection broke after it was sent, or that got no answer in time, is not retried: it may have run and been
charged. Idle connections are let go after KEEPALIVE_S, before the server's keep-alive (5 s) closes them under
a request. For a stream, retries end at its first event (the
server sends the stream's headers with its first event, and errors before it as a status): once it has
begun its pieces may already have been used.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import time
from typing import (TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Iterator, Mapping, Optional, Sequence,
                    TypedDict, Union)

import httpx

from .shared.schemas import (GenerateResponse, GenerationChoice, GenerationTimings, GenerationUsage, GlossaryResult,
                             Language, TranslateResponse)

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Client", "AsyncClient", "TextStream", "AsyncTextStream", "Glossary", "GlossaryResult", "TranslateResponse",
           "GenerateOptions", "GenerateResult", "GenerationChoice", "GenerationUsage", "GenerationTimings",
           "TranserveError", "APIConnectionError", "APITimeoutError", "APIError", "APIStatusError", "APIStreamError",
           "APIResponseValidationError", "BadRequestError", "AuthenticationError", "PayloadTooLargeError",
           "OverloadedError", "InternalServerError", "MAX_RETRY_WAIT_S"]


# A 429's or 503's Retry-After above this is not waited for (the default of max_retry_wait_s): the error is raised
# at once (a day's character limit says hours), and the caller decides.
MAX_RETRY_WAIT_S = 10.0
# Idle connections are closed after this: under the server's keep-alive (--keep-alive-timeout-s, 5 s), so a request
# is never sent on a connection the server is closing (which would break after it was sent: not retried).
KEEPALIVE_S = 4.0
LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=KEEPALIVE_S)  # else httpx's


class TranserveError(Exception):
    def __reduce__(self):
        """Pickled and copied with its attributes (keyword-only constructors): for process pools."""
        return _restored, (type(self), self.args, self.__dict__)


def _restored(cls: type, args: tuple, state: dict) -> "TranserveError":
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class APIConnectionError(TranserveError):
    pass


class APITimeoutError(APIConnectionError):
    pass


class APIError(TranserveError):
    """An error the server reported. .status_code is None where there was none (an error event in a stream)."""

    status_code: Optional[int] = None

    def __init__(self, message: str, *, request_id: Optional[str], body: Any, status_code: Optional[int] = None):
        err = body.get("error") if isinstance(body, dict) else None
        self.type = err.get("type") if isinstance(err, dict) else None
        self.limit = err.get("limit") if isinstance(err, dict) else None
        self.message, self.status_code, self.request_id, self.body = message, status_code, request_id, body
        super().__init__(f"{status_code if status_code is not None else self.type or 'error'}: {message}")


class APIStatusError(APIError):
    status_code: int

    def __init__(self, message: str, *, status_code: int, request_id: Optional[str], body: Any,
                 retry_after: Optional[float] = None):
        super().__init__(message, status_code=status_code, request_id=request_id, body=body)
        self.retry_after = retry_after


class APIStreamError(APIError):
    """The server sent {"type": "error", "error": {"type", "message"}} after the stream began (its status was
    200, so .status_code is None); .request_id is the stream's X-Request-ID, .body the event."""


class BadRequestError(APIStatusError):
    pass


class AuthenticationError(APIStatusError):
    pass


class PayloadTooLargeError(APIStatusError):
    pass


class OverloadedError(APIStatusError):
    retry_after: float

    def __init__(self, message: str, *, status_code: int, request_id: Optional[str], body: Any,
                 retry_after: Optional[float] = None):
        super().__init__(message, status_code=status_code, request_id=request_id, body=body,
                         retry_after=1.0 if retry_after is None else retry_after)


class InternalServerError(APIStatusError):
    pass


class APIResponseValidationError(APIError):
    """A success (2xx) whose body this client cannot read as the API's answer."""


def retry_after_s(value: Optional[str]) -> Optional[float]:
    """A Retry-After header in seconds: a number of seconds or an HTTP date (RFC 9110); None when absent or
    unreadable (a negative or non-finite number too)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        return max(0.0, when.timestamp() - time.time())
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


_STATUS = {400: BadRequestError, 422: BadRequestError, 401: AuthenticationError, 403: AuthenticationError,
           413: PayloadTooLargeError, 429: OverloadedError, 503: OverloadedError}


# --- translation --------------------------------------------------------------------------------------

# translate()'s glossary: {source term: target term}, (source, target) pairs, or {"source": ..., "target": ...}
# dicts as POST /translate takes them.
Glossary = Union[Mapping[str, str], Sequence[Union[Sequence[str], Mapping[str, str]]]]


# --- text generation ----------------------------------------------------------------------------------

class GenerateOptions(TypedDict, total=False):
    """Options of POST /generate; those not given take the server's defaults (shown here)."""
    model: Optional[str]            # generation package id (default: the first one loaded)
    max_new_tokens: int             # 64
    min_new_tokens: int             # 0 = off
    temperature: float              # 1.0; 0 = greedy
    top_k: int                      # 0 = off
    top_p: float                    # 1.0 = off
    repetition_penalty: float       # 1.0 = off
    stop: Union[str, Sequence[str]]  # up to 4 stop sequences (not returned)
    seed: Optional[int]             # None = random
    num_return_sequences: int       # 1 (generate() only)
    beam_size: int                  # 1 = off


class GenerateResult(GenerateResponse):
    """POST /generate's answer (the wire schema the server validates against), and its first text."""

    @property
    def text(self) -> str:
        """The text of the first (or only) sequence."""
        return self.choices[0].text


class _EventParser:
    """Server-sent events of a /generate stream, line by line; no I/O. feed() returns the text pieces of
    sequence 0 the line completes; after the done event, .result is set."""

    def __init__(self, request_id: Optional[str]):
        self.request_id = request_id
        self.result: Optional[GenerateResult] = None
        self._data: list[str] = []
        self._texts: dict[int, list[str]] = {}

    def feed(self, line: str) -> list[str]:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):                      # a comment (keep-alive)
            return []
        field, _, value = line.partition(":")
        if field == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return []                                     # event:, id:, retry: are not used

    def end(self) -> list[str]:
        """The stream ended: a last event without its blank line still counts."""
        pieces = self._dispatch()
        if self.result is None:
            raise APIConnectionError("the stream ended before its done event")
        return pieces

    def _dispatch(self) -> list[str]:
        if not self._data:
            return []
        data, self._data = "\n".join(self._data), []
        try:
            event = json.loads(data)
        except ValueError:
            raise APIStreamError(f"the server sent an event that is not JSON: {data[:200]!r}",
                                 request_id=self.request_id,
                                 body={"error": {"type": "invalid_event", "message": data[:200]}}) from None
        kind = event.get("type") if isinstance(event, dict) else None
        try:
            if kind == "token":
                index, text = int(event.get("index", 0)), event.get("text") or ""
                self._texts.setdefault(index, []).append(str(text))
                return [text] if index == 0 and text else []
            if kind == "done":
                choices = [dict(c, text="".join(self._texts.get(c.get("index", 0), ())))
                           for c in event.get("choices", ())]
                self.result = GenerateResult.model_validate(dict(event, choices=choices))
                return []
        except (ValueError, TypeError, AttributeError):    # pydantic's ValidationError is a ValueError
            raise APIStreamError(f"the server sent a {kind} event this client cannot read: {data[:200]!r}",
                                 request_id=self.request_id,
                                 body={"error": {"type": "invalid_event", "message": data[:200]}}) from None
        if kind == "error":
            err = event.get("error") if isinstance(event.get("error"), dict) else {}
            raise APIStreamError(str(err.get("message") or "the generation failed"), request_id=self.request_id,
                                 body=event)
        return []                                     # an event type this client does not know


class TextStream:
    """What Client.stream returns: iterate it for the text pieces of sequence 0 as they arrive; once it is
    exhausted, .result is the whole GenerateResult. close() (or leaving the `with` block) disconnects,
    which stops the generation on the server."""

    def __init__(self, response: httpx.Response):
        self.response = response
        self.request_id: Optional[str] = response.headers.get("x-request-id")
        self._parser = _EventParser(self.request_id)
        self._pieces: Optional[Iterator[str]] = None
        self._closed = False

    @property
    def result(self) -> Optional[GenerateResult]:
        """The done event with the streamed text; None until the stream has been read to its end."""
        return self._parser.result

    def __iter__(self) -> "TextStream":
        return self

    def __next__(self) -> str:
        if self._pieces is None:
            if self._closed:
                raise StopIteration
            self._pieces = self._read()
        return next(self._pieces)

    def _read(self) -> Iterator[str]:
        try:
            for line in self.response.iter_lines():
                yield from self._parser.feed(line)
            yield from self._parser.end()
        except httpx.TimeoutException as e:
            raise APITimeoutError(f"no event within the timeout: {e}") from e
        except httpx.TransportError as e:
            raise APIConnectionError(f"the stream broke off: {e}") from e
        finally:
            self._closed = True
            self.response.close()

    def until_done(self) -> GenerateResult:
        """Reads the rest of the stream; the result."""
        for _ in self:
            pass
        if self.result is None:
            raise APIConnectionError("the stream was closed before its done event")
        return self.result

    def close(self) -> None:
        self._closed = True
        if self._pieces is not None:
            self._pieces.close()
        self.response.close()

    def __enter__(self) -> "TextStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncTextStream:
    """What AsyncClient.stream returns, the mirror of TextStream: `async for piece in stream`, `async with`,
    `await stream.aclose()`. The request is sent on `async with`, on `await stream`, or on the first
    piece asked for, whichever comes first."""

    def __init__(self, open_: Callable[[], Awaitable[httpx.Response]]):
        self._open = open_
        self.response: Optional[httpx.Response] = None
        self.request_id: Optional[str] = None
        self._parser = _EventParser(None)
        self._pieces: Optional[AsyncIterator[str]] = None
        self._closed = False

    @property
    def result(self) -> Optional[GenerateResult]:
        """The done event with the streamed text; None until the stream has been read to its end."""
        return self._parser.result

    async def start(self) -> "AsyncTextStream":
        """Sends the request (with retries) unless it was sent already."""
        if self.response is None:
            if self._closed:
                raise RuntimeError("the stream is closed")
            self.response = await self._open()
            self.request_id = self._parser.request_id = self.response.headers.get("x-request-id")
        return self

    def __await__(self):
        return self.start().__await__()

    def __aiter__(self) -> "AsyncTextStream":
        return self

    async def __anext__(self) -> str:
        if self._pieces is None:
            if self._closed:
                raise StopAsyncIteration
            await self.start()
            self._pieces = self._read()
        return await self._pieces.__anext__()

    async def _read(self) -> AsyncIterator[str]:
        assert self.response is not None
        lines = self.response.aiter_lines()
        try:
            async for line in lines:
                for piece in self._parser.feed(line):
                    yield piece
            for piece in self._parser.end():
                yield piece
        except httpx.TimeoutException as e:
            raise APITimeoutError(f"no event within the timeout: {e}") from e
        except httpx.TransportError as e:
            raise APIConnectionError(f"the stream broke off: {e}") from e
        finally:
            self._closed = True
            await lines.aclose()
            await self.response.aclose()

    async def until_done(self) -> GenerateResult:
        """Reads the rest of the stream; the result."""
        async for _ in self:
            pass
        if self.result is None:
            raise APIConnectionError("the stream was closed before its done event")
        return self.result

    async def aclose(self) -> None:
        self._closed = True
        if self._pieces is not None:
            await self._pieces.aclose()       # type: ignore[attr-defined]
        if self.response is not None:
            await self.response.aclose()

    async def __aenter__(self) -> "AsyncTextStream":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


class BaseClient:
    """Builds requests and parses responses; no I/O."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", *, api_key: Optional[str] = None,
                 timeout: float = 60.0, max_retries: int = 2, max_retry_wait_s: float = MAX_RETRY_WAIT_S):
        if httpx.URL(base_url).scheme not in ("http", "https"):
            raise ValueError("base_url must start with http:// or https://")     # not quoted: it may hold a password
        self.base_url = base_url.rstrip("/")
        self.api_key, self.timeout, self.max_retries = api_key, timeout, max_retries
        self.max_retry_wait_s = max_retry_wait_s

    def _headers(self) -> dict[str, str]:
        h = {"Accept": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    @classmethod
    def _translate_body(cls, text: Union[str, Sequence[str]], source_lang: str, target_lang: str,
                        options: dict) -> dict:
        body = {"text": text if isinstance(text, str) else list(text), "source_lang": source_lang,
                "target_lang": target_lang}
        options = dict(options, glossary=cls._glossary(options.get("glossary")))
        body.update({k: v for k, v in options.items() if v is not None})
        return body

    @staticmethod
    def _glossary(glossary: Optional[Glossary]) -> Optional[list[dict]]:
        """A Glossary as POST /translate's list of {"source", "target"} objects; None (not sent) for None or an
        empty one. An entry of another shape is a TypeError before sending, numbered from 1 as the server numbers
        entries; the terms themselves are the server's to check (400 invalid_glossary, BadRequestError)."""
        if glossary is None:
            return None
        if isinstance(glossary, (str, bytes)):
            raise TypeError("glossary must be a dict of source term -> target term or a list of entries, not text")
        if isinstance(glossary, Mapping):
            glossary = list(glossary.items())
        out = []
        for n, entry in enumerate(glossary, 1):
            if isinstance(entry, Mapping) and set(entry) == {"source", "target"}:
                out.append({"source": entry["source"], "target": entry["target"]})
            elif not isinstance(entry, (str, bytes, Mapping)) and isinstance(entry, Sequence) and len(entry) == 2:
                out.append({"source": entry[0], "target": entry[1]})
            else:
                raise TypeError(f"glossary entry {n}: a (source, target) pair or a dict with the keys source and "
                                f"target, not {entry!r:.80}")
        return out or None

    @staticmethod
    def _generate_body(prompt: str, options: dict, *, stream: bool) -> dict:
        """The JSON body of POST /generate: the prompt, stream, and only the options given."""
        unknown = sorted(set(options) - set(GenerateOptions.__annotations__))
        if unknown:
            raise TypeError(f"unknown generation option(s): {', '.join(unknown)}; "
                            f"known: {', '.join(GenerateOptions.__annotations__)}")
        if stream and (options.get("num_return_sequences") or 1) > 1:
            raise ValueError("a stream returns one sequence: use generate() for num_return_sequences > 1")
        body: dict[str, Any] = {"prompt": prompt}
        body.update({k: v for k, v in options.items() if v is not None})
        if "stop" in body:
            body["stop"] = [body["stop"]] if isinstance(body["stop"], str) else list(body["stop"])
        body["stream"] = stream
        return body

    _STREAM_HEADERS = {"Accept": "text/event-stream"}

    @staticmethod
    def _json(body: dict, headers: Optional[dict[str, str]] = None) -> dict:
        """httpx's arguments sending `body` as JSON, in UTF-8 as httpx's `json=` sends it; but a text with a
        lone UTF-16 surrogate, which has no UTF-8 (httpx would raise UnicodeEncodeError), goes escaped as
        "\\ud800", as a JavaScript client sends it, so that the server's 422 names the text
        (BadRequestError)."""
        try:
            content = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
        except UnicodeEncodeError:
            content = json.dumps(body, separators=(",", ":"), allow_nan=False).encode("ascii")
        return {"content": content, "headers": {"Content-Type": "application/json", **(headers or {})}}

    @staticmethod
    def _check(response: httpx.Response) -> httpx.Response:
        """The response itself when it succeeded; otherwise the matching APIStatusError (a redirect too: the
        client does not follow one, and its body is not the answer)."""
        status = response.status_code
        if status < 300:
            return response
        try:
            body = response.json()
        except ValueError:
            body = {"error": {"type": "http_error", "message": response.text[:200]}}
        err = body.get("error") if isinstance(body, dict) else None
        message = (err.get("message") if isinstance(err, dict) else err) or response.reason_phrase or f"HTTP {status}"
        if status < 400:
            message = f"redirected to {response.headers.get('location', 'no location')}: give the final URL"
        cls = _STATUS.get(status, InternalServerError if status >= 500 else APIStatusError)
        request_id = response.headers.get("x-request-id") or (
            body.get("request_id") if isinstance(body, dict) else None)
        raise cls(str(message), status_code=status, request_id=request_id, body=body,
                  retry_after=retry_after_s(response.headers.get("retry-after")))

    @staticmethod
    def _answer(response: httpx.Response, read: Callable[[Any], Any]) -> Any:
        """read(the response's JSON): the answer; an APIResponseValidationError when the body is not JSON or
        read() refuses it (pydantic's ValidationError is a ValueError)."""
        try:
            return read(response.json())
        except (ValueError, TypeError, AttributeError) as e:
            raise APIResponseValidationError(
                f"{response.request.method} {response.request.url.path}: the answer is not this API's "
                f"({type(e).__name__}): {response.text[:200]!r}", status_code=response.status_code,
                request_id=response.headers.get("x-request-id"), body=response.text[:200]) from None

    @staticmethod
    def _not_events(response: httpx.Response) -> Optional[APIResponseValidationError]:
        """The error to raise (once the response is closed) when a stream's answer is not server-sent events."""
        kind = response.headers.get("content-type", "")
        if kind.startswith("text/event-stream"):
            return None
        return APIResponseValidationError(f"the stream's answer is {kind or 'untyped'}, not server-sent events",
                                          status_code=response.status_code,
                                          request_id=response.headers.get("x-request-id"), body=None)

    @staticmethod
    def _object(body: Any) -> dict:
        if not isinstance(body, dict):
            raise TypeError("not a JSON object")
        return body

    @staticmethod
    def _languages(body: Any) -> list[Language]:
        if not isinstance(body, list):
            raise TypeError("not a JSON list")
        return [Language.model_validate(x) for x in body]

    def _retry_delay(self, error: TranserveError, attempt: int, method: str) -> Optional[float]:
        """Seconds to wait before retrying, or None to give up (see the module's docstring). Overload: the
        server's Retry-After, unless over max_retry_wait_s; connection errors where the request cannot have
        run: exponential backoff (0.5 s, 1 s, 2 s, ...)."""
        if attempt >= self.max_retries:
            return None
        if isinstance(error, OverloadedError):
            return error.retry_after if error.retry_after <= self.max_retry_wait_s else None
        if isinstance(error, APIConnectionError) and not isinstance(error, APITimeoutError):
            unsent = isinstance(error.__cause__, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout))
            return 0.5 * 2 ** attempt if unsent or method == "GET" else None
        return None

    @staticmethod
    def _connection_error(method: str, path: str, e: httpx.TransportError) -> APIConnectionError:
        return APIConnectionError(f"{method} {path}: {type(e).__name__}" + (f": {e}" if str(e) else ""))


class Client(BaseClient):
    """Blocking client. Use as a context manager, or call close(). transport: see the module docstring."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", *, transport: Optional[httpx.BaseTransport] = None,
                 **kwargs):
        super().__init__(base_url, **kwargs)
        self._http = httpx.Client(base_url=self.base_url, timeout=self.timeout, headers=self._headers(),
                                  transport=transport, limits=LIMITS)

    def _request(self, method: str, path: str, *, stream: bool = False, **kwargs) -> httpx.Response:
        attempt = 0
        while True:
            try:
                return self._check(self._send(method, path, stream=stream, **kwargs))
            except TranserveError as e:
                delay = self._retry_delay(e, attempt, method)
                if delay is None:
                    raise
                time.sleep(delay)
                attempt += 1

    def _send(self, method: str, path: str, *, stream: bool = False, **kwargs) -> httpx.Response:
        """One request. stream=True: a successful response is returned unread (an error one is read and closed)."""
        try:
            if not stream:
                return self._http.request(method, path, **kwargs)
            response = self._http.send(self._http.build_request(method, path, **kwargs), stream=True)
            if response.status_code >= 300:                            # _check raises: read it, close it
                try:
                    response.read()
                finally:
                    response.close()
            return response
        except (httpx.ConnectTimeout, httpx.PoolTimeout) as e:        # not sent: retried as a refused connection
            raise self._connection_error(method, path, e) from e
        except httpx.TimeoutException as e:
            raise APITimeoutError(f"{method} {path}: no answer within {self.timeout} s") from e
        except httpx.TransportError as e:
            raise self._connection_error(method, path, e) from e

    def translate(self, text: Union[str, Sequence[str]], *, source_lang: str, target_lang: str,
                  beam_size: Optional[int] = None, num_alternatives: Optional[int] = None,
                  length_penalty: Optional[float] = None, max_length: Optional[int] = None,
                  no_repeat_ngram_size: Optional[int] = None, repetition_penalty: Optional[float] = None,
                  glossary: Optional[Glossary] = None, glossary_id: Optional[str] = None) -> TranslateResponse:
        """Translates one text or a list; options left None take the server's defaults. glossary: fixed
        translations of terms (a Glossary), kept by beam search (beam_size 2 or more), each translation's
        .glossary saying which held; None = none. glossary_id: a glossary stored with POST /glossaries by this
        key, instead; None = none."""
        body = self._translate_body(text, source_lang, target_lang, dict(
            beam_size=beam_size, num_alternatives=num_alternatives, length_penalty=length_penalty,
            max_length=max_length, no_repeat_ngram_size=no_repeat_ngram_size, repetition_penalty=repetition_penalty,
            glossary=glossary, glossary_id=glossary_id))
        return self._answer(self._request("POST", "/translate", **self._json(body)), TranslateResponse.model_validate)

    def generate(self, prompt: str, **options: Unpack[GenerateOptions]) -> GenerateResult:
        """Continues the prompt (POST /generate); options not given take the server's defaults."""
        body = self._generate_body(prompt, dict(options), stream=False)
        return self._answer(self._request("POST", "/generate", **self._json(body)), GenerateResult.model_validate)

    def stream(self, prompt: str, **options: Unpack[GenerateOptions]) -> TextStream:
        """Like generate(), streamed: sends the request now (retrying until the stream begins) and returns
        the TextStream to iterate, best in a `with` block. num_return_sequences > 1 is a ValueError."""
        body = self._generate_body(prompt, dict(options), stream=True)
        response = self._request("POST", "/generate", stream=True, **self._json(body, self._STREAM_HEADERS))
        if error := self._not_events(response):
            response.close()
            raise error
        return TextStream(response)

    def languages(self) -> list[Language]:
        return self._answer(self._request("GET", "/languages"), self._languages)

    def info(self) -> dict:
        return self._answer(self._request("GET", "/info"), self._object)

    def health(self) -> bool:
        return self._request("GET", "/health").status_code == 200

    def ready(self) -> bool:
        try:
            return self._http.get("/ready").status_code == 200
        except httpx.TransportError:
            return False

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncClient(BaseClient):
    """asyncio client, the mirror of Client. Use `async with`, or await aclose(). transport: see the module
    docstring (an httpx.AsyncBaseTransport here)."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", *,
                 transport: Optional[httpx.AsyncBaseTransport] = None, **kwargs):
        super().__init__(base_url, **kwargs)
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout, headers=self._headers(),
                                       transport=transport, limits=LIMITS)

    async def _request(self, method: str, path: str, *, stream: bool = False, **kwargs) -> httpx.Response:
        attempt = 0
        while True:
            try:
                return self._check(await self._send(method, path, stream=stream, **kwargs))
            except TranserveError as e:
                delay = self._retry_delay(e, attempt, method)
                if delay is None:
                    raise
                await asyncio.sleep(delay)
                attempt += 1

    async def _send(self, method: str, path: str, *, stream: bool = False, **kwargs) -> httpx.Response:
        try:
            if not stream:
                return await self._http.request(method, path, **kwargs)
            response = await self._http.send(self._http.build_request(method, path, **kwargs), stream=True)
            if response.status_code >= 300:
                try:
                    await response.aread()
                finally:
                    await response.aclose()
            return response
        except (httpx.ConnectTimeout, httpx.PoolTimeout) as e:        # not sent: retried as a refused connection
            raise self._connection_error(method, path, e) from e
        except httpx.TimeoutException as e:
            raise APITimeoutError(f"{method} {path}: no answer within {self.timeout} s") from e
        except httpx.TransportError as e:
            raise self._connection_error(method, path, e) from e

    async def translate(self, text: Union[str, Sequence[str]], *, source_lang: str, target_lang: str,
                        beam_size: Optional[int] = None, num_alternatives: Optional[int] = None,
                        length_penalty: Optional[float] = None, max_length: Optional[int] = None,
                        no_repeat_ngram_size: Optional[int] = None, repetition_penalty: Optional[float] = None,
                        glossary: Optional[Glossary] = None, glossary_id: Optional[str] = None) -> TranslateResponse:
        body = self._translate_body(text, source_lang, target_lang, dict(
            beam_size=beam_size, num_alternatives=num_alternatives, length_penalty=length_penalty,
            max_length=max_length, no_repeat_ngram_size=no_repeat_ngram_size, repetition_penalty=repetition_penalty,
            glossary=glossary, glossary_id=glossary_id))
        return self._answer(await self._request("POST", "/translate", **self._json(body)),
                            TranslateResponse.model_validate)

    async def generate(self, prompt: str, **options: Unpack[GenerateOptions]) -> GenerateResult:
        body = self._generate_body(prompt, dict(options), stream=False)
        return self._answer(await self._request("POST", "/generate", **self._json(body)),
                            GenerateResult.model_validate)

    def stream(self, prompt: str, **options: Unpack[GenerateOptions]) -> AsyncTextStream:
        """Not a coroutine: returns the AsyncTextStream at once (num_return_sequences > 1 is a ValueError
        here); the request goes out on `async with`, `await`, or the first `async for` step."""
        body = self._generate_body(prompt, dict(options), stream=True)
        async def opened() -> httpx.Response:
            response = await self._request("POST", "/generate", stream=True, **self._json(body, self._STREAM_HEADERS))
            if error := self._not_events(response):
                await response.aclose()
                raise error
            return response
        return AsyncTextStream(opened)

    async def languages(self) -> list[Language]:
        return self._answer(await self._request("GET", "/languages"), self._languages)

    async def info(self) -> dict:
        return self._answer(await self._request("GET", "/info"), self._object)

    async def health(self) -> bool:
        return (await self._request("GET", "/health")).status_code == 200

    async def ready(self) -> bool:
        try:
            return (await self._http.get("/ready")).status_code == 200
        except httpx.TransportError:
            return False

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
