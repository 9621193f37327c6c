"""A request's glossary in the translate worker: its entries checked against the model (every target term must be
writable, within the sentence limit), matched in each sentence (service/shared/glossary.py), the matches made the
sentence's constraints (service/shared/constraints.py), and afterwards each text's report of what held."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..inference.engine import Engine
from ..metrics import metrics
from ..shared.constraints import Terms
from ..shared.glossary import Entry, GlossaryError, check_entries, held, matches
from .scheduler import Failure


@dataclass
class SentenceTerms:
    """Each sentence's constraints (None: it holds no entry) and the entries it holds (indices into entries)."""
    entries: list[Entry]
    terms: list[Terms | None]
    found: list[list[int]]


def sentence_terms(engine: Engine, sentences: Sequence[str], pairs: Sequence[Sequence[str]],
                   max_tokens: int) -> SentenceTerms | Failure:
    """The glossary `pairs` ((source, target) each) over `sentences`, or a 400 naming the first bad entry. The
    message never quotes a term: errors are logged, and the terms are the client's text."""
    try:
        entries = check_entries([Entry(a, b) for a, b in pairs])
    except GlossaryError as e:
        return Failure(400, "invalid_glossary", str(e))
    ids = []
    for n, e in enumerate(entries, 1):
        t = engine.term_ids(e.target)
        if engine.unk_id in t:
            return Failure(400, "invalid_glossary", f"glossary entry {n}: its target term has characters "
                           f"{engine.package.name} cannot write")
        if len(t) > max_tokens:
            return Failure(400, "invalid_glossary", f"glossary entry {n}: its target term is {len(t)} tokens; the "
                           f"limit is {max_tokens}")
        ids.append(t)
    found = [matches(s, entries) for s in sentences]
    return SentenceTerms(entries, [Terms.of([ids[i] for i in hits], joiners=engine.joiners) if hits else None
                                   for hits in found], found)


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
