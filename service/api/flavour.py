"""What an API flavour tells the HTTP core, so that a flavour is one module plus its line in server.FLAVOURS.

A flavour (native.py: ours; openai_api.py; libretranslate.py; ui.py: the pages) installs its own routes
over the Gateway, owns its request and response models and its error shape, and consumes the Gateway's typed
results and events; it never calls another flavour. server.py reads these fields: the error handlers and the
middleware answer an error under `prefix` with `error_body`, the middleware counts `endpoints` and leaves
`open_paths` without a key, bounds the body of a `file_paths` path by --max-file-bytes instead of
--max-payload-bytes, and /openapi.json is passed to `describe`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import ApiError
from ..shared import html_text
from ..shared.schemas import AUTO

if TYPE_CHECKING:
    from fastapi import FastAPI, Request
    from starlette.datastructures import FormData

    from ..http.gateway import Gateway


@dataclass(frozen=True)
class Flavour:
    install: Callable[[FastAPI, Gateway], None]           # adds the flavour's routes to the app
    prefix: str = "/"                                     # its paths: an error under it takes its shape
    error_body: Callable[[ApiError, str | None], dict] | None = None   # (error, request id) -> JSON; None: ours
    endpoints: dict[str, str] = field(default_factory=dict)            # path -> the metrics' endpoint label
    open_paths: frozenset[str] = frozenset()              # served without a key (e.g. language lists)
    key_in_body: frozenset[str] = frozenset()             # POST paths whose clients may send the key in the body
    file_paths: frozenset[str] = frozenset()              # POST paths that take a document: --max-file-bytes bodies
    direct_paths: frozenset[str] = frozenset()            # POST routes taking (request) -> Response that the
    #                                                       middleware calls itself (middleware.direct_route)
    describe: Callable[[dict, Gateway], None] | None = None   # names what is served in /openapi.json


def describe_pairs(body: dict, fields: tuple[str, str], gateway: Gateway, text: dict, texts: dict) -> None:
    """A translation request's schema with exactly the served pairs, and each language into itself (returned
    unchanged); "auto" into any of them (a detected language with no model to the target is a 422, see
    Gateway.translate_detected: which texts those are, no schema can say). Each translation flavour calls it with
    its own field names."""
    langs = gateway.source_languages()
    if not langs:                    # no translation package: nothing to name (an empty anyOf is invalid)
        return
    (src, tgt), props = fields, body["properties"]
    props[src]["enum"], props[tgt]["enum"] = [*langs, AUTO], langs
    body["anyOf"] = [{"properties": {src: {"const": a}, tgt: {"enum": sorted(
        {b for x, b in gateway.pairs if x == a} | {a})}}} for a in langs]
    body["anyOf"].append({"properties": {src: {"const": AUTO}, tgt: {"enum": langs}}})
    for one in (props.get("text") or props["q"])["anyOf"]:
        one.update(text if one["type"] == "string" else texts)


async def read_file_form(request: Request, max_bytes: int, wrong_type: str, unparsed: str = "",
                         types: tuple[str, ...] = ("multipart/form-data",)) -> FormData:
    """A document's upload form (one file part, 16 fields at most), or a 400 for a body of none of `types`
    (`wrong_type`: what to send, in the flavour's words) or a form that cannot be parsed (`unparsed` before
    Starlette's reason), or the 413 of a body over --max-file-bytes (the middleware's, declared or counted as it
    is read). Each flavour's error shape comes from its prefix (Flavour.error_body)."""
    if not request.headers.get("content-type", "").lower().startswith(types):
        raise ApiError(400, "invalid_request", wrong_type)
    try:
        return await request.form(max_files=1, max_fields=16)
    except StarletteHTTPException as e:
        if e.status_code == 413:
            raise ApiError(413, "file_too_large", f"the file is larger than {max_bytes} bytes (--max-file-bytes)",
                           max_bytes, {"Connection": "close"}) from None
        if e.status_code != 400:
            raise
        raise ApiError(400, "invalid_request", f"{unparsed}the form cannot be parsed: {e.detail}") from None


DETECT_CHARS = 2000     # a document without its source language: detected from its first texts, this many characters


def detection_sample(texts: list[str]) -> str:
    """A document's first texts, about DETECT_CHARS characters, for the Gateway's language detection (a flavour's
    document without its source language: LibreTranslate's source=auto, DeepL's absent source_lang)."""
    sample, size = [], 0
    for text in texts:
        if size > DETECT_CHARS:
            break
        sample.append(text)
        size += len(text)
    return "\n".join(sample)


def parse_markup(fragments: list[str], max_texts: int, what: str,
                 tags: html_text.Splitting = html_text.HTML) -> tuple[list, list[str]]:
    """HTML or XML fragments parsed (shared/html_text.py; `tags`: which of them split a run) with their runs of
    text: a 400 for markup that cannot be read, a 413 for markup too costly or with more runs than --max-texts
    (`what` names it: "the HTML")."""
    try:
        docs = html_text.parse_all(fragments, tags)
    except html_text.MarkupError as e:
        raise ApiError(e.status, "invalid_html" if e.status == 400 else "html_too_large", str(e)) from None
    runs = html_text.texts(docs, leaves=False)
    if len(runs) > max_texts:
        raise ApiError(413, "too_many_texts", f"{what} has {len(runs)} runs of text to translate (a paragraph, "
                       f"heading, cell or list item each); the limit is {max_texts} per request", max_texts)
    return docs, runs
