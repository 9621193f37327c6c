"""The HTTP layer: a LitServer around TranslateAPI, plus the routes LitServe does not have.

    POST /translate                 our API (pydantic models, in the OpenAPI schema at /docs)
    POST /generate                  text generation with a decoder-only package; "stream": true for
                                    server-sent events
    POST /libretranslate/translate  LibreTranslate's API, feeding the same queue and batches
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
import hmac
import json
import logging
import multiprocessing as mp
import pickle
import time
import uuid
from collections import deque
from contextlib import contextmanager
from typing import Any, AsyncIterator

import litserve as ls
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from litserve.server import RegularRequestHandler, StreamingRequestHandler
from litserve.utils import LitAPIStatus, ResponseBufferItem, WorkerSetupStatus
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import __version__
from .config import Settings
from .metrics import m, render
from .batching import IDLE_WAKE_S
from .cancel import CancelBoard
from .generate_api import ENDPOINT as GENERATE, GenerateAPI
from .schemas import (ErrorResponse, GenerateRequest, GenerateResponse, Language, LibreTranslateError,
                      LibreTranslateRequest, LibreTranslateResponse, TranslateRequest, TranslateResponse)
from .engine import probe_device
from .translate_api import ENDPOINT, TranslateAPI, check_packages

log = logging.getLogger("transerve")

LANGUAGE_NAMES = {"de": "German", "en": "English", "fr": "French", "es": "Spanish", "it": "Italian",
                  "nl": "Dutch", "pt": "Portuguese", "pl": "Polish", "ru": "Russian", "zh": "Chinese",
                  "ja": "Japanese", "cs": "Czech", "da": "Danish", "sv": "Swedish", "fi": "Finnish"}


class ApiError(Exception):
    def __init__(self, status: int, type_: str, message: str, limit: int | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.type, self.message, self.limit, self.headers = status, type_, message, limit, headers or {}

    def body(self, request_id: str | None) -> dict:
        err: dict[str, Any] = {"type": self.type, "message": self.message}
        if self.limit is not None:
            err["limit"] = self.limit
        return {"error": err, "request_id": request_id}


LITSERVE_INFO = "/litserve/info"   # LitServe always adds an info route; Gateway.install removes it

ERROR_KIND = {400: "validation", 401: "auth", 403: "auth", 413: "limit", 422: "validation", 429: "overload",
              503: "overload", 504: "timeout"}


class Gateway:
    """Routes, limits and metrics of the HTTP process."""

    def __init__(self, server: ls.LitServer, api: TranslateAPI | None, settings: Settings, packages: list[dict],
                 generate_api: GenerateAPI | None = None, board: CancelBoard | None = None):
        self.server, self.api, self.settings, self.packages = server, api, settings, packages
        self.handler = RegularRequestHandler(api, server) if api else None
        self.generate_handler = StreamingRequestHandler(generate_api, server) if generate_api else None
        self.board = board
        self.generators = [p["name"] for p in packages if p["task"] == "generation"]
        # Shared by every HTTP process (LitServe forks them after this): the queue bound is global,
        # and SIGTERM in the main process can see when the last request has been answered.
        self.active = mp.Value("i", 0)
        self.draining = mp.Event()
        self.pairs = sorted({tuple(d.split("-")) for p in packages for d in p["directions"]})
        self._watcher: asyncio.Future | None = None      # see worker_lost(); per HTTP process
        self._lost: dict[str, asyncio.Event] = {}
        self._lost_at: dict[str, float] = {}              # when the watcher last saw a worker stop (monotonic)
        self.device = "cpu"                              # where the engines run: build_server probes it

    # --- the one way into the queues ---------------------------------------------------------------
    @contextmanager
    def admitted(self, endpoint: str):
        """Holds one of the max_queue places shared by every HTTP process, or refuses with 503."""
        if self.draining.is_set():
            raise ApiError(503, "shutting_down", "the server is shutting down; retry on another replica",
                           headers={"Retry-After": "1"})
        with self.active.get_lock():
            full = self.active.value >= self.settings.max_queue
            if not full:
                self.active.value += 1
        if full:
            m().rejected.labels(endpoint).inc()
            raise ApiError(503, "overloaded", f"{self.settings.max_queue} requests are already waiting; retry later",
                           self.settings.max_queue, {"Retry-After": "1"})
        m().in_flight.labels(endpoint).inc()
        try:
            yield
        finally:
            with self.active.get_lock():
                self.active.value -= 1
            m().in_flight.labels(endpoint).dec()

    async def submit(self, endpoint: str, payload: dict, request: Request | None = None) -> dict | None:
        """The worker's answer to a /translate payload; None when the client went away first (its
        request is then dropped from the worker's queue and from the engine batches not yet run)."""
        if self.handler is None:
            raise ApiError(400, "no_translation_model", "no translation model is loaded; start the service with "
                           "--model <a translation package>")
        with self.admitted(endpoint):
            out = await self._submit(payload, request)
        if out is not None and "error" in out:
            e = out["error"]
            raise ApiError(out["status"], e["type"], e["message"], e.get("limit"))
        return out

    async def _submit(self, payload: dict, request: Request | None) -> dict | None:
        # LitServe's timeout only evicts requests still queued, and its monitor does not reach this
        # process's requests when a worker dies: without these two bounds such a request would wait
        # forever. A worker that stops being ready fails the requests in flight at once (503, retry);
        # twice the queue timeout bounds queue wait plus the longest computation (504).
        deadline = 2 * self.settings.request_timeout_s
        uid = await self._enqueue(self.handler, ENDPOINT, payload)
        answered = asyncio.Event()
        self.server.response_buffer[uid] = item = ResponseBufferItem(answered)
        waits = {asyncio.ensure_future(answered.wait()): "answered",
                 asyncio.ensure_future(self.worker_lost(ENDPOINT).wait()): "worker lost"}
        if request is not None:
            waits[asyncio.ensure_future(self._watch_disconnect(request))] = "client gone"
        try:
            done, _ = await asyncio.wait(waits, timeout=deadline, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
            self.server.response_buffer.pop(uid, None)  # a late answer then finds no one waiting
        what = {waits[t] for t in done}
        if "answered" in what:
            response, status = item.response
            if status != LitAPIStatus.ERROR:
                return response
            try:
                self.handler._handle_error_response(response)   # raises LitServe's HTTPException
            except StarletteHTTPException as e:
                if e.status_code == 504:  # LitServe evicted it from the queue before a worker took it
                    raise ApiError(504, "timeout", f"the request waited more than {self.settings.request_timeout_s:g} "
                                   "s for a worker", headers={"Retry-After": "5"}) from None
            # The worker failed the whole batch or died under it (LitServe restarts it): worth a retry.
            raise ApiError(503, "worker_failed", "the inference worker failed while running this request; retry",
                           headers={"Retry-After": "1"})
        if "client gone" in what:
            self.board.cancel(payload["number"])  # the worker skips it, queued or between engine batches
            m().cancelled.labels(ENDPOINT).inc()
            return None
        if "worker lost" in what:
            # Its payload may still wait in the queue: the restarted worker must not spend time on it.
            self.board.cancel(payload["number"])
            raise ApiError(503, "worker_failed", "the inference worker stopped while running this request "
                           "(it is being restarted); retry", headers={"Retry-After": "2"})
        raise ApiError(504, "timeout", f"no answer within {deadline:g} s", headers={"Retry-After": "5"})

    async def worker_events(self, payload: dict) -> AsyncIterator[dict]:
        """Submits to the generation workers and yields their per-step events for this request."""
        uid = await self._enqueue(self.generate_handler, GENERATE, payload)
        available, queue = asyncio.Event(), deque()
        self.server.response_buffer[uid] = ResponseBufferItem(event=available, response_queue=queue)
        stream = self.server.data_streamer(queue, data_available=available, send_status=True)
        # As in _submit: a worker that dies sends nothing more, so each wait races the worker watcher.
        lost = asyncio.ensure_future(self.worker_lost(GENERATE).wait())
        step = None
        try:
            while True:
                step = asyncio.ensure_future(anext(stream))
                await asyncio.wait({step, lost}, return_when=asyncio.FIRST_COMPLETED)
                if not step.done():
                    raise ApiError(503, "worker_failed", "the generation worker stopped while running this "
                                   "request (it is being restarted); retry", headers={"Retry-After": "2"})
                try:
                    data, status = step.result()
                except StopAsyncIteration:
                    return
                if status == LitAPIStatus.ERROR:
                    try:
                        err = pickle.loads(data) if isinstance(data, bytes) else data
                    except Exception:
                        err = None
                    if getattr(err, "status_code", None) == 504:
                        raise ApiError(504, "timeout", f"the request waited more than "
                                       f"{self.settings.request_timeout_s:g} s for a worker", headers={"Retry-After": "5"})
                    raise ApiError(503, "worker_failed", "the inference worker failed while running this request; "
                                   "retry", headers={"Retry-After": "1"})
                if data:
                    yield json.loads(data) if isinstance(data, (str, bytes)) else data
        finally:
            lost.cancel()
            if step is not None and not step.done():
                # Worker lost, or this request cancelled (its client went away) while waiting: the
                # streamer must stop running before aclose(), and the cancellation must not stop that wait.
                # A payload still in the queue is skipped by whichever worker takes it (a restarted one).
                self.board.cancel(payload["number"])
                step.cancel()
                await asyncio.shield(asyncio.wait({step}))
            await stream.aclose()
            self.server.response_buffer.pop(uid, None)

    async def _enqueue(self, handler, queue: str, payload: dict) -> str:
        """Puts a request on a worker queue; its uid. The queue-depth gauge goes up here and down only
        where a worker takes the request off the queue (batching.collect), whatever happens after.

        Held back for a moment after a worker of `queue` was lost: LitServe's queues live in a manager
        process, and a get() the dead worker was waiting in goes on there until its timeout
        (batching.IDLE_WAKE_S), handing the next request put on the queue to no one. A request put before
        the loss was seen fails with the others (worker_lost); one put after must wait that get out."""
        lost_at = self._lost_at.get(queue)
        if lost_at is not None and (wait := lost_at + IDLE_WAKE_S + 0.5 - time.monotonic()) > 0:
            await asyncio.sleep(wait)
        m().queue_depth.labels(queue).inc()   # before the put: the worker may take it at once
        try:
            return (await handler._submit_request(payload))[0]
        except BaseException:
            m().queue_depth.labels(queue).dec()
            raise

    def worker_lost(self, endpoint: str) -> asyncio.Event:
        """An event set when a worker of `endpoint` stops being ready or a new one starts (it died;
        LitServe restarts it). One watcher per HTTP process polls the shared worker states and start
        counts twice a second, whatever the load: a small model's new worker can be ready again before
        the next poll, so its start is what shows the death."""
        if self._watcher is None or self._watcher.done():
            self._lost, self._watcher = {}, asyncio.ensure_future(self._watch_workers())
        return self._lost.setdefault(endpoint, asyncio.Event())

    async def _watch_workers(self) -> None:
        status = getattr(self.server, "workers_setup_status", None)
        seen: dict[str, str] = {}
        starts = self.board.worker_starts() if self.board else {}
        while status is not None:
            await asyncio.sleep(0.5)
            try:
                now = status.copy()  # one round trip to the manager process
            except Exception:  # the manager is gone: shutting down
                return
            lost = {key.rsplit("_", 1)[0] for key, state in now.items()
                    if seen.get(key) == WorkerSetupStatus.READY and state != WorkerSetupStatus.READY}
            seen = now
            if self.board:
                now_starts = self.board.worker_starts()
                lost |= {e for e, n in now_starts.items() if n != starts.get(e, n)}
                starts = now_starts
            for endpoint in lost:
                self._lost_at[endpoint] = time.monotonic()
                event = self._lost.pop(endpoint, None)
                if event is not None:
                    event.set()  # requests waiting now fail; later ones get a new event

    def ready(self) -> PlainTextResponse:
        status = getattr(self.server, "workers_setup_status", None) or {}
        if self.draining.is_set():
            return PlainTextResponse("draining", status_code=503)
        if status and all(v == WorkerSetupStatus.READY for v in status.values()):
            return PlainTextResponse("ok")
        return PlainTextResponse("not ready", status_code=503)

    def drain_and_stop(self, grace_s: float) -> None:
        """SIGTERM: refuse new requests (and fail /ready), let the admitted ones finish, then stop."""
        self.draining.set()
        deadline = time.monotonic() + grace_s
        # Connections accepted just before the signal may not have reached a handler yet: give them a
        # moment to be admitted (or refused with 503) before waiting for the active count to reach 0.
        time.sleep(min(1.0, grace_s))
        while self.active.value > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        log.info("drained (%d requests still active); stopping", self.active.value)
        self.server._shutdown_event.set()

    def check_key(self, request: Request, body_key: str | None = None) -> None:
        if not self.settings.api_keys:
            return
        auth = request.headers.get("authorization", "")
        given = auth[7:] if auth.lower().startswith("bearer ") else request.headers.get("x-api-key") or body_key or ""
        # Compare against every key in constant time, so timing says nothing about a near miss.
        ok = False
        for key in self.settings.api_keys:
            ok |= hmac.compare_digest(given.encode("utf-8", "surrogatepass"), key.encode())
        if not ok:
            raise ApiError(401 if not given else 403, "unauthorized",
                           "missing API key: send Authorization: Bearer <key>" if not given else "invalid API key")

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
            valid = ", ".join(f"{a}-{b}" for a, b in self.pairs)
            raise ApiError(400, "unsupported_language_pair",
                           f"no model translates {source}-{target}; available pairs: {valid}")

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

    # --- routes -----------------------------------------------------------------------------------
    async def translate(self, body: TranslateRequest, request: Request) -> TranslateResponse:
        self.check_key(request)
        texts = [body.text] if isinstance(body.text, str) else list(body.text)
        self.check_limits(texts)
        self.check_pair(body.source_lang, body.target_lang)
        if body.source_lang == body.target_lang:
            return self.identity(texts, body.source_lang)  # type: ignore[return-value]
        received = time.monotonic()
        payload = body.model_dump(exclude={"text"}) | {"texts": texts, "received": received,
                                                       "request_id": request.state.request_id,
                                                       "number": self.board.new_number()}
        out = await self.submit(ENDPOINT, payload, request)
        if out is None:
            return Response(status_code=499)  # nginx's "client closed request": no one reads it
        total = (time.monotonic() - received) * 1000
        m().queue_wait.labels(ENDPOINT).observe(out["timings"]["queue_ms"] / 1000)
        out["timings"]["total_ms"] = round(total, 2)
        return out  # type: ignore[return-value]

    async def generate(self, body: GenerateRequest, request: Request):
        self.check_key(request)
        if not self.generators:
            raise ApiError(400, "no_generation_model", "no generation model is loaded; start the service with "
                           "--model <a generation package> (model.json task \"generation\")")
        if body.model is not None and body.model not in self.generators:
            raise ApiError(400, "unknown_model", f"no generation model {body.model!r}; loaded: "
                           f"{', '.join(self.generators)}")
        if len(body.prompt) > self.settings.max_text_chars:
            raise ApiError(413, "text_too_long", f"the prompt has {len(body.prompt)} characters; the limit is "
                           f"{self.settings.max_text_chars}", self.settings.max_text_chars)
        received = time.monotonic()
        number = self.board.new_number()
        payload = body.model_dump() | {"received": received, "request_id": request.state.request_id, "number": number}
        admission = self.admitted(GENERATE)
        admission.__enter__()
        events = self.worker_events(payload)
        state = {"first": None, "last": None, "done": None, "texts": {}}
        try:
            first = _worker_error(await anext(events))
        except BaseException:
            await events.aclose()
            admission.__exit__(None, None, None)
            raise

        def take(event: dict) -> None:
            _worker_error(event)  # after the first event: the worker failed on this request (500)
            now = time.monotonic()
            for p in event.get("pieces", ()):
                state["first"] = state["first"] or now
                state["last"] = now
                state["texts"][p["index"]] = state["texts"].get(p["index"], "") + p["text"]
            if "done" in event:
                state["done"] = event["done"]

        def finish(completed: bool) -> dict | None:
            admission.__exit__(None, None, None)
            if not completed:
                self.board.cancel(number)  # the client went away: free its rows in the batch
                return None
            done = state["done"]
            model = done["model"]
            end = time.monotonic()
            if state["first"] is not None:
                m().time_to_first_token.labels(GENERATE, model).observe(state["first"] - received)
                most = max(c["tokens"] for c in done["choices"])
                if most > 1:
                    m().time_per_output_token.labels(GENERATE, model).observe((state["last"] - state["first"]) / (most - 1))
            m().queue_wait.labels(GENERATE).observe(done["queue_ms"] / 1000)
            return {"queue_ms": done["queue_ms"], "total_ms": round((end - received) * 1000, 2),
                    "first_token_ms": None if state["first"] is None else round((state["first"] - received) * 1000, 2)}

        if not body.stream:
            watcher = asyncio.create_task(self._watch_disconnect(request))
            completed = False
            try:
                take(first)
                while state["done"] is None:
                    reader = asyncio.ensure_future(anext(events))
                    await asyncio.wait({reader, watcher}, return_when=asyncio.FIRST_COMPLETED)
                    if not reader.done():  # disconnected
                        reader.cancel()
                        await asyncio.wait({reader})  # the generator must stop running before aclose()
                        break
                    take(reader.result())
                completed = state["done"] is not None
            finally:
                watcher.cancel()
                timings = finish(completed)  # first: the queue place is given back whatever aclose() does
                await events.aclose()
            if not completed:
                return Response(status_code=499)
            done = state["done"]
            return {"model": done["model"], "usage": done["usage"], "timings": timings,
                    "choices": [c | {"text": state["texts"].get(c["index"], "")} for c in done["choices"]]}

        async def sse():
            completed = False
            t0 = time.perf_counter()
            try:
                event = first
                while True:
                    take(event)
                    for p in event.get("pieces", ()):
                        yield _sse({"type": "token", "index": p["index"], "text": p["text"]})
                    if "done" in event:
                        break
                    event = await anext(events)
                completed = True
                timings = finish(True)
                done = state["done"]
                yield _sse({"type": "done", "model": done["model"], "choices": done["choices"], "usage": done["usage"],
                            "timings": timings})
            except ApiError as e:
                completed = True
                finish(False) if state["done"] is None else None
                m().errors.labels(GENERATE, ERROR_KIND.get(e.status, "internal")).inc()  # the status said 200
                yield _sse({"type": "error", "error": {"type": e.type, "message": e.message}})
            finally:
                await events.aclose()
                if not completed:
                    finish(False)
                m().request_duration.labels(GENERATE).observe(time.perf_counter() - t0 + (t0 - received))

        return StreamingResponse(sse(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def _watch_disconnect(self, request: Request) -> None:
        """Returns when the client goes away. A blocking receive, not polling is_disconnected(): under
        Starlette's BaseHTTPMiddleware the latter never sees the disconnect (its zero-timeout receive
        is cancelled inside the middleware's task group)."""
        while (await request.receive())["type"] != "http.disconnect":
            pass

    async def libre_translate(self, request: Request) -> JSONResponse:
        """LibreTranslate's POST /translate: JSON or form; errors as {"error": "..."}."""
        try:
            ctype = request.headers.get("content-type", "")
            form = ctype.startswith(("application/x-www-form-urlencoded", "multipart/form-data"))
            if form:
                fields = await request.form()
                data: dict = {k: fields.get(k) for k in fields.keys()}
                if len(fields.getlist("q")) > 1:
                    data["q"] = fields.getlist("q")
            else:
                try:
                    data = await request.json()
                except (ValueError, RecursionError) as e:
                    raise ApiError(400, "invalid_json", _parse_error(e)) from None
            if not isinstance(data, dict):
                raise ApiError(400, "invalid_request", "the body must be a JSON object")
            if data.get("api_key") is not None and not isinstance(data["api_key"], str):
                raise ApiError(400, "invalid_request", "api_key must be a string")
            self.check_key(request, data.get("api_key"))
            q, source, target = data.get("q"), data.get("source"), data.get("target")
            for name, value in (("q", q), ("source", source), ("target", target)):
                if value is None or value == "" or value == []:
                    raise ApiError(400, "invalid_request", f"Invalid request: missing {name} parameter")
            fmt = data.get("format", "text")
            if fmt not in ("text", "html"):
                raise ApiError(400, "invalid_request", f"format must be text or html, got {fmt!r}")
            alternatives = data.get("alternatives", 0)
            if form and isinstance(alternatives, str) and alternatives.isdigit():
                alternatives = int(alternatives)      # a form's fields are all text
            if isinstance(alternatives, float) and alternatives.is_integer():
                alternatives = int(alternatives)      # 2.0: JSON Schema's integers include it
            if isinstance(alternatives, bool) or not isinstance(alternatives, int) or not 0 <= alternatives <= 3:
                raise ApiError(400, "invalid_request", "alternatives must be an integer from 0 to 3")
            if source == "auto":
                raise ApiError(400, "invalid_request", "language detection (source=auto) is not supported; "
                               f"name the source language, one of {', '.join(sorted({s for s, _ in self.pairs}))}")
            try:
                req = TranslateRequest(text=q, source_lang=source, target_lang=target, beam_size=max(4, alternatives + 1),
                                       num_alternatives=alternatives)
            except ValidationError as e:
                raise ApiError(400, "invalid_request", _first_error(e)) from None
            texts = [req.text] if isinstance(req.text, str) else list(req.text)
            self.check_limits(texts)
            self.check_pair(source, target)
            if source == target:
                out = self.identity(texts, source)
            else:
                payload = req.model_dump(exclude={"text"}) | {"texts": texts, "received": time.monotonic(),
                                                              "request_id": request.state.request_id,
                                                              "number": self.board.new_number()}
                out = await self.submit("libretranslate", payload, request)
        except ApiError as e:
            return JSONResponse({"error": e.message}, status_code=e.status, headers=e.headers)
        if out is None:
            return Response(status_code=499)
        items = out["translations"]
        if isinstance(q, list):
            body = {"translatedText": [i["text"] for i in items]}
            if alternatives:
                body["alternatives"] = [[a["text"] for a in i["alternatives"]] for i in items]
        else:
            body = {"translatedText": items[0]["text"]}
            if alternatives:
                body["alternatives"] = [a["text"] for a in items[0]["alternatives"]]
        return JSONResponse(body)

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
        for endpoint in ("translate", "libretranslate", GENERATE):
            m().rejected.labels(endpoint)
            for kind in sorted(set(ERROR_KIND.values()) | {"internal"}):
                m().errors.labels(endpoint, kind)
        # Drop LitServe's own POST /translate and readiness check (ours submit through the same handler
        # and know about draining), its info route (ours is /info) and its "litserve running" root.
        app.router.routes = [r for r in app.router.routes if getattr(r, "path", None)
                             not in ("/", "/translate", "/generate", "/ready", LITSERVE_INFO)]
        app.openapi_schema = None
        app.title, app.version = "transerve", __version__
        errors = {c: {"model": ErrorResponse} for c in (400, 401, 403, 413, 422, 503, 504)}
        app.add_api_route("/translate", self.translate, methods=["POST"], response_model=TranslateResponse,
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
                          responses={c: {"model": LibreTranslateError} for c in (400, 401, 403, 413, 503, 504)},
                          openapi_extra={"requestBody": {"required": True, "content": {
                              "application/json": body, "application/x-www-form-urlencoded": body}}},
                          summary="LibreTranslate-compatible translate", tags=["libretranslate"])
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
        app.add_api_route("/metrics", _metrics, methods=["GET"], tags=["ops"], include_in_schema=False)
        self._describe_served_values(app)
        app.add_exception_handler(ApiError, self._api_error)
        app.add_exception_handler(RequestValidationError, self._validation_error)
        app.add_exception_handler(StarletteHTTPException, self._http_error)
        app.add_middleware(self._request_context)

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
                    props[src]["enum"] = props[tgt]["enum"] = langs
                    # Exactly the served pairs, and each language into itself (returned unchanged).
                    body["anyOf"] = [{"properties": {src: {"const": a}, tgt: {"enum": sorted(
                        {b for x, b in self.pairs if x == a} | {a})}}} for a in langs]
                    for one in (props.get("text") or props["q"])["anyOf"]:
                        one.update(text if one["type"] == "string" else texts)
                gen = models["GenerateRequest"]["properties"]
                gen["prompt"]["maxLength"] = s.max_text_chars
                if self.generators:
                    gen["model"]["anyOf"][0]["enum"] = self.generators
            return app.openapi_schema

        app.openapi = openapi

    # --- cross-cutting ------------------------------------------------------------------------------
    def _request_context(self, app):
        """Wraps the app: the request id in (`request.state.request_id`) and out (`X-Request-ID`), the
        body limit (_limited_receive), the request and error counters, the duration, and a JSON 500
        instead of a stack trace.

        Plain ASGI rather than Starlette's `BaseHTTPMiddleware` (`app.middleware("http")`), which runs
        the route in a task of its own and streams the response body back through a memory channel:
        that cost more CPU per request than routing, validation and JSON together (py-spy over the
        HTTP process, lone requests; benchmarks/results/vs-ctranslate2-cpu.md)."""
        endpoints = {"/translate": ENDPOINT, "/libretranslate/translate": "libretranslate", "/generate": GENERATE}

        async def request_context(scope, receive, send):
            if scope["type"] != "http":
                return await app(scope, receive, send)
            rid = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), "")[:64] \
                or uuid.uuid4().hex
            scope.setdefault("state", {})["request_id"] = rid
            endpoint = endpoints.get(scope["path"])
            t0 = time.perf_counter()
            started: dict = {}

            async def send_with_id(message):
                if message["type"] == "http.response.start":
                    headers = list(message.get("headers", []))
                    headers.append((b"x-request-id", rid.encode("latin-1")))
                    message = message | {"headers": headers}
                    started["status"] = message["status"]
                    started["stream"] = any(k == b"content-type" and v.startswith(b"text/event-stream")
                                            for k, v in headers)
                await send(message)

            limited = self._limited_receive(scope, receive)
            try:
                if limited is None:
                    too_large = ApiError(413, "payload_too_large", self._too_large(), self.settings.max_payload_bytes,
                                         {"Connection": "close"})
                    await self._error_response(scope["path"], rid, too_large)(scope, receive, send_with_id)
                else:
                    await app(scope, limited, send_with_id)
            except Exception:  # never a stack trace to the client
                log.exception("unhandled error on %s", scope["path"])
                if started:
                    raise
                await JSONResponse(ApiError(500, "internal_error", "internal error").body(rid),
                                   status_code=500)(scope, receive, send_with_id)
            if endpoint and started:
                status = started["status"]
                m().requests.labels(endpoint, str(status)).inc()
                if not started["stream"]:
                    # A stream's duration is observed when it ends (Gateway.generate), not here.
                    m().request_duration.labels(endpoint).observe(time.perf_counter() - t0)
                if status >= 400:
                    m().errors.labels(endpoint, ERROR_KIND.get(status, "internal")).inc()

        return request_context

    def _limited_receive(self, scope, receive):
        """`receive` counting the body as the app reads it: past --max-payload-bytes it raises a 413
        (an HTTPException, which FastAPI's body parsing passes on to _http_error), and the connection
        closes. None when the declared Content-Length is over the limit: that body is never read, and
        the 413 goes out at once; waiting for a body that never comes would hold the connection open,
        since nothing in uvicorn times out a body read (LitServe's max_payload_size only counted)."""
        limit = self.settings.max_payload_bytes
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), b"")
        if declared.isdigit() and int(declared) > limit:
            return None
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise StarletteHTTPException(413, headers={"Connection": "close"})
            return message

        return limited

    @staticmethod
    def _error_response(path: str, request_id: str | None, e: ApiError) -> JSONResponse:
        if path.startswith("/libretranslate/"):  # LibreTranslate's shape, for its clients
            return JSONResponse({"error": e.message}, status_code=e.status, headers=e.headers)
        return JSONResponse(e.body(request_id), status_code=e.status, headers=e.headers)

    async def _api_error(self, request: Request, e: ApiError) -> JSONResponse:
        return self._error_response(request.url.path, getattr(request.state, "request_id", None), e)

    async def _validation_error(self, request: Request, e: RequestValidationError) -> JSONResponse:
        errs = e.errors()
        if any(err.get("type") == "json_invalid" for err in errs):
            err = ApiError(400, "invalid_json", "the body is not valid JSON")
        elif any(tuple(err.get("loc", ())) == ("body",) and err.get("type") != "value_error" for err in errs):
            # (a value_error at the body itself is a model validator's: a 422 like any field's)
            err = ApiError(400, "invalid_json", "the body must be a JSON object sent with Content-Type: application/json")
        else:
            err = ApiError(422, "invalid_request", _first_error(e))
        return await self._api_error(request, err)

    async def _http_error(self, request: Request, e: StarletteHTTPException) -> JSONResponse:
        """Starlette's and FastAPI's own errors (404, 405 with its Allow header, a body FastAPI could not
        parse, a body over the limit) in our shape."""
        kinds = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large",
                 504: "timeout"}
        kind, limit = kinds.get(e.status_code, "error"), None
        message = str(e.detail) if e.status_code < 500 else "internal error"
        if e.status_code == 400 and e.__cause__ is not None:  # FastAPI's "There was an error parsing the body"
            kind, message = "invalid_json", _parse_error(e.__cause__)
        elif e.status_code == 413:
            message, limit = self._too_large(), self.settings.max_payload_bytes
        return await self._api_error(request, ApiError(e.status_code, kind, message, limit, dict(e.headers or {})))

    def _too_large(self) -> str:
        return f"the body is larger than {self.settings.max_payload_bytes} bytes (--max-payload-bytes)"


def _worker_error(event: dict) -> dict:
    """A worker's event, or its error raised as ApiError."""
    if "error" in event:
        e = event["error"]
        raise ApiError(event["status"], e["type"], e["message"], e.get("limit"))
    return event


def _sse(event: dict) -> str:
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n"


def _parse_error(e: BaseException | None) -> str:
    """Why a body is not JSON, for the client."""
    if isinstance(e, UnicodeDecodeError):
        return f"the body is not valid UTF-8 (byte {e.start}); send JSON text encoded as UTF-8"
    if isinstance(e, RecursionError):
        return "the body's JSON is nested too deeply to parse; nest it a few hundred levels at most"
    return "the body is not valid JSON"


def _first_error(e: ValidationError | RequestValidationError) -> str:
    parts = []
    for err in e.errors()[:3]:
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
        msg = err.get("msg", "invalid").removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


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
    api = TranslateAPI(settings, board) if "translation" in tasks else None
    generate_api = GenerateAPI(settings, board) if "generation" in tasks else None
    server = ls.LitServer([a for a in (api, generate_api) if a], accelerator="cuda" if cuda else "cpu",
                          devices=1 if cuda else "auto",
                          workers_per_device=settings.workers, timeout=settings.request_timeout_s,
                          restart_workers=True,  # a dead worker is replaced; without this the server exits
                          healthcheck_path="/ready", info_path=LITSERVE_INFO,
                          max_payload_size=None)  # enforced before reading: Gateway._limited_receive
    gateway = Gateway(server, api, settings, packages, generate_api, board)
    gateway.device = "cuda" if cuda else "cpu"
    gateway.install()
    return server, gateway
