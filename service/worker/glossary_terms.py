"""A request's constraints in the translate worker: the spans kept as written (service/shared/kept_spans.py: marked
`<dnt>`, URLs, e-mail addresses, code, what the model cannot write) replaced by placeholders the search must write;
its glossary's entries checked against the model (every target term writable, within the sentence limit) and
matched in each sentence (service/shared/glossary.py); both made the sentence's terms (service/shared/constraints.py);
and afterwards the spans put back and each text's report of what held."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..inference.engine import Engine
from ..metrics import metrics
from ..shared.constraints import Terms
from ..shared.glossary import Entry, GlossaryError, check_entries, held, matches
from ..shared.kept_spans import QUOTES, Kept, keep
from .scheduler import Failure


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
                   max_tokens: int, *, keep_spans: bool = False, beam: bool = True) -> SentenceTerms | Failure:
    """The glossary `pairs` ((source, target) each; None: none) over `sentences`, and with keep_spans their kept
    spans, or a 400 naming the first bad entry. Placeholders are terms only in beam search (`beam`): the other
    searches keep none, and their spans come back where the model copied the placeholder, or at the end. The
    message never quotes a term: errors are logged, and the terms are the client's text."""
    kept = [keep(s, engine.writable) if keep_spans else Kept(s) for s in sentences]
    texts = [k.text.translate(QUOTES) if keep_spans else k.text for k in kept]
    entries, ids = glossary_ids(engine, pairs or [], max_tokens)
    if isinstance(entries, Failure):
        return entries
    found = [matches(t, entries) for t in texts]
    terms = []
    for hits, k in zip(found, kept):
        include = [ids[i] for i in hits] + ([engine.term_ids(p) for p in k.placeholders()] if beam else [])
        terms.append(Terms.of(include, joiners=engine.joiners) if include else None)
    return SentenceTerms(entries, terms, found, texts, kept)


def glossary_ids(engine: Engine, pairs: Sequence[Sequence[str]], max_tokens: int
                 ) -> tuple[list[Entry], list[list[int]]] | tuple[Failure, None]:
    """The checked entries and each target term's ids, or (a 400 naming the entry, None)."""
    try:
        entries = check_entries([Entry(a, b) for a, b in pairs])
    except GlossaryError as e:
        return Failure(400, "invalid_glossary", str(e)), None
    ids = []
    for n, e in enumerate(entries, 1):
        t = engine.term_ids(e.target)
        if engine.unk_id in t or not all(engine.writable(ch) for ch in e.target if not ch.isspace()):
            return Failure(400, "invalid_glossary", f"glossary entry {n}: its target term has characters "
                           f"{engine.package.name} cannot write"), None
        if len(t) > max_tokens:
            return Failure(400, "invalid_glossary", f"glossary entry {n}: its target term is {len(t)} tokens; the "
                           f"limit is {max_tokens}"), None
        ids.append(t)
    return entries, ids


def report(st: SentenceTerms, span: tuple[int, int], translations: Sequence[str], model: str) -> list[dict]:
    """A text's entries (its sentences `span`, their translations in order): each entry its source terms matched,
    held when its target term is in every sentence's translation where it matched; counted in the metric."""
    out: dict[int, bool] = {}
    start, end = span
    for k, text in zip(range(start, end), translations):
        for i in st.found[k]:
            out[i] = out.get(i, True) and held(text, st.entries[i].target)
    applied = sum(out.values())
    if out:
        m = metrics().glossary_entries
        m.labels(model, "held").inc(applied)
        m.labels(model, "missed").inc(len(out) - applied)
    return [{"source": st.entries[i].source, "target": st.entries[i].target, "held": ok} for i, ok in out.items()]
