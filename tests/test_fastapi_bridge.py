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


def test_the_direct_routes_posts_skip_fastapis_own_middleware(monkeypatch):
    """POST /translate enters request_context outside FastAPI's ServerErrorMiddleware and the rest of its own
    layers (fastapi_bridge.outermost, middleware.direct_first: they cost it CPU and gave it nothing); every other
    request still passes through them, and both answer in our error shape with their request id."""
    import asyncio

    import httpx
    from starlette.middleware.errors import ServerErrorMiddleware

    from service.config import Settings
    from service.server import build_server

    seen = []
    through = ServerErrorMiddleware.__call__

    async def noting(self, scope, receive, send):
        seen.append((scope.get("method"), scope.get("path")))
        return await through(self, scope, receive, send)

    monkeypatch.setattr(ServerErrorMiddleware, "__call__", noting)
    server, _ = build_server(Settings(models=["models/de-en"]))

    async def requests():
        transport = httpx.ASGITransport(app=server.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            bad = await client.post("/translate", content=b"{not json", headers={"content-type": "application/json",
                                                                                 "x-request-id": "direct-1"})
            health = await client.get("/health")
            missing = await client.get("/translate")
        return bad, health, missing

    bad, health, missing = asyncio.run(requests())
    assert bad.status_code == 400 and bad.json()["error"]["type"] and bad.headers["x-request-id"] == "direct-1"
    assert health.status_code == 200 and health.headers["x-request-id"]
    assert missing.status_code == 405
    assert seen == [("GET", "/health"), ("GET", "/translate")]
