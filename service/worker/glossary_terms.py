"""A request's constraints in the translate worker (service/inference/request_terms.py makes them: kept spans,
glossary terms), a bad glossary made the request's 400, and afterwards each text's report of what its glossary's
entries held, counted in the metric."""

from __future__ import annotations

from typing import Sequence

from ..inference.engine import Engine
from ..inference.request_terms import SentenceTerms, sentence_terms
from ..metrics import metrics
from ..shared.glossary import GlossaryError, held
from .scheduler import Failure


def request_terms(engine: Engine, sentences: Sequence[str], pairs: Sequence[Sequence[str]] | None, max_tokens: int,
                  *, beam: bool) -> SentenceTerms | Failure:
    """request_terms.sentence_terms with every span kept, or a 400 `invalid_glossary` naming the first bad entry."""
    try:
        return sentence_terms(engine, sentences, pairs, max_tokens, keep_spans=True, beam=beam)
    except GlossaryError as e:
        return Failure(400, "invalid_glossary", str(e))


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
