"""Our own API, the one the SDK (service/client.py) and the translate page speak:

    POST /translate     one text or a list of them (TranslateRequest -> TranslateResponse)
    POST /generate      a prompt continued (GenerateRequest -> GenerateResponse); "stream": true for server-sent
                        events: {"type": "token", "index", "text"} ..., then {"type": "done", "model", "choices",
                        "usage", "timings"}, or {"type": "error", "error": {"type", "message"}} after the 200
    GET  /languages     [{"code", "name", "targets"}]
    /glossaries         stored glossaries, used by /translate's glossary_id (glossaries.py, installed here)

Errors in our shape (errors.ApiError.body), documented in the README.
"""

from __future__ import annotations

from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import Response

from . import glossaries, sse
from ..errors import ApiError
from .flavour import Flavour, describe_pairs
from ..http.gateway import Finished, Gateway, GenerationStream
from ..http.json_body import add_schema, model_response, read_model, request_body
from ..worker.generate_api import ENDPOINT as GENERATE
from ..shared.schemas import (ErrorResponse, GenerateRequest, GenerateResponse, Language, TranslateRequest,
                             TranslateResponse)
from ..worker.translate_api import ENDPOINT as TRANSLATE

ERRORS = {c: {"model": ErrorResponse} for c in (400, 401, 403, 413, 422, 503, 504)}


def install(app: FastAPI, gateway: Gateway) -> None:
    async def translate(request: Request) -> Response:   # the body read by the route: http/json_body.py says why
        out = await gateway.translate(await read_model(request, TranslateRequest), request)
        if out is None:
            return Response(status_code=499)   # nginx's "client closed request"
        return model_response(TranslateResponse, out, exclude_none=True)   # detected_lang only with "auto"

    async def generate(body: GenerateRequest, request: Request):
        stream = await gateway.generate(body, request)
        if body.stream:
            return sse.response(events(stream))
        done = await stream.result(request)
        if done is None:
            return Response(status_code=499)
        return {"model": done.model, "usage": done.usage, "timings": done.timings, "choices": done.choices}

    app.add_api_route("/translate", translate, methods=["POST"], response_model=TranslateResponse,
                      responses=ERRORS | {404: {"model": ErrorResponse}},   # an unknown glossary_id
                      openapi_extra=request_body(TranslateRequest),
                      summary="Translate one text or a list of texts", tags=["translation"])
    app.add_api_route("/generate", generate, methods=["POST"], response_model=GenerateResponse,
                      responses=ERRORS | {200: {"content": {"text/event-stream": {}},
                                                "description": "JSON, or server-sent events with stream=true"}},
                      summary="Continue a prompt with a generation model", tags=["generation"])
    app.add_api_route("/languages", gateway.languages, methods=["GET"], response_model=list[Language],
                      tags=["translation"])
    glossaries.install(app, gateway)


async def events(stream: GenerationStream) -> AsyncIterator[str]:
    """A generation's events as our server-sent events; the stream closed however this ends (a client that
    went away cancels its rows)."""
    try:
        async for event in stream:
            if isinstance(event, Finished):
                yield sse.event({"type": "done", "model": event.model, "choices": event.choices,
                                 "usage": event.usage, "timings": event.timings})
            else:
                for p in event.pieces:
                    yield sse.event({"type": "token", "index": p["index"], "text": p["text"]})
    except ApiError as e:    # after the 200: an event of its own
        yield sse.event({"type": "error", "error": {"type": e.type, "message": e.message}})
    finally:
        await stream.aclose()


def describe(schema: dict, gateway: Gateway) -> None:
    """/openapi.json names what this server serves: its languages and generation models as enums, its text
    limits as maxItems/maxLength. The request models accept any well-formed code, so that a wrong one gets a
    400 listing the right ones; the schema says which ones will be served."""
    models, s = schema["components"]["schemas"], gateway.settings
    text = {"maxLength": s.max_text_chars, "pattern": r"\S"}        # not blank: TranslateRequest refuses that
    describe_pairs(add_schema(schema, TranslateRequest), ("source_lang", "target_lang"), gateway, text,
                   {"minItems": 1, "maxItems": s.max_texts, "items": {"type": "string"} | text})
    glossaries.describe(schema, gateway)
    gen = models["GenerateRequest"]["properties"]
    gen["prompt"]["maxLength"] = s.max_text_chars
    if gateway.generators:
        gen["model"]["anyOf"][0]["enum"] = gateway.generators


FLAVOUR = Flavour(install, endpoints={"/translate": TRANSLATE, "/generate": GENERATE},
                  open_paths=frozenset({"/languages"}), direct_paths=frozenset({"/translate"}), describe=describe)
