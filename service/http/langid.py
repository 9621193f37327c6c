"""Language identification for source_lang "auto" and LibreTranslate's /detect: py3langid (langid.py's
naive Bayes model, shipped in its wheel, so it loads offline), asked only about the languages the server
translates from. The only module that imports it; benchmarks/langid.py measured it against the others
(benchmarks/results/langid.md).

The model loads on the first call (0.1 s import, 0.4 s to read the model on an idle core), not at startup:
a server that is never asked to detect never pays for it."""

from __future__ import annotations

import copy
import threading
from functools import lru_cache

_lock = threading.Lock()
_base = None   # the identifier over all its languages, loaded once per process


def _identifier_base():
    global _base
    with _lock:   # two first requests at once must not read the model twice
        if _base is None:
            from py3langid.langid import MODEL_FILE, LanguageIdentifier

            # norm_probs: probabilities over the candidate languages, which the confidence reports.
            _base = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        return _base


def supported(candidates: list[str]) -> list[str]:
    """The candidates the model knows (a served language it does not know can never be detected)."""
    known = set(_identifier_base().labels)
    return sorted(c for c in candidates if c in known)


@lru_cache(maxsize=16)
def _identifier(candidates: tuple[str, ...]):
    # A shallow copy restricted to the candidates: set_languages rebinds the copy's tables (slices of the
    # shared model) and leaves the base, and every other restriction, as they were.
    ident = copy.copy(_identifier_base())
    ident.set_languages(list(candidates))
    return ident


def detect(texts: list[str], candidates: list[str]) -> list[list[tuple[str, float]]]:
    """For each text, the candidate languages the model knows with their confidence (0-100, one decimal,
    summing to about 100), best first; [] for each text when it knows none of them."""
    langs = tuple(supported(candidates))
    if not langs:
        return [[] for _ in texts]
    if len(langs) == 1:
        return [[(langs[0], 100.0)] for _ in texts]
    ident = _identifier(langs)
    return [[(lang, round(p * 100, 1)) for lang, p in ident.rank(t)] for t in texts]
