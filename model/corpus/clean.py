"""Cleaning and deduplication of parallel pairs, whatever their source."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Iterable

from .text import Pair, normalize_text

MAX_CHARS = 250  # per side; longer "pairs" are mostly help texts, not translations
MAX_RATIO = 3.0  # max(len)/max(min(len), RATIO_FLOOR) in characters
RATIO_FLOOR = 10  # short terms ("Ja" / "Yes") must not be judged by their ratio


def clean_pair(
    pair: Pair, max_chars: int = MAX_CHARS, max_ratio: float = MAX_RATIO
) -> tuple[Pair | None, str]:
    """Normalise a pair and decide whether to keep it; returns (pair or None, reason).

    Reasons for dropping: an empty side; a side longer than ``max_chars``; a character length
    ratio above ``max_ratio`` (measured against at least ``RATIO_FLOOR`` characters so
    ``Ja``/``Yes`` is fine but ``Ja``/``a forty-character explanation`` is not); identical
    sides of more than one word (untranslated strings copied by translators; single-word
    identical pairs such as ``Name``/``Name`` or ``OK``/``OK`` are real translations).
    """
    de, en = normalize_text(pair.de), normalize_text(pair.en)
    if not de or not en:
        return None, "empty"
    if len(de) > max_chars or len(en) > max_chars:
        return None, "too_long"
    longer, shorter = max(len(de), len(en)), min(len(de), len(en))
    if longer / max(shorter, RATIO_FLOOR) > max_ratio:
        return None, "length_ratio"
    if de == en and len(de.split()) > 1:
        return None, "identical"
    return Pair(de, en, pair.origin, pair.sentence), "kept"


def source_name(origin: str) -> str:
    """Group origins for the summary: a Debian package's or a wheel's catalogs count as that package
    (``deb:NAME``), each user corpus file as itself (``tsv:…``, ``moses:…``), and every other reader's
    pages or keys as its kind (``gettext``, ``lohelp``, ``debref``, ``hedgewars`` for ``hedgewars:lua``)."""
    kind, _, rest = origin.partition(":")
    if kind in ("deb", "wheel"):
        return f"{kind}:" + rest.split(":", 1)[0]
    if kind in ("tsv", "moses"):
        return origin
    return kind


def clean_corpus(
    pairs: Iterable[Pair], max_chars: int = MAX_CHARS, max_ratio: float = MAX_RATIO
) -> tuple[list[Pair], dict[str, Counter]]:
    """Clean and deduplicate (first origin wins); returns kept pairs and per-source stats
    (``raw``, ``kept``, ``duplicate`` and the drop reasons of :func:`clean_pair`)."""
    stats: dict[str, Counter] = defaultdict(Counter)
    seen: set[tuple[str, str]] = set()
    kept: list[Pair] = []
    for pair in pairs:
        source = source_name(pair.origin)
        stats[source]["raw"] += 1
        cleaned, reason = clean_pair(pair, max_chars, max_ratio)
        if cleaned is None:
            stats[source][reason] += 1
            continue
        key = (cleaned.de, cleaned.en)
        if key in seen:
            stats[source]["duplicate"] += 1
            continue
        seen.add(key)
        stats[source]["kept"] += 1
        kept.append(cleaned)
    return kept, stats
