"""A request's constraints made with its model (service/inference/request_terms.py): a glossary checked and
tokenized once and kept for the next request that sends the same entries; a bad one refused every time."""

import pytest

from service.inference.engine import Engine
from service.inference import request_terms
from service.inference.request_terms import glossary_ids, sentence_terms
from service.shared.glossary import GlossaryError

from conftest import ROOT


@pytest.fixture(scope="module")
def engine():
    return Engine(ROOT / "models" / "de-en", device="cpu", intra_op_threads=1)


def test_a_glossary_sent_again_is_kept_and_gives_the_same_terms(engine):
    pairs = [["Haus", "building"], ["Auftrag", "order"]]
    first = glossary_ids(engine, pairs, 64)
    assert glossary_ids(engine, [tuple(p) for p in pairs], 64) is first          # kept, whatever the sequences
    assert glossary_ids(engine, pairs[:1], 64) is not first                       # other entries, another key
    long = [["Haus", "a building of several floors"]]
    assert glossary_ids(engine, long, 64)
    with pytest.raises(GlossaryError, match="the limit is 2"):                   # the limit is part of the key
        glossary_ids(engine, long, 2)
    st = sentence_terms(engine, ["Das Haus ist groß."], pairs, 64)
    assert st.found == [[0]] and st.terms[0].include == (tuple(first[1][0]),)


def test_a_bad_glossary_is_refused_every_time_it_comes(engine):
    for _ in range(2):
        with pytest.raises(GlossaryError, match="entry 2"):
            glossary_ids(engine, [["Haus", "building"], ["Welt", "😀"]], 64)


def test_the_glossaries_kept_are_bounded_by_their_entries_in_all(engine, monkeypatch):
    monkeypatch.setattr(request_terms, "GLOSSARY_ENTRIES_KEPT", 3)
    two, one = [["Haus", "building"], ["Welt", "world"]], [["Auftrag", "order"]]
    first = glossary_ids(engine, two, 64)
    assert glossary_ids(engine, one, 64) and glossary_ids(engine, two, 64) is first     # 3 entries: both kept
    glossary_ids(engine, [["Baum", "tree"]], 64)                                         # 4: the oldest goes
    kept = request_terms.KEPT[engine]
    assert ((("Auftrag", "order"),), 64) not in kept and glossary_ids(engine, two, 64) is first
    assert sum(len(e) for e, _ in request_terms.KEPT[engine].values()) <= 3
