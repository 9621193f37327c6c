"""http/fastapi_bridge.py: FastAPI's own OpenTelemetry stays off in our app, even where a global provider is
configured (it would record each request's path and query as sent: issue 54)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.telemetry import _asgi

from service.http.fastapi_bridge import without_native_telemetry


class Configured:
    """A tracer provider as an SDK or opentelemetry-instrument sets it globally (not one of the API's proxies)."""


def test_fastapi_records_nothing_of_its_own_even_with_a_global_provider(monkeypatch):
    monkeypatch.setattr(_asgi.trace, "get_tracer_provider", lambda: Configured())
    app = FastAPI()
    assert app._native_telemetry.enabled()      # FastAPI would trace every request itself
    without_native_telemetry(app)
    assert not app._native_telemetry.enabled()


def test_the_server_app_has_it_off(tmp_path):
    from service.config import Settings
    from service.server import build_server

    server, _ = build_server(Settings(models=["models/de-en"]))
    assert not any(server.app._telemetry[k] for k in ("tracing", "metrics", "logs"))
