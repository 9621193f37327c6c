"""A request's constraints, made with its model: the spans kept as written (service/shared/kept_spans.py: marked
`<dnt>`, URLs, e-mail addresses, code, what the model cannot write) replaced by placeholders the search must write,
and its glossary's entries checked against the model (every target term writable, within a token limit) and
matched in each sentence (service/shared/glossary.py); both made each sentence's terms (service/shared/constraints.py).
The translate worker (service/worker/glossary_terms.py) and the bulk command's in-process path use it alike."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence
from weakref import WeakKeyDictionary

from .engine import Engine
from ..shared.constraints import Terms
from ..shared.glossary import Entry, GlossaryError, check_entries, matches
from ..shared.kept_spans import QUOTES, Kept, keep


@dataclass
class SentenceTerms:
    """Each sentence's constraints (None: none), the glossary entries it holds (indices into entries), what goes
    to the model in its place (`texts`) and what comes back as written (`kept`)."""
    entries: list[Entry]
    terms: list[Terms | None]
    found: list[list[int]]
    texts: list[str] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)

    @property
    def constrained(self) -> bool:
        return any(t is not None for t in self.terms)


def sentence_terms(engine: Engine, sentences: Sequence[str], pairs: Sequence[Sequence[str]] | None,
                   max_tokens: int, *, keep_spans: bool = False, beam: bool = True) -> SentenceTerms:
    """The glossary `pairs` ((source, target) each; None: none) over `sentences`, and with keep_spans their kept
    spans; GlossaryError naming the first bad entry. Placeholders are terms only in beam search (`beam`): the other
    searches keep none, and their spans come back where the model copied the placeholder, or at the end. The
    message never quotes a term: errors are logged, and the terms are the client's text."""
    entries, ids = glossary_ids(engine, pairs or [], max_tokens)
    avoid = "\n".join(t for e in entries for t in (e.source, e.target))    # no placeholder a term's, nor in one
    kept = [keep(s, engine.writable, avoid) if keep_spans else Kept(s) for s in sentences]
    texts = [k.text.translate(QUOTES) if keep_spans else k.text for k in kept]
    found = [matches(t, entries) for t in texts]
    terms = []
    for hits, k in zip(found, kept):
        include = [ids[i] for i in hits] + ([engine.term_ids(p) for p in k.placeholders()] if beam else [])
        terms.append(Terms.of(include, joiners=engine.joiners) if include else None)
    return SentenceTerms(entries, terms, found, texts, kept)


def glossary_ids(engine: Engine, pairs: Sequence[Sequence[str]], max_tokens: int) -> tuple[list[Entry],
                                                                                          list[list[int]]]:
    """The checked entries and each target term's ids (the caller's to read, not to change); GlossaryError naming
    the first bad entry. The glossaries last used are kept per engine, up to GLOSSARY_ENTRIES_KEPT entries in all,
    keyed by their entries and the limit: a stored glossary (glossary_id) sends all its entries with every request,
    and checking and tokenizing 10,000 of them cost a one-sentence request 267-318 ms, and 20-29 ms when kept
    (benchmarks/glossary_cost.py). A deleted glossary's entries stay here until newer ones push them out."""
    key = (tuple((a, b) for a, b in pairs), max_tokens)
    kept = KEPT.setdefault(engine, OrderedDict())
    if key in kept:
        kept.move_to_end(key)
        return kept[key]
    checked = checked_ids(engine, key[0], max_tokens)
    kept[key] = checked
    while sum(len(entries) for entries, _ in kept.values()) > GLOSSARY_ENTRIES_KEPT:
        kept.popitem(last=False)                  # the least recently used first; one too large goes at once
    return checked


# Entries kept per engine: two glossaries at the store's 10,000-entry limit, about 12 MB of Python objects each
# (the entries, their token ids and the key's strings).
GLOSSARY_ENTRIES_KEPT = 20_000
KEPT: WeakKeyDictionary = WeakKeyDictionary()    # engine -> OrderedDict((pairs, max_tokens) -> (entries, ids))


def checked_ids(engine: Engine, pairs: tuple[tuple[str, str], ...], max_tokens: int) -> tuple[list[Entry],
                                                                                            list[list[int]]]:
    entries = check_entries([Entry(a, b) for a, b in pairs])
    ids = []
    for n, e in enumerate(entries, 1):
        t = engine.term_ids(e.target)
        if engine.unk_id in t or not all(engine.writable(ch) for ch in e.target if not ch.isspace()):
            raise GlossaryError(f"glossary entry {n}: its target term has characters {engine.package.name} "
                                "cannot write")
        if len(t) > max_tokens:
            raise GlossaryError(f"glossary entry {n}: its target term is {len(t)} tokens; the limit is "
                                f"{max_tokens}")
        ids.append(t)
    return entries, ids
