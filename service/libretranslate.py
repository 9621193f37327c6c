"""LibreTranslate's API on top of ours: POST /libretranslate/translate (JSON or form), /libretranslate/detect
and its languages, for LibreTranslate's clients (libretranslatepy, its web UI, integrations) unchanged. Errors
in its shape, `{"error": "..."}`; the requests feed the same queue and batches as POST /translate, and
source=auto is detected as there (Gateway.translate_detected)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from .errors import ApiError, first_error, parse_error
from .shared.schemas import AUTO, TranslateRequest

if TYPE_CHECKING:
    from .app import Gateway

ENDPOINT = "libretranslate"   # the metrics' endpoint label; the work goes to the translate workers


async def read_fields(request: Request) -> tuple[dict, bool]:
    """The request's fields and whether they came as a form (every value then text)."""
    ctype = request.headers.get("content-type", "")
    if ctype.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
        fields = await request.form()
        data: dict = {k: fields.get(k) for k in fields.keys()}
        if len(fields.getlist("q")) > 1:
            data["q"] = fields.getlist("q")
        return data, True
    try:
        data = await request.json()
    except (ValueError, RecursionError) as e:
        raise ApiError(400, "invalid_json", parse_error(e)) from None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_request", "the body must be a JSON object")
    return data, False


def alternatives_of(data: dict, form: bool) -> int:
    alternatives = data.get("alternatives", 0)
    if form and isinstance(alternatives, str) and alternatives.isdigit():
        alternatives = int(alternatives)      # a form's fields are all text
    if isinstance(alternatives, float) and alternatives.is_integer():
        alternatives = int(alternatives)      # 2.0: JSON Schema's integers include it
    if isinstance(alternatives, bool) or not isinstance(alternatives, int) or not 0 <= alternatives <= 3:
        raise ApiError(400, "invalid_request", "alternatives must be an integer from 0 to 3")
    return alternatives


def to_request(data: dict, form: bool) -> TranslateRequest:
    """LibreTranslate's fields as our TranslateRequest, or a 400 naming the first problem."""
    q, source, target = data.get("q"), data.get("source"), data.get("target")
    for name, value in (("q", q), ("source", source), ("target", target)):
        if value is None or value == "" or value == []:
            raise ApiError(400, "invalid_request", f"Invalid request: missing {name} parameter")
    fmt = data.get("format", "text")
    if fmt not in ("text", "html"):
        raise ApiError(400, "invalid_request", f"format must be text or html, got {fmt!r}")
    alternatives = alternatives_of(data, form)
    try:
        return TranslateRequest(text=q, source_lang=source, target_lang=target, beam_size=max(4, alternatives + 1),
                                num_alternatives=alternatives)
    except ValidationError as e:
        raise ApiError(400, "invalid_request", first_error(e)) from None


def to_response(out: dict, listed: bool, alternatives: int, detected: bool) -> dict:
    """LibreTranslate's answer: one text or a list, with alternatives and, for source=auto, detectedLanguage
    (an object, or a list of them for a list of texts, as LibreTranslate answers)."""
    items = out["translations"]
    if listed:
        body: dict = {"translatedText": [i["text"] for i in items]}
        if alternatives:
            body["alternatives"] = [[a["text"] for a in i["alternatives"]] for i in items]
        if detected:
            body["detectedLanguage"] = [i["detected_lang"] for i in items]
        return body
    body = {"translatedText": items[0]["text"]}
    if alternatives:
        body["alternatives"] = [a["text"] for a in items[0]["alternatives"]]
    if detected:
        body["detectedLanguage"] = items[0]["detected_lang"]
    return body


def check_api_key(gateway: Gateway, request: Request, data: dict) -> None:
    if data.get("api_key") is not None and not isinstance(data["api_key"], str):
        raise ApiError(400, "invalid_request", "api_key must be a string")
    gateway.check_key(request, data.get("api_key"))


async def translate(gateway: Gateway, request: Request) -> Response:
    """LibreTranslate's POST /translate."""
    try:
        data, form = await read_fields(request)
        check_api_key(gateway, request, data)
        req = to_request(data, form)
        out = await gateway.translate_texts(ENDPOINT, req, request)
    except ApiError as e:
        return JSONResponse({"error": e.message}, status_code=e.status, headers=e.headers)
    if out is None:
        return Response(status_code=499)
    return JSONResponse(to_response(out, isinstance(data["q"], list), req.num_alternatives, req.source_lang == AUTO))


async def detect(gateway: Gateway, request: Request) -> Response:
    """LibreTranslate's POST /detect: `[{"language": "de", "confidence": 97.0}, ...]`, best first, over the
    languages the server translates from. A list q is detected as one text (its texts joined), as
    LibreTranslate detects it."""
    try:
        data, _ = await read_fields(request)
        check_api_key(gateway, request, data)
        q = data.get("q")
        if q is None or q == "" or q == []:
            raise ApiError(400, "invalid_request", "Invalid request: missing q parameter")
        texts = q if isinstance(q, list) else [q]
        if not all(isinstance(t, str) for t in texts):
            raise ApiError(400, "invalid_request", "q must be a string or a list of strings")
        if "" in texts:   # in a form, [""] and "" are the same field: both are no text
            raise ApiError(400, "invalid_request", f"Invalid request: q[{texts.index('')}] is empty")
        gateway.check_limits(texts)
        ranked = (await gateway.detect(["\n".join(texts)]))[0]
    except ApiError as e:
        return JSONResponse({"error": e.message}, status_code=e.status, headers=e.headers)
    return JSONResponse([{"language": lang, "confidence": conf} for lang, conf in ranked])
