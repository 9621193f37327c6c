"""The games' texts of issue 55: Widelands' catalogs (found by ``package_catalogs``), Hedgewars' Lua table,
id-keyed files and Qt catalog, FreeOrion's stringtables. Every fixture is a small file written here in the
real formats; nothing touches the network."""

from __future__ import annotations

import struct
from pathlib import Path

import polib
import pytest

from model.corpus import freeorion, hedgewars
from model.corpus.catalogs import package_catalogs, read_gettext
from model.corpus.text import CorpusError


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def triples(pairs) -> list[tuple[str, str, str]]:
    return sorted((p.de, p.en, p.origin) for p in pairs)


def test_widelands_catalogs_are_found_in_the_games_locale_tree(tmp_path: Path) -> None:
    """widelands-data keeps its catalogs in usr/share/games/widelands/data/locale/<lang>/LC_MESSAGES, one
    per campaign, map and tutorial; Low German (nds) is not German."""
    locale = tmp_path / "usr/share/games/widelands/data/locale"
    for lang, text in (("de", "Baue einen Wachturm."), ("nds", "Bu en Wachttoorn."), ("fr", "Construis une tour.")):
        po = polib.POFile()
        po.metadata = {"Content-Type": "text/plain; charset=UTF-8"}
        po.append(polib.POEntry(msgid="Build a watchtower.", msgstr=text))
        (locale / lang / "LC_MESSAGES").mkdir(parents=True)
        po.save_as_mofile(str(locale / lang / "LC_MESSAGES/scenario_emp02.wmf.mo"))
    cats = package_catalogs(tmp_path)
    assert [c.relative_to(locale).as_posix() for c in cats] == ["de/LC_MESSAGES/scenario_emp02.wmf.mo"]
    assert [(p.de, p.en) for p in read_gettext(cats[0])] == [("Baue einen Wachturm.", "Build a watchtower.")]


LUA = r"""locale = {
["Welcome to the training!"] = "Willkommen zum Training!", -- Basic_Training
["Say \"hello\"|to everyone"]="Sag \"Hallo\" zu|allen",
['It\'s a trap!'] = 'Das ist eine Falle!',
["Bake a cake"] = "Backe einen Kuchen f\195\188r \x41nna und \u{00DC}li\nheute",
["%s has won with %d points"] = "%s hat mit %d Punkten gewonnen",
["%d hogs left"] = "Nur noch wenige Igel übrig",
["Desert Eagle"] = "Desert Eagle",
["011101000"] = "011101000",
["Not translated yet"] = "",
--      ["Commented out"] = "Auskommentiert",
}
"""
EN_TXT = """; English locale
01:02=%1 wins!
01:05=Really quit? (%1/%2)
02:00=%1 has kicked the bucket!
02:00=%1 waves goodbye!
04:00=Attack your enemies|using a simple grenade.
05:00=Only in English
"""
DE_TXT = """; German locale
01:02=%1 gewinnt!
01:05=Wirklich beenden?
02:00=%1 hat den Löffel abgegeben!
02:00=%1 stellt sich tot!
04:00=Greife deine Feinde mit|einer einfachen Granate an.
06:00=Nur auf Deutsch
"""


def qm_bytes(messages: list[tuple[str, list[str]]]) -> bytes:
    """A compiled Qt catalog: a hashes section (skipped by readers that look messages up by source) and the
    messages section, each message its translations (UTF-16), source text and context (UTF-8)."""
    body = b""
    for source, translations in messages:
        for translation in translations:
            encoded = translation.encode("utf-16-be")
            body += bytes([3]) + struct.pack(">I", len(encoded)) + encoded
        body += bytes([6]) + struct.pack(">I", len(source.encode())) + source.encode()
        body += bytes([7]) + struct.pack(">I", 8) + b"PageMain" + bytes([1])
    hashes = struct.pack(">II", 0x1234, 0)
    magic = bytes.fromhex("3cb86418caef9c95cd211cbf60a1bddd")
    return (magic + bytes([0x42]) + struct.pack(">I", len(hashes)) + hashes
            + bytes([0x69]) + struct.pack(">I", len(body)) + body)


def hedgewars_tree(root: Path) -> Path:
    locale = root / hedgewars.LOCALE_DIR
    write(locale / "de.lua", LUA)
    write(locale / "en.txt", EN_TXT)
    write(locale / "de.txt", DE_TXT)
    write(locale / "missions_en.txt", 'Basic_Training.name=Basic Training\n'
          'Basic_Training.desc="Learn how to use the \\"rope\\", and win."\n\nOld_Mission.desc="Gone"\n')
    write(locale / "missions_de.txt", 'Basic_Training.name=Grundausbildung\n'
          'Basic_Training.desc="Lerne, wie man das \\"Seil\\" benutzt, und gewinne."\n')
    write(locale / "campaigns_en.txt", 'A_Classic_Fairytale.name="A Classic Fairytale"\n')
    write(locale / "campaigns_de.txt", 'A_Classic_Fairytale.name="Ein klassisches Märchen"\n')
    (locale / "hedgewars_de.qm").write_bytes(qm_bytes([
        ("&Quit the game now", ["Das Spiel jetzt &beenden"]),
        ("%n hedgehogs", ["%n Igel", "%n Igel"]),                      # plural forms: no single counterpart
        ("<b>Warning</b>: the server is down", ["<b>Achtung</b>: der Server ist nicht erreichbar"]),
        ("Nickname is already in use", ["Spitzname bereits in Benutzung"])]))
    return root


def test_hedgewars_pairs_by_key_with_lua_escapes_and_line_breaks(tmp_path: Path) -> None:
    pairs = list(hedgewars.read({"hedgewars-data": hedgewars_tree(tmp_path)}))
    assert triples(pairs) == sorted([
        ("Willkommen zum Training!", "Welcome to the training!", "hedgewars:lua"),
        ('Sag "Hallo" zu allen', 'Say "hello" to everyone', "hedgewars:lua"),
        ("Das ist eine Falle!", "It's a trap!", "hedgewars:lua"),
        ("Backe einen Kuchen für Anna und Üli heute", "Bake a cake", "hedgewars:lua"),
        ("%s hat mit %d Punkten gewonnen", "%s has won with %d points", "hedgewars:lua"),
        ("%1 gewinnt!", "%1 wins!", "hedgewars:engine"),
        ("Greife deine Feinde mit einer einfachen Granate an.", "Attack your enemies using a simple grenade.",
         "hedgewars:engine"),
        ("Grundausbildung", "Basic Training", "hedgewars:missions"),
        ('Lerne, wie man das "Seil" benutzt, und gewinne.', 'Learn how to use the "rope", and win.',
         "hedgewars:missions"),
        ("Ein klassisches Märchen", "A Classic Fairytale", "hedgewars:campaigns"),
        ("Das Spiel jetzt beenden", "Quit the game now", "hedgewars:frontend"),
        ("Spitzname bereits in Benutzung", "Nickname is already in use", "hedgewars:frontend")])
    assert {p.sentence for p in pairs if p.de == "Das ist eine Falle!"} == {False}   # three words
    assert all(p.sentence for p in pairs if p.de.startswith("Greife deine Feinde"))


def test_hedgewars_placeholders_must_agree(tmp_path: Path) -> None:
    assert hedgewars.placeholders("%s: %.1f%% of %d, %1 and %n") == [".1f", "1", "d", "n", "s"]   # %% is text
    assert hedgewars.clean_pair("Wirklich beenden?", "Really quit? (%1/%2)") is None
    assert hedgewars.clean_pair("Nur noch %d Igel", "%d hogs left") == ("Nur noch %d Igel", "%d hogs left")
    assert hedgewars.clean_pair("Desert Eagle", "Desert Eagle") is None
    assert hedgewars.clean_pair("", "Not translated yet") is None


def test_lua_string_escapes() -> None:
    assert hedgewars.lua_string(r'"a\tb\\c\"d\'e\z   f"') == "a\tb\\c\"d'ef"
    assert hedgewars.lua_string(r'"Gr\195\182\195\159e \u{1F600}"') == "Größe \U0001F600"
    assert hedgewars.lua_string("'\\65\\066C'") == "ABC"


def test_hedgewars_without_its_locale_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CorpusError):
        list(hedgewars.read({"hedgewars-data": tmp_path}))


EN_TABLE = """English
# comment lines and blank lines between entries

SHIPYARD
Shipyard

TECH_ROBOTICS
Robotic Production

DUPLICATE
First text wins.

DUPLICATE
Second text loses.

BLD_SHIPYARD_DESC
'''A <i>basic</i> [[SHIPYARD]] builds ships.
Requires [[tech TECH_ROBOTICS]] and a population of 3.

*  Upkeep grows with each ship.'''

FLEET_NAME
Fleet %1%

SITREP_MINES
At %system%: mines damaged the %ship%.

STALE_DESC
Increases industry by 5.

OUTDATED_ARTICLE
'''Shields protect ships.
They regenerate each turn.'''

ENGLISH_LEFT
Increases the supply range of the planet by one.

NEEDS_UNTRANSLATED
This needs [[SUPPLY_RANGE]] to work.

SUPPLY_RANGE
supply range

EMPTY_TEXT
Everything is fine.

OPTIONS_TITLE
Options

ONLY_ENGLISH
Only in English.

ESCAPED_BREAK
First line.\\nSecond line follows here.

#include "../parameters.txt"
"""
DE_TABLE = """Deutsch

SHIPYARD
Werft

#SHIPYARD_COMMENTED
#Auskommentiert

TECH_ROBOTICS
Robotische Produktion

DUPLICATE
Der erste Text gilt.

BLD_SHIPYARD_DESC
'''Eine <i>einfache</i> [[SHIPYARD]] baut Schiffe.
Benötigt [[tech TECH_ROBOTICS]] und eine Bevölkerung von 3.

*  Der Unterhalt wächst mit jedem Schiff.'''

FLEET_NAME
Flotte %2%

SITREP_MINES
In %system%: Minen haben das Schiff %ship% beschädigt.

STALE_DESC
Erhöht die Industrie um 20.

OUTDATED_ARTICLE
Schilde schützen Schiffe.

ENGLISH_LEFT
Increases the Versorgung range of the planet by one.

NEEDS_UNTRANSLATED
Dazu wird [[SUPPLY_RANGE]] gebraucht.

EMPTY_TEXT


OPTIONS_TITLE
Options

ESCAPED_BREAK
Erste Zeile.\\nDie zweite Zeile folgt hier.

#include "../parameters.txt"
"""


def freeorion_tree(root: Path) -> Path:
    tables = root / freeorion.TABLE_DIR
    write(tables / "en.txt", EN_TABLE)
    write(tables / "de.txt", DE_TABLE)
    write(tables.parent / "parameters.txt", "FUNCTIONAL_LIST\n'''A\nB'''\n")
    return root


def test_freeorion_stringtable_grammar(tmp_path: Path) -> None:
    table = freeorion.read_stringtable(freeorion_tree(tmp_path) / freeorion.TABLE_DIR / "en.txt")
    assert table["DUPLICATE"] == "First text wins."
    assert table["BLD_SHIPYARD_DESC"].startswith("A <i>basic</i> [[SHIPYARD]]")
    assert table["BLD_SHIPYARD_DESC"].endswith("with each ship.")
    assert table["ESCAPED_BREAK"] == "First line.\nSecond line follows here."
    assert table["FUNCTIONAL_LIST"] == "A\nB"                               # from the #include
    assert "SHIPYARD_COMMENTED" not in freeorion.read_stringtable(tmp_path / freeorion.TABLE_DIR / "de.txt")


def test_freeorion_references_resolve_in_their_own_language_only() -> None:
    table = {"A": "see [[B]] and [[tech C]]", "B": "b[[C]]", "C": "c", "LOOP": "[[LOOP]]", "GAP": "[[MISSING]]"}
    cache: dict[str, str | None] = {}
    assert freeorion.expand(table, "A", cache) == "see bc and c"
    assert freeorion.expand(table, "LOOP", cache) is None
    assert freeorion.expand(table, "GAP", cache) is None


def test_freeorion_pairs_by_key_line_and_sentence(tmp_path: Path) -> None:
    pairs = list(freeorion.read({"freeorion-data": freeorion_tree(tmp_path)}))
    assert triples(pairs) == sorted((de, en, "freeorion:stringtable") for de, en in [
        ("Werft", "Shipyard"),
        ("Robotische Produktion", "Robotic Production"),
        ("Der erste Text gilt.", "First text wins."),
        ("Eine einfache Werft baut Schiffe.", "A basic Shipyard builds ships."),
        ("Benötigt Robotische Produktion und eine Bevölkerung von 3.",
         "Requires Robotic Production and a population of 3."),
        ("Der Unterhalt wächst mit jedem Schiff.", "Upkeep grows with each ship."),
        ("In %system%: Minen haben das Schiff %ship% beschädigt.", "At %system%: mines damaged the %ship%."),
        ("Erste Zeile.", "First line."),
        ("Die zweite Zeile folgt hier.", "Second line follows here.")])
    # dropped: FLEET_NAME (%2% for %1%), STALE_DESC (20 for 5), OUTDATED_ARTICLE (one line for two),
    # ENGLISH_LEFT (English on the German side), NEEDS_UNTRANSLATED (SUPPLY_RANGE has no German text),
    # EMPTY_TEXT, OPTIONS_TITLE (untranslated), ONLY_ENGLISH (no German entry)


def test_freeorion_numbers_read_with_decimal_commas() -> None:
    assert freeorion.usable("Erhöht Forschung um 0,05 pro Einwohner.", "Increases research by 0.05 per pop.")
    assert not freeorion.usable("Erhöht Forschung um 0,5 pro Einwohner.", "Increases research by 0.05 per pop.")
