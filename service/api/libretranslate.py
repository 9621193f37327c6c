"""LibreTranslate's API, an API flavour of its own: POST /libretranslate/translate (JSON or form),
/libretranslate/detect and its languages, for LibreTranslate's clients (libretranslatepy, its web UI,
integrations) unchanged. Errors in its shape, `{"error": "..."}`, its field names in their messages; the key
may come in the body's `api_key` field. The requests feed the same queue and batches as POST /translate
(Gateway.translate), and source=auto is detected as there. format=html translates an HTML fragment's text
and keeps its markup (translate_html, service/shared/html_text.py). One field is not LibreTranslate's: `glossary`,
POST /translate's (its terms kept, the answer in LibreTranslate's shape). Its file API (/translate_file, the download
route, /frontend/settings) is libretranslate_files.py, installed here."""

from __future__ import annotations

import asyncio
import re
from typing import Any
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..shared import html_text
from ..shared.options import DEFAULTS
from ..errors import ApiError, declares_json, first_error, parse_error
from . import libretranslate_files as files
from .flavour import Flavour, describe_pairs, parse_markup
from ..http.gateway import Gateway
from ..shared.schemas import (AUTO, DetectedLanguage, Language, LibreTranslateDetectRequest, LibreTranslateError,
                             LibreTranslateRequest, LibreTranslateResponse, TranslateRequest)

ENDPOINT = "libretranslate"   # the metrics' endpoint label; the work goes to the translate workers
DETECT = "detect"             # /detect's endpoint label
MAX_FIELDS = 1000             # a form's fields at most (Starlette's default for the forms it parses)
# Our field names where our checks (TranslateRequest, Gateway) name a field in a message: LibreTranslate's
# clients sent q, source, target.
OUR_NAMES = re.compile(r"\b(text|source_lang|target_lang)(?=[\[.:]| (?:is|has|was|must) )")
LIBRE_NAMES = {"text": "q", "source_lang": "source", "target_lang": "target"}
# The body schema's nested models (GlossaryEntry) go to the components, as json_body.add_schema puts them: a
# "#/$defs/..." reference inside a path's schema would point at the root of /openapi.json, where nothing is.
REFS = "#/components/schemas/{model}"


async def read_fields(request: Request) -> tuple[dict, bool]:
    """The request's fields and whether they came as a form (every value then text). As LibreTranslate reads
    them: JSON when the Content-Type says so, a form when it says one, and no fields from anything else
    (there a 400 saying what to send, where LibreTranslate says q is missing)."""
    ctype = request.headers.get("content-type", "").lower()
    if ctype.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
        pairs = await read_form(request, ctype)
        data: dict = dict(pairs)              # a field given twice: its last value, as Starlette's forms
        if len(qs := [v for k, v in pairs if k == "q"]) > 1:
            data["q"] = qs
        return data, True
    if not declares_json(ctype):
        raise ApiError(400, "invalid_request", "send the fields as JSON (Content-Type: application/json) or as a "
                       "form (application/x-www-form-urlencoded or multipart/form-data)")
    try:
        data = await request.json()
    except (ValueError, RecursionError) as e:
        raise ApiError(400, "invalid_json", parse_error(e)) from None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_request", "the body must be a JSON object")
    return data, False


async def read_form(request: Request, ctype: str) -> list[tuple[str, str]]:
    """A form's (name, value) pairs, or a 400 for one that is not UTF-8, as a JSON body must be: in its bytes,
    or once its %-escapes are decoded (%ED%A0%80, an encoded lone surrogate, included). Starlette's parser
    would read such bytes as Latin-1 or U+FFFD and translate that."""
    try:
        text = (await request.body()).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, "invalid_request", f"the form is not valid UTF-8 (byte {e.start}); send it encoded "
                       "as UTF-8") from None
    if ctype.startswith("multipart/form-data"):   # its parts are cut from the UTF-8 checked above
        return await multipart_pairs(request)
    try:
        return parse_qsl(text, keep_blank_values=True, encoding="utf-8", errors="strict", max_num_fields=MAX_FIELDS)
    except UnicodeDecodeError:
        raise ApiError(400, "invalid_request", "a %-escaped form field is not valid UTF-8 (an encoded lone "
                       "surrogate, or bytes that are no UTF-8); send it encoded as UTF-8") from None
    except ValueError:   # parse_qsl's "Max number of fields exceeded"
        raise ApiError(400, "invalid_request", f"the form has more than {MAX_FIELDS} fields") from None


async def multipart_pairs(request: Request) -> list[tuple[str, str]]:
    """A multipart form's text fields (files are no field of LibreTranslate's), or a 400 for a malformed one."""
    try:
        fields = await request.form(max_fields=MAX_FIELDS)
    except StarletteHTTPException as e:   # Starlette's 400 for a malformed multipart body
        raise ApiError(400, "invalid_request", f"the form cannot be parsed: {e.detail}") from None
    return [(k, v) for k, v in fields.multi_items() if isinstance(v, str)]


async def lenient_key(request: Request) -> str | None:
    """The api_key field of a form that read_fields refused (bytes not UTF-8 in another field), read leniently,
    so that the key given there decides 401/403 before the 400 is told; None where none can be read (a body
    that is not JSON, a form that cannot be parsed)."""
    ctype = request.headers.get("content-type", "")
    try:
        if ctype.startswith("multipart/form-data"):
            pairs = await multipart_pairs(request)
        elif ctype.startswith("application/x-www-form-urlencoded"):
            pairs = parse_qsl((await request.body()).decode("utf-8", "replace"), keep_blank_values=True,
                              errors="replace", max_num_fields=MAX_FIELDS)
        else:
            return None
    except (ApiError, ValueError):
        return None
    return dict(pairs).get("api_key")


def alternatives_of(data: dict, form: bool) -> int:
    alternatives = data.get("alternatives", 0)
    # A form's fields are all text. isdecimal, not isdigit (true of "²"), and short: int() refuses "²" and 5000 digits
    if form and isinstance(alternatives, str) and alternatives.isdecimal() and len(alternatives) <= 3:
        alternatives = int(alternatives)
    if isinstance(alternatives, float) and alternatives.is_integer():
        alternatives = int(alternatives)      # 2.0: JSON Schema's integers include it
    if isinstance(alternatives, bool) or not isinstance(alternatives, int) or not 0 <= alternatives <= 3:
        raise ApiError(400, "invalid_request", "alternatives must be an integer from 0 to 3")
    return alternatives


def glossary_of(data: dict) -> Any:
    """The glossary field, an extension of LibreTranslate's API: a list of {source, target} objects (checked by
    TranslateRequest, as POST /translate's), or DeepL's TSV in a string, the one way a form can send it; None
    where it was not sent or is blank. Bad TSV: a 400 naming its line or entry."""
    glossary = data.get("glossary")
    return files.tsv_glossary(glossary) if isinstance(glossary, str) else glossary


def to_request(data: dict, form: bool) -> TranslateRequest:
    """LibreTranslate's fields as our TranslateRequest, or a 400 naming the first problem."""
    q, source, target = data.get("q"), data.get("source"), data.get("target")
    for name, value in (("q", q), ("source", source), ("target", target)):
        if value is None or value == "" or value == []:
            raise ApiError(400, "invalid_request", f"Invalid request: missing {name} parameter")
    fmt = data.get("format", "text")
    if fmt not in ("text", "html"):
        raise ApiError(400, "invalid_request", f"format must be text or html, got {fmt!r}")
    alternatives, glossary = alternatives_of(data, form), glossary_of(data)
    try:
        return TranslateRequest(text=q, source_lang=source, target_lang=target,
                                beam_size=max(DEFAULTS.beam_size, alternatives + 1), num_alternatives=alternatives,
                                glossary=glossary)
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


async def authorized_fields(gateway: Gateway, request: Request) -> tuple[dict, bool]:
    """read_fields once the request's key is checked (auth.py), before any other field is looked at. A request
    with a key in its headers had it checked by the middleware; one without, on a keyed server, has its body
    read only to find the api_key field: a body that cannot be read holds none (401, not the 400 it would get
    with a key), and an api_key that is not a string is none either."""
    try:
        data, form = await read_fields(request)
    except ApiError:
        await gateway.check_key(request, await lenient_key(request))
        raise
    key = data.get("api_key")
    await gateway.check_key(request, key if isinstance(key, str) else None)
    if key is not None and not isinstance(key, str):
        raise ApiError(400, "invalid_request", "api_key must be a string")
    return data, form


def error_body(e: ApiError, request_id: str | None) -> dict:
    """LibreTranslate's error shape, its field names in the message where ours would be."""
    return {"error": OUR_NAMES.sub(lambda m: LIBRE_NAMES[m.group(1)], e.message)}


async def translate(gateway: Gateway, request: Request) -> Response:
    """LibreTranslate's POST /translate."""
    data, form = await authorized_fields(gateway, request)
    req = to_request(data, form)
    listed = isinstance(data["q"], list)
    if data.get("format") == "html":
        body = await translate_html(gateway, request, req, listed)
    else:
        out = await gateway.translate(req, request, ENDPOINT)
        body = None if out is None else to_response(out, listed, req.num_alternatives, req.source_lang == AUTO)
    if body is None:
        return Response(status_code=499)
    return JSONResponse(body)


async def translate_html(gateway: Gateway, request: Request, req: TranslateRequest, listed: bool) -> dict | None:
    """format=html: each fragment's runs of text (service/shared/html_text.py: a paragraph's sentence whole, its inline
    tags put back into the translation) translated as the texts of ONE request, through the same queue,
    limits and batches as any other; its markup, entities and kept elements (script, style, code, pre,
    translate="no") as written. Alternatives are not made for HTML: [] as LibreTranslate answers. A 400/413
    for hostile markup (too deep, too many elements, unclosed markup too costly to parse)."""
    fragments = [req.text] if isinstance(req.text, str) else list(req.text)
    gateway.check_limits(fragments)          # the markup counts: a text's limit is on what was sent
    limit = gateway.settings.max_texts
    docs, runs = await asyncio.to_thread(parse_markup, fragments, limit, "the HTML")
    leaves = len(html_text.texts(docs, leaves=True)) <= limit
    source, detected = req.source_lang, None
    if source == AUTO:
        source, detected = await html_source(gateway, runs or fragments, req.target_lang)
    gateway.check_pair(source, req.target_lang)
    if not runs or source == req.target_lang:
        translated = fragments
    else:
        update = {"text": html_text.texts(docs, leaves), "source_lang": source, "num_alternatives": 0}
        out = await gateway.translate(req.model_copy(update=update), request, ENDPOINT)
        if out is None:
            return None
        translated = html_text.render(docs, [i["text"] for i in out["translations"]], leaves)
    body: dict = {"translatedText": translated if listed else translated[0]}
    if req.num_alternatives:
        body["alternatives"] = [[] for _ in translated] if listed else []
    if detected is not None:
        body["detectedLanguage"] = [detected for _ in translated] if listed else detected
    return body


async def html_source(gateway: Gateway, texts: list[str], target: str) -> tuple[str, dict]:
    """source=auto for HTML: the language of all its text at once (a run alone, one word in a <b>, is too
    short to tell), as a list q is detected on /detect; a 422 where no model takes it to target."""
    if not any(target in pair for pair in gateway.pairs):
        gateway.check_pair(AUTO, target)     # the 400 of an unserved target, whatever is detected
    lang, confidence = (await gateway.detect(["\n".join(texts)]))[0][0]
    if (lang, target) not in gateway.pairs and lang != target:
        raise ApiError(422, "unsupported_detected_language", f"the HTML's text was detected as {lang} (confidence "
                       f"{confidence}), and no model translates {lang}-{target}; {gateway.pairs_text()}; name "
                       "source to translate it from another language")
    return lang, {"language": lang, "confidence": confidence}


async def detect(gateway: Gateway, request: Request) -> Response:
    """LibreTranslate's POST /detect: `[{"language": "de", "confidence": 97.0}, ...]`, best first, over the
    languages the server translates from. A list q is detected as one text (its texts joined), as
    LibreTranslate detects it."""
    data, _ = await authorized_fields(gateway, request)
    texts = detect_texts(data.get("q"))
    gateway.check_limits(texts)
    ranked = (await gateway.detect(["\n".join(texts)]))[0]
    return JSONResponse([{"language": lang, "confidence": conf} for lang, conf in ranked])


def detect_texts(q) -> list[str]:
    """/detect's q as a list of texts, or a 400: missing, empty, not text, or with a lone UTF-16 surrogate
    (JSON "\\ud800" without its pair: not Unicode text, as /translate answers it)."""
    if q is None or q == "" or q == []:
        raise ApiError(400, "invalid_request", "Invalid request: missing q parameter")
    texts = q if isinstance(q, list) else [q]
    if not all(isinstance(t, str) for t in texts):
        raise ApiError(400, "invalid_request", "q must be a string or a list of strings")
    if "" in texts:   # in a form, [""] and "" are the same field: both are no text
        raise ApiError(400, "invalid_request", f"Invalid request: q[{texts.index('')}] is empty")
    for i, t in enumerate(texts):
        try:
            t.encode("utf-8")
        except UnicodeEncodeError as e:
            where = "q" if isinstance(q, str) else f"q[{i}]"
            raise ApiError(400, "invalid_request", f"{where} has a lone UTF-16 surrogate ({t[e.start]!r} at "
                           f"character {e.start}), which is not Unicode text; send its pair or drop it") from None
    return texts


# --- the flavour: its routes, and what the HTTP core is to know of it ---------------------------------------
ERRORS = {c: {"model": LibreTranslateError} for c in (400, 401, 403, 404, 413, 422, 429, 503, 504)}


def install(app: FastAPI, gateway: Gateway) -> None:
    async def translate_route(request: Request) -> Response:
        return await translate(gateway, request)

    async def detect_route(request: Request) -> Response:
        return await detect(gateway, request)

    body = {"schema": LibreTranslateRequest.model_json_schema(ref_template=REFS)}
    body["schema"].pop("$defs", None)           # describe() adds them to the components
    app.add_api_route("/libretranslate/translate", translate_route, methods=["POST"],
                      response_model=LibreTranslateResponse, response_model_exclude_none=True, responses=ERRORS,
                      openapi_extra={"requestBody": {"required": True, "content": {
                          "application/json": body, "application/x-www-form-urlencoded": body}}},
                      summary="LibreTranslate-compatible translate", tags=["libretranslate"])
    detect_body = {"schema": LibreTranslateDetectRequest.model_json_schema()}
    app.add_api_route("/libretranslate/detect", detect_route, methods=["POST"], response_model=list[DetectedLanguage],
                      responses={c: ERRORS[c] for c in (400, 401, 403, 413, 422)},
                      openapi_extra={"requestBody": {"required": True, "content": {
                          "application/json": detect_body, "application/x-www-form-urlencoded": detect_body}}},
                      summary="LibreTranslate-compatible language detection, among the served languages",
                      tags=["libretranslate"])
    app.add_api_route("/libretranslate/languages", gateway.languages, methods=["GET"],
                      response_model=list[Language], tags=["libretranslate"])
    files.install(app, gateway, {c: ERRORS[c] for c in (400, 401, 403, 404, 413, 422, 429, 503, 504)})


def describe(schema: dict, gateway: Gateway) -> None:
    """The served pairs and text limits in /openapi.json, under LibreTranslate's field names."""
    s = gateway.settings
    text = {"maxLength": s.max_text_chars, "pattern": r"\S"}
    texts = {"minItems": 1, "maxItems": s.max_texts, "items": {"type": "string"} | text}
    paths = schema["paths"]
    for content in paths["/libretranslate/translate"]["post"]["requestBody"]["content"].values():
        describe_pairs(content["schema"], ("source", "target"), gateway, text, texts)
    schema.setdefault("components", {}).setdefault("schemas", {}).update(
        LibreTranslateRequest.model_json_schema(ref_template=REFS).get("$defs", {}))
    detect_content = paths["/libretranslate/detect"]["post"]["requestBody"]["content"]
    for one in (q for b in detect_content.values() for q in b["schema"]["properties"]["q"]["anyOf"]):
        one.update({"maxLength": s.max_text_chars} if one["type"] == "string" else
                   {"maxItems": s.max_texts, "items": {"type": "string", "minLength": 1,
                                                        "maxLength": s.max_text_chars}})


PATHS = ("/libretranslate/translate", "/libretranslate/detect", files.TRANSLATE_FILE)
FLAVOUR = Flavour(install, prefix="/libretranslate/", error_body=error_body,
                  endpoints={"/libretranslate/translate": ENDPOINT, "/libretranslate/detect": DETECT,
                             files.TRANSLATE_FILE: ENDPOINT},
                  # its clients and web page ask for these without a key (LibreTranslate exempts them too)
                  open_paths=frozenset({"/libretranslate/languages", files.SETTINGS}),
                  key_in_body=frozenset(PATHS), file_paths=frozenset({files.TRANSLATE_FILE}), describe=describe)
