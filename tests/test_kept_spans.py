"""What comes back as written (service/shared/kept_spans.py): spans marked <dnt>, URLs, e-mail addresses, code and
characters the model cannot write become placeholders the beam search must place, and come back in their place;
through POST /translate of a real server over models/de-en, greedy and beam, and beside a glossary."""

import httpx
import pytest

from service.shared.kept_spans import keep

from conftest import ROOT, start_server, stop_server

ASCII = str.isascii


def test_marked_spans_and_unwritable_runs_become_placeholders_in_order():
    k = keep("Hallo 😀 Welt <dnt>Speichern unter</dnt>, https://x.org/a?b=1. Mail a.b@c.de `make`", ASCII)
    assert k.text == "Hallo XQ1 Welt XQ2, XQ3. Mail XQ4 XQ5"
    assert k.spans == ["😀", "Speichern unter", "https://x.org/a?b=1", "a.b@c.de", "`make`"]
    assert k.restore("Hello XQ1 world XQ2, XQ3. Mail XQ4 XQ5") == (
        "Hello 😀 world Speichern unter, https://x.org/a?b=1. Mail a.b@c.de `make`")


def test_a_text_holding_the_placeholder_prefix_gets_another_and_nothing_kept_changes_nothing():
    assert keep("XQ1 ist 😀", ASCII).text == "XQ1 ist XZ1"
    assert keep("Foo 😀", ASCII, avoid="Foo\nXQ1\nXZ").text == "Foo XJ1"      # nor one a glossary term holds
    k = keep("Nichts zu behalten.", ASCII)
    assert k.text == "Nichts zu behalten." and k.restore("Nothing to keep.") == "Nothing to keep."


def test_restore_drops_copies_and_appends_what_the_model_left_out():
    k = keep("😀😀😀 und ☃", ASCII)
    assert k.text == "XQ1 und XQ2"
    assert k.restore("XQ1XQ1 and XQ2") == "😀😀😀 and ☃"
    assert k.restore("and") == "and 😀😀😀 ☃"
    assert k.restore("XQ1 and XQ") == "😀😀😀 and ☃"          # a placeholder the budget cut: not left in the text


def test_restore_leaves_no_mangled_placeholder_in_the_text():
    """A search that need not place them (greedy) may write a placeholder run together with more: the previous
    package wrote "The ☁ ☂ ☃ ☄ ★ XQ07088XXQ ☉Q10 here." for twelve marks; no word holding the prefix comes back."""
    marks = "☀☁☂☃☄★☆☇☈☉☊☋"
    k = keep(" ".join(marks), ASCII)
    out = k.restore("Hello XQ01 XQ07088XXQ there.")
    assert out == "Hello ☀ there. ☁ ☂ ☃ ☄ ★ ☆ ☇ ☈ ☉ ☊ ☋"


def test_restore_reads_a_placeholder_the_search_stuttered_as_one():
    """The previous package wrote "☉Q10" for "XQ10Q10": the stutter's rest is the placeholder's, not the text's; what
    merely follows a placeholder (a plural's "s") is the model's and stays."""
    marks = "☀☁☂☃☄★☆☇☈☉☊☋"
    k = keep(" ".join(marks), ASCII)
    out = k.restore(" ".join(k.placeholders()[:9]) + " XQ10Q10 here XQ11 XQ1212.")
    assert out == "☀ ☁ ☂ ☃ ☄ ★ ☆ ☇ ☈ ☉ here ☊ ☋."
    assert keep("Ein 😀 und", ASCII).restore("An XQ1s and") == "An 😀s and"


def test_placeholders_are_as_wide_as_the_last_so_none_begins_another():
    marks = "☀☁☂☃☄★☆☇☈☉☊☋"
    k = keep(" ".join(marks), ASCII)
    assert k.text.split() == [f"XQ{i:02d}" for i in range(1, 13)]
    assert k.restore(" ".join(reversed(k.text.split()))) == " ".join(reversed(marks))


@pytest.fixture(scope="module")
def server():
    proc, url = start_server(ROOT / "models" / "de-en")
    yield url
    stop_server(proc)


TEXTS = {"Hallo 😀 Welt": "😀", "😀😀😀": "😀😀😀", "Der Preis ist 5 € pro Stück.": "€",
         "Besuchen Sie https://example.org/a?b=1 für mehr Informationen.": "https://example.org/a?b=1",
         "Schreiben Sie an info@example.org, wenn Sie Fragen haben.": "info@example.org",
         "Klicken Sie auf <dnt>Speichern unter</dnt> im Menü.": "Speichern unter",
         "Führen Sie `make install` aus.": "`make install`"}


@pytest.mark.parametrize("beam", [1, 4])
def test_what_the_model_cannot_write_and_marked_spans_come_back_as_written(server, beam):
    r = httpx.post(server + "/translate", json={"text": list(TEXTS), "source_lang": "de", "target_lang": "en",
                                                "beam_size": beam}, timeout=120)
    assert r.status_code == 200, r.text
    for (source, span), t in zip(TEXTS.items(), r.json()["translations"]):
        assert t["text"].count(span) == 1, (source, t["text"])
        assert "XQ" not in t["text"] and "<dnt>" not in t["text"]


def test_twelve_kept_spans_come_back_each_once(server):
    """Twelve placeholders (XQ01-XQ12) through the constrained beam search: each mark once, no placeholder left.
    Their order is the model's: the phase-21 package wrote them in the source's order, phase 22's writes XQ12 first
    and XQ01 eleventh; that each comes back at the placeholder the search wrote is
    test_placeholders_are_as_wide_as_the_last_so_none_begins_another's."""
    marks = "☀☁☂☃☄★☆☇☈☉☊☋"
    r = httpx.post(server + "/translate", json={"text": f"Die Zeichen {' '.join(marks)} stehen hier.",
                                                "source_lang": "de", "target_lang": "en"}, timeout=120)
    text = r.json()["translations"][0]["text"]
    assert all(text.count(m) == 1 for m in marks) and "XQ" not in text, text


def test_kept_spans_and_a_glossary_hold_together(server):
    r = httpx.post(server + "/translate", json={
        "text": "Das Haus 😀 ist groß.", "source_lang": "de", "target_lang": "en",
        "glossary": [{"source": "Haus", "target": "building"}]}, timeout=120)
    (t,) = r.json()["translations"]
    assert "😀" in t["text"] and "building" in t["text"] and t["glossary"][0]["held"]


def test_a_glossary_term_that_looks_like_a_placeholder_is_kept_beside_the_span(server):
    r = httpx.post(server + "/translate", json={
        "text": "Besuchen Sie https://example.org für Haus.", "source_lang": "de", "target_lang": "en",
        "glossary": [{"source": "Haus", "target": "XQ1"}]}, timeout=120)
    (t,) = r.json()["translations"]
    assert "https://example.org" in t["text"] and "XQ1" in t["text"] and t["glossary"][0]["held"], t
