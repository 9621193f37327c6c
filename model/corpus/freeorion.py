"""FreeOrion's stringtables (Debian's ``freeorion-data``, GPL-2) as German-English pairs.

``usr/share/games/freeorion/default/stringtables/en.txt`` holds all of the game's text (interface,
situation reports, the encyclopedia's articles on techs, buildings, species), ``de.txt`` the German
translation of about half of it (the game shows English for the rest). After a first line naming the
language, an entry is an identifier on a line of its own and its text on the next line, or several lines
between ``'''`` quotes; ``#`` starts a comment, ``#include "file"`` pulls in a language-neutral file.

Entries are paired by identifier only. Their text is prepared as the game prepares it: ``\\n`` is a line
break, ``[[KEY]]`` is replaced by KEY's own (expanded) text, a link ``[[tech KEY]]`` by KEY's text, markup
(``<i>``, ``<rgba …>``, ``<img …>``) is dropped. References resolve in each language's own table only:
the game would fill a German text's gaps from the English table, which would put English into the
German side, so such an entry is left out. An entry's lines (paragraphs, list items) are paired line by
line, and lines cut into sentences, where both sides have as many; an entry whose lines do not
correspond (a translation older than the English text) is left out, as are lines left in English, pairs
whose format arguments (``%1%``, ``%planet%``) differ and pairs whose numbers differ: the game's numbers
change with its balance, and a German line saying "um 20" where the English now says "by 5" is a
translation of an older text (numbers written out in words are lost with them).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Iterator

from .ding import is_sentence
from .lohelp import aligned_sentences
from .man import detect_lang
from .text import CorpusError, Pair, normalize_text

PACKAGES = ("freeorion-data",)
LICENSE = "GPL-2"
TABLE_DIR = Path("usr/share/games/freeorion/default/stringtables")
ORIGIN = "freeorion:stringtable"

# The game's own grammar (util/StringTable.cpp): blank and comment lines, the key, then a '''-quoted
# block or one line.
_ENTRY = re.compile(r"(?:\s|#[^\n]*\n)*(\w+)[ \t]*(?:#[^\n]*)?\n(?:'''(.*?)'''[ \t]*(?:\n|$)|([^\n]*)(?:\n|$))", re.S)
_TRAILER = re.compile(r"(?:\s|#[^\n]*(?:\n|$))*")
_INCLUDE = re.compile(r'^#include\s+"([^"]+)"[ \t]*$', re.M)
# [[KEY]] (KEY's text in its place) or [[type KEY]] (a link showing KEY's text).
_REFERENCE = re.compile(r"\[\[(\w+)\]\]|\[\[\w+\s+(\w+)\]\]")
_TAG = re.compile(r"</?[A-Za-z][\w:-]*(?:\s[^<>]*)?/?>")
_BULLET = re.compile(r"^\s*(?:[*\u2022-]\s+)")
_PLACEHOLDER = re.compile(r"%\w+%")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def _with_includes(path: Path) -> str:
    """The file with its ``#include "file"`` lines replaced by those files (relative to it)."""
    def include(m: re.Match[str]) -> str:
        included = path.parent / m.group(1)
        return included.read_text(encoding="utf-8", errors="replace") + "\n" if included.is_file() else ""
    return _INCLUDE.sub(include, path.read_text(encoding="utf-8", errors="replace"))


def read_stringtable(path: Path) -> dict[str, str]:
    """Key -> raw text (``\\n`` resolved, references not) of a stringtable; the first of a repeated key
    counts, as in the game. A malformed rest of the file is reported and left out."""
    text = _with_includes(path)
    pos = text.find("\n") + 1 if "\n" in text else len(text)     # the language's name
    table: dict[str, str] = {}
    while m := _ENTRY.match(text, pos):
        value = m.group(2) if m.group(2) is not None else m.group(3)
        table.setdefault(m.group(1), value.replace("\\n", "\n"))
        pos = m.end()
    pos = _TRAILER.match(text, pos).end()
    if pos < len(text):
        line = text.count("\n", 0, pos) + 1
        print(f"warning: {path}: cannot parse from line {line} on, ignoring the rest", file=sys.stderr)
    return table


def expand(table: dict[str, str], key: str, cache: dict[str, str | None], seen: frozenset[str] = frozenset()
           ) -> str | None:
    """KEY's text with ``[[KEY]]`` replaced by those keys' expanded text and ``[[type KEY]]`` links by
    their target's; None when a reference is missing from ``table`` or cyclic."""
    if key in cache:
        return cache[key]
    if key not in table or key in seen:
        return None
    seen = seen | {key}
    parts, pos, text = [], 0, table[key]
    for m in _REFERENCE.finditer(text):
        value = expand(table, m.group(1) or m.group(2), cache, seen)
        if value is None:
            cache[key] = None
            return None
        parts += [text[pos:m.start()], value]
        pos = m.end()
    cache[key] = "".join(parts) + text[pos:]
    return cache[key]


def _lines(text: str) -> list[str]:
    """The text's non-empty lines as displayed: no markup, no list bullets, normalised."""
    lines = (normalize_text(_BULLET.sub("", _TAG.sub("", line))) for line in text.split("\n"))
    return [line for line in lines if line]


def _numbers(text: str) -> list[str]:
    """The text's numbers, decimal commas as points (``0,05`` is ``0.05``)."""
    return sorted(n.replace(",", ".") for n in _NUMBER.findall(text))


def usable(de: str, en: str) -> bool:
    """Both sides have words and differ, the German one is not English, and both carry the same format
    arguments and numbers."""
    return (de != en and any(c.isalpha() for c in de) and any(c.isalpha() for c in en)
            and detect_lang(de) != "en"
            and sorted(_PLACEHOLDER.findall(de)) == sorted(_PLACEHOLDER.findall(en))
            and _numbers(de) == _numbers(en))


def entry_pairs(de_text: str, en_text: str) -> list[tuple[str, str]]:
    """One entry's (German, English) pairs: line by line and sentence by sentence where the counts agree;
    nothing when the entry's lines do not correspond."""
    de_lines, en_lines = _lines(de_text), _lines(en_text)
    if len(de_lines) != len(en_lines):
        return []
    pairs = [s for de, en in zip(de_lines, en_lines) for s in aligned_sentences(de, en)]
    return [(de, en) for de, en in pairs if usable(de, en)]


def read_stringtables(de_path: Path, en_path: Path) -> Iterator[Pair]:
    """Pairs of every key both tables define, in key order."""
    de_table, en_table = read_stringtable(de_path), read_stringtable(en_path)
    de_cache: dict[str, str | None] = {}
    en_cache: dict[str, str | None] = {}
    for key in sorted(de_table.keys() & en_table.keys()):
        de_text, en_text = expand(de_table, key, de_cache), expand(en_table, key, en_cache)
        if not de_text or not en_text or de_text == en_text:
            continue
        for de, en in entry_pairs(de_text, en_text):
            yield Pair(de=de, en=en, origin=ORIGIN, sentence=is_sentence(de, en))


def read(roots: dict[str, Path]) -> Iterator[Pair]:
    """Every pair of the unpacked package ``roots["freeorion-data"]``, origin ``freeorion:stringtable``."""
    tables = roots["freeorion-data"] / TABLE_DIR
    if not (tables / "de.txt").is_file() or not (tables / "en.txt").is_file():
        raise CorpusError(f"no {TABLE_DIR}/de.txt and en.txt in {roots['freeorion-data']}")
    yield from read_stringtables(tables / "de.txt", tables / "en.txt")
