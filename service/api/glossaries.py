"""Stored glossaries, our flavour's routes (native.py installs them), as DeepL's glossary API has them:

    POST   /glossaries                     {"name", "source_lang", "target_lang", "entries": [{"source", "target"}]
                                           or DeepL's TSV or CSV text, "entries_format": "tsv" | "csv"} -> 201 with
                                           the glossary (GlossaryInfo) and its Location
    GET    /glossaries                     the calling key's: {"glossaries": [GlossaryInfo]}
    GET    /glossaries/{glossary_id}       GlossaryInfo
    GET    /glossaries/{glossary_id}/entries   its entries as TSV (text/tab-separated-values), as DeepL sends them
    DELETE /glossaries/{glossary_id}       204

A glossary belongs to the key that created it: another key's id is a 404, as an unknown one (glossary_store.py).
POST /translate uses one by its `glossary_id` (Gateway.translate). Errors in our shape (errors.ApiError.body).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response

from ..errors import ApiError
from ..http.gateway import Gateway
from ..shared.glossary import Entry, GlossaryError, check_entries, parse
from ..shared.schemas import ErrorResponse, GlossaryCreateRequest, GlossaryInfo, GlossaryList

CODES = (400, 401, 403, 404, 409, 413, 422, 429, 503)
ERRORS = {c: {"model": ErrorResponse} for c in CODES}
# A route answering TSV: FastAPI would document a model's errors under its media type, which they are not sent in
JSON_ERRORS = {c: {"description": "Error", "content": {"application/json": {"schema": {
    "$ref": "#/components/schemas/ErrorResponse"}}}} for c in CODES}
TAGS = ["glossaries"]
# What a created glossary leads to, for generated clients and schemathesis' stateful tests (OpenAPI links)
BY_ID = {"glossary_id": "$response.body#/glossary_id"}
LINKS = {name: {"operationId": op, "parameters": BY_ID} for name, op in (
    ("GetGlossary", "get_glossary"), ("GetGlossaryEntries", "get_glossary_entries"),
    ("DeleteGlossary", "delete_glossary"))}


class TsvResponse(Response):
    media_type = "text/tab-separated-values"


def install(app: FastAPI, gateway: Gateway) -> None:
    store = gateway.glossaries

    def owner(request: Request) -> str:
        return gateway.tenant(request).name

    async def create(body: GlossaryCreateRequest, request: Request, response: Response) -> dict:
        gateway.check_pair(body.source_lang, body.target_lang)
        if body.source_lang == body.target_lang:
            raise ApiError(400, "unsupported_language_pair", "a glossary translates between two languages; "
                           f"{gateway.pairs_text()}")
        info = await store.create(owner(request), body.name, body.source_lang, body.target_lang, entries_of(body))
        response.headers["Location"] = f"/glossaries/{info['glossary_id']}"
        return info

    async def listed(request: Request) -> dict:
        return {"glossaries": await store.listed(owner(request))}

    async def info(glossary_id: str, request: Request) -> dict:
        return await store.info(owner(request), glossary_id)

    async def entries(glossary_id: str, request: Request) -> TsvResponse:
        return TsvResponse(await store.entries(owner(request), glossary_id))

    async def delete(glossary_id: str, request: Request) -> Response:
        await store.delete(owner(request), glossary_id)
        return Response(status_code=204)

    app.add_api_route("/glossaries", create, methods=["POST"], status_code=201, response_model=GlossaryInfo,
                      responses=ERRORS | {201: {"description": "Stored", "links": LINKS}}, tags=TAGS,
                      operation_id="create_glossary", summary="Store a glossary for the calling key")
    app.add_api_route("/glossaries", listed, methods=["GET"], response_model=GlossaryList, responses=ERRORS,
                      tags=TAGS, operation_id="list_glossaries", summary="The calling key's glossaries")
    app.add_api_route("/glossaries/{glossary_id}", info, methods=["GET"], response_model=GlossaryInfo,
                      responses=ERRORS, tags=TAGS, operation_id="get_glossary",
                      summary="A glossary of the calling key, without its entries")
    app.add_api_route("/glossaries/{glossary_id}/entries", entries, methods=["GET"], response_class=TsvResponse,
                      responses=JSON_ERRORS | {200: {"description": "source TAB target, a line each"}}, tags=TAGS,
                      operation_id="get_glossary_entries", summary="A glossary's entries as TSV")
    app.add_api_route("/glossaries/{glossary_id}", delete, methods=["DELETE"], status_code=204,
                      response_class=Response, responses=ERRORS, tags=TAGS, operation_id="delete_glossary",
                      summary="Delete a glossary")


def entries_of(body: GlossaryCreateRequest) -> list[Entry]:
    """The request's entries, checked as /translate's glossary is (glossary.check_entries); the 400 of a bad one
    names its entry or line."""
    try:
        if isinstance(body.entries, str):
            entries = parse(body.entries, body.entries_format or "tsv")
        else:
            entries = check_entries([Entry(e.source, e.target) for e in body.entries])
    except GlossaryError as e:
        raise ApiError(400, "invalid_glossary", str(e)) from None
    if not entries:
        raise ApiError(400, "invalid_glossary", "the glossary has no entries; give at least one")
    return entries


def describe(schema: dict, gateway: Gateway) -> None:
    """POST /glossaries' languages in /openapi.json: the served pairs (a language into itself is no glossary's).
    The model accepts any well-formed code, so that a wrong one gets a 400 listing the right ones."""
    body = schema["components"]["schemas"]["GlossaryCreateRequest"]
    sources = sorted({a for a, _ in gateway.pairs})
    if not sources:
        return
    props = body["properties"]
    props["source_lang"]["enum"], props["target_lang"]["enum"] = sources, sorted({b for _, b in gateway.pairs})
    body["anyOf"] = [{"properties": {"source_lang": {"const": a}, "target_lang": {
        "enum": sorted(b for x, b in gateway.pairs if x == a)}}} for a in sources]
