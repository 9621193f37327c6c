"""What wraps every request: the request id in (`request.state.request_id`) and out (`X-Request-ID`), the
body limit, the request and error counters, the duration, and a JSON 500 instead of a stack trace. HEAD is
answered by every GET route, as HTTP asks of a server (RFC 9110 section 9.3.2; uptime checkers send it):
FastAPI's routes answer only the methods they name.

Plain ASGI rather than Starlette's `BaseHTTPMiddleware` (`app.middleware("http")`), which runs the route
in a task of its own and streams the response body back through a memory channel: that cost more CPU per
request than routing, validation and JSON together (py-spy over the HTTP process, lone requests;
benchmarks/results/vs-ctranslate2-cpu.md)."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time

from typing import Awaitable, Callable

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.types import ASGIApp

from .auth import admit, given_key
from .keys import ANONYMOUS, KeyRing
from .quota import Quota
from .uvicorn_bridge import BODY_WHOLE
from ..errors import ERROR_KIND, ApiError, Responder, http_api_error, too_large
from ..logs import access
from ..metrics import labelled, metrics
from ..tracing import NOOP, Span, enabled, start_span, use_span

log = logging.getLogger("transerve")

REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")   # an X-Request-ID taken from the client (request_id)

# The most of a refused body (over --max-payload-bytes) read and dropped before the 413, so that a client
# that writes its whole body before reading (urllib, most scripts) reads the answer: closing with the body
# unread resets the connection under it (a broken pipe, the 413 lost). A body declared larger is refused
# at once, unread, as is one whose client waits for "100 Continue"; the connection then lingers half-closed,
# dropping what still comes (uvicorn_bridge's `linger`), so that a client still writing reads the 413.
DRAIN_BYTES = 16 * 2**20

# The methods a log line or a span names as sent (HTTP's, RFC 9110, and PATCH); any other, a token a client chose
# (h11, uvicorn's parser where httptools is not installed, passes any), is "_OTHER", as OpenTelemetry names it.
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"})
UNMATCHED = "(unmatched)"   # the route of a request no route took (404, or refused before routing)
GZIP_MIN_BYTES = 1000   # the smallest answer compressed: LitServe's GZipMiddleware's minimum_size

Endpoint = Callable[[Request], Awaitable[ASGIApp]]   # a route that reads its Request and returns its Response


def request_context(app, respond: Responder, endpoints: dict[str, str], max_payload_bytes: int, keys: KeyRing,
                    quota: Quota, open_paths: frozenset = frozenset(), key_in_body: frozenset = frozenset(),
                    body_timeout_s: float = 30.0, access_log: bool = False, body_limits: dict[str, int] = {},
                    direct: dict[str, Endpoint] = {}, gzip: bool = False, plain: frozenset[str] = frozenset()):
    """`app` wrapped; `respond` answers an error in its path's flavour's shape (errors.responder); `endpoints`
    maps the paths whose requests are counted to their metrics label; the paths but `open_paths` (probes,
    language lists: auth.open_paths) need one of the `keys`, checked with its route and requests per minute
    (`quota`) before the body is read (key_refusal), but for a POST to `key_in_body` without one in its headers.
    A body must arrive within `body_timeout_s` of the headers (408, closed), and be `body_limits[path]` bytes at
    most (documents'), else `max_payload_bytes`. `access_log`: an access line per request (service/logs.py).
    `direct`: POST paths whose routes this calls itself (direct_route); `gzip`: LitServe's GZipMiddleware is on;
    `plain`: paths of Starlette's routes (/openapi.json: unnamed on the scope)."""
    fixed = frozenset(endpoints) | frozenset(direct) | plain
    direct_apps = {path: direct_route(endpoint, respond, max_payload_bytes, gzip) for path, endpoint in direct.items()}

    async def wrapped(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        rid = request_id(scope)
        state = scope.setdefault("state", {})
        state["request_id"] = rid
        method, path = named_method(scope), scope["path"]
        t0 = time.perf_counter()
        started: dict = {}
        traced = request_span(scope, rid, endpoints)
        state["trace_id"] = traced.trace_id   # None when traces are off

        send_with_id = noting_send(send, state, started)
        scope = scope | {"method": "GET"} if scope["method"] == "HEAD" else scope   # uvicorn drops HEAD's body
        with use_span(traced):
            try:
                await serve(scope, receive, send_with_id)
            except Exception:  # never a stack trace to the client
                log.exception("unhandled error on %s", route_of(scope, fixed))
                if started:
                    raise
                await failed(path, rid, state, respond)(scope, receive, send_with_id)
            finally:
                end_request_span(traced, state, started.get("status"), route := route_of(scope, fixed))
        if started:
            noted(state, method, route, endpoints.get(path), started, t0, access_log)

    async def serve(scope, receive, send):
        """The request's key checked, its body bounded, then the route: the app's, or a direct one."""
        path, state = scope["path"], scope["state"]
        limited = limited_receive(scope, receive, limit := body_limits.get(path, max_payload_bytes), body_timeout_s)
        send = body_read_before_the_end(send, limited)
        if path not in open_paths and (refused := await key_refusal(keys, quota, scope, key_in_body)):
            state["error_type"] = refused.type
            await respond(path, state["request_id"], refused)(scope, receive, send)
        elif limited is None:
            await drain_declared(scope, receive, body_timeout_s)
            state["error_type"] = "payload_too_large"
            await respond(path, state["request_id"], too_large(limit, path in body_limits))(scope, receive, send)
        elif (direct_app := direct_apps.get(path)) is not None and scope["method"] == "POST":
            await direct_app(scope, limited, send)
        else:
            await app(scope, limited, send)

    return wrapped


def direct_first(app, direct_app, paths: frozenset[str]):
    """`app`, but for a POST to one of `paths`, which goes to `direct_app` (request_context over the direct routes)
    from outside FastAPI's own middleware (fastapi_bridge.outermost): those layers gave it nothing, as
    request_context answers its errors itself and limits its body, and cost a one-sentence /translate 8 of the app's
    265 CPU µs in process (benchmarks/http_cost.py; benchmarks/results/serving-cpu.md)."""
    async def routed(scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in paths:
            return await direct_app(scope, receive, send)
        return await app(scope, receive, send)

    return routed


def failed(path: str, rid: str, state: dict, respond: Responder):
    """The 500 of a request whose route raised before answering: our error, never a stack trace."""
    state["error_type"] = "internal_error"
    return respond(path, rid, ApiError(500, "internal_error", "internal error"))


def noting_send(send, state: dict, started: dict):
    """`send` adding the request's headers (response_headers) to its answer, and noting its status in `started`
    (and whether it streams)."""
    async def send_with_id(message):
        if message["type"] == "http.response.start":
            message = message | {"headers": response_headers(message, state)}
            started["status"] = message["status"]
            started["stream"] = any(k == b"content-type" and v.startswith(b"text/event-stream")
                                    for k, v in message["headers"])
        await send(message)

    return send_with_id


def noted(state: dict, method: str, route: str, endpoint: str | None, started: dict, t0: float, access_log: bool):
    """An answered request's access line (when `access_log`) and, for a counted `endpoint`, its metrics."""
    if access_log:
        access(state, method, route, started["status"], (time.perf_counter() - t0) * 1000)
    if endpoint:
        count(endpoint, started["status"], None if started["stream"] else time.perf_counter() - t0,
              state.get("tenant", ANONYMOUS).name)


def route_of(scope, fixed: frozenset[str]) -> str:
    """The route a request took, as its template (`/libretranslate/download_file/{filename}`), never the path a
    client sent (a download's token, a file's name, whatever it probed): its path if it is one of the `fixed`
    paths (the counted endpoints, the direct routes: taken or refused before routing), else the template of the
    route the app's router matched, else UNMATCHED."""
    if scope["path"] in fixed:
        return scope["path"]
    route = scope.get("route")   # set by the app's router on the scope it was given
    return getattr(route, "path", UNMATCHED)


def direct_route(endpoint: Endpoint, respond: Responder, max_payload_bytes: int, gzip: bool):
    """A route called as the app would call it (made once a path), without the app's routing, exception middleware
    and FastAPI's request handler, which cost more than the route itself on a one-sentence /translate
    (json_body.py). Its errors are answered as the app's handlers answer them (errors.install_handlers), its
    answer compressed as the app's GZipMiddleware would (1,000 bytes or more, to a client that accepts gzip)."""

    async def run(scope, receive, send):
        try:
            response: ASGIApp = await endpoint(Request(scope, receive))
        except ApiError as e:
            error = e
        except StarletteHTTPException as e:   # limited_receive's 408, 413 and 499
            error = http_api_error(e, max_payload_bytes)
        else:
            if gzip and any(k == b"accept-encoding" and b"gzip" in v for k, v in scope["headers"]):
                response = GZipMiddleware(response, minimum_size=GZIP_MIN_BYTES)
            return await response(scope, receive, send)
        scope["state"]["error_type"] = error.type
        await respond(scope["path"], scope["state"]["request_id"], error)(scope, receive, send)

    return run


def response_headers(message: dict, state: dict) -> list[tuple[bytes, bytes]]:
    """An answer's headers with the request's id, its trace's id (when traced) and, but on a 429, which carries
    the fields of the limit it is over, the RateLimit fields of its key."""
    headers = list(message.get("headers", []))
    headers.append((b"x-request-id", state["request_id"].encode("latin-1")))
    if state.get("trace_id") is not None:
        headers.append((b"x-trace-id", state["trace_id"].encode("latin-1")))
    if state.get("model_version"):      # the version that translated it (Gateway.translate; model control)
        headers.append((b"x-model-version", state["model_version"].encode("latin-1")))
    if message["status"] != 429:
        headers += [(k.lower().encode(), v.encode()) for k, v in state.get("ratelimit", {}).items()]
    return headers


def named_method(scope) -> str:
    """The request's method as logs and spans name it: one of KNOWN_METHODS, else "_OTHER"."""
    return scope["method"] if scope["method"] in KNOWN_METHODS else "_OTHER"


def request_span(scope, rid: str, endpoints: dict[str, str]) -> Span:
    """The request's span (NOOP when traces are off): a child of the client's `traceparent` when it sent
    a valid one, else a trace's root. Named by method and route for the routes counted (`endpoints`), by method
    alone for the others (their paths are whatever a client sent, and a span's name is to take few values).
    The client's `tracestate` is not taken: a span carries its trace state into every export, and those
    vendor fields are the client's to fill."""
    if not enabled():
        return NOOP
    carrier = {"traceparent": v.decode("latin-1") for k, v in scope["headers"] if k == b"traceparent"}
    method, path = named_method(scope), scope["path"]
    return start_span(f"{method} {path}" if path in endpoints else method, parent=carrier, server=True,
                      request_id=rid, **{"http.request.method": method})


def end_request_span(span: Span, state: dict, status: int | None, route: str) -> None:
    """Its status, route (the template: route_of; never the path sent), key name and error type: a 5xx marks it
    failed (a 4xx is the client's, as OpenTelemetry's HTTP conventions have it for a server)."""
    if span is NOOP:
        return
    tenant = state.get("tenant")
    span.set(key=tenant.name if tenant is not None else None,
             **{"http.response.status_code": status, "http.route": route})
    if state.get("error_type") is not None:
        span.set(**{"error.type": state["error_type"]})
    if status is None or status >= 500:
        span.fail(state.get("error_type") or "internal_error")
    span.end()


def request_id(scope) -> str:
    """The client's X-Request-ID when it is 1 to 128 printable ASCII characters (no spaces), else a new
    one: the id is echoed in the answer and its error body and written to the log."""
    given = next((v for k, v in scope["headers"] if k == b"x-request-id"), b"")
    # A new one: 128 random bits in 32 hex digits, as uuid4().hex writes them, without making the UUID object
    return given.decode("ascii") if REQUEST_ID.fullmatch(given) else os.urandom(16).hex()


async def key_refusal(keys: KeyRing, quota: Quota, scope, key_in_body: frozenset = frozenset()) -> ApiError | None:
    """The 401/403/429 of a request to a path that needs a key, from its headers alone, before anything reads
    its body (auth.admit); None when its key is good, or when it is a POST to a `key_in_body` path
    (LibreTranslate's) with no key in its headers: the route reads the key from the body first
    (libretranslate.authorized_fields)."""
    headers = {k: v.decode("latin-1") for k, v in scope["headers"] if k in (b"authorization", b"x-api-key")}
    if scope["path"] in key_in_body and scope["method"] == "POST" and \
            not given_key(headers.get(b"authorization", ""), headers.get(b"x-api-key")):
        return None
    try:
        await admit(keys, quota, scope["state"], scope["path"], headers.get(b"authorization", ""),
                    headers.get(b"x-api-key"))
    except ApiError as e:
        return e
    return None


def count(endpoint: str, status: int, seconds: float | None, key: str = ANONYMOUS.name) -> None:
    labelled(metrics().requests, endpoint, str(status)).inc()
    labelled(metrics().key_requests, key, endpoint, str(status)).inc()
    if seconds is not None:  # a stream's duration is observed when it ends (gateway.GenerationStream), not here
        labelled(metrics().request_duration, endpoint).observe(seconds)
    if status >= 400:
        labelled(metrics().errors, endpoint, ERROR_KIND.get(status, "internal")).inc()


def limited_receive(scope, receive, limit: int, timeout_s: float = 30.0):
    """`receive` counting the body as the app reads it: past `limit` it reads and drops the rest (see
    DRAIN_BYTES) and raises a 413 (an HTTPException, which FastAPI's body parsing passes on to the error
    handlers), and the connection closes. The whole body must arrive within `timeout_s` (uvicorn times out
    no body read): then a 408, and the connection closes. A client that goes away before its body is whole
    gets a 499 here, where every route reads its body (FastAPI's parsing, the LibreTranslate and OpenAI
    routes' own): counted as `client_closed`, not as the 400 of a body cut short or the 500 of Starlette's
    ClientDisconnect. None when the declared Content-Length is over the limit: that body is refused without
    being parsed (drain_declared, then the 413)."""
    declared = next((v for k, v in scope["headers"] if k == b"content-length"), b"")
    if declared.isdigit() and int(declared) > limit:
        return None
    deadline = asyncio.get_running_loop().time() + timeout_s
    seen, done = 0, False
    # A request without a body (a GET) is whole from the start: its disconnect, whenever it comes, is passed on
    # (a streaming response listens for it), not answered.
    has_body = (declared.isdigit() and int(declared) > 0) or any(k == b"transfer-encoding" for k, _ in scope["headers"])

    async def limited():
        nonlocal seen, done
        if done:   # the body is in: later receives wait for the disconnect, as long as the answer takes
            return await receive()
        # A body the server has whole already (uvicorn_bridge: most requests' come with their headers) is not
        # waited for: an asyncio.timeout over its receive cost every request a timer and its bookkeeping.
        message = await (receive() if scope.get(BODY_WHOLE) else body_part(receive, deadline, timeout_s))
        seen += len(message.get("body", b""))
        done = not message.get("more_body", False)   # the last part, or a disconnect
        if message["type"] == "http.disconnect" and has_body:
            raise StarletteHTTPException(499, "the client closed the connection before its body was whole")
        if seen > limit:
            if not done:
                await drain(receive, deadline, DRAIN_BYTES)
            done = True          # what is left past DRAIN_BYTES is not read: the connection closes
            raise StarletteHTTPException(413, headers={"Connection": "close"})
        return message

    async def rest() -> None:
        """What the app left of the body read and dropped (DRAIN_BYTES at most, by the deadline)."""
        if has_body and not done:
            await drain(receive, deadline, DRAIN_BYTES)

    limited.rest = rest
    return limited


def body_read_before_the_end(send, limited):
    """`send`, but an answer's last part waits for what the app left of the request's body (limited_receive's
    `rest`: a route that refuses before reading it, a key refused); `send` itself when the body was refused unread
    (`limited` None). uvicorn closes a connection the client asked to close as that last part is sent, and one
    closed with a request's bytes unread is reset by the kernel: the client lost the answer it had been sent
    (benchmarks/http_fuzz.py found it)."""
    async def sending(message: dict) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            await limited.rest()
        await send(message)
    return send if limited is None else sending


async def body_part(receive, deadline: float, timeout_s: float) -> dict:
    """The next part of a request's body, or a 408 once `deadline` (the loop's clock) has passed."""
    try:
        async with asyncio.timeout_at(deadline):
            return await receive()
    except TimeoutError:
        raise StarletteHTTPException(408, f"the body did not arrive within {timeout_s:g} s of the headers "
                                     "(--body-timeout-s)", headers={"Connection": "close"}) from None


async def drain(receive, deadline: float, budget: int) -> None:
    """Reads and drops a body's rest: until its end, `budget` bytes or `deadline`, whichever comes first."""
    try:
        async with asyncio.timeout_at(deadline):
            while budget > 0:
                message = await receive()
                budget -= len(message.get("body", b""))
                if not message.get("more_body", False):
                    return
    except TimeoutError:
        return


async def drain_declared(scope, receive, timeout_s: float) -> None:
    """Before the 413 of a body declared over the limit: the body read and dropped if it is at most
    DRAIN_BYTES and its client is sending it (no `Expect: 100-continue`), within `timeout_s`."""
    headers = dict(scope["headers"])
    if int(headers.get(b"content-length", b"0")) <= DRAIN_BYTES and headers.get(b"expect", b"").lower() != \
            b"100-continue":
        await drain(receive, asyncio.get_running_loop().time() + timeout_s, DRAIN_BYTES)
