"""LibreTranslate's file API, part of its flavour (libretranslate.py installs it): POST /translate_file
(multipart `file`, `source`, `target`, `api_key`) -> {"translatedFileUrl": ".../download_file/<name>"}, the
download route that URL names, and GET /frontend/settings, where LibreTranslate's clients and web page read
that files can be sent and which (`filesTranslation`, `supportedFilesFormat`). Shapes as LibreTranslate's
libretranslate/app.py has them; errors in its shape, `{"error": "..."}`.

A document is read by service/documents (its limits: the --max-file-* settings), its texts translated through
the Gateway as requests of at most --max-texts texts, a few at a time: the same queue, batches, key limits and
characters as any translation; the engine is never called here. The result waits in the FileStore
(file_store.py) for the key that sent it."""

from __future__ import annotations

import asyncio
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import FormData, UploadFile

from ..documents.formats import EXTENSIONS, MEDIA_TYPES, format_of, load
from ..documents.limits import DocumentError, Limits
from ..errors import ApiError
from ..http.gateway import Gateway
from ..shared.glossary import GlossaryError, parse as parse_glossary
from ..shared.schemas import AUTO, MAX_GLOSSARY_ENTRIES, TranslateRequest
from ..worker.translate_api import ENDPOINT
from .file_store import FileStore
from .flavour import detection_sample, read_file_form

TRANSLATE_FILE = "/libretranslate/translate_file"
SETTINGS = "/libretranslate/frontend/settings"
DOWNLOAD = "libretranslate_download_file"       # the download route's name, for url_for
IN_FLIGHT = 4           # a document's requests queued at once: its batches fill, other clients' requests still pass
LANG = {"type": "string", "minLength": 1}     # source, target in /openapi.json


async def read_upload(request: Request, max_bytes: int) -> FormData:
    """The form (flavour.read_file_form); a urlencoded one is taken too, to answer "missing file" as
    LibreTranslate does rather than a word on its type."""
    return await read_file_form(request, max_bytes, "send the file as multipart/form-data with the fields file, "
                                "source and target (and api_key)",
                                types=("multipart/form-data", "application/x-www-form-urlencoded"))


def fields_of(form: FormData) -> tuple[UploadFile, str, str]:
    """The file, source and target, each checked as LibreTranslate checks them (its messages)."""
    upload, source, target = form.get("file"), form.get("source"), form.get("target")
    for name, value in (("file", upload), ("source", source), ("target", target)):
        if value is None or value == "":
            raise ApiError(400, "invalid_request", f"Invalid request: missing {name} parameter")
    if not isinstance(upload, UploadFile) or not upload.filename:
        raise ApiError(400, "invalid_request", "Invalid request: file must be a file part with a file name")
    if not isinstance(source, str) or not isinstance(target, str):
        raise ApiError(400, "invalid_request", "Invalid request: source and target must be text fields")
    return upload, source, target


def file_format(filename: str) -> str:
    fmt = format_of(filename)
    if fmt is None:
        raise ApiError(400, "unsupported_file_format", f"Invalid request: file format not supported ({filename!r}); "
                       f"supported: {', '.join('.' + e for e in EXTENSIONS)}")
    return fmt


def safe_name(filename: str) -> str:
    """The download's name: the upload's base name, with only letters, digits, '.', '-' and '_'."""
    base = filename.replace("\\", "/").rsplit("/", 1)[-1]
    return "".join(c if c.isascii() and (c.isalnum() or c in ".-_") else "_" for c in base)[-100:] or "file"


def tsv_glossary(text: str) -> list[dict] | None:
    """A glossary sent as DeepL's TSV (a source term TAB its target term a line): how a form sends one, an
    extension of LibreTranslate's API on /translate and /translate_file; None where blank. Bad TSV: a 400 naming
    its line or entry; more entries than POST /translate takes: a 413 with the limit."""
    if not text.strip():
        return None
    try:
        entries = parse_glossary(text, "tsv")
    except GlossaryError as e:
        raise ApiError(400, "invalid_glossary", str(e)) from None
    if len(entries) > MAX_GLOSSARY_ENTRIES:
        raise ApiError(413, "too_many_glossary_entries", f"the glossary has {len(entries)} entries; the limit is "
                       f"{MAX_GLOSSARY_ENTRIES}", MAX_GLOSSARY_ENTRIES)
    return [{"source": e.source, "target": e.target} for e in entries]


async def translate_file(gateway: Gateway, store: FileStore, request: Request) -> Response:
    form = await read_upload(request, gateway.settings.max_file_bytes)
    try:
        key = form.get("api_key")
        await gateway.check_key(request, key if isinstance(key, str) else None)
        upload, source, target = fields_of(form)
        glossary = form.get("glossary")
        glossary = tsv_glossary(glossary) if isinstance(glossary, str) else None
        fmt = file_format(upload.filename)
        data = await upload.read()
    finally:
        await form.close()
    try:
        document = await asyncio.to_thread(load, fmt, data, Limits(**gateway.settings.document_limits()))
    except DocumentError as e:   # str(e): with the detail that quotes the file, as this answer ends the request
        raise ApiError(e.status, e.code, f"{upload.filename}: {e}", e.limit) from None
    translations = await translate_texts(gateway, request, document.texts, source, target, glossary)
    if translations is None:
        return Response(status_code=499)
    result = await asyncio.to_thread(document.render, translations)
    name = safe_name(upload.filename)
    token = await asyncio.to_thread(store.put, result, name, gateway.tenant(request).name, MEDIA_TYPES[fmt])
    store.start_sweeping()
    return JSONResponse({"translatedFileUrl": str(request.url_for(DOWNLOAD, filename=f"{token}.{name}"))})


async def translate_texts(gateway: Gateway, request: Request, texts: list[str], source: str,
                          target: str, glossary: list[dict] | None = None) -> list[str] | None:
    """The texts' translations in order, None when the client went away. Requests of at most --max-texts texts
    and --max-text-chars characters, IN_FLIGHT of them queued at once, each with the glossary."""
    limit = gateway.settings.max_text_chars
    if long := next((t for t in texts if len(t) > limit), None):
        raise ApiError(413, "text_too_long", f"a paragraph of the document has {len(long)} characters; the limit "
                       f"is {limit}", limit)
    if source == AUTO:             # a document with nothing to translate comes back as it was
        source = await detect_source(gateway, texts, target) if texts else target
    gateway.check_pair(source, target)
    chunks, current, size = [], [], 0
    for text in texts:
        if current and (len(current) == gateway.settings.max_texts or size + len(text) > limit):
            chunks.append(current)
            current, size = [], 0
        current.append(text)
        size += len(text)
    chunks += [current] if current else []
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(chunk: list[str]) -> dict | None:
        async with gate:
            return await gateway.translate(TranslateRequest(text=chunk, source_lang=source, target_lang=target,
                                                            glossary=glossary), request, ENDPOINT)

    tasks = [asyncio.ensure_future(one(chunk)) for chunk in chunks]
    try:
        outs = await asyncio.gather(*tasks)
    finally:
        for task in tasks:           # one request refused: the others are not left running for nothing
            task.cancel()
    if any(out is None for out in outs):
        return None
    if outs:                         # each chunk noted itself, the last over the others: the document's whole
        gateway.noted(request, texts, {
            "translations": [item for out in outs for item in out["translations"]],
            "model": "+".join(dict.fromkeys(out["model"] for out in outs)),
            "timings": {"queue_ms": max(out["timings"]["queue_ms"] for out in outs),        # its longest wait
                        "inference_ms": round(sum(out["timings"]["inference_ms"] for out in outs), 2)}})
    return [item["text"] for out in outs for item in out["translations"]]


async def detect_source(gateway: Gateway, texts: list[str], target: str) -> str:
    """source=auto: the language of the document's first texts (LibreTranslate detects the file's too)."""
    lang, confidence = (await gateway.detect([detection_sample(texts)]))[0][0]
    if (lang, target) not in gateway.pairs and lang != target:
        raise ApiError(422, "unsupported_detected_language", f"the document was detected as {lang} (confidence "
                       f"{confidence}), and no model translates {lang}-{target}; {gateway.pairs_text()}")
    return lang


async def download_file(store: FileStore, gateway: Gateway, request: Request, filename: str) -> Response:
    data, meta = await asyncio.to_thread(store.get, filename.split(".", 1)[0], gateway.tenant(request).name)
    return Response(data, media_type=meta["media_type"], headers={"Content-Disposition": attachment(meta["name"])})


def attachment(name: str) -> str:
    """Content-Disposition for a download named `name` (as Starlette's FileResponse writes it: RFC 6266's
    filename*= where the name is not plain ASCII)."""
    quoted = quote(name)
    return f"attachment; filename*=utf-8''{quoted}" if quoted != name else f'attachment; filename="{name}"'


def frontend_settings(gateway: Gateway) -> dict:
    """LibreTranslate's GET /frontend/settings, with what this server does (no suggestions; its keys)."""
    s, targets = gateway.settings, sorted({t for _, t in gateway.pairs})
    target = "en" if "en" in targets else (targets[0] if targets else "en")
    return {"charLimit": s.max_text_chars, "frontendTimeout": 500, "apiKeys": s.keyed, "keyRequired": s.keyed,
            "suggestions": False, "filesTranslation": True,
            "supportedFilesFormat": ["." + e for e in EXTENSIONS],
            "language": {"source": {"code": AUTO, "name": "Auto Detect"},
                         "target": {"code": target, "name": next((lang["name"] for lang in gateway.languages()
                                                                   if lang["code"] == target), target)}}}


def install(app: FastAPI, gateway: Gateway, errors: dict) -> None:
    store = FileStore(gateway.settings.file_dir, gateway.settings.file_ttl_s)
    store.sweep(force=True)          # what an earlier run of the server left
    gateway.at_start.append(store.start_sweeping)    # and what expires before this run's first file

    async def translate_route(request: Request) -> Response:
        return await translate_file(gateway, store, request)

    async def download_route(request: Request, filename: str) -> Response:
        return await download_file(store, gateway, request, filename)

    app.add_api_route(TRANSLATE_FILE, translate_route, methods=["POST"], responses=errors, tags=["libretranslate"],
                      summary="LibreTranslate-compatible file translation: {\"translatedFileUrl\": ...}",
                      openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {
                          "schema": {"type": "object", "required": ["file", "source", "target"], "properties": {
                              "file": {"type": "string", "format": "binary"}, "source": LANG, "target": LANG,
                              "api_key": {"type": "string"},
                              "glossary": {"type": "string", "description": "Not LibreTranslate's: DeepL's TSV, a "
                                           "source term TAB its target term a line, kept in every paragraph"}}}}}}})
    app.add_api_route("/libretranslate/download_file/{filename}", download_route, methods=["GET"], name=DOWNLOAD,
                      responses={404: errors[404]}, tags=["libretranslate"],
                      summary="A translated file, for the key that sent it, until it expires")
    app.add_api_route(SETTINGS, lambda: frontend_settings(gateway), methods=["GET"], tags=["libretranslate"],
                      summary="LibreTranslate's frontend settings: limits, keys, the file formats")
