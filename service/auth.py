"""API keys: what a request must carry when the service has any (Settings.api_keys)."""

from __future__ import annotations

import hmac

from fastapi import Request

from .errors import ApiError


def check_key(api_keys: list[str] | tuple[str, ...], request: Request, body_key: str | None = None) -> None:
    """Passes when no key is configured or the request carries one of them (Authorization: Bearer, X-API-Key,
    or LibreTranslate's api_key field); else 401 (none given) or 403 (a wrong one)."""
    if not api_keys:
        return
    auth = request.headers.get("authorization", "")
    given = auth[7:] if auth.lower().startswith("bearer ") else request.headers.get("x-api-key") or body_key or ""
    # Compare against every key in constant time, so timing says nothing about a near miss.
    ok = False
    for key in api_keys:
        ok |= hmac.compare_digest(given.encode("utf-8", "surrogatepass"), key.encode())
    if not ok:
        raise ApiError(401 if not given else 403, "unauthorized",
                       "missing API key: send Authorization: Bearer <key>" if not given else "invalid API key")
