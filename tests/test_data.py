"""Tests for model/data.py (corpus preparation).

The Ding fixture holds verbatim lines of the real dictionary, so the expected pairs below are
what the real corpus contains.  Nothing here needs network access or apt.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

polib = pytest.importorskip("polib")

from model.corpus.catalogs import catalog_origin, find_catalogs, gettext_pair, read_gettext  # noqa: E402
from model.corpus.clean import clean_corpus, clean_pair  # noqa: E402
from model.corpus.debian import fetch_deb  # noqa: E402
from model.corpus.ding import (find_ding, is_sentence, parse_ding_line, read_ding, split_alternatives,  # noqa: E402
                               strip_annotations, strip_markers)
from model.corpus.split import split_corpus  # noqa: E402
from model.corpus.text import CorpusError, Pair, normalize_text  # noqa: E402
from model.corpus.tsv import read_pairs, write_tsv  # noqa: E402
from model.corpus.user import read_moses, read_tsv_corpus  # noqa: E402
from model.data import main  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "ding_sample.txt"


def ding_line(prefix: str) -> str:
    """The fixture line starting with ``prefix`` (exactly one must exist)."""
    lines = [
        line for line in FIXTURE.read_text(encoding="utf-8").splitlines() if line.startswith(prefix)
    ]
    assert len(lines) == 1, prefix
    return lines[0]


def pairs_of(prefix: str) -> list[tuple[str, str]]:
    return [(p.de, p.en) for p in parse_ding_line(ding_line(prefix))]


# --------------------------------------------------------------------------------------------
# Ding parsing
# --------------------------------------------------------------------------------------------


def test_equal_alternative_counts_pair_one_to_one() -> None:
    assert pairs_of("A {n}; Ais {n}") == [
        ("A", "A"),
        ("Ais", "A sharp"),
        ("As", "A flat"),
        ("Aisis", "A double sharp"),
        ("Ases", "A double flat"),
        ("A-Dur", "A major"),
    ]


def test_unequal_alternative_counts_pair_first_only() -> None:
    # 2 German vs 1 English alternative; parentheticals and {pl} removed
    assert pairs_of("Aale {pl}") == [("Aale", "eels")]
    # 1 vs 2, [cook.] [Am.] (auf der Speisekarte) (on a menu) removed
    assert pairs_of("Salatmischung {f}") == [("Salatmischung", "mixed salad")]
    # 3 German vs 2 English alternatives in every sub-entry: first with first, no product
    assert pairs_of("etw. stauen;") == [
        ("etw. stauen", "to dam"),
        ("stauend", "damming"),
        ("gestaut", "dammed"),
        ("staut", "dams"),
        ("staute", "dammed"),
    ]


def test_subentries_give_one_pair_each() -> None:
    line = ding_line("entweichen {vi}")
    n_sub = len(line.split(" :: ")[0].split(" | "))
    assert n_sub == 5
    assert len(parse_ding_line(line)) == n_sub
    assert pairs_of("Aalbestand {m}") == [
        ("Aalbestand", "eel stock"),
        ("Aalbestände", "eel stocks"),
    ]


def test_register_and_region_markers_removed() -> None:
    assert pairs_of("das A und O") == [("das A und O", "the nuts and bolts")]
    assert pairs_of("bevormundend") == [("bevormundend", "paternalistic")]
    # /IFP/ (abbreviation) and ~Prozesskostenhilfe (related term) are markers too
    assert pairs_of("Armenrecht {n}") == [("Armenrecht", "in forma pauperis")]
    assert pairs_of("Radarquerschnitt {m}") == [("Radarquerschnitt", "radar cross section")]


def test_strip_markers_and_parentheticals() -> None:
    assert strip_markers("to dam up <> sth.") == "to dam up sth."
    assert strip_markers("roll-call <rollcall> <roll call>") == "roll-call"
    assert strip_markers("initial public offering /IPO/") == "initial public offering"
    assert strip_markers("bill of exchange /B/E/") == "bill of exchange"
    assert strip_markers("he/she squats") == "he/she squats"
    assert strip_annotations("Aalen {n} (erdgeschichtliche Stufe) [geol.]") == "Aalen"
    assert strip_annotations("Das war (hoch)anständig von ihm.") == "Das war anständig von ihm."
    assert strip_annotations("Es tut mir (schrecklich) leid.") == "Es tut mir leid."
    assert strip_annotations("(Ganz) wie Sie wollen!") == "Wie Sie wollen!"
    assert (
        strip_annotations("Das Land ist auf einem guten Weg (, dieses Ziel zu erreichen).")
        == "Das Land ist auf einem guten Weg."
    )


def test_no_annotation_characters_survive() -> None:
    pairs = list(read_ding(FIXTURE))
    assert len(pairs) > 50
    for p in pairs:
        for side in (p.de, p.en):
            assert side == side.strip() and "  " not in side
            for ch in "{}[]<>()~\u2019":
                assert ch not in side, (ch, p)


def test_placeholders_are_kept() -> None:
    assert ("von jdm./etw. hören", "to hear of sb. / about sth.") in pairs_of("von jdm./etw. hören")
    assert pairs_of("jdn. verstimmen")[0] == ("jdn. verstimmen", "to put sb. in a bad mood")
    assert pairs_of("klagen (über etw.)")[0] == ("klagen", "to lament")


def test_sentences_are_classified() -> None:
    pairs = parse_ding_line(ding_line("nicht beschlussfähig sein"))
    assert [(p.de, p.en, p.sentence) for p in pairs] == [
        ("nicht beschlussfähig sein", "to lack a quorum", False),
        # "The committee has no quorum.; A quorum of ... is not present." -> first one
        ("Der Ausschuss ist nicht beschlussfähig.", "The committee has no quorum.", True),
    ]
    questions = parse_ding_line(ding_line("von jdm./etw. hören"))
    assert [(p.de, p.en, p.sentence) for p in questions] == [
        ("von jdm./etw. hören", "to hear of sb. / about sth.", False),
        ("Hast du vom Erdbeben gehört?", "Have you heard about the earthquake?", True),
        ("Kate Buck? Von der hab ich noch nie gehört.", "Kate Buck? Never heard of her.", True),
    ]
    assert is_sentence(
        "Das Museum ist montags nicht geöffnet.", "The museum is not open on Monday."
    )
    assert not is_sentence("Ehre, wem Ehre gebührt", "Give credit where credit is due.")
    assert not is_sentence("etw. durch etw. hindurch passieren.", "to pass through sth.")
    assert not is_sentence("Ja, bitte.", "Yes, please do.")  # 2 words


def test_parentheses_inside_sentences() -> None:
    # swath(e): optional letters glued to a word; "(hoch)anständig": glued prefix
    assert pairs_of("Schneise {f}")[1] == (
        "Wir schlugen uns eine Schneise durch das dichte Unterholz.",
        "We cut a swath through the dense undergrowth.",
    )
    assert pairs_of("anständig {adj}")[2] == (
        "Das war anständig von ihm.",
        "That was decent of him.",
    )
    # "; " inside parentheses does not split alternatives; the parentheticals go on both sides
    assert pairs_of("Ich bin Amerikaner") == [("Ich bin Amerikaner.", "I am an American.")]


def test_semicolon_inside_a_sentence_is_not_an_alternative() -> None:
    assert pairs_of("die Sache an sich herankommen lassen")[1] == (
        "Ich habe noch nichts entschieden. Ich lasse die Sache an mich herankommen.",
        "I haven't made any decisions; I'm going to play it by ear.",
    )
    # ... but a term list that happens to end in "." is split as terms
    assert pairs_of("Umsatzsteueridentnummer") == [("Umsatzsteueridentnummer", "VAT number")]


def test_missing_full_stop_between_sentence_alternatives() -> None:
    pairs = pairs_of("knapp; nicht ganz")
    assert ("Er starb knapp 80-jährig.", "He died at the age of just under 80") in pairs
    assert ("Er starb mit nicht ganz 80 Jahren.", "He died when he was close to 80.") in pairs
    assert split_alternatives("The committee has no quorum.; A quorum is absent.", True) == [
        "The committee has no quorum.",
        "A quorum is absent.",
    ]


def test_apostrophes_are_ascii() -> None:
    assert pairs_of("Anteil {m} (an)")[2] == (
        "Davon entfallen 20% auf Europa.",
        "Europe's share is 20 percent.",
    )


def test_comment_and_malformed_lines_are_skipped() -> None:
    assert parse_ding_line("# Version :: devel 2023-01-30") == []
    assert parse_ding_line("") == []
    assert parse_ding_line("Haus {n} | Häuser {pl} :: house") == []  # sub-entry counts differ
    # unbalanced parentheses in the real file: "(der Nachkriegszeit :: 1950er ... Jahre)"
    assert parse_ding_line(ding_line("geburtenstarke Jahrgänge")) == []


def test_normalize_text() -> None:
    assert normalize_text("Mu\u0308ller\u00a0 sagt \u201eHallo\u201c\t\u2019s\u200b ok\x07") == (
        'Müller sagt "Hallo" \'s ok'
    )
    assert normalize_text("Mu\u0308ller") == "M\u00fcller"  # NFC


# --------------------------------------------------------------------------------------------
# gettext
# --------------------------------------------------------------------------------------------


def make_catalog(directory: Path) -> tuple[Path, Path]:
    """A German .po catalog with the interesting cases, plus its compiled .mo."""
    po = polib.POFile()
    po.metadata = {
        "Content-Type": "text/plain; charset=UTF-8",
        "Language": "de",
        "Plural-Forms": "nplurals=2; plural=(n != 1);",
    }
    entries = [
        polib.POEntry(msgid="_File", msgstr="_Datei"),
        polib.POEntry(msgid="Save _As", msgstr="Speichern _unter"),
        polib.POEntry(msgid="&Open file", msgstr="Datei ö&ffnen"),
        polib.POEntry(msgid="Salt & pepper", msgstr="Salz & Pfeffer"),
        polib.POEntry(msgid="pg_control is missing", msgstr="pg_control fehlt"),
        polib.POEntry(msgid="%s", msgstr="%s"),
        polib.POEntry(msgid="%d%%", msgstr="%d %%"),
        polib.POEntry(msgid="12:30", msgstr="12:30"),
        polib.POEntry(msgid="Fuzzy thing", msgstr="Unscharfes Ding", flags=["fuzzy"]),
        polib.POEntry(msgid="Untranslated", msgstr=""),
        polib.POEntry(msgid="<b>Bold</b> text", msgstr="<b>Fetter</b> Text"),
        polib.POEntry(msgid="Line one\nLine two", msgstr="Zeile eins\nZeile zwei"),
        polib.POEntry(msgid="Cannot open %s", msgstr="%s kann nicht geöffnet werden\n"),
        polib.POEntry(
            msgid="%d file",
            msgid_plural="%d files",
            msgstr_plural={0: "%d Datei", 1: "%d Dateien"},
        ),
        polib.POEntry(msgid="Open", msgstr="Öffnen", msgctxt="verb"),
        polib.POEntry(msgid="Open", msgstr="Offen", msgctxt="adjective"),
    ]
    for entry in entries:
        po.append(entry)
    directory.mkdir(parents=True, exist_ok=True)
    po_path, mo_path = directory / "demo.po", directory / "demo.mo"
    po.save(str(po_path))
    po.save_as_mofile(str(mo_path))
    return po_path, mo_path


EXPECTED_GETTEXT = [
    ("Datei", "File"),
    ("Speichern unter", "Save As"),
    ("Datei öffnen", "Open file"),
    ("Salz & Pfeffer", "Salt & pepper"),
    ("pg_control fehlt", "pg_control is missing"),
    ("%s kann nicht geöffnet werden", "Cannot open %s"),
    ("%d Datei", "%d file"),
    ("%d Dateien", "%d files"),
    ("Offen", "Open"),  # of two msgctxt variants, "adjective" sorts before "verb"
]


def test_read_gettext_po_and_mo_agree(tmp_path: Path) -> None:
    po_path, mo_path = make_catalog(tmp_path / "de" / "LC_MESSAGES")
    from_po = [(p.de, p.en) for p in read_gettext(po_path)]
    from_mo = [(p.de, p.en) for p in read_gettext(mo_path)]
    assert sorted(from_po) == sorted(EXPECTED_GETTEXT)
    assert sorted(from_mo) == sorted(from_po)
    assert {p.origin for p in read_gettext(po_path)} == {"gettext:demo"}


def test_gettext_pair_rules() -> None:
    assert gettext_pair("_Quit", "_Beenden") == ("Quit", "Beenden")
    assert gettext_pair("E_xit", "Be_enden") == ("Exit", "Beenden")
    assert gettext_pair("R&D budget", "F&E-Budget") == ("R&D budget", "F&E-Budget")
    assert gettext_pair("Bold &amp; italic", "Fett &amp; kursiv") == (
        "Bold & italic",
        "Fett & kursiv",
    )
    assert gettext_pair("{0}", "{0}") is None
    assert gettext_pair("...", "...") is None
    assert gettext_pair("Click <a href='x'>here</a>", "Klicke <a href='x'>hier</a>") is None
    assert gettext_pair(" ".join(["word"] * 61), " ".join(["Wort"] * 61)) is None


def test_find_catalogs_takes_only_german(tmp_path: Path) -> None:
    make_catalog(tmp_path / "locale" / "de" / "LC_MESSAGES")
    make_catalog(tmp_path / "locale" / "fr" / "LC_MESSAGES")
    (tmp_path / "po").mkdir()
    (tmp_path / "po" / "de.po").write_text((tmp_path / "locale/de/LC_MESSAGES/demo.po").read_text())
    (tmp_path / "po" / "fr.po").write_text("")
    found = find_catalogs(tmp_path)
    rel = sorted(str(p.relative_to(tmp_path)) for p in found)
    assert rel == ["locale/de/LC_MESSAGES/demo.mo", "locale/de/LC_MESSAGES/demo.po", "po/de.po"]
    assert catalog_origin(tmp_path / "po" / "de.po") == "gettext:po"
    with pytest.raises(CorpusError):
        find_catalogs(tmp_path / "missing")


def test_cached_deb_is_reused_without_apt(tmp_path: Path) -> None:
    root = tmp_path / "extracted" / "trans-de-en"
    ding = root / "usr/share/trans/de-en"
    ding.parent.mkdir(parents=True)
    ding.write_text(FIXTURE.read_text(encoding="utf-8"), encoding="utf-8")
    assert fetch_deb("trans-de-en", tmp_path) == root
    with pytest.raises(CorpusError, match="not found"):
        find_ding(tmp_path / "nope", tmp_path)


# --------------------------------------------------------------------------------------------
# User corpora
# --------------------------------------------------------------------------------------------


def test_tsv_directions(tmp_path: Path) -> None:
    path = tmp_path / "mine.tsv"
    path.write_text("Guten Morgen\tGood morning\n\nkaputt\n", encoding="utf-8")
    assert list(read_tsv_corpus(path)) == [Pair("Guten Morgen", "Good morning", "tsv:mine")]
    path.write_text("Good morning\tGuten Morgen\n", encoding="utf-8")
    assert list(read_tsv_corpus(path, "en-de")) == [
        Pair("Guten Morgen", "Good morning", "tsv:mine")
    ]


def test_moses(tmp_path: Path) -> None:
    (tmp_path / "corp.de").write_text("Hallo Welt\nDanke\n", encoding="utf-8")
    (tmp_path / "corp.en").write_text("Hello world\nThanks\n", encoding="utf-8")
    assert [(p.de, p.en, p.origin) for p in read_moses(str(tmp_path / "corp"))] == [
        ("Hallo Welt", "Hello world", "moses:corp"),
        ("Danke", "Thanks", "moses:corp"),
    ]


def test_moses_line_mismatch_is_a_clear_error(tmp_path: Path, capsys) -> None:
    (tmp_path / "bad.de").write_text("a\nb\nc\n", encoding="utf-8")
    (tmp_path / "bad.en").write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"has 3 lines but .*bad\.en has 2"):
        list(read_moses(str(tmp_path / "bad")))
    with pytest.raises(SystemExit) as exc:
        main(["--no-ding", "--no-locale", "--moses", str(tmp_path / "bad"),
              "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    assert "line-aligned" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# Cleaning and splitting
# --------------------------------------------------------------------------------------------


def test_clean_pair_rules() -> None:
    keep, reason = clean_pair(Pair(" Ja\u200b ", "Yes", "x"))
    assert (keep, reason) == (Pair("Ja", "Yes", "x"), "kept")
    assert clean_pair(Pair("OK", "OK", "x"))[1] == "kept"
    assert clean_pair(Pair("Save file", "Save file", "x"))[1] == "identical"
    assert clean_pair(Pair("", "x", "x"))[1] == "empty"
    assert clean_pair(Pair("a" * 251, "b" * 200, "x"))[1] == "too_long"
    long_en = "a house with a garden and a very long fence"
    assert clean_pair(Pair("Haus", long_en, "x"))[1] == "length_ratio"
    assert clean_pair(Pair("Ein langes deutsches Wort", "x" * 80, "x"))[1] == "length_ratio"


def test_dedup_keeps_first_origin() -> None:
    pairs, stats = clean_corpus(
        [
            Pair("Haus", "house", "ding"),
            Pair("Haus", "house", "gettext:a"),
            Pair("Haus", "home", "tsv:t"),
        ]
    )
    assert [(p.en, p.origin) for p in pairs] == [("house", "ding"), ("home", "tsv:t")]
    assert stats["gettext"]["duplicate"] == 1 and stats["ding"]["kept"] == 1


def synthetic_corpus() -> list[Pair]:
    pairs = []
    for i in range(80):
        de, en = f"Das ist der Satz Nummer {i}.", f"This is sentence number {i}."
        pairs.append(Pair(de, en, "ding", True))
        pairs.append(Pair(f"Anderes Deutsch {i}", en.rstrip(".").upper(), "gettext:x"))  # leak
        pairs.append(Pair(f"Wort{i}", f"word{i}", "ding", False))
    # not eligible for dev/test: no Ding pair, and a slash alternative
    pairs.append(
        Pair("Ein Satz aus dem Katalog ist hier.", "A sentence from a catalog is here.", "gettext:x")
    )
    pairs.append(
        Pair("Das ist / war ein Satz hier.", "That is / was a sentence here.", "ding", True)
    )
    return pairs


def test_split_is_deterministic_and_leak_free() -> None:
    pairs = synthetic_corpus()
    splits, leaks = split_corpus(pairs, test_size=10, dev_size=7, seed=3)
    shuffled = pairs[:]
    random.Random(99).shuffle(shuffled)
    again, leaks_again = split_corpus(shuffled, test_size=10, dev_size=7, seed=3)
    assert splits == again and leaks == leaks_again  # independent of input order
    assert (len(splits["test"]), len(splits["dev"])) == (10, 7)
    held = set()
    for name in ("dev", "test"):
        for p in splits[name]:
            assert p.sentence and p.origin == "ding" and "/" not in p.de
            held |= {p.de.casefold().rstrip("."), p.en.casefold().rstrip(".")}
    assert not {(p.de, p.en) for p in splits["dev"]} & {(p.de, p.en) for p in splits["test"]}
    for p in splits["train"]:
        assert p.de.casefold().rstrip(".") not in held and p.en.casefold().rstrip(".") not in held
    assert leaks == 17  # each held-out sentence had one gettext pair with the same English
    assert len(splits["train"]) + 10 + 7 + leaks == len(pairs)
    assert splits["train"] != sorted(splits["train"], key=lambda p: (p.de, p.en))  # shuffled


def test_read_pairs_directions(tmp_path: Path) -> None:
    three = tmp_path / "train.tsv"
    write_tsv(three, [Pair("Haus", "house", "ding"), Pair("Tab\there", "new\nline", "x")])
    assert read_pairs(three) == [("Haus", "house"), ("Tab here", "new line")]
    assert read_pairs(three, "en-de") == [("house", "Haus"), ("new line", "Tab here")]
    two = tmp_path / "user.tsv"
    two.write_text("house\tHaus\n\n", encoding="utf-8")
    assert read_pairs(two, "en-de") == [("house", "Haus")]
    assert read_pairs(two, "de-en") == [("house", "Haus")]
    with pytest.raises(ValueError):
        read_pairs(two, "de-fr")


# --------------------------------------------------------------------------------------------
# End to end
# --------------------------------------------------------------------------------------------


def test_main_end_to_end(tmp_path: Path, capsys) -> None:
    make_catalog(tmp_path / "cats" / "de" / "LC_MESSAGES")
    (tmp_path / "user.tsv").write_text("Guten Morgen\tGood morning\n", encoding="utf-8")
    (tmp_path / "c.de").write_text("Hallo Welt\n", encoding="utf-8")
    (tmp_path / "c.en").write_text("Hello world\n", encoding="utf-8")
    out = tmp_path / "out"
    argv = [
        "--ding", str(FIXTURE), "--no-locale", "--gettext", str(tmp_path / "cats"),
        "--tsv", str(tmp_path / "user.tsv"), "--moses", str(tmp_path / "c"),
        "--out", str(out), "--test-size", "3", "--dev-size", "2",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "ding" in printed and "splits: train=" in printed

    meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
    assert meta["langs"] == ["de", "en"] and meta["columns"] == ["de", "en", "origin"]
    assert set(meta["counts"]) == {"ding", "gettext", "tsv:user", "moses:c"}
    assert meta["counts"]["gettext"]["kept"] == 9  # .po and .mo give the same pairs: deduplicated
    assert meta["counts"]["tsv:user"] == {"raw": 1, "kept": 1}
    assert meta["splits"]["test"] == 3 and meta["splits"]["dev"] == 2
    assert meta["created_by"].startswith("python -m model.data --ding ")
    total_kept = sum(c["kept"] for c in meta["counts"].values())
    assert sum(meta["splits"].values()) + meta["leaks_removed"] == total_kept

    for name in ("train", "dev", "test"):
        lines = (out / f"{name}.tsv").read_text(encoding="utf-8").splitlines()
        assert len(lines) == meta["splits"][name]
        assert all(len(line.split("\t")) == 3 for line in lines)
        if name != "train":
            assert all(line.endswith("\tding") for line in lines)
    train = read_pairs(out / "train.tsv")
    assert ("Guten Morgen", "Good morning") in train and ("Hallo Welt", "Hello world") in train

    before = {n: (out / f"{n}.tsv").read_bytes() for n in ("train", "dev", "test")}
    assert main(argv) == 0
    assert before == {n: (out / f"{n}.tsv").read_bytes() for n in ("train", "dev", "test")}


# --------------------------------------------------------------------------------------------
# LibreOffice's help pages, and the software-text test split
# --------------------------------------------------------------------------------------------

HELP_PAGE = """<!DOCTYPE html><html lang="{lang}"><body><div id="DisplayArea">
<h1 id="hd_id3147291" dir="auto">{title}</h1>
<p id="par_id3146957" class="paragraph"><a name="x"></a><span class="avis">{first}</span></p>
<p id="par_id3150443" class="paragraph">{choose} <span id="swln1" class="switchinline"><span hidden="true"
 id="MACtext1" class="MAC"><span class="emph">{mac}</span></span><span hidden="true" id="defaulttext1"><span
 class="emph">{default}</span></span></span>.</p>
<p id="par_id3150444" class="paragraph">{two}</p>
<p id="par_id999" class="paragraph">{only}</p>
</div></body></html>"""


def write_help(root: Path, lang_dir: str, lang: str, **text: str) -> None:
    page = root / "usr/share/libreoffice/help" / lang_dir / "text/shared/optionen/01020000.html"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(HELP_PAGE.format(lang=lang, **text), encoding="utf-8")


def test_libreoffice_help_pages_align_by_paragraph_id_and_split_into_sentences(tmp_path: Path) -> None:
    from model.corpus.lohelp import read_libreoffice_help

    write_help(tmp_path / "de", "de", "de", title="Optionen Laden/Speichern",
               first="Hier legen Sie allgemeine Einstellungen für das Laden fest.", choose="Wählen Sie",
               mac="LibreOffice – Einstellungen", default="Extras – Optionen",
               two="Das ist der erste Satz hier. Und das ist der zweite Satz.", only="Nur auf Deutsch.")
    write_help(tmp_path / "en", "en-US", "en", title="Load/Save Options",
               first="Here you can define general settings for loading.", choose="Choose",
               mac="LibreOffice - Preferences", default="Tools - Options",
               two="This is the first sentence here. And this is the second sentence.", only="")
    pairs = list(read_libreoffice_help(tmp_path / "de", tmp_path / "en"))
    got = [(p.de, p.en, p.sentence) for p in pairs]
    assert got == [
        ("Optionen Laden/Speichern", "Load/Save Options", False),
        ("Hier legen Sie allgemeine Einstellungen für das Laden fest.",
         "Here you can define general settings for loading.", True),
        ("Wählen Sie Extras – Optionen.", "Choose Tools - Options.", True),   # the default variant only
        ("Das ist der erste Satz hier.", "This is the first sentence here.", True),
        ("Und das ist der zweite Satz.", "And this is the second sentence.", True),
    ]
    assert {p.origin for p in pairs} == {"lohelp:shared/optionen/01020000"}


def test_software_sentences_make_a_second_held_out_split() -> None:
    pairs = synthetic_corpus()
    software = [Pair(f"Die Datei Nummer {i} wird jetzt gespeichert.", f"The file number {i} is now saved.",
                     f"lohelp:page{i}", True) for i in range(30)]
    software.append(Pair("Geben Sie %s hier jetzt ein.", "Enter %s here right now.", "gettext:x", True))
    splits, leaks = split_corpus(pairs + software, test_size=10, dev_size=7, seed=3, software_test_size=12)
    assert len(splits["test-software"]) == 12
    assert all(p.origin.startswith("lohelp:") for p in splits["test-software"])      # placeholders stay out
    held = {p.en for p in splits["test-software"]}
    assert not held & {p.en for p in splits["train"]}
    assert len(splits["train"]) + 10 + 7 + 12 + leaks == len(pairs) + len(software)
    without, _ = split_corpus(pairs, test_size=10, dev_size=7, seed=3)
    assert "test-software" not in without and without["test"] == splits["test"]


def test_min_words_keeps_sentence_level_pairs_and_the_same_held_out_splits(tmp_path: Path) -> None:
    common = ["--ding", str(FIXTURE), "--no-locale", "--test-size", "3", "--dev-size", "2"]
    assert main([*common, "--out", str(tmp_path / "all")]) == 0
    assert main([*common, "--out", str(tmp_path / "sentences"), "--min-words", "4"]) == 0
    for name in ("dev", "test"):
        assert (tmp_path / "all" / f"{name}.tsv").read_bytes() == (tmp_path / "sentences" / f"{name}.tsv").read_bytes()
    train = read_pairs(tmp_path / "sentences" / "train.tsv")
    everything = read_pairs(tmp_path / "all" / "train.tsv")
    assert train and all(min(len(de.split()), len(en.split())) >= 4 for de, en in train)
    assert set(train) == {(de, en) for de, en in everything if min(len(de.split()), len(en.split())) >= 4}


def test_upsample_writes_a_sources_training_pairs_n_times_and_leaves_dev_and_test(tmp_path: Path, capsys) -> None:
    common = ["--ding", str(FIXTURE), "--no-locale", "--test-size", "3", "--dev-size", "2"]
    assert main([*common, "--out", str(tmp_path / "once")]) == 0
    assert main([*common, "--out", str(tmp_path / "twice"), "--upsample", "ding=2"]) == 0
    for name in ("dev", "test"):
        assert (tmp_path / "once" / f"{name}.tsv").read_bytes() == (tmp_path / "twice" / f"{name}.tsv").read_bytes()
    once, twice = (read_pairs(tmp_path / d / "train.tsv") for d in ("once", "twice"))
    assert once and twice == once + once          # the fixture is all Ding: every pair once more, after the rest
    meta = json.loads((tmp_path / "twice" / "meta.json").read_text())
    assert meta["upsampled"] == {"ding": 2} and meta["splits"]["train"] == 2 * len(once)
    with pytest.raises(SystemExit) as exit_:
        main([*common, "--out", str(tmp_path / "typo"), "--upsample", "dign=2"])
    assert exit_.value.code == 2 and "dign" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*common, "--out", str(tmp_path / "zero"), "--upsample", "ding=0"])
