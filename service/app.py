"""The HTTP layer: a LitServer around TranslateAPI, plus the routes LitServe does not have.

    POST /translate                 our API (pydantic models, in the OpenAPI schema at /docs)
    POST /generate                  text generation with a decoder-only package; "stream": true for
                                    server-sent events
    POST /libretranslate/translate  LibreTranslate's API, feeding the same queue and batches
    POST /libretranslate/detect     LibreTranslate's language detection (service/langid.py)
    GET  /languages, /libretranslate/languages
    GET  /health                    liveness: the HTTP process answers
    GET  /ready                     readiness: every inference worker loaded and warmed up (LitServe's check)
    GET  /info                      models, versions, settings
    GET  /metrics                   Prometheus, merged over all processes

LitServe's queue is unbounded and its /translate route would accept any JSON, so we replace that
route with one that validates, bounds the queue (503 + Retry-After when full), records metrics and
turns worker-side failures into status codes; it still submits through LitServe's own request
handler, so batching is untouched.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import AsyncExitStack
from typing import AsyncIterator

import litserve as ls
from fastapi import Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse

from . import __version__, langid, libretranslate, ui
from .admission import Admission
from .auth import check_key, open_paths
from .cancel import CancelBoard
from .config import Settings
from .engine import probe_device
from .errors import ERROR_KIND, ApiError, install_handlers, raise_worker_error
from .generate_api import ENDPOINT as GENERATE, GenerateAPI
from .litserve_bridge import Workers, until_disconnected
from .metrics import metrics, render
from .middleware import request_context
from .openai_api import ENDPOINT as COMPLETIONS, OpenAIRoutes
from .shared.schemas import (AUTO, DetectedLanguage, ErrorResponse, GenerateRequest, GenerateResponse, Language,
                             LibreTranslateDetectRequest, LibreTranslateError, LibreTranslateRequest,
                             LibreTranslateResponse, TranslateRequest, TranslateResponse)
from .stopping import Stopping
from .translate_api import ENDPOINT, TranslateAPI, check_packages
from .uvicorn_bridge import hold_signals

log = logging.getLogger("transerve")

LANGUAGE_NAMES = {"de": "German", "en": "English", "fr": "French", "es": "Spanish", "it": "Italian",
                  "nl": "Dutch", "pt": "Portuguese", "pl": "Polish", "ru": "Russian", "zh": "Chinese",
                  "ja": "Japanese", "cs": "Czech", "da": "Danish", "sv": "Swedish", "fi": "Finnish"}

LITSERVE_INFO = "/litserve/info"   # LitServe always adds an info route; Gateway.install removes it
# The paths whose requests the metrics count (middleware.request_context), each with its `endpoint` label.
COUNTED = {"/translate": ENDPOINT, "/libretranslate/translate": libretranslate.ENDPOINT,
           "/libretranslate/detect": libretranslate.DETECT, "/generate": GENERATE, "/v1/completions": COMPLETIONS}


class Gateway:
    """The routes of the HTTP process: each validates, takes a place (Admission), hands the work to the
    workers (litserve_bridge.Workers) and shapes the answer."""

    def __init__(self, server: ls.LitServer, api: TranslateAPI | None, settings: Settings, packages: list[dict],
                 generate_api: GenerateAPI | None, board: CancelBoard, stopping: Stopping, device: str = "cpu"):
        self.server, self.settings, self.packages, self.board, self.device = server, settings, packages, board, device
        self.stopping = stopping
        self.workers = Workers(server, {ENDPOINT: api, GENERATE: generate_api}, board, settings.request_timeout_s)
        self.admission = Admission(settings.max_queue)
        self.generators = [p["name"] for p in packages if p["task"] == "generation"]
        self.pairs = sorted({tuple(d.split("-")) for p in packages for d in p["directions"]})

    # --- checks -----------------------------------------------------------------------------------
    def check_key(self, request: Request, body_key: str | None = None) -> None:
        check_key(self.settings.api_keys, request, body_key)

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

    def languages(self) -> list[dict]:
        codes = sorted({c for pair in self.pairs for c in pair})
        return [{"code": c, "name": LANGUAGE_NAMES.get(c, c),
                 "targets": sorted(t for s, t in self.pairs if s == c)} for c in codes]

    @staticmethod
    def identity(texts: list[str], lang: str) -> dict:
        """source_lang == target_lang, as argostranslate and LibreTranslate answer it: each text
        unchanged. No model runs, so no worker is asked: score 0.0, no tokens read or written."""
        return {"translations": [{"text": t, "score": 0.0, "alternatives": [], "input_tokens": 0, "output_tokens": 0}
                                 for t in texts],
                "model": "identity", "source_lang": lang, "target_lang": lang,
                "timings": {"queue_ms": 0.0, "inference_ms": 0.0, "total_ms": 0.0}}

    # --- translation ------------------------------------------------------------------------------
    async def translate(self, body: TranslateRequest, request: Request) -> TranslateResponse:
        out = await self.translate_texts(ENDPOINT, body, request)
        if out is None:
            return Response(status_code=499)  # nginx's "client closed request": no one reads it
        return out  # type: ignore[return-value]

    async def translate_texts(self, endpoint: str, body: TranslateRequest, request: Request) -> dict | None:
        """Our answer to a translation request (POST /translate's, or LibreTranslate's as `endpoint`); None
        when the client went away first (its request is then dropped from the worker's queue and from the
        engine batches not yet run)."""
        if body.source_lang == AUTO:
            return await self.translate_detected(endpoint, body, request)
        texts = [body.text] if isinstance(body.text, str) else list(body.text)
        self.check_limits(texts)
        self.check_pair(body.source_lang, body.target_lang)
        if body.source_lang == body.target_lang:
            return self.identity(texts, body.source_lang)
        if not self.workers.serves(ENDPOINT):
            raise no_translation_model()
        received = time.monotonic()
        payload = body.model_dump(exclude={"text"}) | {"texts": texts, "received": received,
                                                       "request_id": request.state.request_id,
                                                       "number": self.board.new_number()}
        with self.admission.admitted(endpoint):
            out = raise_worker_error(await self.workers.call(ENDPOINT, payload, request) or {})
        if not out:
            return None
        metrics().queue_wait.labels(endpoint).observe(out["timings"]["queue_ms"] / 1000)
        out["timings"]["total_ms"] = round((time.monotonic() - received) * 1000, 2)
        return out

    # --- language detection -----------------------------------------------------------------------
    async def detect(self, texts: list[str]) -> list[list[tuple[str, float]]]:
        """Each text's served languages with their confidence, best first (service/langid.py), in a thread:
        the first call loads the model, which must not stall the other requests on this event loop."""
        langs = sorted({c for pair in self.pairs for c in pair})   # what /languages lists: each is a source
        if not langs:
            raise no_translation_model()
        ranked = await asyncio.to_thread(langid.detect, texts, langs)
        if not ranked[0]:
            raise ApiError(422, "undetectable_languages", f"the language detector knows none of the served "
                           f"languages ({', '.join(langs)}); name the source language")
        return ranked

    async def translate_detected(self, endpoint: str, body: TranslateRequest, request: Request) -> dict | None:
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
        received = time.monotonic()
        outs = await asyncio.gather(*(self.translate_texts(
            endpoint, body.model_copy(update={"text": [texts[i] for i in idx], "source_lang": lang}), request)
            for lang, idx in groups.items()))
        if any(out is None for out in outs):
            return None
        items: list[dict] = [{}] * len(texts)
        for (lang, idx), out in zip(groups.items(), outs):
            for i, item in zip(idx, out["translations"]):
                items[i] = item | {"detected_lang": {"language": lang, "confidence": found[i][1]}}
        timings = {k: max(out["timings"][k] for out in outs) for k in ("queue_ms", "inference_ms")}
        return {"translations": items, "model": "+".join(dict.fromkeys(out["model"] for out in outs)),
                "source_lang": next(iter(groups)) if len(groups) == 1 else AUTO, "target_lang": body.target_lang,
                "timings": timings | {"total_ms": round((time.monotonic() - received) * 1000, 2)}}

    # --- generation -------------------------------------------------------------------------------
    async def generate(self, body: GenerateRequest, request: Request):
        self.check_generation(body)
        run = Generation(time.monotonic(), self.board.new_number())
        payload = body.model_dump() | {"received": run.received, "request_id": request.state.request_id,
                                       "number": run.number}
        async with AsyncExitStack() as held:
            events = self.workers.events(GENERATE, payload)
            held.push_async_callback(events.aclose)
            held.enter_context(self.admission.admitted(GENERATE))   # given back first, whatever aclose() does
            first = raise_worker_error(await anext(events))         # a 4xx or 503 is still a status here
            if not body.stream:
                return await self._generation_json(run, first, events, request)
            stream = self._generation_sse(run, first, events, held.pop_all())
        return StreamingResponse(stream, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def _generation_json(self, run: Generation, first: dict, events: AsyncIterator[dict], request: Request):
        watcher = asyncio.ensure_future(until_disconnected(request))
        try:
            run.take(first)
            while run.done is None:   # until the worker's closing event
                reader = asyncio.ensure_future(anext(events))
                await asyncio.wait({reader, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if not reader.done():  # disconnected
                    reader.cancel()
                    await asyncio.wait({reader})  # the generator must stop running before aclose()
                    self.board.cancel(run.number)  # free its rows in the batch
                    return Response(status_code=499)
                run.take(reader.result())
        finally:
            watcher.cancel()
        return run.response(run.timings())

    async def _generation_sse(self, run: Generation, first: dict, events: AsyncIterator[dict],
                              held: AsyncExitStack) -> AsyncIterator[str]:
        completed = False
        try:
            event = first
            while True:
                for p in run.take(event):
                    yield sse({"type": "token", "index": p["index"], "text": p["text"]})
                if run.done is not None:
                    break
                event = await anext(events)
            completed = True
            timings = run.timings()
            await held.aclose()
            yield sse({"type": "done", "model": run.done["model"], "choices": run.done["choices"],
                       "usage": run.done["usage"], "timings": timings})
        except ApiError as e:
            metrics().errors.labels(GENERATE, ERROR_KIND.get(e.status, "internal")).inc()  # the status said 200
            yield sse({"type": "error", "error": {"type": e.type, "message": e.message}})
        finally:
            if not completed:
                self.board.cancel(run.number)  # the client went away, or the worker failed: free its rows
            await held.aclose()
            metrics().request_duration.labels(GENERATE).observe(time.monotonic() - run.received)

    async def libre_translate(self, request: Request) -> Response:
        return await libretranslate.translate(self, request)

    async def libre_detect(self, request: Request) -> Response:
        return await libretranslate.detect(self, request)

    # --- operations -------------------------------------------------------------------------------
    def ready(self) -> PlainTextResponse:
        if self.admission.draining.is_set():
            return PlainTextResponse("draining", status_code=503)
        if self.workers.ready():
            return PlainTextResponse("ok")
        return PlainTextResponse("not ready", status_code=503)

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
                "models": self.packages, "settings": self.settings.public()}

    def install(self) -> None:
        app = self.server.app
        # Error and rejection series exist at 0 from the start: rate() over a series that appears
        # with its first event misses that event, so alerts would not see the first burst.
        for endpoint in COUNTED.values():
            metrics().rejected.labels(endpoint)
            for kind in sorted(set(ERROR_KIND.values()) | {"internal"}):
                metrics().errors.labels(endpoint, kind)
        # Drop LitServe's own POST /translate and readiness check (ours submit through the same handler
        # and know about draining), its info route (ours is /info) and its "litserve running" root.
        app.router.routes = [r for r in app.router.routes if getattr(r, "path", None)
                             not in ("/", "/translate", "/generate", "/ready", LITSERVE_INFO)]
        app.openapi_schema = None
        app.title, app.version = "transerve", __version__
        errors = {c: {"model": ErrorResponse} for c in (400, 401, 403, 413, 422, 503, 504)}
        app.add_api_route("/translate", self.translate, methods=["POST"], response_model=TranslateResponse,
                          response_model_exclude_none=True,   # detected_lang only with source_lang "auto"
                          responses=errors, summary="Translate one text or a list of texts", tags=["translation"])
        app.add_api_route("/generate", self.generate, methods=["POST"], response_model=GenerateResponse,
                          responses=errors | {200: {"content": {"text/event-stream": {}},
                                                    "description": "JSON, or server-sent events with stream=true"}},
                          summary="Continue a prompt with a generation model", tags=["generation"])
        app.add_api_route("/languages", self.languages, methods=["GET"], response_model=list[Language],
                          tags=["translation"])
        body = {"schema": LibreTranslateRequest.model_json_schema()}
        app.add_api_route("/libretranslate/translate", self.libre_translate, methods=["POST"],
                          response_model=LibreTranslateResponse, response_model_exclude_none=True,
                          responses={c: {"model": LibreTranslateError} for c in (400, 401, 403, 413, 422, 503, 504)},
                          openapi_extra={"requestBody": {"required": True, "content": {
                              "application/json": body, "application/x-www-form-urlencoded": body}}},
                          summary="LibreTranslate-compatible translate", tags=["libretranslate"])
        detect = {"schema": LibreTranslateDetectRequest.model_json_schema()}
        app.add_api_route("/libretranslate/detect", self.libre_detect, methods=["POST"],
                          response_model=list[DetectedLanguage],
                          responses={c: {"model": LibreTranslateError} for c in (400, 401, 403, 413, 422)},
                          openapi_extra={"requestBody": {"required": True, "content": {
                              "application/json": detect, "application/x-www-form-urlencoded": detect}}},
                          summary="LibreTranslate-compatible language detection, among the served languages",
                          tags=["libretranslate"])
        app.add_api_route("/libretranslate/languages", self.languages, methods=["GET"],
                          response_model=list[Language], tags=["libretranslate"])
        text = {"content": {"text/plain": {"schema": {"type": "string"}}}}
        app.add_api_route("/health", lambda: PlainTextResponse("ok"), methods=["GET"], tags=["ops"],
                          response_class=PlainTextResponse, responses={200: text},
                          summary="Liveness: the HTTP process answers")
        app.add_api_route("/ready", self.ready, methods=["GET"], tags=["ops"], response_class=PlainTextResponse,
                          responses={200: text, 503: text | {"description": "Not ready, or draining"}},
                          summary="Readiness: every inference worker loaded and warmed up, not draining")
        app.add_api_route("/info", self.info, methods=["GET"], tags=["ops"])
        if not self.settings.metrics_port:   # else on its own port (metrics.serve_metrics, __main__)
            app.add_api_route("/metrics", _metrics, methods=["GET"], tags=["ops"], include_in_schema=False)
        self._describe_served_values(app)
        ui.install(app, self.settings)   # GET /ui, the translate page; /docs and /redoc offline
        install_handlers(app, self.settings.max_payload_bytes)
        app.add_middleware(request_context, endpoints=COUNTED, max_payload_bytes=self.settings.max_payload_bytes,
                           api_keys=tuple(self.settings.api_keys),
                           open_paths=open_paths(public_docs=self.settings.public_docs),
                           body_timeout_s=self.settings.body_timeout_s)

    def _describe_served_values(self, app) -> None:
        """/openapi.json names what this server serves: its languages and generation models as enums, its
        text limits as maxItems/maxLength. The request models accept any well-formed code, so that a wrong
        one gets a 400 listing the right ones; the schema says which ones will be served."""
        langs = sorted({c for pair in self.pairs for c in pair})
        s = self.settings
        text = {"maxLength": s.max_text_chars, "pattern": r"\S"}        # not blank: TranslateRequest refuses that
        texts = {"minItems": 1, "maxItems": s.max_texts, "items": {"type": "string"} | text}
        generate = app.openapi

        def openapi() -> dict:
            if app.openapi_schema is None:
                schema = generate()
                models = schema["components"]["schemas"]
                libre = schema["paths"]["/libretranslate/translate"]["post"]["requestBody"]["content"]
                for body, (src, tgt) in ((models["TranslateRequest"], ("source_lang", "target_lang")),
                                         *((b["schema"], ("source", "target")) for b in libre.values())):
                    if not langs:                # no translation package: nothing to name (an empty anyOf is invalid)
                        break
                    props = body["properties"]
                    props[src]["enum"], props[tgt]["enum"] = [*langs, AUTO], langs
                    # Exactly the served pairs, and each language into itself (returned unchanged); "auto" into
                    # any of them (a detected language with no model to the target is a 422, see
                    # translate_detected: which texts those are, no schema can say).
                    body["anyOf"] = [{"properties": {src: {"const": a}, tgt: {"enum": sorted(
                        {b for x, b in self.pairs if x == a} | {a})}}} for a in langs]
                    body["anyOf"].append({"properties": {src: {"const": AUTO}, tgt: {"enum": langs}}})
                    for one in (props.get("text") or props["q"])["anyOf"]:
                        one.update(text if one["type"] == "string" else texts)
                detect = schema["paths"]["/libretranslate/detect"]["post"]["requestBody"]["content"]
                for one in (q for b in detect.values() for q in b["schema"]["properties"]["q"]["anyOf"]):
                    one.update({"maxLength": s.max_text_chars} if one["type"] == "string" else
                               {"maxItems": s.max_texts, "items": {"type": "string", "minLength": 1,
                                                                    "maxLength": s.max_text_chars}})
                gen = models["GenerateRequest"]["properties"]
                gen["prompt"]["maxLength"] = s.max_text_chars
                if self.generators:
                    gen["model"]["anyOf"][0]["enum"] = self.generators
            return app.openapi_schema

        app.openapi = openapi


class Generation:
    """One /generate request's pieces as the worker's events bring them, and its timings."""

    def __init__(self, received: float, number: int):
        self.received, self.number = received, number
        self.first: float | None = None     # when the first and the latest piece arrived (monotonic)
        self.last: float | None = None
        self.done: dict | None = None       # the worker's closing event: model, choices, usage, queue_ms
        self.texts: dict[int, str] = {}     # choice index -> its text so far

    def take(self, event: dict) -> list[dict]:
        """The event's pieces; a worker's error for this request (after the first event) raised."""
        raise_worker_error(event)
        now = time.monotonic()
        pieces = event.get("pieces", [])
        for p in pieces:
            self.first = self.first or now
            self.last = now
            self.texts[p["index"]] = self.texts.get(p["index"], "") + p["text"]
        if "done" in event:
            self.done = event["done"]
        return pieces

    def timings(self) -> dict:
        """The finished request's timings, observed in the metrics too."""
        model = self.done["model"]
        if self.first is not None:
            metrics().time_to_first_token.labels(GENERATE, model).observe(self.first - self.received)
            most = max(c["tokens"] for c in self.done["choices"])
            if most > 1:
                metrics().time_per_output_token.labels(GENERATE, model).observe((self.last - self.first) / (most - 1))
        metrics().queue_wait.labels(GENERATE).observe(self.done["queue_ms"] / 1000)
        return {"queue_ms": self.done["queue_ms"], "total_ms": round((time.monotonic() - self.received) * 1000, 2),
                "first_token_ms": None if self.first is None else round((self.first - self.received) * 1000, 2)}

    def response(self, timings: dict) -> dict:
        return {"model": self.done["model"], "usage": self.done["usage"], "timings": timings,
                "choices": [c | {"text": self.texts.get(c["index"], "")} for c in self.done["choices"]]}


def no_translation_model() -> ApiError:
    return ApiError(400, "no_translation_model", "no translation model is loaded; start the service with "
                    "--model <a translation package>")


def sse(event: dict) -> str:
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n"


async def _metrics() -> Response:
    body, ctype = render()
    return Response(body, media_type=ctype)


def build_server(settings: Settings) -> tuple[ls.LitServer, Gateway]:
    """Checks the packages and the device, then builds the LitServer (workers start in server.run())."""
    packages = check_packages(settings)
    cuda = settings.device != "cpu" and probe_device(packages[0]["path"], settings.device) == "cuda"
    tasks = {p["task"] for p in packages}
    # One LitAPI per endpoint, each with its own workers, loading only its own packages.
    board = CancelBoard(endpoints=(ENDPOINT, GENERATE))
    stopping = Stopping()   # before LitServe starts any process
    api = TranslateAPI(settings, board, stopping) if "translation" in tasks else None
    generate_api = GenerateAPI(settings, board, stopping) if "generation" in tasks else None
    server = ls.LitServer([a for a in (api, generate_api) if a], accelerator="cuda" if cuda else "cpu",
                          devices=1 if cuda else "auto",
                          workers_per_device=settings.workers, timeout=settings.request_timeout_s,
                          restart_workers=True,  # a dead worker is replaced; without this the server exits
                          healthcheck_path="/ready", info_path=LITSERVE_INFO,
                          max_payload_size=None)  # enforced before reading: middleware.limited_receive
    gateway = Gateway(server, api, settings, packages, generate_api, board, stopping, device="cuda" if cuda else "cpu")
    gateway.install()
    hold_signals(server.app, stopping)   # the HTTP processes wait for the main process's drain
    OpenAIRoutes(gateway).install(server.app)   # /v1/completions, /v1/models: OpenAI's API over /generate's path
    return server, gateway
