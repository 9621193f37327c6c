"""The pages a person opens in a browser, served with nothing from outside: the translate page (GET /ui) and
the API docs (/docs, /redoc) with their scripts from a package rather than a CDN.

The translate page is service/api/static/ui.html with ui.css and ui.js put inline, one document built once at
start-up: no framework, no build step, one open path (FLAVOUR.open_paths), and a Content-Security-Policy that
allows exactly those two inline blocks (by their SHA-256) and requests to this origin. It calls the JSON API
(GET /languages, POST /translate, GET /glossaries) with the key the user types; every text goes into the page as text.

FastAPI's Swagger UI and ReDoc pages load their scripts from jsDelivr: blank offline or behind a strict
proxy. Here they load swagger-ui-bundle.js, swagger-ui.css and redoc.standalone.js from the files the
fastapi-offline package ships (its data only, found with importlib; none of its code runs), served under
/docs/ and /redoc/ with the docs' own key rule (auth.DOC_PATHS). Without that package the pages stay
FastAPI's, a warning says so.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import FileResponse, HTMLResponse

from ..config import Settings
from .flavour import Flavour

if TYPE_CHECKING:
    from ..http.gateway import Gateway

log = logging.getLogger("transerve")

STATIC = Path(__file__).parent / "static"
PAGE = "/ui"
# path -> (file in fastapi-offline's static/, media type)
DOC_ASSETS = {"/docs/swagger-ui-bundle.js": ("swagger-ui-bundle.js", "text/javascript"),
              "/docs/swagger-ui.css": ("swagger-ui.css", "text/css"),
              "/docs/favicon.png": ("favicon.png", "image/png"),
              "/redoc/redoc.standalone.js": ("redoc.standalone.js", "text/javascript")}


# ReDoc's side menu shows Redocly's logo from cdn.redoc.ly (no option turns it off): the policy keeps that
# request from leaving; ReDoc's own styles are inline, its search runs in a worker made from a blob.
REDOC_POLICY = ("default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
                "worker-src 'self' blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def translate_page(settings: Settings) -> tuple[str, dict[str, str]]:
    """The page's HTML and its response headers: the inline style and script allowed by hash, nothing else."""
    style = (STATIC / "ui.css").read_text(encoding="utf-8")
    script = (STATIC / "ui.js").read_text(encoding="utf-8")
    if "</" in style or "</script" in script.lower():
        raise ValueError("service/api/static: an inline block must not close its own element")
    html = (STATIC / "ui.html").read_text(encoding="utf-8")
    html = (html.replace("{{key_required}}", "true" if settings.keyed else "false")
                .replace("{{max_chars}}", str(settings.max_text_chars))
                .replace("{{style}}", style).replace("{{script}}", script))
    policy = (f"default-src 'none'; script-src {csp_hash(script)}; style-src {csp_hash(style)}; "
              "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
    return html, {"Content-Security-Policy": policy, "X-Content-Type-Options": "nosniff",
                  "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}


def doc_assets_dir() -> Path | None:
    """fastapi-offline's static/ folder (Swagger UI 5 and ReDoc), or None when the package is not installed."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "static"
    return folder if all((folder / name).is_file() for name, _ in DOC_ASSETS.values()) else None


def install(app, gateway: Gateway) -> None:
    install_pages(app, gateway.settings)


def install_pages(app, settings: Settings) -> None:
    """GET /ui, and /docs and /redoc from local files (in place of FastAPI's CDN pages)."""
    html, headers = translate_page(settings)
    app.add_api_route(PAGE, lambda: HTMLResponse(html, headers=headers), methods=["GET"], include_in_schema=False)
    assets = doc_assets_dir()
    if assets is None:
        log.warning("fastapi-offline is not installed: /docs and /redoc load their scripts from a CDN")
        return
    install_offline_docs(app, assets)


def install_offline_docs(app, assets: Path) -> None:
    docs, redoc, oauth2 = app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url
    app.router.routes = [r for r in app.router.routes if getattr(r, "path", None) not in (docs, redoc, oauth2)]
    for path, (name, media_type) in DOC_ASSETS.items():
        app.add_api_route(path, _file(assets / name, media_type), methods=["GET"], include_in_schema=False)

    def swagger(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(openapi_url=root + app.openapi_url, title=f"{app.title} - Swagger UI",
                                   oauth2_redirect_url=root + oauth2 if oauth2 else None,
                                   swagger_js_url=root + "/docs/swagger-ui-bundle.js",
                                   swagger_css_url=root + "/docs/swagger-ui.css",
                                   swagger_favicon_url=root + "/docs/favicon.png",
                                   # no badge image from validator.swagger.io
                                   swagger_ui_parameters=(app.swagger_ui_parameters or {}) | {"validatorUrl": None})

    def redoc_page(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        page = get_redoc_html(openapi_url=root + app.openapi_url, title=f"{app.title} - ReDoc",
                              redoc_js_url=root + "/redoc/redoc.standalone.js",
                              redoc_favicon_url=root + "/docs/favicon.png", with_google_fonts=False)
        page.headers["Content-Security-Policy"] = REDOC_POLICY
        return page

    if docs:
        app.add_api_route(docs, swagger, methods=["GET"], include_in_schema=False)
    if oauth2:
        app.add_api_route(oauth2, get_swagger_ui_oauth2_redirect_html, methods=["GET"], include_in_schema=False)
    if redoc:
        app.add_api_route(redoc, redoc_page, methods=["GET"], include_in_schema=False)


def _file(path: Path, media_type: str):
    def serve() -> FileResponse:
        return FileResponse(path, media_type=media_type, headers={"Cache-Control": "public, max-age=86400"})
    return serve


# The pages are a flavour of their own: the translate page calls our JSON API from the browser, as any client.
FLAVOUR = Flavour(install, open_paths=frozenset({PAGE}))
