"""Every error the HTTP layer answers: ApiError, raised wherever a request is refused, and the handlers that
answer it (LitServe's and Starlette's own errors included). Our shape, the documented one:

    {"error": {"type": "...", "message": "...", "limit": 1000}, "request_id": "..."}

An API flavour with its own (LibreTranslate's `{"error": "..."}`, OpenAI's) gives it in its Flavour
(service/api/flavour.py), and `responder` answers each path in its flavour's shape.
"""

from __future__ import annotations

from typing import Any, Callable

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

# The `kind` label of transerve_errors_total for each status; anything else counts as "internal". A request
# the routes cannot take (404, 405) is wrong as a malformed one is: "validation", not a bug of ours. 499 is
# nginx's "client closed request": the client went away before its answer, no failure of ours either. 429 is a
# key at its own limit (or its limits not checkable): "limit", which more replicas would not help; "overload" is
# the queue full (503).
ERROR_KIND = {400: "validation", 401: "auth", 403: "auth", 404: "validation", 405: "validation", 408: "limit",
              413: "limit", 422: "validation", 429: "limit", 456: "limit", 499: "client_closed", 503: "overload",
              504: "timeout"}


class ApiError(Exception):
    def __init__(self, status: int, type_: str, message: str, limit: int | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.type, self.message, self.limit, self.headers = status, type_, message, limit, headers or {}

    def body(self, request_id: str | None) -> dict:
        err: dict[str, Any] = {"type": self.type, "message": self.message}
        if self.limit is not None:
            err["limit"] = self.limit
        return {"error": err, "request_id": request_id}


def worker_failed(why: str, retry_after_s: int = 1) -> ApiError:
    """A worker died or failed a whole batch under a request (LitServe restarts it): worth a retry."""
    return ApiError(503, "worker_failed", why, headers={"Retry-After": str(retry_after_s)})


def queue_timeout(request_timeout_s: float) -> ApiError:
    return ApiError(504, "timeout", f"the request waited more than {request_timeout_s:g} s for a worker",
                    headers={"Retry-After": "5"})


def raise_worker_error(event: dict) -> dict:
    """A worker's answer or event, or the error it carries (one request's own failure) raised."""
    if "error" in event:
        e = event["error"]
        raise ApiError(event["status"], e["type"], e["message"], e.get("limit"))
    return event


# What a body must be on our routes and OpenAI's (one rule per API flavour; LibreTranslate's also takes forms,
# service/api/libretranslate.py). FastAPI holds /generate to it, http/json_body.read_model /translate (as FastAPI
# would), openai_api.read_request the rest.
NOT_JSON = "the body must be a JSON object sent with Content-Type: application/json"


def declares_json(content_type: str) -> bool:
    """Whether a Content-Type names JSON, as FastAPI reads it: application/json or application/*+json,
    whatever its parameters (charset)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def parse_error(e: BaseException | None) -> str:
    """Why a body is not JSON, for the client."""
    if isinstance(e, UnicodeDecodeError):
        return f"the body is not valid UTF-8 (byte {e.start}); send JSON text encoded as UTF-8"
    if isinstance(e, RecursionError):
        return "the body's JSON is nested too deeply to parse; nest it a few hundred levels at most"
    return "the body is not valid JSON"


def first_error(e: ValidationError | RequestValidationError) -> str:
    parts = []
    for err in e.errors()[:3]:
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
        msg = err.get("msg", "invalid").removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


def invalid_body(e: ValidationError | RequestValidationError, in_body: bool = True) -> ApiError:
    """The 400 or 422 of a body that did not validate: FastAPI's RequestValidationError (its locations start
    with "body"), or pydantic's own from a route that reads its body itself (json_body.read_model,
    `in_body=False`: its locations start at the body)."""
    errs = e.errors() if in_body else [err | {"loc": ("body", *err.get("loc", ()))} for err in e.errors()]
    if any(err.get("type") == "json_invalid" for err in errs):
        return ApiError(400, "invalid_json", "the body is not valid JSON")
    if bad := next((err for err in errs if err.get("type") == "string_unicode"), None):
        # pydantic's error for a lone surrogate in a key (the values' are the schemas' own 422s)
        return ApiError(422, "invalid_request", f"a field name has a lone UTF-16 surrogate "
                        f"({repr(bad.get('input'))[:40]}), which is not Unicode text; send its pair or drop it")
    if any(tuple(err.get("loc", ())) == ("body",) and err.get("type") != "value_error" for err in errs):
        # (a value_error at the body itself is a model validator's: a 422 like any field's)
        return ApiError(400, "invalid_json", NOT_JSON)
    return ApiError(422, "invalid_request", first_error(e))


# A document's body: the file and its multipart framing and fields (source, target, api_key), so that a file of
# --max-file-bytes passes the middleware's limit and the route's 413 names the file's own size.
FORM_SLACK = 65536


def too_large(limit: int, document: bool = False) -> ApiError:
    """A body over its limit: --max-payload-bytes, or a document's (--max-file-bytes, FORM_SLACK more for its
    form's fields), which the message names as the flag gives it."""
    if document:
        limit -= FORM_SLACK
        return ApiError(413, "payload_too_large", f"the file is larger than {limit} bytes (--max-file-bytes)",
                        limit, {"Connection": "close"})
    return ApiError(413, "payload_too_large", f"the body is larger than {limit} bytes (--max-payload-bytes)",
                    limit, {"Connection": "close"})


Responder = Callable[[str, "str | None", ApiError], JSONResponse]


def responder(shapes: dict[str, Callable[[ApiError, str | None], dict]]) -> Responder:
    """(path, request id, error) -> the answer, in the shape of the flavour whose prefix the path has (the
    longest that matches; `shapes` maps prefix to its body), else ours (ApiError.body)."""
    prefixes = sorted(shapes, key=len, reverse=True)

    def respond(path: str, request_id: str | None, e: ApiError) -> JSONResponse:
        prefix = next((p for p in prefixes if path.startswith(p)), None)
        body = e.body(request_id) if prefix is None else shapes[prefix](e, request_id)
        return JSONResponse(body, status_code=e.status, headers=e.headers)

    return respond


def http_api_error(e: StarletteHTTPException, max_payload_bytes: int) -> ApiError:
    """Starlette's own errors (404, 405 with its Allow header, a body FastAPI could not parse, a body over the
    limit or cut short: middleware.limited_receive's) as ours."""
    kinds = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large",
             408: "timeout", 499: "client_closed", 504: "timeout"}
    kind, limit = kinds.get(e.status_code, "error"), None
    message = str(e.detail) if e.status_code < 500 else "internal error"
    if e.status_code == 400 and e.__cause__ is not None:  # FastAPI's "There was an error parsing the body"
        kind, message = "invalid_json", parse_error(e.__cause__)
    elif e.status_code == 413:
        limited = too_large(max_payload_bytes)
        message, limit = limited.message, limited.limit
    headers = dict(e.headers or {})
    if "GET" in headers.get("Allow", "").split(", "):
        headers["Allow"] += ", HEAD"   # answered by every GET route (middleware.request_context)
    return ApiError(e.status_code, kind, message, limit, headers)


def install_handlers(app, max_payload_bytes: int, respond: Responder) -> None:
    """Our errors, FastAPI's validation errors and Starlette's own (404, 405 with its Allow header, a body
    FastAPI could not parse, a body over the limit) all answered by `respond` (see responder)."""

    async def api_error(request: Request, e: ApiError) -> JSONResponse:
        request.scope.setdefault("state", {})["error_type"] = e.type   # the access line's (service/logs.py)
        return respond(request.url.path, getattr(request.state, "request_id", None), e)

    async def validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        return await api_error(request, invalid_body(e))

    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        if e.status_code == 405:
            e = StarletteHTTPException(405, e.detail, dict(e.headers or {}) | {"Allow": path_methods(request)})
        return await api_error(request, http_api_error(e, max_payload_bytes))

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)


def path_methods(request: Request) -> str:
    """Allow's methods for a 405: those of every route of the request's path. Starlette names only the first
    route's, and a path may have several (GET and DELETE /glossaries/{glossary_id}); HEAD is added after
    (http_api_error)."""
    methods = {m for route in request.app.router.routes if getattr(route, "methods", None)
               and route.matches(request.scope)[0] is not Match.NONE for m in route.methods}
    return ", ".join(sorted(methods - {"HEAD"}))
