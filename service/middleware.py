"""What wraps every request: the request id in (`request.state.request_id`) and out (`X-Request-ID`), the
body limit, the request and error counters, the duration, and a JSON 500 instead of a stack trace.

Plain ASGI rather than Starlette's `BaseHTTPMiddleware` (`app.middleware("http")`), which runs the route
in a task of its own and streams the response body back through a memory channel: that cost more CPU per
request than routing, validation and JSON together (py-spy over the HTTP process, lone requests;
benchmarks/results/vs-ctranslate2-cpu.md)."""

from __future__ import annotations

import logging
import time
import uuid

from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .auth import check_headers
from .errors import ERROR_KIND, ApiError, error_response, too_large
from .metrics import metrics

log = logging.getLogger("transerve")


def request_context(app, endpoints: dict[str, str], max_payload_bytes: int, api_keys=(),
                    guarded: frozenset = frozenset()):
    """`app` wrapped; `endpoints` maps the paths whose requests are counted to their metrics label; the
    `guarded` paths (docs, info, metrics: auth.guarded_paths) need one of `api_keys` (the endpoints check
    their own, LibreTranslate's may come in the body)."""

    async def wrapped(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        rid = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), "")[:64] \
            or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        t0 = time.perf_counter()
        started: dict = {}

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", rid.encode("latin-1")))
                message = message | {"headers": headers}
                started["status"] = message["status"]
                started["stream"] = any(k == b"content-type" and v.startswith(b"text/event-stream")
                                        for k, v in headers)
            await send(message)

        limited = limited_receive(scope, receive, max_payload_bytes)
        try:
            if api_keys and scope["path"] in guarded and (refused := key_error(api_keys, scope)):
                await error_response(scope["path"], rid, refused)(scope, receive, send_with_id)
            elif limited is None:
                await error_response(scope["path"], rid, too_large(max_payload_bytes))(scope, receive, send_with_id)
            else:
                await app(scope, limited, send_with_id)
        except Exception:  # never a stack trace to the client
            log.exception("unhandled error on %s", scope["path"])
            if started:
                raise
            await JSONResponse(ApiError(500, "internal_error", "internal error").body(rid),
                               status_code=500)(scope, receive, send_with_id)
        if (endpoint := endpoints.get(scope["path"])) and started:
            count(endpoint, started["status"], None if started["stream"] else time.perf_counter() - t0)

    return wrapped


def key_error(api_keys, scope) -> ApiError | None:
    headers = {k: v.decode("latin-1") for k, v in scope["headers"] if k in (b"authorization", b"x-api-key")}
    try:
        check_headers(api_keys, headers.get(b"authorization", ""), headers.get(b"x-api-key"))
    except ApiError as e:
        return e
    return None


def count(endpoint: str, status: int, seconds: float | None) -> None:
    metrics().requests.labels(endpoint, str(status)).inc()
    if seconds is not None:  # a stream's duration is observed when it ends (Gateway.generate), not here
        metrics().request_duration.labels(endpoint).observe(seconds)
    if status >= 400:
        metrics().errors.labels(endpoint, ERROR_KIND.get(status, "internal")).inc()


def limited_receive(scope, receive, limit: int):
    """`receive` counting the body as the app reads it: past `limit` it raises a 413 (an HTTPException,
    which FastAPI's body parsing passes on to the error handlers), and the connection closes. None when
    the declared Content-Length is over the limit: that body is never read, and the 413 goes out at once;
    waiting for a body that never comes would hold the connection open, since nothing in uvicorn times
    out a body read (LitServe's max_payload_size only counted)."""
    declared = next((v for k, v in scope["headers"] if k == b"content-length"), b"")
    if declared.isdigit() and int(declared) > limit:
        return None
    seen = 0

    async def limited():
        nonlocal seen
        message = await receive()
        seen += len(message.get("body", b""))
        if seen > limit:
            raise StarletteHTTPException(413, headers={"Connection": "close"})
        return message

    return limited
