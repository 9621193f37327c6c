"""A JSON body read into its request model by the route itself, refused exactly as FastAPI's own body parameter
refuses it (the same 400s and 422s, errors.invalid_body), for the routes that serve most requests.

Why not FastAPI's body parameter there: its request handler (reading the body, json.loads, validating it through
its field, solving the route's dependencies, then validating and serializing the answer through the response
model), with the app's routing and exception middleware around it, cost more than the route itself. Read here and
called by the middleware (middleware.direct_route), the same pydantic model validates once, and the app executes a
third fewer instructions a one-sentence /translate (benchmarks/http_cost.py --instructions; benchmarks/results/
serving-cpu.md, "Issue 50: /translate past FastAPI's handler").
"""

from __future__ import annotations

import json
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from ..errors import NOT_JSON, ApiError, declares_json, invalid_body, parse_error

Model = TypeVar("Model", bound=BaseModel)


async def read_model(request: Request, model: type[Model]) -> Model:
    """The body as `model`; an ApiError as FastAPI's handling of a `body: model` parameter would answer it: a
    Content-Type that does not say JSON, an empty body, or one that is not a JSON object: 400 invalid_json; a
    field that does not validate: 422 invalid_request naming it."""
    if not declares_json(request.headers.get("content-type", "")):
        raise ApiError(400, "invalid_json", NOT_JSON)
    raw = await whole_body(request)
    if not raw:
        raise ApiError(400, "invalid_json", NOT_JSON)
    try:
        return model.model_validate_json(raw)   # parsed and validated in one pass, in pydantic's Rust
    except ValidationError:
        pass
    # Refused, or JSON that only Python's parser reads (a byte order mark, UTF-16): parsed and validated again
    # as FastAPI does, which gives the answer and the error this route has always given
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as e:   # also an integer of over 4,300 digits (sys.get_int_max_str_digits)
        raise ApiError(400, "invalid_json", parse_error(e)) from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise invalid_body(e, in_body=False) from None


async def whole_body(request: Request) -> bytes:
    """The body, read from the request's receive() as Request.body() reads it, without its async generator over
    each part: the routes that read_model read nothing more of their request."""
    parts = []
    while True:
        message = await request.receive()
        if message["type"] != "http.request":
            raise ClientDisconnect()
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


def model_response(model: type[BaseModel], out: dict, exclude_none: bool = False) -> Response:
    """`out` validated as `model` and sent as its JSON (as FastAPI's response_model does)."""
    return Response(model.model_validate(out).model_dump_json(exclude_none=exclude_none),
                    media_type="application/json")


def request_body(model: type[BaseModel]) -> dict:
    """The OpenAPI requestBody of a route that reads `model` itself (FastAPI cannot see it in the signature): a
    reference to its schema, which the flavour's `describe` adds (add_schema)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": {
        "$ref": f"#/components/schemas/{model.__name__}"}}}}}


def add_schema(openapi: dict, model: type[BaseModel]) -> dict:
    """`model`'s schema added to the OpenAPI document's components, where request_body refers to it; returned."""
    schemas = openapi.setdefault("components", {}).setdefault("schemas", {})
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(schema.pop("$defs", {}))
    schemas[model.__name__] = schema
    return schema
