"""FastAPI's private names, in one place. LitServe makes the app (`FastAPI(lifespan=..., openapi_url=...)`), so the
options FastAPI takes only at construction are set here on the app it made.
"""

from __future__ import annotations

from typing import Callable

from fastapi import FastAPI
from starlette.types import ASGIApp


def without_native_telemetry(app: FastAPI) -> None:
    """FastAPI's own OpenTelemetry (0.165 and later) off for good. It turns itself on whenever a global provider is
    configured (opentelemetry-instrument, FASTAPI_OTEL_AUTO_CONFIGURE=true), and then records each request's path as
    sent, in spans and metric attributes beside ours (service/tracing.py, which never does); off or not, it asked
    for the three global providers on every request to find out (about 3% of the app's profile on /translate)."""
    config = getattr(app, "_telemetry", None)   # the dict FastAPI's NativeTelemetry reads at each request
    if config is not None:
        config.update(tracing=False, metrics=False, logs=False)


def outermost(app: FastAPI, wrap: Callable[[ASGIApp], ASGIApp]) -> None:
    """`wrap(stack)` served instead of the app's middleware stack, so that what it answers itself skips FastAPI's own
    middleware (ServerErrorMiddleware, its telemetry's, its body limit's), which `add_middleware` always puts
    outside the app's. Starlette builds the stack at the first request (`build_middleware_stack`); the app's class
    is swapped for a subclass that wraps what it builds, as LitServe serves a copy of the app (copy.copy), whose
    methods are the class's. What `wrap` answers itself skips every middleware on the app, those added after this
    call too (LitServe's RequestCountMiddleware with track_requests=True, which our Server does not set)."""
    base = type(app)

    class Wrapped(base):   # type: ignore[misc, valid-type]
        def build_middleware_stack(self) -> ASGIApp:
            return wrap(base.build_middleware_stack(self))

    Wrapped.__name__ = Wrapped.__qualname__ = base.__name__
    app.__class__ = Wrapped
