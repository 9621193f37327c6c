"""The HTTP server composed: a LitServer with one LitAPI per endpoint (its workers), the Gateway over them, the
operations routes, and the API flavours, each installing its own routes:

    FLAVOURS    native (POST /translate, /generate, GET /languages), openai_api (/v1/), libretranslate
                (/libretranslate/), deepl (/deepl/v2/: DeepL's API), ui (GET /ui, and /docs and /redoc offline),
                admin (/admin/models: model control, admin keys only; api/admin.py)
    GET /health     liveness: the HTTP process answers
    GET /ready      readiness: every inference worker loaded and warmed up, not draining
    GET /info       models, versions, settings (no secrets)
    GET /metrics    Prometheus, merged over all processes (or on --metrics-port)
    GET /usage      the calling key's limits and what it has used (http/quota.py)

LitServe's own POST routes would accept any JSON into an unbounded queue: they are removed, and the flavours'
routes submit through http/litserve_workers.Workers, so batching is untouched. A new
flavour is a module with a FLAVOUR (service/api/flavour.py) and its line in FLAVOURS.
"""

from __future__ import annotations

import logging
import os

import litserve as ls
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.middleware.gzip import GZipMiddleware

from . import __version__
from .api import admin, deepl, libretranslate, native, openai_api, ui
from .http.auth import USAGE_PATH, open_paths
from .http.keys import ANONYMOUS, KeyRing
from .http.quota import WINDOWS
from .worker.cancel import CancelBoard
from .worker.litserve_bridge import Server
from .config import Settings
from .inference.device import probe_device
from .errors import ERROR_KIND, FORM_SLACK, install_handlers, responder
from .api.flavour import Flavour
from .http.gateway import Gateway
from .http.model_control import initial_table
from .worker.model_swap import ModelTable
from .worker.generate_api import ENDPOINT as GENERATE, GenerateAPI
from .metrics import metrics, render
from .http.middleware import direct_first, request_context
from .stopping import Stopping
from .worker.translate_api import ENDPOINT, TranslateAPI, check_packages
from .http.fastapi_bridge import outermost, without_native_telemetry
from .http.uvicorn_bridge import hold_signals

log = logging.getLogger("transerve")

FLAVOURS: tuple[Flavour, ...] = (native.FLAVOUR, openai_api.FLAVOUR, libretranslate.FLAVOUR, deepl.FLAVOUR,
                                 ui.FLAVOUR, admin.FLAVOUR)

LITSERVE_INFO = "/litserve/info"   # LitServe always adds an info route; install() removes it


# --api-servers 0 on a GPU: an HTTP process per this many cores the inference workers leave (a core each), at most
# MOST_API_SERVERS. An HTTP process spent 0.9-1.2 CPU ms a one-sentence request on the CPUs here
# (benchmarks/results/serving-cpu.md): one process keeps up with about 800 such requests a second, which a small
# model on a GPU can exceed. On a CPU the workers take every core and one is enough. Not yet measured on a GPU.
CORES_PER_API_SERVER = 4
MOST_API_SERVERS = 4


def api_servers(settings: Settings, device: str, keys: KeyRing, cores: int | None = None) -> int:
    """The HTTP processes to start: --api-servers, or for 0 one on a CPU and, on a GPU, one per
    CORES_PER_API_SERVER cores the workers leave (at most MOST_API_SERVERS); one, whatever the machine, while
    keys have limits and no --redis-url is given, since each process would count them on its own (quota.py)."""
    in_memory = not settings.redis_url and any(t.limits.given() for t in keys.tenants.values())
    if settings.api_servers:
        if in_memory and settings.api_servers > 1:
            log.warning("--api-servers %d without --redis-url: each HTTP process counts the keys' limits on its "
                        "own, so a key may use up to %d times its limits", settings.api_servers, settings.api_servers)
        return settings.api_servers
    if device != "cuda" or in_memory:
        return 1
    cores = cores or len(os.sched_getaffinity(0))
    return max(1, min(MOST_API_SERVERS, (cores - settings.workers) // CORES_PER_API_SERVER))


def build_server(settings: Settings, flavours: tuple[Flavour, ...] = FLAVOURS) -> tuple[ls.LitServer, Gateway]:
    """Checks the packages and the device, then builds the LitServer (workers start in server.run())."""
    packages = check_packages(settings)
    cuda = settings.device != "cpu" and probe_device(packages[0]["path"], settings.device) == "cuda"
    tasks = {p["task"] for p in packages}
    # One LitAPI per endpoint, each with its own workers, loading only its own packages.
    board = CancelBoard(endpoints=(ENDPOINT, GENERATE), workers=settings.workers)
    stopping = Stopping()   # before LitServe starts any process
    # The served versions (model control), shared by the HTTP processes and the translation workers
    models = ModelTable()
    models.write(initial_table(packages))
    api = TranslateAPI(settings, board, stopping, models) if "translation" in tasks else None
    generate_api = GenerateAPI(settings, board, stopping) if "generation" in tasks else None
    server = Server([a for a in (api, generate_api) if a], accelerator="cuda" if cuda else "cpu",
                          devices=1 if cuda else "auto",
                          workers_per_device=settings.workers, timeout=settings.request_timeout_s,
                          restart_workers=True,  # a dead worker is replaced; without this the server exits
                          healthcheck_path="/ready", info_path=LITSERVE_INFO,
                          max_payload_size=None)  # enforced before reading: middleware.limited_receive
    gateway = Gateway(server, api, settings, packages, generate_api, board, stopping,
                      device="cuda" if cuda else "cpu", models=models)
    server.stopping = stopping   # what its HTTP-process watcher orders when none is left
    install(server.app, gateway, flavours)
    hold_signals(server.app, stopping)   # the HTTP processes wait for the main process's drain
    return server, gateway


def install(app: FastAPI, gateway: Gateway, flavours: tuple[Flavour, ...]) -> None:
    """The operations routes, every flavour's routes, the error handlers and the middleware, on `app`."""
    settings = gateway.settings
    endpoints = {path: label for f in flavours for path, label in f.endpoints.items()}
    # Error and rejection series exist at 0 from the start: rate() over a series that appears
    # with its first event misses that event, so alerts would not see the first burst.
    for endpoint in {*endpoints.values(), GENERATE}:
        metrics().rejected.labels(endpoint)
        for kind in sorted(set(ERROR_KIND.values()) | {"internal"}):
            metrics().errors.labels(endpoint, kind)
    for outcome in ("admitted", "refused"):   # the alert on Redis down reads these (quota.Quota.counted)
        metrics().ratelimit_store_errors.labels(outcome)
    for name in gateway.keys.names() or [ANONYMOUS.name]:
        for limit in WINDOWS:
            metrics().key_rate_limited.labels(name, limit)
    # Drop LitServe's own POST routes and readiness check (ours submit through the same handler and know about
    # draining), its info route (ours is /info) and its "litserve running" root.
    app.router.routes = [r for r in app.router.routes if getattr(r, "path", None)
                         not in ("/", "/translate", "/generate", "/ready", LITSERVE_INFO)]
    app.title, app.version = "transerve", __version__
    without_native_telemetry(app)   # ours is service/tracing.py
    install_operations(app, gateway)
    for flavour in flavours:
        flavour.install(app, gateway)
    describe_served_values(app, gateway, flavours)
    respond = responder({f.prefix: f.error_body for f in flavours if f.error_body})
    install_handlers(app, settings.max_payload_bytes, respond)
    body_limits = {path: settings.max_file_bytes + FORM_SLACK for f in flavours for path in f.file_paths}
    direct_paths = frozenset().union(*(f.direct_paths for f in flavours))
    direct = {r.path: r.endpoint for r in app.router.routes
              if isinstance(r, APIRoute) and r.path in direct_paths and "POST" in r.methods}
    app.add_middleware(at_startup, start=gateway.started)
    context = dict(respond=respond, endpoints=endpoints, max_payload_bytes=settings.max_payload_bytes,
                   body_limits=body_limits, keys=gateway.keys, quota=gateway.quota,
                   open_paths=open_paths(frozenset().union(*(f.open_paths for f in flavours)),
                                         public_docs=settings.public_docs),
                   key_in_body=frozenset().union(*(f.key_in_body for f in flavours)),
                   body_timeout_s=settings.body_timeout_s, access_log=settings.access_log,
                   direct=direct, gzip=any(m.cls is GZipMiddleware for m in app.user_middleware),
                   plain=frozenset(r.path for r in app.router.routes
                                   if not isinstance(r, APIRoute) and "{" not in getattr(r, "path", "{")))
    app.add_middleware(request_context, **context)
    # The direct routes' POSTs enter request_context before FastAPI's own middleware, every other request after it.
    outermost(app, lambda stack: direct_first(stack, request_context(stack, **context), frozenset(direct)))


def at_startup(app, start):
    """`app` wrapped so that `start()` runs in each HTTP process as its server starts (the ASGI lifespan's scope,
    on its event loop): the models file's poller must not wait for a first /ready probe, which a server run
    without probes never gets, nor the document jobs' sweep for a first upload."""
    async def wrapped(scope, receive, send):
        if scope["type"] == "lifespan":
            start()
        return await app(scope, receive, send)
    return wrapped


def install_operations(app: FastAPI, gateway: Gateway) -> None:
    """/health, /ready, /info and (unless it has a port of its own) /metrics."""
    text = {"content": {"text/plain": {"schema": {"type": "string"}}}}

    async def usage(request: Request) -> dict:
        tenant = gateway.tenant(request)
        return {"key": tenant.name, "limits": await gateway.quota.usage(tenant),
                "routes": None if tenant.routes is None else sorted(tenant.routes),
                "models": None if tenant.models is None else sorted(tenant.models)}

    async def ready() -> PlainTextResponse:
        gateway.models.watch()   # the models file's poller in this HTTP process (http/models_file.py)
        ok, why = await run_in_threadpool(gateway.readiness)   # as a sync route: it asks LitServe's manager process
        return PlainTextResponse(why, status_code=200 if ok else 503)

    app.add_api_route("/health", lambda: PlainTextResponse("ok"), methods=["GET"], tags=["ops"],
                      response_class=PlainTextResponse, responses={200: text},
                      summary="Liveness: the HTTP process answers")
    app.add_api_route("/ready", ready, methods=["GET"], tags=["ops"], response_class=PlainTextResponse,
                      responses={200: text, 503: text | {"description": "Not ready, or draining"}},
                      summary="Readiness: every inference worker loaded and warmed up, not draining")
    app.add_api_route("/info", gateway.info, methods=["GET"], tags=["ops"])
    app.add_api_route(USAGE_PATH, usage, methods=["GET"], tags=["ops"],
                      summary="The calling key's name, limits and what it has used of each in the current window")
    if not gateway.settings.metrics_port:   # else on its own port (metrics.serve_metrics, __main__)
        app.add_api_route("/metrics", metrics_route, methods=["GET"], tags=["ops"], include_in_schema=False)


async def metrics_route() -> Response:
    body, ctype = render()
    return Response(body, media_type=ctype)


def describe_served_values(app: FastAPI, gateway: Gateway, flavours: tuple[Flavour, ...]) -> None:
    """/openapi.json, built once, with what this server serves named by each flavour (Flavour.describe)."""
    generate = app.openapi
    app.openapi_schema = None

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = generate()
            for flavour in flavours:
                if flavour.describe:
                    flavour.describe(schema, gateway)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
