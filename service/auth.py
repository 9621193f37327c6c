"""API keys: what a request must carry when the service has any (Settings.api_keys).

What a key protects (README, "API keys"): every route but the liveness and readiness probes, /docs,
/openapi.json and /info included unless --public-docs, /metrics too unless it has its own port
(--metrics-port, for a scraper that holds no key). LibreTranslate's /languages stays open, as in
LibreTranslate, whose clients ask for it without a key.
"""

from __future__ import annotations

import hmac

from fastapi import Request

from .errors import ApiError

DOC_PATHS = {"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json", "/info"}


def check_key(api_keys: list[str] | tuple[str, ...], request: Request, body_key: str | None = None) -> None:
    """Passes when no key is configured or the request carries one of them (Authorization: Bearer, X-API-Key,
    or LibreTranslate's api_key field); else 401 (none given) or 403 (a wrong one)."""
    check_headers(api_keys, request.headers.get("authorization", ""), request.headers.get("x-api-key"), body_key)


def check_headers(api_keys, authorization: str, x_api_key: str | None, body_key: str | None = None) -> None:
    if not api_keys:
        return
    auth = authorization
    given = auth[7:] if auth.lower().startswith("bearer ") else x_api_key or body_key or ""
    # Compare against every key in constant time, so timing says nothing about a near miss.
    ok = False
    for key in api_keys:
        ok |= hmac.compare_digest(given.encode("utf-8", "surrogatepass"), key.encode())
    if not ok:
        raise ApiError(401 if not given else 403, "unauthorized",
                       "missing API key: send Authorization: Bearer <key>" if not given else "invalid API key")


def guarded_paths(*, metrics_on_main_port: bool, public_docs: bool) -> set[str]:
    """The routes outside the endpoints' own checks that a key must open: docs and info (unless public),
    /metrics where it is served on the main port."""
    return (set() if public_docs else DOC_PATHS) | ({"/metrics"} if metrics_on_main_port else set())
