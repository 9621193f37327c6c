"""Glossaries: how entries match a sentence and read from DeepL's TSV/CSV (service/shared/glossary.py), and a
glossary on POST /translate of a real server over models/de-en: its terms written and reported, bad glossaries
refused naming the entry, the requests beside a refused one unaffected, the metric counted."""

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from service.shared.glossary import Entry, GlossaryError, held, matches, parse

from conftest import ROOT, start_server, stop_server

DE_EN = ROOT / "models" / "de-en"


def entries(*pairs: str) -> list[Entry]:
    return [Entry(*p.split("=")) for p in pairs]


def test_a_source_term_matches_whole_words_with_its_first_letter_in_either_case():
    g = entries("Auftrag=order", "release=Version", "Bau=construction")
    assert matches("Der Auftrag ist da.", g) == [0]
    assert matches("auftrag", g) == [0]
    assert matches("Release und Auftrag", g) == [1, 0]                 # in the order they stand
    assert matches("Die Aufträge und des Auftrags", g) == []           # inflected forms are not matched
    assert matches("Gebäude, Bauer, Umbau", g) == []                   # never inside a longer word
    assert matches("Der AUFTRAG", g) == []                             # the rest of the case as written


def test_the_longest_overlapping_term_wins():
    g = entries("Release=Version", "Release Notes=Versionshinweise")
    assert matches("Die Release Notes sind da", g) == [1]
    assert matches("Das Release kommt", g) == [0]


def test_deepl_tsv_and_csv_read_and_bad_lines_name_their_line():
    assert parse("Auftrag\torder\n\nBau\tconstruction\n") == entries("Auftrag=order", "Bau=construction")
    assert parse('"Auftrag, groß",order\nBau,construction\n', "csv") == entries("Auftrag, groß=order",
                                                                                "Bau=construction")
    with pytest.raises(GlossaryError, match="line 2: 3 fields"):
        parse("a\tb\nc\td\te\n")
    with pytest.raises(GlossaryError, match="entry 2: its target term is empty"):
        parse("a\tb\nc\t \n")
    with pytest.raises(GlossaryError, match="entry 2: its source term is already entry 1"):
        parse("a\tb\na\tc\n")
    with pytest.raises(GlossaryError, match="line 2: not CSV that can be read"):    # over csv's field limit
        parse("a,b\nc," + "d" * 200_000 + "\n", "csv")


def test_a_target_term_is_held_as_written_and_as_a_whole_word():
    assert held("The forest is dark.", "forest") and not held("The forests are dark.", "forest")
    assert held("Use C++ here", "C++") and not held("The Forest", "forest")


@pytest.fixture(scope="module")
def server():
    proc, url = start_server(DE_EN)
    yield url
    stop_server(proc)


def translate(url: str, text, **extra) -> httpx.Response:
    return httpx.post(url + "/translate", json={"text": text, "source_lang": "de", "target_lang": "en"} | extra,
                      timeout=120)


def test_glossary_terms_are_written_and_each_text_says_which_held(server):
    texts = ["Der Auftrag wurde gestern erteilt.", "Das Haus ist groß.", "Es regnet."]
    plain = translate(server, texts).json()["translations"]
    assert all("glossary" not in t or t["glossary"] is None for t in plain)
    glossary = [{"source": "Auftrag", "target": "purchase order"}, {"source": "Haus", "target": "building"}]
    got = translate(server, texts, glossary=glossary).json()["translations"]
    assert "purchase order" in got[0]["text"] and "purchase order" not in plain[0]["text"]
    assert "building" in got[1]["text"]
    assert got[0]["glossary"] == [{"source": "Auftrag", "target": "purchase order", "held": True}]
    assert got[1]["glossary"] == [{"source": "Haus", "target": "building", "held": True}]
    assert got[2]["glossary"] == [] and got[2]["text"] == plain[2]["text"]    # no entry: searched as without
    metrics = httpx.get(server + "/metrics").text
    assert 'transerve_glossary_entries_total{model="de-en",result="held"}' in metrics


@pytest.mark.parametrize("glossary, status, message", [
    ([{"source": "Haus", "target": " "}], 400, "glossary entry 1: its target term is empty"),
    ([{"source": "Haus", "target": "house"}, {"source": "Haus", "target": "home"}], 400,
     "glossary entry 2: its source term is already entry 1"),
    ([{"source": "Haus", "target": "house"}, {"source": "Dach", "target": "屋根"}], 400,
     "glossary entry 2: its target term has characters de-en cannot write"),
    ([{"source": "Haus", "target": "x" * 201}], 400, "glossary entry 1: its target term has 201 characters; the "
                                                      "limit is 200"),
    ([{"source": "", "target": "house"}], 400, "glossary entry 1: its source term is empty"),
    ([{"source": "Haus"}], 422, "target"),
])
def test_a_bad_glossary_is_refused_naming_its_entry(server, glossary, status, message):
    r = translate(server, "Das Haus ist groß.", glossary=glossary)
    assert r.status_code == status, r.text
    assert message in r.text


def test_a_glossary_needs_beam_search(server):
    r = translate(server, "Das Haus ist groß.", beam_size=1, glossary=[{"source": "Haus", "target": "building"}])
    assert r.status_code == 422 and "beam_size 2 or more" in r.text


def test_a_refused_glossary_leaves_the_requests_beside_it_alone(server):
    texts = ["Das Haus ist groß.", "Der Auftrag wurde gestern erteilt.", "Wir haben kein Geld dafür."] * 3
    alone = [translate(server, t).json()["translations"][0]["text"] for t in texts]
    bad = [{"source": "Haus", "target": "屋根"}]
    asks = [(t, None) for t in texts] + [(t, bad) for t in texts[:3]]
    with ThreadPoolExecutor(12) as pool:         # all at once: the refused ones among the others
        answers = list(pool.map(lambda a: translate(server, a[0], **({"glossary": a[1]} if a[1] else {})), asks))
    good, refused = answers[:len(texts)], answers[len(texts):]
    assert [r.json()["translations"][0]["text"] for r in good] == alone
    assert {r.status_code for r in refused} == {400}
