"""DeepL's language codes read as the served languages, for both halves of the DeepL flavour: deepl.py (text,
glossaries) and deepl_documents.py (documents), which deepl.py installs. Here, not in deepl.py, because deepl.py
imports deepl_documents.py (its routes, endpoints and file paths), and an import back would be a loop
(tests/test_architecture.py refuses them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ApiError
from ..shared.schemas import AUTO

if TYPE_CHECKING:
    from ..http.gateway import Gateway

# DeepL's regional target codes and the language each is translated into: one model per language here, so both
# Englishes are the same English. ZH-HANT (traditional Chinese) is not among them: a zh model writes one script.
VARIANTS = {"EN-GB": "en", "EN-US": "en", "PT-BR": "pt", "PT-PT": "pt", "ES-419": "es", "ZH-HANS": "zh"}


def unsupported(field: str) -> ApiError:
    """DeepL's 400 for a value it does not take, in its words (its clients and integrations match them)."""
    return ApiError(400, "invalid_request", f"Value for '{field}' not supported.")


def target_language(code: str, gateway: Gateway) -> str:
    """A DeepL target_lang (any case: DE, en-us, PT-BR, and the bare EN and PT DeepL still takes) -> the served
    language it names; the 400 of DeepL's message for one no model here writes."""
    if not isinstance(code, str):
        raise unsupported("target_lang")
    upper = code.upper()
    lang = VARIANTS.get(upper, upper.lower() if upper.isalpha() else "")
    if lang not in {b for _, b in gateway.pairs}:
        raise unsupported("target_lang")
    return lang


def source_language(code: str | None, gateway: Gateway) -> str:
    """A DeepL source_lang (any case; a base language only, DE or EN, as DeepL takes) -> the served language it
    names, or "auto" for none given (detected); the 400 of DeepL's message for one no model here reads."""
    if code is None or code == "":
        return AUTO
    if not isinstance(code, str) or not code.isalpha() or code.lower() not in {a for a, _ in gateway.pairs}:
        raise unsupported("source_lang")
    return code.lower()


def deepl_code(lang: str) -> str:
    """Our language code -> DeepL's, upper case (de -> DE)."""
    return lang.upper()
