"""DeepL's API (v2), an API flavour of its own under /deepl/, for DeepL's clients (the `deepl` Python package, with
server_url "http://host:port/deepl/", and the integrations built on it; docs/serving.md on other SDKs) unchanged:

    POST     /deepl/v2/translate                text(s) into target_lang, JSON or a form (`text` repeated)
    GET/POST /deepl/v2/languages                type=source|target, in DeepL's codes (DE, EN-GB, EN-US, ...)
    GET/POST /deepl/v2/usage                    the key's characters: used and its limit (characters_per_day)
    GET      /deepl/v2/glossary-language-pairs  the pairs a glossary may have (the served pairs)
    /deepl/v2/glossaries[/{id}[/entries]]       our stored glossaries (http/glossary_store.py), in DeepL's shapes
    /deepl/v2/document...                       documents as jobs: deepl_documents.py, installed here

Auth as DeepL's: `Authorization: DeepL-Auth-Key KEY` (http/auth.py; a wrong one is 403) or our forms. Errors in
DeepL's shape, `{"message": "..."}`, DeepL's words where it has some (its clients and integrations match them:
"Value for 'target_lang' not supported."), with DeepL's statuses, so its clients raise their own exceptions: 400
(DeepLException), 403 (AuthorizationException), 404 (GlossaryNotFoundException on a glossary route), 413, 429
with Retry-After (TooManyRequestsException), and 456 (QuotaExceededException) when the key's characters_per_day
is used up, DeepL's "quota for the billing period". A detected language no model takes to target_lang is a 400
here (our 422), which DeepL's clients read as a bad request.

What DeepL has and one model per pair cannot do: `formality` prefer_more, prefer_less and default are accepted and
change nothing (no target language here supports formality: /languages says supports_formality false), more and
less refused as DeepL refuses them for a language without formality; `context` and `custom_instructions` are taken
and not read; `split_sentences`, `preserve_formatting`, `outline_detection`, `tag_handling_version` and
`model_type` are checked as DeepL checks them and change nothing (long texts are always split into sentences and
joined back with their line breaks; one model serves every model_type, named back in model_type_used).
tag_handling html or xml translates the markup's runs of text and keeps the markup (shared/html_text.py, as
LibreTranslate's format=html here): `ignore_tags` are kept as written, as an element with translate="no" is;
HTML's inline elements (b, i, span, a...) never split a sentence and every other tag does; with xml,
`non_splitting_tags` are inline too (a sentence across them is translated whole) and `splitting_tags` split, even
an HTML inline one (html_text.Splitting.xml). With html both lists are checked and HTML's own rules apply. A text
of spaces only comes back as sent (our /translate refuses it; DeepL's clients send them, cells of a table). Each
request maps to ONE TranslateRequest (to_translate_request), which the Gateway takes as POST /translate's.

DeepL's codes read as ours (`target_language`, `source_language`, `deepl_code`) are deepl_codes.py's, which
deepl_documents.py shares: it cannot import this module, which imports it. `error_body` and `ERRORS` are public
for it too (ERRORS reaches it through its install)."""

from __future__ import annotations

import asyncio
import re
import secrets
from dataclasses import dataclass
from typing import Annotated, Literal, Optional, Union
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import deepl_documents as documents
from .deepl_codes import VARIANTS, deepl_code, source_language, target_language, unsupported
from .flavour import Flavour, parse_markup
from ..errors import ApiError, declares_json, first_error, parse_error
from ..http.gateway import LANGUAGE_NAMES, Gateway
from ..shared import html_text
from ..shared.glossary import GlossaryError, parse
from ..shared.schemas import AUTO, GlossaryInfo, GlossaryList, TranslateRequest

ENDPOINT = "deepl"     # /deepl/v2/translate's endpoint label in the metrics; the work goes to the translate workers
V2 = "/deepl/v2"
TRANSLATE, LANGUAGES, USAGE = f"{V2}/translate", f"{V2}/languages", f"{V2}/usage"
GLOSSARY_PAIRS, GLOSSARIES = f"{V2}/glossary-language-pairs", f"{V2}/glossaries"
# /v2/usage's character_limit for a key without a characters_per_day limit: DeepL's own answer for an account
# without one (a Pro subscription's "unlimited" is 10^12), so that a client computing what is left sees plenty.
UNLIMITED = 1_000_000_000_000
MAX_FIELDS = 1000             # a form's fields at most (Starlette's default for the forms it parses)
VARIANT_NAMES = {"EN-GB": "English (British)", "EN-US": "English (American)", "PT-BR": "Portuguese (Brazilian)",
                 "PT-PT": "Portuguese (European)", "ES-419": "Spanish (Latin American)",
                 "ZH-HANS": "Chinese (simplified)"}
# The form fields DeepL takes repeated (text=a&text=b); any other given twice: its last value, as Starlette's forms
MULTI = ("text", "ignore_tags", "splitting_tags", "non_splitting_tags", "glossary_ids")
TAG = re.compile(r"[A-Za-z_][\w.:-]*")     # an XML name, as ignore_tags and its kin list them


# --- DeepL's shapes --------------------------------------------------------------------------------------------
class DeepLError(BaseModel):
    """DeepL's error shape: one message (its clients raise it after a status of their own: "Bad request, message:
    ...")."""
    message: str


Flag = Union[StrictBool, Literal["0", "1", "true", "false"]]    # JSON's true, a form's 1
Tags = Union[str, list[str]]                                      # "a,b" or ["a", "b"]


class DeepLTranslateRequest(BaseModel):
    """POST /deepl/v2/translate's body, JSON or form, as DeepL takes it; fields DeepL has and this server does not
    know are ignored, as DeepL ignores them (the module's docstring says which of these change nothing)."""
    model_config = ConfigDict(extra="allow")

    text: Union[str, list[str]] = Field(..., description="A text, or texts translated independently (in a form: "
                                        "the field repeated)")
    target_lang: str = Field(..., description="DeepL's code, any case: EN-US, EN-GB, DE, PT-BR...",
                             examples=["EN-US"])
    source_lang: Optional[str] = Field(None, description="DeepL's code (DE, EN); absent: detected, and each "
                                       "translation says which (detected_source_language)", examples=["DE"])
    context: Optional[str] = Field(None, description="Accepted and not used: one model per pair reads no context")
    split_sentences: Optional[Literal["0", "1", "nonewlines"]] = None
    preserve_formatting: Optional[Flag] = None
    formality: Optional[Literal["default", "more", "less", "prefer_more", "prefer_less"]] = Field(
        None, description="default and prefer_* accepted; more and less refused: no language here supports it")
    glossary_id: Optional[str] = Field(None, description="A stored glossary of this key; needs source_lang")
    glossary_ids: Optional[Union[str, Annotated[list[str], Field(max_length=1)]]] = Field(
        None, description="At most one glossary here (in a form: ids joined by commas)")
    tag_handling: Optional[Literal["html", "xml"]] = None
    tag_handling_version: Optional[Literal["v1", "v2"]] = None
    outline_detection: Optional[Flag] = None
    ignore_tags: Optional[Tags] = Field(None, description="Elements kept as written, untranslated")
    splitting_tags: Optional[Tags] = Field(None, description="With xml: elements that end a sentence (even b, i...)")
    non_splitting_tags: Optional[Tags] = Field(None, description="With xml: elements inside a sentence, translated "
                                               "with it")
    model_type: Optional[Literal["quality_optimized", "latency_optimized", "prefer_quality_optimized"]] = None
    show_billed_characters: Optional[Flag] = None
    # What DeepL has that nothing here is, a style rule and a translation memory: refused rather than ignored (the
    # client names an object of its account, which this server cannot have).
    style_id: None = Field(None, description="Not served here: no style rules")
    translation_memory_id: None = Field(None, description="Not served here: no translation memories")


class DeepLTranslation(BaseModel):
    detected_source_language: str = Field(..., description="The source language, detected or as sent (DE)")
    text: str
    billed_characters: Optional[int] = Field(None, description="With show_billed_characters: the text's length")
    model_type_used: Optional[str] = Field(None, description="With model_type")


class DeepLTranslateResponse(BaseModel):
    translations: list[DeepLTranslation]


class DeepLLanguage(BaseModel):
    language: str = Field(..., examples=["EN-US"])
    name: str = Field(..., examples=["English (American)"])
    supports_formality: Optional[bool] = Field(None, description="Target languages: always false here")


class DeepLUsage(BaseModel):
    character_count: int = Field(..., description="Characters translated in the key's day (characters_per_day)")
    character_limit: int = Field(..., description="The key's characters_per_day; 10^12 for a key without one")


class DeepLGlossaryPair(BaseModel):
    source_lang: str = Field(..., examples=["de"])
    target_lang: str = Field(..., examples=["en"])


class DeepLGlossaryPairs(BaseModel):
    supported_languages: list[DeepLGlossaryPair]


class DeepLGlossaryCreate(BaseModel):
    """POST /deepl/v2/glossaries' body, JSON or form, as DeepL's v2 takes it."""
    name: str = Field(..., min_length=1, max_length=256)
    source_lang: str = Field(..., description="DeepL's code (DE, EN), any case", examples=["DE"])
    target_lang: str = Field(..., description="DeepL's code (DE, EN), any case", examples=["EN"])
    entries: str = Field(..., description="source TAB target a line (tsv), or source,target (csv)",
                         examples=["Auftrag\tpurchase order\n"])
    entries_format: Literal["tsv", "csv"]


# --- DeepL's errors, which deepl_documents.py shares -----------------------------------------------------------
ERRORS = {c: {"model": DeepLError} for c in (400, 401, 403, 404, 413, 429, 456, 503, 504)}


def error_body(err: ApiError, request_id: str | None) -> dict:
    """DeepL's error shape, `{"message": "..."}`, for everything under /deepl/."""
    return {"message": err.message}


def missing(field: str) -> ApiError:
    return ApiError(400, "invalid_request", f"Parameter '{field}' not specified.")


# --- a body read as DeepL reads it ------------------------------------------------------------------------------
async def read_fields(request: Request) -> dict:
    """The request's fields: its query's, then its body's over them (JSON when the Content-Type says so, else a
    form; DeepL's own mock reads both so, and the deepl package sends GET /v2/languages' `type` as a form body).
    A 400 for a body that cannot be read."""
    fields: dict = dict(request.query_params)
    ctype = request.headers.get("content-type", "").lower()
    if declares_json(ctype):
        try:
            data = await request.json()
        except (ValueError, RecursionError) as e:
            raise ApiError(400, "invalid_json", parse_error(e)) from None
        if not isinstance(data, dict):
            raise ApiError(400, "invalid_request", "the body must be a JSON object")
        return fields | data
    if ctype.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
        pairs = await form_pairs(request, ctype)
    elif await request.body():
        raise ApiError(400, "invalid_request", "send the fields as JSON (Content-Type: application/json) or as a "
                       "form (application/x-www-form-urlencoded or multipart/form-data)")
    else:
        pairs = []
    form: dict = dict(pairs)
    for name in MULTI:
        if len(values := [v for k, v in pairs if k == name]) > 1:
            form[name] = values
    return fields | form


async def form_pairs(request: Request, ctype: str) -> list[tuple[str, str]]:
    """A form's (name, value) pairs, or a 400 for one that is not UTF-8 (in its bytes or its %-escapes), too many
    fields or a malformed multipart body: never text read as Latin-1 and translated."""
    try:
        text = (await request.body()).decode("utf-8")
        if ctype.startswith("multipart/form-data"):
            form = await request.form(max_fields=MAX_FIELDS)
            return [(k, v) for k, v in form.multi_items() if isinstance(v, str)]
        return parse_qsl(text, keep_blank_values=True, encoding="utf-8", errors="strict", max_num_fields=MAX_FIELDS)
    except UnicodeDecodeError:
        raise ApiError(400, "invalid_request", "the form is not valid UTF-8 (in its bytes or a %-escape); send it "
                       "encoded as UTF-8") from None
    except ValueError:   # parse_qsl's "Max number of fields exceeded"
        raise ApiError(400, "invalid_request", f"the form has more than {MAX_FIELDS} fields") from None
    except StarletteHTTPException as e:   # Starlette's 400 for a malformed multipart body
        raise ApiError(400, "invalid_request", f"the form cannot be parsed: {e.detail}") from None


def validated(model: type[BaseModel], data: dict) -> BaseModel:
    """`data` as `model`, or DeepL's 400 naming the first field at fault: missing, or a value it does not take."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        field = str(err["loc"][0]) if err.get("loc") else "body"
        raise missing(field) if err["type"] == "missing" else unsupported(field) from None


# --- POST /v2/translate --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Translation:
    """A DeepL translate request mapped once (to_translate_request): `request` is what the Gateway translates
    (None where every text is blank), `texts` what was sent, `sent` the indices of the texts it holds."""
    request: TranslateRequest | None
    texts: list[str]
    sent: list[int]
    tags: str | None
    ignore: tuple[str, ...]
    billed: bool
    model_type_used: str | None
    splitting: html_text.Splitting = html_text.HTML     # which tags split a run: HTML's, or xml's lists


def tag_list(body: DeepLTranslateRequest, name: str) -> tuple[str, ...]:
    """ignore_tags and its kin: "a,b", ["a", "b"] or ["a,b"] (as the deepl package joins them) -> ("a", "b"); a
    400 for a name that is no XML name."""
    value = getattr(body, name) or []
    tags = [t.strip() for v in ([value] if isinstance(value, str) else value) for t in v.split(",") if t.strip()]
    if not all(TAG.fullmatch(t) for t in tags):
        raise unsupported(name)
    return tuple(tags)


def glossary_of(body: DeepLTranslateRequest, source: str) -> str | None:
    """The stored glossary a request names (glossary_id, or glossary_ids: of one here), which DeepL uses only with
    a source_lang: a glossary is one pair."""
    ids = body.glossary_ids.split(",") if isinstance(body.glossary_ids, str) else body.glossary_ids or []
    if len(ids) > 1:
        raise unsupported("glossary_ids")
    if body.glossary_id is not None and ids:
        raise ApiError(400, "invalid_request", "glossary_id and glossary_ids cannot be used together")
    glossary = body.glossary_id or (ids[0] if ids else None)
    if glossary is not None and source == AUTO:
        raise ApiError(400, "invalid_request", "Use of a glossary requires the source_lang parameter to be specified")
    return glossary


def to_translate_request(body: DeepLTranslateRequest, gateway: Gateway) -> Translation:
    """DeepL's fields -> the one TranslateRequest the Gateway takes (its search options are POST /translate's
    defaults: nothing of DeepL's chooses them), and what the answer needs; DeepL's 400s first."""
    target = target_language(body.target_lang, gateway)
    source = source_language(body.source_lang, gateway)
    if body.formality in ("more", "less"):        # DeepL's answer for a target language without formality
        raise ApiError(400, "invalid_request", "'formality' is not supported for given 'target_lang'.")
    texts = [body.text] if isinstance(body.text, str) else body.text
    if not texts:
        raise missing("text")
    glossary, ignore = glossary_of(body, source), tag_list(body, "ignore_tags")
    splitting = html_text.Splitting.xml(tag_list(body, "splitting_tags"), tag_list(body, "non_splitting_tags"))
    sent = [i for i, t in enumerate(texts) if t.strip()]
    try:
        request = TranslateRequest(text=[texts[i] for i in sent], source_lang=source, target_lang=target,
                                   glossary_id=glossary) if sent else None
    except ValidationError as e:          # a lone surrogate in a text: not Unicode
        raise ApiError(400, "invalid_request", first_error(e).removeprefix("body: ")) from None
    model = body.model_type.removeprefix("prefer_") if body.model_type else None
    return Translation(request, texts, sent, body.tag_handling, ignore,
                       body.show_billed_characters in (True, "1", "true"), model,
                       splitting if body.tag_handling == "xml" else html_text.HTML)   # DeepL's are xml options


async def translate(gateway: Gateway, request: Request) -> Response:
    """DeepL's POST /v2/translate: `{"translations": [{"detected_source_language", "text"}, ...]}`, one a text."""
    job = to_translate_request(validated(DeepLTranslateRequest, await read_fields(request)), gateway)
    try:
        done = await (translate_tagged if job.tags else translate_plain)(gateway, request, job)
    except ApiError as e:
        raise deepl_status(e, gateway, request) from None
    if done is None:
        return Response(status_code=499)   # the client went away
    out, detected = done
    items = []
    for text, lang, sent in zip(out, detected, job.texts):
        item: dict = {"detected_source_language": deepl_code(lang) if lang else "", "text": text}
        if job.billed:
            item["billed_characters"] = len(sent)
        if job.model_type_used:
            item["model_type_used"] = job.model_type_used
        items.append(item)
    return JSONResponse({"translations": items})


async def translate_plain(gateway: Gateway, request: Request, job: Translation) -> tuple[list, list] | None:
    """Plain texts: each one's translation and source language (as sent, or detected per text); a blank text as
    it came, with the request's source language (or the first one detected, or none)."""
    out, detected = list(job.texts), [None] * len(job.texts)
    gateway.check_limits(job.texts)           # the blank ones too: they come back, and count as texts
    if job.request is not None:
        answer = await gateway.translate(job.request, request, ENDPOINT)
        if answer is None:
            return None
        for i, item in zip(job.sent, answer["translations"]):
            out[i] = item["text"]
            detected[i] = item["detected_lang"]["language"] if "detected_lang" in item else job.request.source_lang
    source = job.request.source_lang if job.request is not None else AUTO
    fill = source if source != AUTO else next((d for d in detected if d), "")
    return out, [d or fill for d in detected]


async def translate_tagged(gateway: Gateway, request: Request, job: Translation) -> tuple[list, list] | None:
    """tag_handling html or xml: each text's runs of text (shared/html_text.py) translated as the texts of ONE
    request, its markup and the elements of ignore_tags kept as written (marked translate="no" while they are
    read: see ignored()). The source language, where none is given, is detected over all the runs at once (a
    run alone, a word in a <b>, is too short to tell); a 400/413 for hostile markup."""
    texts, req = job.texts, job.request
    gateway.check_limits(texts)          # the markup counts: a text's limit is on what was sent
    marked, marker = ignored(texts, job.ignore)
    limit = gateway.settings.max_texts
    docs, runs = await asyncio.to_thread(parse_markup, marked, limit, "the markup", job.splitting)
    if req is None or not runs:
        source = req.source_lang if req is not None and req.source_lang != AUTO else ""
        return list(texts), [source] * len(texts)
    source = req.source_lang
    if source == AUTO:
        source = await tagged_source(gateway, runs, req.target_lang)
    gateway.check_pair(source, req.target_lang)
    translated = marked
    if source == req.target_lang:             # no model runs: charged as POST /translate charges it
        await gateway.charge_characters(request, runs)
    else:
        leaves = len(html_text.texts(docs, leaves=True)) <= limit
        out = await gateway.translate(req.model_copy(update={"text": html_text.texts(docs, leaves),
                                                             "source_lang": source}), request, ENDPOINT)
        if out is None:
            return None
        translated = html_text.render(docs, [i["text"] for i in out["translations"]], leaves)
    return [t.replace(marker, "") for t in translated], [source] * len(texts)


def ignored(texts: list[str], tags: tuple[str, ...]) -> tuple[list[str], str]:
    """The texts with each start tag of `tags` marked translate="no", which html_text keeps as written with all it
    holds, and the marker, which the caller removes from the result: a random attribute no text holds, so only
    what was added is taken away (the markup comes back byte for byte, a kept element's with it)."""
    marker = f' translate="no" data-transerve-kept="{secrets.token_hex(8)}"'
    if not tags:
        return list(texts), marker
    start = re.compile(r"<(%s)(?=[\s/>])" % "|".join(re.escape(t) for t in tags), re.IGNORECASE)
    return [start.sub(lambda m: f"<{m.group(1)}{marker}", t) for t in texts], marker


async def tagged_source(gateway: Gateway, runs: list[str], target: str) -> str:
    """The language of all the markup's text at once, which a model must take to target."""
    if not any(target in pair for pair in gateway.pairs):
        gateway.check_pair(AUTO, target)
    lang, confidence = (await gateway.detect(["\n".join(runs)]))[0][0]
    if (lang, target) not in gateway.pairs and lang != target:
        raise ApiError(400, "unsupported_detected_language", f"the text was detected as {deepl_code(lang)} "
                       f"(confidence {confidence}), and no model translates it into {deepl_code(target)}; name "
                       "source_lang to translate it from another language")
    return lang


def deepl_status(e: ApiError, gateway: Gateway, request: Request) -> ApiError:
    """An error of the Gateway's with the status DeepL's clients expect: the key's characters_per_day used up
    (or smaller than the request) is DeepL's 456, its quota for the period; a detected language no model
    translates (our 422) a bad request."""
    day = gateway.tenant(request).limits.characters_per_day
    if e.type in ("rate_limited", "over_key_limit") and e.limit is not None and e.limit == day:
        return ApiError(456, "quota_exceeded", f"Quota exceeded: {e.message}", e.limit, e.headers)
    if e.status == 422:
        return ApiError(400, e.type, e.message, e.limit, e.headers)
    return e


# --- languages, usage ----------------------------------------------------------------------------------------
def languages(gateway: Gateway, kind: str) -> list[dict]:
    """The served languages in DeepL's codes: sources as DE, EN; targets with their regional codes (EN-GB and
    EN-US for en), none supporting formality."""
    if kind == "source":
        return [{"language": deepl_code(a), "name": LANGUAGE_NAMES.get(a, a)}
                for a in sorted({a for a, _ in gateway.pairs})]
    out = []
    for lang in sorted({b for _, b in gateway.pairs}):
        codes = [c for c, base in VARIANTS.items() if base == lang] or [deepl_code(lang)]
        out += [{"language": c, "name": VARIANT_NAMES.get(c, LANGUAGE_NAMES.get(lang, lang)),
                 "supports_formality": False} for c in sorted(codes)]
    return out


async def usage(gateway: Gateway, request: Request) -> dict:
    """DeepL's usage: the key's characters_per_day, used and its limit (the window starts at the key's first
    request in it: http/quota.py); a key without that limit counts nothing here, 0 of UNLIMITED."""
    tenant = gateway.tenant(request)
    if "characters_per_day" not in tenant.limits.given():
        return {"character_count": 0, "character_limit": UNLIMITED}
    day = (await gateway.quota.usage(tenant))["characters_per_day"]
    if day["used"] is None:     # the counts' store does not answer: not "nothing used", which a client would spend
        raise ApiError(429, "limits_unavailable", "the key's usage cannot be read now (its store does not answer); "
                       "retry shortly", headers={"Retry-After": "1"})
    return {"character_count": day["used"], "character_limit": day["limit"]}


# --- glossaries: our store (http/glossary_store.py), in DeepL's v2 shapes ------------------------------------------
def glossary_language(code: str, field: str, gateway: Gateway) -> str:
    """A glossary's language: DeepL's base code (DE, EN; any case; no regional variant, as DeepL takes) -> ours."""
    if not code.isalpha() or code.lower() not in gateway.source_languages():
        raise unsupported(field)
    return code.lower()


async def create_glossary(gateway: Gateway, request: Request) -> JSONResponse:
    """POST /v2/glossaries: 201 with the glossary; 400 for a pair no model serves or entries that do not parse
    (naming the line), 413/409 over the store's limits (glossary_store.GlossaryLimits)."""
    body = validated(DeepLGlossaryCreate, await read_fields(request))
    source = glossary_language(body.source_lang, "source_lang", gateway)
    target = glossary_language(body.target_lang, "target_lang", gateway)
    gateway.check_pair(source, target)
    if source == target:
        raise ApiError(400, "invalid_request", f"a glossary translates between two languages; "
                       f"{gateway.pairs_text()}")
    try:
        entries = parse(body.entries, body.entries_format)
    except GlossaryError as e:
        raise ApiError(400, "invalid_glossary", str(e)) from None
    if not entries:
        raise ApiError(400, "invalid_glossary", "the glossary has no entries; give at least one")
    info = await gateway.glossaries.create(gateway.tenant(request).name, body.name, source, target, entries)
    return JSONResponse(GlossaryInfo.model_validate(info).model_dump(), status_code=201)   # with ready: true


def install_glossaries(app: FastAPI, gateway: Gateway) -> None:
    store, tags = gateway.glossaries, ["deepl"]
    errors = {c: {"model": DeepLError} for c in (400, 401, 403, 404, 409, 413, 429, 503)}

    def owner(request: Request) -> str:
        return gateway.tenant(request).name

    async def create(request: Request) -> JSONResponse:
        return await create_glossary(gateway, request)

    async def listed(request: Request) -> dict:
        return {"glossaries": await store.listed(owner(request))}

    async def info(glossary_id: str, request: Request) -> dict:
        return await store.info(owner(request), glossary_id)

    async def entries(glossary_id: str, request: Request) -> Response:
        return Response(await store.entries(owner(request), glossary_id),
                        media_type="text/tab-separated-values; charset=utf-8")

    async def delete(glossary_id: str, request: Request) -> Response:
        await store.delete(owner(request), glossary_id)
        return Response(status_code=204)

    form = {"schema": {"$ref": "#/components/schemas/DeepLGlossaryCreate"}}
    app.add_api_route(GLOSSARIES, create, methods=["POST"], status_code=201, response_model=GlossaryInfo,
                      responses=errors, tags=tags, operation_id="deepl_create_glossary",
                      summary="DeepL-compatible: store a glossary for the calling key",
                      openapi_extra={"requestBody": {"required": True, "content": {
                          "application/json": form, "application/x-www-form-urlencoded": form}}})
    app.add_api_route(GLOSSARIES, listed, methods=["GET"], response_model=GlossaryList, responses=errors,
                      tags=tags, operation_id="deepl_list_glossaries", summary="DeepL-compatible: the calling key's "
                      "glossaries")
    app.add_api_route(f"{GLOSSARIES}/{{glossary_id}}", info, methods=["GET"], response_model=GlossaryInfo,
                      responses=errors, tags=tags, operation_id="deepl_get_glossary",
                      summary="DeepL-compatible: a glossary, without its entries")
    tsv_errors = {c: {"description": "Error", "content": {"application/json": {"schema": {
        "$ref": "#/components/schemas/DeepLError"}}}} for c in errors}
    app.add_api_route(f"{GLOSSARIES}/{{glossary_id}}/entries", entries, methods=["GET"], response_class=Response,
                      responses=tsv_errors | {200: {"description": "source TAB target, a line each", "content": {
                          "text/tab-separated-values": {"schema": {"type": "string"}}}}},
                      tags=tags, operation_id="deepl_get_glossary_entries",
                      summary="DeepL-compatible: a glossary's entries as TSV")
    app.add_api_route(f"{GLOSSARIES}/{{glossary_id}}", delete, methods=["DELETE"], status_code=204,
                      response_class=Response, responses=errors, tags=tags, operation_id="deepl_delete_glossary",
                      summary="DeepL-compatible: delete a glossary")


# --- the flavour: its routes, and what the HTTP core is to know of it -------------------------------------------
def install(app: FastAPI, gateway: Gateway) -> None:
    tags = ["deepl"]
    type_param = {"parameters": [{"name": "type", "in": "query", "required": False, "schema": {
        "type": "string", "enum": ["source", "target"], "default": "source"}}]}

    async def translate_route(request: Request) -> Response:
        return await translate(gateway, request)

    async def languages_route(request: Request) -> list[dict]:
        kind = (await read_fields(request)).get("type", "source")
        if kind not in ("source", "target"):
            raise ApiError(400, "invalid_request", "Parameter 'type' is invalid. 'source' and 'target' are valid "
                           "values.")
        return languages(gateway, kind)

    async def usage_route(request: Request) -> dict:
        return await usage(gateway, request)

    async def pairs_route() -> dict:
        return {"supported_languages": [{"source_lang": a, "target_lang": b} for a, b in gateway.pairs]}

    body = {"schema": {"$ref": "#/components/schemas/DeepLTranslateRequest"}}
    app.add_api_route(TRANSLATE, translate_route, methods=["POST"], response_model=DeepLTranslateResponse,
                      response_model_exclude_none=True, responses=ERRORS, tags=tags,
                      openapi_extra={"requestBody": {"required": True, "content": {
                          "application/json": body, "application/x-www-form-urlencoded": body}}},
                      operation_id="deepl_translate", summary="DeepL-compatible translate")
    for method in ("GET", "POST"):
        app.add_api_route(LANGUAGES, languages_route, methods=[method], response_model=list[DeepLLanguage],
                          response_model_exclude_none=True, responses={c: ERRORS[c] for c in (400, 401, 403, 429)},
                          tags=tags, openapi_extra=type_param, operation_id=f"deepl_languages_{method.lower()}",
                          summary="DeepL-compatible: the languages translated from (type=source) or into (target)")
        app.add_api_route(USAGE, usage_route, methods=[method], response_model=DeepLUsage, tags=tags,
                          responses={c: ERRORS[c] for c in (401, 403, 429, 503)},
                          operation_id=f"deepl_usage_{method.lower()}",
                          summary="DeepL-compatible: the key's characters")
    app.add_api_route(GLOSSARY_PAIRS, pairs_route, methods=["GET"], response_model=DeepLGlossaryPairs, tags=tags,
                      responses={c: ERRORS[c] for c in (401, 403, 429)}, operation_id="deepl_glossary_pairs",
                      summary="DeepL-compatible: the language pairs a glossary may have")
    install_glossaries(app, gateway)
    documents.install(app, gateway, ERRORS)


def any_case(codes: list[str]) -> str:
    """A pattern matching exactly `codes` in any case, as DeepL reads them (JSON Schema's patterns have no flag):
    an enum would call "en-us" invalid, which is served."""
    return "^(" + "|".join("".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in code)
                           for code in codes) + ")$"      # a code's other characters: digits and "-" (ES-419)


def describe(schema: dict, gateway: Gateway) -> None:
    """DeepL's request models in the components, with the served codes (in any case) and text limits: what will
    be served (the pair may still be one no model serves: a 400 naming it)."""
    models, s = schema.setdefault("components", {}).setdefault("schemas", {}), gateway.settings
    for model in (DeepLTranslateRequest, DeepLGlossaryCreate):   # read by the routes themselves
        models[model.__name__] = model.model_json_schema(ref_template="#/components/schemas/{model}")
    if not gateway.pairs:
        return
    props, targets = models["DeepLTranslateRequest"]["properties"], {b for _, b in gateway.pairs}
    codes = sorted({x["language"] for x in languages(gateway, "target")} | {deepl_code(b) for b in targets})
    props["target_lang"]["pattern"] = any_case(codes)      # EN-US, EN-GB and DeepL's bare EN
    sources = ["", *(x["language"] for x in languages(gateway, "source"))]     # "": none, detected
    props["source_lang"]["anyOf"][0]["pattern"] = any_case(sources)
    text = {"maxLength": s.max_text_chars}
    for one in props["text"]["anyOf"]:
        one.update(text if one["type"] == "string" else {"minItems": 1, "maxItems": s.max_texts,
                                                          "items": {"type": "string"} | text})
    glossary = models["DeepLGlossaryCreate"]["properties"]
    for field in ("source_lang", "target_lang"):
        glossary[field]["pattern"] = any_case([deepl_code(x) for x in gateway.source_languages()])


FLAVOUR = Flavour(install, prefix="/deepl/", error_body=error_body,
                  endpoints={TRANSLATE: ENDPOINT, **documents.ENDPOINTS},
                  file_paths=documents.FILE_PATHS, describe=describe)
