"""DeepL's document API, part of its flavour (deepl.py installs it), as DeepL's clients drive it (the deepl
package's translate_document: upload, the status polled every 5 s, download):

    POST /deepl/v2/document                        multipart: file, target_lang; source_lang, filename,
                                                   glossary_id, formality, output_format -> {"document_id",
                                                   "document_key"} at once; the document is translated after
    POST /deepl/v2/document/{document_id}          document_key (JSON or form) -> {"document_id", "status" (queued,
                                                   translating, done, error, downloaded), "seconds_remaining" while
                                                   translating, "billed_characters" once done, "error_message"}
    POST /deepl/v2/document/{document_id}/result   document_key -> the translated file, once; then 503 "Document
                                                   already downloaded", as DeepL's API reference has it

The upload checks what it can at once: the key, the fields, the languages (deepl.target_language,
source_language), the file's type and size, the glossary; a 4xx in DeepL's shape. The document is read by the job:
one that cannot be read, or is over a --max-file-* limit, fails its job with the reason (status "error": DeepL's
clients raise DocumentTranslationException), as DeepL reports a document it cannot open. No file name goes into a
log, a metric, an error or the store (document_jobs.py), nor a word of the document: a refusal's message quotes
none (its quoted detail, DocumentError.detail, is left out); the result comes back as "translated.<format>".

A job runs on the HTTP process that took its upload, JOBS_AT_ONCE at a time (the others wait, queued), its texts
translated through the Gateway as requests of at most --max-texts texts, IN_FLIGHT at a time: the same queue,
batches, key limits and characters as any translation, under the uploading key; the engine is never called here.
Its state and files live in the document store (http/document_jobs.py: Redis, or SQLite on one host), which
every replica reads, and this process renews the job's lease while it runs. A request that fails (an inference
worker killed under it, the key's limit reached, the server draining) fails the job with that request's message;
a server that dies stops renewing, and the next reader fails the job (document_jobs.STOPPED). A key may have
--max-document-jobs-per-key jobs queued or translating at once, over all replicas (the store admits each upload
atomically: document_jobs.py); beyond, the upload is DeepL's 429 with Retry-After. transerve_document_jobs_active
counts this process's jobs waiting for the gate (queued) and translating, each state left however the job ends.

formality: our models write one register, so "more" and "less" are refused as DeepL refuses them for a language
without formality, and "default" and the "prefer_" ones are taken. output_format: the input's own only (nothing
is converted here).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.responses import Response
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..documents.formats import EXTENSIONS, MEDIA_TYPES, format_of, load
from ..documents.limits import DocumentError, Limits
from ..errors import ApiError, declares_json
from ..metrics import metrics
from ..shared.schemas import AUTO, TranslateRequest
from .deepl_codes import deepl_code, source_language, target_language   # not from deepl.py: it imports this module
from .flavour import detection_sample, read_file_form

if TYPE_CHECKING:
    from fastapi import FastAPI

    from ..http.gateway import Gateway
    from ..keyfile import Tenant

log = logging.getLogger("transerve")

UPLOAD = "/deepl/v2/document"
STATUS = UPLOAD + "/{document_id}"
RESULT = STATUS + "/result"
ENDPOINT = "deepl_document"          # the metrics' endpoint label of the uploads and of their jobs' requests
ENDPOINTS: dict[str, str] = {UPLOAD: ENDPOINT}   # path -> the metrics' endpoint label (deepl.FLAVOUR merges it)
FILE_PATHS: frozenset[str] = frozenset({UPLOAD})  # POST paths whose bodies are documents (--max-file-bytes)
# Jobs translating at once per HTTP process: each keeps IN_FLIGHT requests queued, so two fill a batch while the
# requests of other clients (and other documents' jobs, queued meanwhile) still pass.
JOBS_AT_ONCE = 2
IN_FLIGHT = 4
FORMALITIES = frozenset({"default", "prefer_more", "prefer_less"})   # taken: our models have one register
TEXT_FIELDS = ("target_lang", "source_lang", "filename", "glossary_id", "glossary_ids", "formality", "output_format")
# What DeepL stores that nothing here is: refused rather than ignored, since the client names an object of its account
NOT_STORED = {"style_id": "style rules", "translation_memory_id": "translation memories"}
STATES = ("queued", "done", "error")  # transerve_document_jobs_total's
ACTIVE_STATES = ("queued", "translating")   # transerve_document_jobs_active's: a job this process holds now


@dataclass(frozen=True)
class Job:
    """What a running job needs to know of its upload (the rest is in the store)."""
    document_id: str
    tenant: Tenant
    request_id: str
    fmt: str
    source: str              # a served language, or AUTO
    target: str
    glossary_id: str | None
    created: float


@dataclass
class Progress:
    """A running job's characters: all of its texts' and those translated so far (its lease carries them)."""
    chars: int = 0
    translated: int = 0
    ending: bool = False     # its last state is being written: a lease found lost no longer cancels it


def form_fields(form: FormData) -> tuple[UploadFile, dict[str, str]]:
    """The file part and the text fields DeepL's upload takes (blank ones left out), each checked for its kind."""
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise ApiError(400, "invalid_request", "Invalid file data: send the document as the file part `file`")
    fields = {}
    for name in TEXT_FIELDS:
        value = form.get(name)
        if value is not None and not isinstance(value, str):
            raise ApiError(400, "invalid_request", f"Value for '{name}' not supported: send it as a text field")
        if value:
            fields[name] = value.strip()
    if not fields.get("target_lang"):
        raise ApiError(400, "invalid_request", "Parameter 'target_lang' not specified.")
    if given := next((name for name in NOT_STORED if form.get(name)), None):
        raise ApiError(400, "invalid_request", f"Value for '{given}' not supported: no {NOT_STORED[given]} are "
                       "stored here")
    return upload, fields


def file_format(fields: dict[str, str], upload: UploadFile) -> str:
    """The document's format by its name's extension (`filename`, else the file part's name), checked against
    output_format."""
    fmt = format_of(fields.get("filename") or upload.filename or "")
    if fmt is None:
        raise ApiError(400, "unsupported_file_format", "Invalid file data: the file's type is not supported here "
                       f"(by its name's extension); supported: {', '.join('.' + e for e in EXTENSIONS)}")
    wanted = fields.get("output_format")
    if wanted and format_of("." + wanted) != fmt:
        raise ApiError(400, "unsupported_output_format", f"Value for 'output_format' not supported: a document is "
                       f"translated into its own format here (.{fmt})")
    return fmt


def glossary_of(fields: dict[str, str], source: str) -> str | None:
    """The glossary id (glossary_id, or glossary_ids naming one), which DeepL takes only with a source_lang."""
    ids = [i.strip() for i in fields.get("glossary_ids", "").split(",") if i.strip()]
    if "glossary_id" in fields:
        if ids:
            raise ApiError(400, "invalid_request", "glossary_id cannot be used together with glossary_ids")
        ids = [fields["glossary_id"]]
    if len(ids) > 1:
        raise ApiError(400, "invalid_request", "Value for 'glossary_ids' not supported: one glossary per document here")
    if ids and source == AUTO:
        raise ApiError(400, "invalid_request", "Use of a glossary requires the source_lang parameter to be specified")
    return ids[0] if ids else None


async def checked_upload(gateway: Gateway, request: Request) -> tuple[bytes, dict]:
    """The file's bytes and the job's fields, or the 4xx of the first thing wrong. The key comes in a header
    only (the middleware checked it before the body was read): DeepL's older `auth_key` field would mean reading
    a document of --max-file-bytes before knowing whose it is."""
    form = await read_file_form(request, gateway.settings.max_file_bytes, "Invalid file data: send the document as "
                                "multipart/form-data, with the fields file and target_lang", "Invalid file data: ")
    try:
        upload, fields = form_fields(form)
        target = target_language(fields["target_lang"], gateway)
        source = source_language(fields.get("source_lang"), gateway)
        fmt = file_format(fields, upload)
        formality = fields.get("formality", "default").lower()
        if formality not in FORMALITIES:
            raise ApiError(400, "unsupported_formality", "'formality' is not supported for given 'target_lang'."
                           if formality in ("more", "less") else "Value for 'formality' not supported.")
        glossary_id = glossary_of(fields, source)
        data = await upload.read()
    finally:
        await form.close()
    limit = gateway.settings.max_file_bytes
    if len(data) > limit:
        raise ApiError(413, "file_too_large", f"the file has {len(data)} bytes; the limit is {limit} "
                       "(--max-file-bytes)", limit)
    if not data:
        raise ApiError(400, "invalid_request", "Invalid file data: the file is empty")
    if source != AUTO:
        gateway.check_pair(source, target)
        gateway.allow_pair(request, source, target)
    if glossary_id is not None:        # its 404 (not this key's) or 400 (another pair) now, not in the job
        await gateway.glossaries.pairs(gateway.tenant(request).name, glossary_id, source, target)
    return data, {"format": fmt, "source_lang": source, "target_lang": target, "glossary_id": glossary_id or ""}


async def upload_document(gateway: Gateway, jobs: Jobs, request: Request) -> dict:
    data, fields = await checked_upload(gateway, request)
    tenant = gateway.tenant(request)
    document_id, key = await gateway.documents.create(tenant.name, fields, data)
    metrics().document_jobs.labels("queued").inc()
    job = Job(document_id, tenant, request.state.request_id, fields["format"], fields["source_lang"],
              fields["target_lang"], fields["glossary_id"] or None, time.time())
    jobs.start(gateway, job)
    return {"document_id": document_id, "document_key": key}


class Jobs:
    """This HTTP process's running jobs: their tasks (kept, so that none is collected while it runs) and the gate
    that lets JOBS_AT_ONCE of them translate at once."""

    def __init__(self):
        self.gate = asyncio.Semaphore(JOBS_AT_ONCE)
        self.tasks: set[asyncio.Task] = set()

    def start(self, gateway: Gateway, job: Job) -> None:
        # A context of its own: the job outlives its upload, whose trace span and request state end with it
        task = asyncio.get_running_loop().create_task(run_job(gateway, self, job), context=contextvars.Context())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


async def run_job(gateway: Gateway, jobs: Jobs, job: Job) -> None:
    """One job, start to end: its turn waited for (queued, its lease renewed meanwhile), then translated, then
    its result or its failure written. Its lease found lost (a reader failed it: this server was too slow to renew)
    cancels it: what it would write is no longer its to write."""
    store, owner, progress = gateway.documents, job.tenant.name, Progress()
    lease = asyncio.ensure_future(hold(gateway, job, progress, asyncio.current_task()))
    try:
        with active("queued"):
            await jobs.gate.acquire()
        try:
            with active("translating"):
                started = time.time()
                if not await store.change(owner, job.document_id, {"status": "translating", "started": started}):
                    return
                metrics().document_queue_wait.observe(max(0.0, started - job.created))
                result = await translate_document(gateway, job, await store.source(owner, job.document_id),
                                                  progress)
        finally:
            jobs.gate.release()
        progress.ending = True
        if await store.change(owner, job.document_id, {"status": "done", "billed": progress.chars,
                                                       "translated": progress.chars}, result, drop_source=True):
            metrics().document_jobs.labels("done").inc()
    except (ApiError, DocumentError) as e:
        await fail(gateway, job, progress, e.message, e.status)
    except Exception as e:              # its type only: a reader's message or traceback may quote the document
        log.error("a document job failed: %s (request_id=%s)", type(e).__name__, job.request_id)
        await fail(gateway, job, progress, "internal error", 500)
    finally:
        lease.cancel()


@contextmanager
def active(state: str) -> Iterator[None]:
    """transerve_document_jobs_active{state} one higher while the block runs, however it ends (an exception, the
    job cancelled): a gauge left high would show a job that no longer exists."""
    gauge = metrics().document_jobs_active.labels(state)
    gauge.inc()
    try:
        yield
    finally:
        gauge.dec()


async def fail(gateway: Gateway, job: Job, progress: Progress, message: str, status: int) -> None:
    """The job's error written (if it is still this process's), or left to its lease where the store cannot
    answer: the next reader fails it then. Logged by its status alone (the message may quote the document), and by
    its upload's request id, never its document id: that is half of the download's credential."""
    progress.ending = True
    log.info("a document job failed with status %d (request_id=%s)", status, job.request_id)
    try:
        if await gateway.documents.change(job.tenant.name, job.document_id, {"status": "error", "error": message},
                                          drop_source=True):
            metrics().document_jobs.labels("error").inc()
    except ApiError:
        log.warning("a document job's failure could not be written; its lease will run out (request_id=%s)",
                    job.request_id)


async def hold(gateway: Gateway, job: Job, progress: Progress, work: asyncio.Task) -> None:
    """The job's lease, renewed every third of --document-lease-s with its progress, until it is cancelled; a
    renewal refused (the job failed by a reader, or expired) cancels the job's work."""
    store = gateway.documents
    while True:
        await asyncio.sleep(store.lease_s / 3)
        try:
            held = await store.change(job.tenant.name, job.document_id, {"chars": progress.chars,
                                                                          "translated": progress.translated})
        except ApiError:
            continue         # the store down a moment: the next renewal may pass, else the lease runs out
        if not held and not progress.ending:
            log.warning("a document job's lease was lost; stopped (request_id=%s)", job.request_id)
            work.cancel()
            return


async def translate_document(gateway: Gateway, job: Job, data: bytes | None, progress: Progress) -> bytes:
    """The document read, its texts translated, the result written in its format."""
    if data is None:
        raise ApiError(404, "document_not_found", "the uploaded document is gone from the store (expired)")
    try:
        document = await asyncio.to_thread(load, job.fmt, data, Limits(**gateway.settings.document_limits()))
    except DocumentError as e:
        raise ApiError(e.status, e.code, f"the document cannot be translated: {e.message}", e.limit) from None
    texts = document.texts
    progress.chars = sum(map(len, texts))
    request = job_request(job)
    source = job.source
    if source == AUTO:             # a document with nothing to translate comes back as it was
        source = await detect_source(gateway, texts, job.target) if texts else job.target
        gateway.check_pair(source, job.target)
        gateway.allow_pair(request, source, job.target)
    translations = await translate_texts(gateway, request, job, texts, source, progress)
    return await asyncio.to_thread(document.render, translations)


def job_request(job: Job) -> Request:
    """The Request a job's translations go through the Gateway with: the uploading key, the upload's request id (its
    log lines' and traces'), and a client that never goes away (the job is not its upload's connection)."""
    async def never() -> dict:
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    scope = {"type": "http", "method": "POST", "path": UPLOAD, "headers": [], "query_string": b"",
             "state": {"tenant": job.tenant, "request_id": job.request_id}}
    return Request(scope, never)


async def translate_texts(gateway: Gateway, request: Request, job: Job, texts: list[str], source: str,
                          progress: Progress) -> list[str]:
    """The texts' translations in order: requests of at most --max-texts texts and --max-text-chars characters,
    IN_FLIGHT of them queued at once, each with the job's glossary. The first to fail fails them all."""
    limit = gateway.settings.max_text_chars
    if long := next((t for t in texts if len(t) > limit), None):
        raise ApiError(413, "text_too_long", f"a paragraph of the document has {len(long)} characters; the limit "
                       f"is {limit}", limit)
    chunks, current, size = [], [], 0
    for text in texts:
        if current and (len(current) == gateway.settings.max_texts or size + len(text) > limit):
            chunks.append(current)
            current, size = [], 0
        current.append(text)
        size += len(text)
    chunks += [current] if current else []
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(chunk: list[str]) -> list[str]:
        async with gate:
            out = await gateway.translate(TranslateRequest(text=chunk, source_lang=source, target_lang=job.target,
                                                           glossary_id=job.glossary_id), request, ENDPOINT)
        if out is None:
            raise ApiError(503, "cancelled", "the document's translation was cancelled")
        progress.translated += sum(map(len, chunk))
        return [item["text"] for item in out["translations"]]

    tasks = [asyncio.ensure_future(one(chunk)) for chunk in chunks]
    try:
        outs = await asyncio.gather(*tasks)
    finally:
        for task in tasks:           # one request refused: the others are not left running for nothing
            task.cancel()
    return [t for out in outs for t in out]


async def detect_source(gateway: Gateway, texts: list[str], target: str) -> str:
    """No source_lang: the language of the document's first texts, as DeepL detects a document's."""
    lang, confidence = (await gateway.detect([detection_sample(texts)]))[0][0]
    if (lang, target) not in gateway.pairs and lang != target:
        raise ApiError(422, "unsupported_detected_language", f"the document was detected as {deepl_code(lang)} "
                       f"(confidence {confidence}), and no model translates it into {deepl_code(target)}")
    return lang


async def document_key(request: Request) -> str:
    """The document_key a status or download request sends: in a JSON body (DeepL's clients) or a form, never the
    query (it is a credential, and URLs end in proxies' logs); DeepL's 400 for none."""
    ctype = request.headers.get("content-type", "")
    value = None
    if declares_json(ctype):
        try:
            body = json.loads(await request.body() or b"{}")
        except (ValueError, RecursionError):
            raise ApiError(400, "invalid_json", "the body is not valid JSON") from None
        value = body.get("document_key") if isinstance(body, dict) else None
    elif ctype.lower().startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
        try:
            value = (await request.form(max_files=0, max_fields=16)).get("document_key")
        except StarletteHTTPException as e:
            raise ApiError(400, "invalid_request", f"the form cannot be parsed: {e.detail}") from None
    if not isinstance(value, str) or not value:
        raise ApiError(400, "invalid_request", "Parameter 'document_key' not specified.")
    return value


def status_body(document_id: str, job: dict) -> dict:
    """DeepL's status answer: seconds_remaining while translating (once some texts are done), billed_characters
    once done, error_message (and message, as DeepL's own answer has both) for a failed job."""
    body = {"document_id": document_id, "status": job["status"]}
    if job["status"] == "translating" and job.get("translated") and job.get("started"):
        elapsed, chars = time.time() - job["started"], job["chars"] or 0
        body["seconds_remaining"] = max(0, round(elapsed * (chars - job["translated"]) / job["translated"]))
    if job["status"] in ("done", "downloaded"):
        body["billed_characters"] = job["billed"] or 0
    if job["status"] == "error":
        body["error_message"] = body["message"] = job["error"]
    return body


def install(app: FastAPI, gateway: Gateway, errors: dict) -> None:
    """Adds the document routes; `errors`: deepl.py's OpenAPI error responses."""
    jobs = Jobs()
    for state in STATES:             # at 0 from the start: rate() misses a series' first event
        metrics().document_jobs.labels(state)
    for state in ACTIVE_STATES:
        metrics().document_jobs_active.labels(state)
    key_body = {"requestBody": {"required": True, "content": {ctype: {"schema": {
        "type": "object", "required": ["document_key"], "properties": {"document_key": {"type": "string"}}}}
        for ctype in ("application/json", "application/x-www-form-urlencoded")}}}

    async def upload_route(request: Request) -> dict:
        return await upload_document(gateway, jobs, request)

    async def status_route(request: Request, document_id: str) -> dict:
        key = await document_key(request)
        return status_body(document_id, await gateway.documents.find(gateway.tenant(request).name, document_id, key))

    async def result_route(request: Request, document_id: str) -> Response:
        key = await document_key(request)
        job, data = await gateway.documents.take(gateway.tenant(request).name, document_id, key)
        return Response(data, media_type=MEDIA_TYPES[job["format"]],
                        headers={"Content-Disposition": f'attachment; filename="translated.{job["format"]}"'})

    app.add_api_route(UPLOAD, upload_route, methods=["POST"], responses=errors, tags=["deepl"],
                      summary="DeepL-compatible document upload: {\"document_id\", \"document_key\"}; translated "
                              "in the background", openapi_extra=upload_schema())
    app.add_api_route(STATUS, status_route, methods=["POST"], responses=errors, tags=["deepl"],
                      summary="A DeepL document's status", openapi_extra=key_body)
    app.add_api_route(RESULT, result_route, methods=["POST"], tags=["deepl"], openapi_extra=key_body,
                      responses={200: {"description": "The translated file, in its own format", "content": {
                          media: {"schema": {"type": "string", "format": "binary"}}
                          for media in sorted(set(MEDIA_TYPES.values()))}}} | errors,
                      summary="A DeepL document's translation, downloaded once")


def upload_schema() -> dict:
    text = {"type": "string"}
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
        "type": "object", "required": ["file", "target_lang"], "properties": {
            "file": {"type": "string", "format": "binary", "description": "The document: " + ", ".join(
                "." + e for e in EXTENSIONS)},
            "target_lang": text, "source_lang": text | {"description": "None: detected from the first texts"},
            "filename": text | {"description": "The document's name, for its extension, if the file part has none"},
            "glossary_id": text, "formality": {"enum": ["default", "prefer_more", "prefer_less"]},
            "output_format": text | {"description": "The input's own format only"}}}}}}}
