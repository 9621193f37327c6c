"""The service as every API flavour sees it, with no route and no wire format of its own: `Gateway` checks a
request (limits, language pair, generation model), takes a place for it (Admission: 503 when the queue is
full), hands it to the workers (litserve_workers.Workers) and gives back typed results:

    translate(body, request)      -> a TranslateResponse-shaped dict, or None when the client went away
    detect(texts)                 -> each text's served languages with their confidence, best first
    languages()                   -> [{"code", "name", "targets"}]
    generate(body, request)       -> a started GenerationStream: Pieces events, then one Finished
    glossaries                    the stored glossaries (glossary_store.GlossaryStore), which translate() reads
                                  a request's glossary_id from
    documents                     DeepL's document jobs (document_jobs.DocumentJobs): their state and files
    cache                         the translation cache (translation_cache.TranslationCache, --cache-size), which
                                  translate() asks before the workers and tells what they answered

Its errors are ApiError, which each flavour answers in its own shape. The flavours (api/native.py,
openai_api.py, libretranslate.py, ui.py) install their routes over it; server.py composes them.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable

import litserve as ls
from fastapi import Request

from .. import __version__
from . import langid
from .admission import Admission
from .auth import add_fields, admit
from .document_jobs import DocumentJobs
from .glossary_store import GlossaryStore
from .translation_cache import TranslationCache
from .keys import ANONYMOUS, KeyRing, allow_model
from .quota import Quota, charges
from ..worker.cancel import CancelBoard
from ..config import Settings
from ..errors import ERROR_KIND, ApiError, raise_worker_error
from ..keyfile import Tenant
from ..worker.generate_api import ENDPOINT as GENERATE, GenerateAPI
from .litserve_workers import Workers, until_disconnected
from .model_control import ModelControl, Route, initial_table
from .models_file import ModelsFile
from ..metrics import labelled, metrics
from ..shared.schemas import AUTO, GenerateRequest, TranslateRequest
from ..stopping import Stopping
from ..worker.model_swap import ModelTable
from ..worker.translate_api import ENDPOINT, TranslateAPI

LANGUAGE_NAMES = {"de": "German", "en": "English", "fr": "French", "es": "Spanish", "it": "Italian",
                  "nl": "Dutch", "pt": "Portuguese", "pl": "Polish", "ru": "Russian", "zh": "Chinese",
                  "ja": "Japanese", "cs": "Czech", "da": "Danish", "sv": "Swedish", "fi": "Finnish"}


def generate_payload(body: GenerateRequest, max_output_tokens: int) -> dict:
    """What the generate worker reads of a request: its prompt, model, sequences, seed and stops, and its engine
    options, mapped once, here (GenerateRequest.to_search_options). ApiError 422 where the request asks more of
    its strategy than it gives."""
    try:
        options = body.to_search_options(max_output_tokens)
    except ValueError as e:
        raise ApiError(422, "invalid_request", str(e)) from None
    return body.model_dump(include={"prompt", "model", "num_return_sequences", "seed", "stop"}) | {
        "options": options}


def translate_payload(body: TranslateRequest, texts: list[str], max_output_tokens: int,
                      stored: list[tuple[str, str]] | None = None) -> dict:
    """What the translate worker reads of a request: its texts, its pair and its engine options, mapped once,
    here (TranslateRequest.to_search_options); the worker applies no default of its own. Its glossary: the
    request's own, or the entries of the stored one its glossary_id names (`stored`), under the same key."""
    return {"texts": texts, "source_lang": body.source_lang, "target_lang": body.target_lang,
            "options": body.to_search_options(max_output_tokens),
            "glossary": stored if body.glossary_id is not None else body.glossary_pairs()}


class Gateway:
    """Checks, admits and hands work to the workers; knows no API flavour."""

    def __init__(self, server: ls.LitServer, api: TranslateAPI | None, settings: Settings, packages: list[dict],
                 generate_api: GenerateAPI | None, board: CancelBoard, stopping: Stopping, device: str = "cpu",
                 models: ModelTable | None = None):
        self.settings, self.packages, self.board, self.device = settings, packages, board, device
        self.stopping = stopping
        self.workers = Workers(server, {ENDPOINT: api, GENERATE: generate_api}, board, settings.request_timeout_s)
        self.admission = Admission(settings.max_queue)
        self.keys = KeyRing(settings.api_keys, settings.api_keys_file)   # made before the HTTP processes fork
        self.quota = Quota(settings)
        self.glossaries = GlossaryStore(settings)
        self.documents = DocumentJobs(settings)
        # What each HTTP process starts as its server starts, besides the models file's poller (`started`): the
        # document jobs' sweep, and the flavours' (LibreTranslate's files)
        self.at_start: list[Callable[[], None]] = [self.documents.start_sweeping]
        self.cache = TranslationCache(settings)   # --cache-size: translate() asks it first, then keeps what it sent
        self.generators = [p["name"] for p in packages if p["task"] == "generation"]
        if models is None:                      # the workers' table (server.build_server), or one of its own
            models = ModelTable()
            models.write(initial_table(packages))
        # The translation packages' versions, which serves a request, their changes (http/model_control.py)
        self.models = ModelControl(models, self.workers, settings, sorted(
            {tuple(d.split("-")) for p in packages if p["task"] != "translation" for d in p["directions"]}))
        self.models.file = ModelsFile(settings.models_file, self.models) if settings.models_file else None

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """The served language pairs, as model control has them now."""
        return self.models.pairs()

    def route_for(self, request: Request, source: str, target: str) -> Route | None:
        """The version that serves the request's source-target (a canary's share drawn once per request and pair,
        kept in its state): its slot goes to the worker, its checksum keys what is kept of its answers."""
        routes = request.scope["state"].setdefault("model_routes", {})
        if (source, target) not in routes:
            name = self.models.name_for(source, target)
            routes[(source, target)] = None if name is None else self.models.route(name, self.tenant(request).name)
        return routes[(source, target)]

    # --- checks -----------------------------------------------------------------------------------
    async def check_key(self, request: Request, body_key: str | None = None) -> None:
        """The key of a request the middleware let through without one in its headers (LibreTranslate's api_key
        field): identified, allowed and counted as the middleware does (auth.admit); 401/403/429 if not."""
        state = request.scope["state"]
        if "tenant" not in state:
            await admit(self.keys, self.quota, state, request.url.path, request.headers.get("authorization", ""),
                        request.headers.get("x-api-key"), body_key)

    @staticmethod
    def tenant(request: Request) -> Tenant:
        return request.scope.get("state", {}).get("tenant", ANONYMOUS)

    async def charge_characters(self, request: Request, texts: list[str]) -> None:
        """A translation's characters against its key's limits, before it is queued (429 over one)."""
        tenant, n = self.tenant(request), sum(len(t) for t in texts)
        add_fields(request.scope["state"], await self.quota.take(tenant, charges(tenant, characters=n)))
        labelled(metrics().key_characters, tenant.name).inc(n)

    def allow_pair(self, request: Request, source: str, target: str) -> None:
        """403 when the request's key may not use the package that translates source-target."""
        tenant = self.tenant(request)
        if tenant.models is not None and source != target:
            allow_model(tenant, self.models.name_for(source, target) or f"{source}-{target}")

    def check_limits(self, texts: list[str]) -> None:
        s = self.settings
        if len(texts) > s.max_texts:
            raise ApiError(413, "too_many_texts", f"{len(texts)} texts in one request; the limit is {s.max_texts}",
                           s.max_texts)
        for i, t in enumerate(texts):
            if len(t) > s.max_text_chars:
                raise ApiError(413, "text_too_long", f"text[{i}] has {len(t)} characters; the limit is "
                               f"{s.max_text_chars}", s.max_text_chars)

    def check_pair(self, source: str, target: str) -> None:
        """Served pairs, and a served language into itself (identity: see identity())."""
        if (source, target) not in self.pairs and not (source == target and any(source in p for p in self.pairs)):
            raise ApiError(400, "unsupported_language_pair",
                           f"no model translates {source}-{target}; {self.pairs_text()}")

    def pairs_text(self) -> str:
        return "available pairs: " + ", ".join(f"{a}-{b}" for a, b in self.pairs)

    def check_generation(self, body: GenerateRequest) -> None:
        if not self.generators:
            raise ApiError(400, "no_generation_model", "no generation model is loaded; start the service with "
                           "--model <a generation package> (model.json task \"generation\")")
        if body.model is not None and body.model not in self.generators:
            raise ApiError(400, "unknown_model", f"no generation model {body.model!r}; loaded: "
                           f"{', '.join(self.generators)}")
        if len(body.prompt) > self.settings.max_text_chars:
            raise ApiError(413, "text_too_long", f"the prompt has {len(body.prompt)} characters; the limit is "
                           f"{self.settings.max_text_chars}", self.settings.max_text_chars)

    def source_languages(self) -> list[str]:
        return sorted({c for pair in self.pairs for c in pair})

    def languages(self) -> list[dict]:
        return [{"code": c, "name": LANGUAGE_NAMES.get(c, c),
                 "targets": sorted(t for s, t in self.pairs if s == c)} for c in self.source_languages()]

    @staticmethod
    def identity(texts: list[str], lang: str) -> dict:
        """source_lang == target_lang, as argostranslate and LibreTranslate answer it: each text
        unchanged. No model runs, so no worker is asked: score 0.0, no tokens read or written."""
        return {"translations": [{"text": t, "score": 0.0, "alternatives": [], "input_tokens": 0, "output_tokens": 0}
                                 for t in texts],
                "model": "identity", "source_lang": lang, "target_lang": lang,
                "timings": {"queue_ms": 0.0, "inference_ms": 0.0, "total_ms": 0.0}}

    # --- translation ------------------------------------------------------------------------------
    async def translate(self, body: TranslateRequest, request: Request, endpoint: str = ENDPOINT,
                        charged: bool = False) -> dict | None:
        """The answer to a translation request (TranslateResponse's shape); None when the client went away
        first (its request is then dropped from the worker's queue and from the engine batches not yet run).
        `endpoint`: the label its admission counts under (the flavour's); `charged`: its characters were
        counted against its key already (source "auto": all at once, before it is split by language)."""
        if body.source_lang == AUTO:
            return await self.translate_detected(body, request, endpoint)
        texts = [body.text] if isinstance(body.text, str) else list(body.text)
        self.check_limits(texts)
        self.check_pair(body.source_lang, body.target_lang)
        self.allow_pair(request, body.source_lang, body.target_lang)
        stored = None if body.glossary_id is None else await self.glossaries.pairs(
            self.tenant(request).name, body.glossary_id, body.source_lang, body.target_lang)   # 404, 400 first
        if not charged:
            await self.charge_characters(request, texts)
        if body.source_lang == body.target_lang:
            return self.noted(request, texts, self.identity(texts, body.source_lang))
        if not self.workers.serves(ENDPOINT):
            raise no_translation_model()
        received = time.monotonic()
        route, out = self.route_for(request, body.source_lang, body.target_lang), {}
        fields = translate_payload(body, texts, self.settings.max_output_tokens, stored)
        # What this version answered this key before skips queue and worker
        cached = await self.cache.lookup(fields, route, self.tenant(request).name)
        if sent := cached.sent():
            out = await self.computed(fields | {"texts": sent, "received": received}, route, request, endpoint)
            if out and cached.mixed(out):   # a swap unloaded the routed version: all of it from the one answering
                metrics().translation_cache_resent.inc()
                cached = cached.whole()
                out = await self.computed(fields | {"received": received}, route, request, endpoint)
            if not out:
                return None
            self.cache.store(cached, out)
        out = cached.answer(out or None)
        request.scope["state"]["model_version"] = out.get("model_version")   # X-Model-Version (middleware)
        out["timings"]["total_ms"] = round((time.monotonic() - received) * 1000, 2)
        return self.noted(request, texts, out)

    async def computed(self, payload: dict, route: Route | None, request: Request, endpoint: str) -> dict:
        """The workers' answer to a translation's `payload` (translate_payload's fields, its texts to send and when it
        was received), admitted and counted by the version it was routed to; {} when the client went away."""
        out: dict = {}
        payload |= {"request_id": request.state.request_id, "number": self.board.new_number(),
                    "slot": route and route.slot}
        with self.admission.admitted(endpoint), self.models.observed(route, out):
            out.update(raise_worker_error(await self.workers.call(ENDPOINT, payload, request) or {}))
        if out:
            labelled(metrics().queue_wait, endpoint).observe(out["timings"]["queue_ms"] / 1000)
        return out

    @staticmethod
    def noted(request: Request, texts: list[str], out: dict) -> dict:
        """`out`, its counts and timings noted for the access line (service/logs.py): numbers, never text."""
        items = out["translations"]
        request.scope["state"]["access"] = {
            "chars_in": sum(map(len, texts)), "chars_out": sum(len(i["text"]) for i in items),
            "tokens_in": sum(i["input_tokens"] for i in items), "tokens_out": sum(i["output_tokens"] for i in items),
            "queue_ms": out["timings"]["queue_ms"], "inference_ms": out["timings"]["inference_ms"],
            "model": out["model"]}
        return out

    async def translate_detected(self, body: TranslateRequest, request: Request, endpoint: str) -> dict | None:
        """source_lang "auto": each text's language detected, each language's texts translated as one request
        (concurrently), the items put back in order with what was detected. A detected language that no model
        takes to target_lang is a 422 (the schema cannot say which texts those are), before any translating."""
        texts = [body.text] if isinstance(body.text, str) else list(body.text)
        self.check_limits(texts)
        if not any(body.target_lang in pair for pair in self.pairs):
            self.check_pair(AUTO, body.target_lang)   # the 400 of an unserved target, whatever is detected
        found = [r[0] for r in await self.detect(texts)]
        groups: dict[str, list[int]] = {}
        for i, (lang, _) in enumerate(found):
            groups.setdefault(lang, []).append(i)
        for lang, idx in groups.items():
            if (lang, body.target_lang) not in self.pairs and lang != body.target_lang:
                where = "text" if isinstance(body.text, str) else f"text[{idx[0]}]"
                raise ApiError(422, "unsupported_detected_language",
                               f"{where} was detected as {lang} (confidence {found[idx[0]][1]}), and no model "
                               f"translates {lang}-{body.target_lang}; {self.pairs_text()}; name source_lang "
                               "to translate it from another language")
        for lang in groups:
            self.allow_pair(request, lang, body.target_lang)
        await self.charge_characters(request, texts)
        received = time.monotonic()
        outs = await asyncio.gather(*(self.translate(
            body.model_copy(update={"text": [texts[i] for i in idx], "source_lang": lang}), request, endpoint,
            charged=True) for lang, idx in groups.items()))
        if any(out is None for out in outs):
            return None
        items: list[dict] = [{}] * len(texts)
        for (lang, idx), out in zip(groups.items(), outs):
            for i, item in zip(idx, out["translations"]):
                items[i] = item | {"detected_lang": {"language": lang, "confidence": found[i][1]}}
        timings = {k: max(out["timings"][k] for out in outs) for k in ("queue_ms", "inference_ms")}
        versions = "+".join(dict.fromkeys(v for out in outs if (v := out.get("model_version")))) or None
        request.scope["state"]["model_version"] = versions
        return self.noted(request, texts, {
            "translations": items, "model": "+".join(dict.fromkeys(out["model"] for out in outs)),
            "model_version": versions,
            "source_lang": next(iter(groups)) if len(groups) == 1 else AUTO, "target_lang": body.target_lang,
            "timings": timings | {"total_ms": round((time.monotonic() - received) * 1000, 2)}})

    # --- language detection -----------------------------------------------------------------------
    async def detect(self, texts: list[str]) -> list[list[tuple[str, float]]]:
        """Each text's served languages with their confidence, best first (service/http/langid.py), in a thread:
        the first call loads the model, which must not stall the other requests on this event loop."""
        langs = self.source_languages()   # what /languages lists: each is a source
        if not langs:
            raise no_translation_model()
        ranked = await asyncio.to_thread(langid.detect, texts, langs)
        if not ranked[0]:
            raise ApiError(422, "undetectable_languages", f"the language detector knows none of the served "
                           f"languages ({', '.join(langs)}); name the source language")
        return ranked

    # --- generation -------------------------------------------------------------------------------
    async def generate(self, body: GenerateRequest, request: Request) -> GenerationStream:
        """The request's stream, started: its checks, its place in the queue and the worker's first event
        are behind it, so that a 4xx or 503 is still raised here, before any answer starts."""
        self.check_generation(body)
        fields = generate_payload(body, self.settings.max_output_tokens)   # a 422 before any quota is taken
        tenant = self.tenant(request)
        allow_model(tenant, body.model or self.generators[0])
        add_fields(request.scope["state"], await self.quota.take(tenant, charges(tenant, tokens=0)))
        received, number = time.monotonic(), self.board.new_number()
        payload = fields | {"received": received, "request_id": request.state.request_id, "number": number}
        async with AsyncExitStack() as held:
            events = self.workers.events(GENERATE, payload)
            held.push_async_callback(events.aclose)
            held.enter_context(self.admission.admitted(GENERATE))   # given back first, whatever aclose() does
            first = raise_worker_error(await anext(events))
            stream = GenerationStream(self.board, number, received, body.stream, first, events, held.pop_all())
            stream.spent = lambda finished: self.count_tokens(tenant, finished, request.scope["state"])
            return stream

    async def count_tokens(self, tenant: Tenant, finished: Finished, state: dict) -> None:
        """A finished generation's tokens against its key's tokens per day (counted after the fact: how many a
        generation takes is known only at its end; the next request over the limit is refused), and noted for
        the access line (summed over the prompts of one request)."""
        usage = finished.usage
        n = usage["prompt_tokens"] + usage["completion_tokens"]
        noted = state.setdefault("access", {"tokens_in": 0, "tokens_out": 0})
        noted |= {"tokens_in": noted.get("tokens_in", 0) + usage["prompt_tokens"], "model": finished.model,
                  "tokens_out": noted.get("tokens_out", 0) + usage["completion_tokens"],
                  "queue_ms": finished.timings["queue_ms"]}
        metrics().key_tokens.labels(tenant.name).inc(n)
        try:
            await self.quota.take(tenant, charges(tenant, tokens=n))
        except ApiError:   # Redis down with --redis-down refuse: the answer is out already, nothing to refuse
            pass

    # --- operations -------------------------------------------------------------------------------
    def started(self) -> None:
        """What each HTTP process starts on its event loop as its server starts: the models file's poller, and the
        document jobs' and the flavours' sweeps (`at_start`), so that a restarted server deletes the jobs and files
        that expire while it waits for its first upload."""
        self.models.watch()
        for start in self.at_start:
            start()

    def readiness(self) -> tuple[bool, str]:
        if self.admission.draining():
            return False, "draining"
        return (True, "ok") if self.workers.ready() else (False, "not ready")

    def drain_and_stop(self, grace_s: float) -> None:
        """SIGINT or SIGTERM: refuse new requests (and fail /ready), let the admitted ones finish, then stop
        every process (service/stopping.py)."""
        self.admission.drain(grace_s)
        self.stopping.order()
        self.workers.stop()

    def info(self) -> dict:
        import onnxruntime
        import pydantic

        return {"service": "transerve", "version": __version__,
                "versions": {"litserve": ls.__version__, "onnxruntime": onnxruntime.__version__,
                             "pydantic": pydantic.__version__},
                "providers": onnxruntime.get_available_providers(), "device": self.device,
                "models": self.served_packages(), "settings": self.settings.public()}

    def served_packages(self) -> list[dict]:
        """The packages serving now: generation's as started; translation's as model control has them (each
        model's active version, its version id beside): after a load or an unload, not as at start-up."""
        started = {str(Path(p["path"]).resolve()): p for p in self.packages}   # the table's paths are resolved
        out = []
        for name, model in sorted(self.models.table.read().get("models", {}).items()):
            version = model["versions"][model["active"]]
            out.append(started.get(version["path"], {"path": version["path"]}) | {
                "name": name, "task": "translation", "directions": version["directions"], "version": model["active"]})
        return out + [p for p in self.packages if p["task"] != "translation"]


# --- a generation's typed events ---------------------------------------------------------------------
@dataclass
class Pieces:
    """New text: one {"index": choice, "text": piece} per choice that grew at this step."""
    pieces: list[dict]


@dataclass
class Finished:
    """The closing event: each choice with its whole text, finish reason and tokens; usage; timings."""
    model: str
    choices: list[dict]
    usage: dict
    timings: dict


class GenerationStream:
    """One generation request's events as its worker sends them: Pieces, then one Finished. A worker's failure
    after the start is raised from the iteration as an ApiError (a stream's counted in the errors metric here:
    its client saw a 200). Closing it before Finished (aclose) cancels its rows in the batch; either way its
    place in the queue is given back when it ends."""

    def __init__(self, board: CancelBoard, number: int, received: float, streamed: bool, first: dict,
                 events: AsyncIterator[dict], held: AsyncExitStack):
        self.board, self.number, self.received, self.streamed = board, number, received, streamed
        self.events, self.held = events, held
        self.pending: dict | None = first        # the worker's first event, taken to raise its 4xx in time
        self.first_at: float | None = None       # when the first and the latest piece arrived (monotonic)
        self.last_at: float | None = None
        self.texts: dict[int, str] = {}          # choice index -> its text so far
        self.finished: Finished | None = None
        self.spent: Callable[[Finished], Awaitable[None]] | None = None   # told once finished (Gateway)
        self.told = False                        # Finished was returned
        self.closed = False

    def __aiter__(self) -> GenerationStream:
        return self

    async def __anext__(self) -> Pieces | Finished:
        if self.finished is None and not self.closed:
            try:
                event, self.pending = self.pending or await anext(self.events), None
                pieces = self._take(raise_worker_error(event))
            except ApiError as e:
                if self.streamed:
                    metrics().errors.labels(GENERATE, ERROR_KIND.get(e.status, "internal")).inc()
                await self.aclose()
                raise
            except StopAsyncIteration:   # the worker ended without its closing event: not expected
                await self.aclose()
                raise ApiError(500, "internal_error", "the generation ended without its result") from None
            if self.finished is not None:
                await self.aclose()              # its place given back before the closing event is sent
            if pieces.pieces or self.finished is None:
                return pieces
        if self.finished is not None and not self.told:
            self.told = True
            return self.finished
        raise StopAsyncIteration

    def _take(self, event: dict) -> Pieces:
        """The event's pieces; its Finished kept for the next call when it is the closing one."""
        now = time.monotonic()
        pieces = event.get("pieces", [])
        for p in pieces:
            self.first_at = self.first_at or now
            self.last_at = now
            self.texts[p["index"]] = self.texts.get(p["index"], "") + p["text"]
        if "done" in event:
            done = event["done"]
            choices = [c | {"text": self.texts.get(c["index"], "")} for c in done["choices"]]
            self.finished = Finished(done["model"], choices, done["usage"], self._timings(done))
        return Pieces(pieces)

    def _timings(self, done: dict) -> dict:
        """The finished request's timings, observed in the metrics too."""
        model = done["model"]
        if self.first_at is not None:
            metrics().time_to_first_token.labels(GENERATE, model).observe(self.first_at - self.received)
            most = max(c["tokens"] for c in done["choices"])
            if most > 1:
                metrics().time_per_output_token.labels(GENERATE, model).observe(
                    (self.last_at - self.first_at) / (most - 1))
        metrics().queue_wait.labels(GENERATE).observe(done["queue_ms"] / 1000)
        return {"queue_ms": done["queue_ms"], "total_ms": round((time.monotonic() - self.received) * 1000, 2),
                "first_token_ms": None if self.first_at is None else round((self.first_at - self.received) * 1000, 2)}

    async def result(self, request: Request) -> Finished | None:
        """Every event read to the Finished one; None when the client went away first (its rows cancelled at
        once, not at the next event: a request that is not streamed gets none before its last)."""
        watcher = asyncio.ensure_future(until_disconnected(request))
        try:
            while True:
                reader = asyncio.ensure_future(anext(self, None))
                await asyncio.wait({reader, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if not reader.done():            # disconnected
                    reader.cancel()
                    await asyncio.wait({reader})  # the worker's generator must stop running before aclose()
                    return None
                event = reader.result()
                if event is None or isinstance(event, Finished):
                    return self.finished
        finally:
            watcher.cancel()
            await self.aclose()

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.finished is None:
            self.board.cancel(self.number)       # the client went away, or the worker failed: free its rows
        await self.held.aclose()
        if self.finished is not None and self.spent is not None:
            await self.spent(self.finished)
        if self.streamed:    # a JSON answer's duration is the middleware's, as any request's
            metrics().request_duration.labels(GENERATE).observe(time.monotonic() - self.received)


def no_translation_model() -> ApiError:
    return ApiError(400, "no_translation_model", "no translation model is loaded; start the service with "
                    "--model <a translation package>")
