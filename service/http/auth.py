"""API keys: what a request must carry when the service has any (http/keys.py: given, or in the keys file).

What a key protects (README, "API keys"): every route but the liveness and readiness probes and the language
lists, unknown paths included (401 rather than 404, 405 or 413: a client without a key learns nothing of the
routes), /docs, /openapi.json and /info too unless --public-docs, /metrics on the main port. The middleware
checks it before anything reads the body (middleware.key_refusal). LibreTranslate's POST routes take the key
in their `api_key` field too: one without a key in its headers goes on to the route, which reads the body
only to find that field and answers 401 before it looks at any other (libretranslate.authorized_fields).
DeepL's clients send theirs as `Authorization: DeepL-Auth-Key KEY`, taken as a bearer token is (a wrong one is
their 403, FORBIDDEN_SCHEMES).
LibreTranslate's /languages stays open, as in LibreTranslate, whose clients ask for it without a key.
"""

from __future__ import annotations

from .keys import ANONYMOUS, KeyRing, allow_route
from .quota import Quota, charges
from ..errors import ApiError
from ..keyfile import Tenant

OPEN_PATHS = frozenset({"/health", "/ready"})   # the probes; each flavour adds its own (Flavour.open_paths)
DOC_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json", "/info",
                       # their scripts (service/api/ui.py)
                       "/docs/swagger-ui-bundle.js", "/docs/swagger-ui.css", "/docs/favicon.png",
                       "/redoc/redoc.standalone.js"})
# Sent with every 401 (RFC 9110 section 11.6.1): the scheme a client is to answer with; for a key given but not
# known, also why (RFC 6750 section 3.1).
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="transerve"'}
INVALID = {"WWW-Authenticate": 'Bearer realm="transerve", error="invalid_token"'}


# What surrounds a header's value and is no part of it (RFC 9110 section 5.5, OWS); the parsers drop it
# before a value, not always after it.
OWS = " \t"


# The schemes whose token is the key: ours, and DeepL's (`Authorization: DeepL-Auth-Key KEY`, which its clients send
# to the DeepL flavour, api/deepl.py). Scheme names are case-insensitive (RFC 9110 section 11.1).
SCHEMES = frozenset({"bearer", "deepl-auth-key"})
# The scheme whose clients read a refused key as 403, not 401: DeepL answers a wrong key with 403, and its clients
# (the deepl package's AuthorizationException) know no other status for it.
FORBIDDEN_SCHEMES = frozenset({"deepl-auth-key"})


def given_key(authorization: str, x_api_key: str | None, body_key: str | None = None) -> str:
    """The key a request gives: its bearer (or DeepL-Auth-Key) token, else X-API-Key, else LibreTranslate's
    api_key field; "" for none. A header's key is read without the whitespace around it, and the token after the
    scheme and one or more spaces (RFC 9110 section 11.4); a body's field is taken as it is."""
    scheme, _, token = authorization.strip(OWS).partition(" ")
    if scheme.lower() in SCHEMES and token:
        return token.strip(OWS)
    return (x_api_key or "").strip(OWS) or body_key or ""


def identify(keys: KeyRing, authorization: str, x_api_key: str | None, body_key: str | None = None) -> Tenant:
    """The Tenant of the key a request gives (KeyRing.find), or 401: none given, or one not known (a wrong key, or
    one the keys file no longer has: the request lacks valid credentials, RFC 9110 section 15.5.2, as OpenAI's API
    answers an invalid key; 403 is for a known key refused a route or model, keys.allow_route and allow_model), but
    403 for one sent as `DeepL-Auth-Key`, as DeepL answers it (FORBIDDEN_SCHEMES); ANONYMOUS when the server has
    no keys."""
    if not keys:
        return ANONYMOUS
    given = given_key(authorization, x_api_key, body_key)
    tenant = keys.find(given)
    if tenant is None and not given:
        raise ApiError(401, "unauthorized", "missing API key: send Authorization: Bearer <key> or X-API-Key: <key>",
                       headers=CHALLENGE)
    if tenant is None and authorization.strip(OWS).partition(" ")[0].lower() in FORBIDDEN_SCHEMES:
        raise ApiError(403, "unauthorized", "invalid API key")
    if tenant is None:
        raise ApiError(401, "unauthorized", "invalid API key", headers=INVALID)
    return tenant


def open_paths(flavours_open: frozenset[str], *, public_docs: bool) -> frozenset[str]:
    """The paths that need no key: the probes, those the flavours leave open (the language lists, the translate
    page), and the docs with --public-docs."""
    return OPEN_PATHS | flavours_open | (DOC_PATHS if public_docs else frozenset())


USAGE_PATH = "/usage"   # a key reads its own usage here (server.install_operations)


async def admit(keys: KeyRing, quota: Quota, state: dict, path: str, authorization: str, x_api_key: str | None,
                body_key: str | None = None) -> None:
    """The request's key identified (its Tenant in `state["tenant"]`), allowed on `path` and counted against
    its requests per minute, or the 401/403/429: not on /usage, where a key over its limits reads why."""
    tenant = identify(keys, authorization, x_api_key, body_key)
    state["tenant"] = tenant
    if path != USAGE_PATH:
        allow_route(tenant, path)
        add_fields(state, await quota.take(tenant, charges(tenant, requests=1)))


def add_fields(state: dict, headers: dict[str, str]) -> None:
    """The RateLimit fields the answer is to carry, with those of the request's earlier checks (one list)."""
    old = state.setdefault("ratelimit", {})
    for name, value in headers.items():
        old[name] = f"{old[name]}, {value}" if name in old else value
