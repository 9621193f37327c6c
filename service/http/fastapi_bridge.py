"""FastAPI's private names, in one place. LitServe makes the app (`FastAPI(lifespan=..., openapi_url=...)`), so the
options FastAPI takes only at construction are set here on the app it made.
"""

from __future__ import annotations

from fastapi import FastAPI


def without_native_telemetry(app: FastAPI) -> None:
    """FastAPI's own OpenTelemetry (0.165 and later) off for good. It turns itself on whenever a global provider is
    configured (opentelemetry-instrument, FASTAPI_OTEL_AUTO_CONFIGURE=true), and then records each request's path as
    sent, in spans and metric attributes beside ours (service/tracing.py, which never does); off or not, it asked
    for the three global providers on every request to find out (about 3% of the app's profile on /translate)."""
    config = getattr(app, "_telemetry", None)   # the dict FastAPI's NativeTelemetry reads at each request
    if config is not None:
        config.update(tracing=False, metrics=False, logs=False)
