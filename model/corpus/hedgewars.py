"""Hedgewars' texts (Debian's ``hedgewars-data``, GPL-2) as German-English pairs.

The package keeps every translation of the game under ``usr/share/games/hedgewars/Data/Locale``, in four
formats:

* ``de.lua``: the table the Lua scripts (missions, campaigns, game styles) look their messages up in,
  ``["English text"] = "deutscher Text",`` with Lua string escapes;
* ``en.txt`` / ``de.txt``: the engine's messages, keyed ``group:number`` (``01:02=%1 wins!``);
* ``missions_{en,de}.txt`` / ``campaigns_{en,de}.txt``: titles and descriptions, keyed
  ``Mission.name`` / ``Mission.desc`` (Qt's INI syntax: values may be quoted, with backslash escapes);
* ``hedgewars_de.qm``: the Qt frontend's compiled catalog, which keeps each source text next to its
  translation.

Pairs are aligned by key only, the English text itself (Lua table, ``.qm``) or the identifier, never by
position. Left out for that reason: ``tips_{en,de}.xml``, a list without ids, and the engine's keys that
carry several lines in one language (``02:00``, the ten ways a hedgehog dies): the game picks one at
random, and the German lines are free alternatives, not translations of the English ones beside them.
``|`` is the game's line break, put wherever a line got long in each language, so it becomes a space.
Format arguments (``%s``, ``%.1f``, ``%1``) must be the same on both sides: a translation that lost or
added one is broken, and the model must not learn to do the same.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Iterable, Iterator

from .catalogs import gettext_pair
from .ding import is_sentence
from .text import CorpusError, Pair, normalize_text

PACKAGES = ("hedgewars-data",)
LICENSE = "GPL-2"
LOCALE_DIR = Path("usr/share/games/hedgewars/Data/Locale")
LOCALE_FILES = ("de.lua", "en.txt", "de.txt", "missions_en.txt", "missions_de.txt", "campaigns_en.txt",
                "campaigns_de.txt", "hedgewars_de.qm")

# string.format's conversions (%s, %d, %.3f; %% is a literal percent sign) and the engine's/Qt's %1, %n.
_PLACEHOLDER = re.compile(r"%%|%(\d+|n|[-+#0]*\d*(?:\.\d+)?[a-zA-Z])")
# One table entry per line; "--" comments (other locales comment out what is not translated yet).
_LUA_STRING = r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'"
_LUA_ENTRY = re.compile(rf"^\s*\[({_LUA_STRING})\]\s*=\s*({_LUA_STRING})\s*,?\s*(?:--.*)?$")
_LUA_ESCAPE = re.compile(r"\\(?:(\d{1,3})|x([0-9A-Fa-f]{2})|u\{([0-9A-Fa-f]{1,6})\}|z\s*|(.))", re.S)
_LUA_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}
_QM_MAGIC = bytes.fromhex("3cb86418caef9c95cd211cbf60a1bddd")
_QM_MESSAGES = 0x69
_QM_END, _QM_TRANSLATION, _QM_OBSOLETE1, _QM_SOURCE, _QM_CONTEXT, _QM_COMMENT = 1, 3, 5, 6, 7, 8


def placeholders(text: str) -> list[str]:
    return sorted(m.group(1) for m in _PLACEHOLDER.finditer(text) if m.group(1))


def clean_pair(de: str, en: str) -> tuple[str, str] | None:
    """The pair as the player reads it, or None when one side is missing, untranslated, without words,
    or with other format arguments than the other side."""
    de, en = normalize_text(de.replace("|", " ")), normalize_text(en.replace("|", " "))
    if not de or not en or de == en:
        return None
    if not any(c.isalpha() for c in de) or not any(c.isalpha() for c in en):
        return None
    if placeholders(de) != placeholders(en):
        return None
    return de, en


def lua_string(literal: str) -> str:
    """The value of a quoted Lua string literal. Lua's \\ddd and \\xXX escapes are bytes (a UTF-8
    character may be written as two of them), so the text is rebuilt as bytes and decoded once."""
    body, out, pos = literal[1:-1], bytearray(), 0
    for m in _LUA_ESCAPE.finditer(body):
        out += body[pos:m.start()].encode()
        decimal, hexa, codepoint, char = m.groups()
        if decimal:
            out.append(int(decimal) % 256)
        elif hexa:
            out.append(int(hexa, 16))
        elif codepoint:
            out += chr(min(int(codepoint, 16), 0x10FFFF)).encode(errors="replace")
        elif char is not None:                       # \z (skip the following whitespace) leaves nothing
            out += _LUA_SIMPLE_ESCAPES.get(char, char).encode()
        pos = m.end()
    out += body[pos:].encode()
    return out.decode("utf-8", errors="replace")


def read_lua_table(path: Path) -> dict[str, str]:
    """English -> German of a ``locale = { ["en"] = "de", ... }`` file; as in Lua, a repeated key's last
    value counts."""
    table = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        m = _LUA_ENTRY.match(line)
        if m:
            table[lua_string(m.group(1))] = lua_string(m.group(2))
    return table


def ini_value(raw: str) -> str:
    """A Qt INI value: surrounding quotes removed, backslash escapes resolved."""
    raw = raw.strip()
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        raw = raw[1:-1]
    return re.sub(r"\\(.)", lambda m: _LUA_SIMPLE_ESCAPES.get(m.group(1), m.group(1)), raw)


def read_keyed(path: Path) -> dict[str, str]:
    """``key=value`` lines (``;`` starts a comment); keys given more than once (random alternatives)
    are left out."""
    values: dict[str, list[str]] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.lstrip().startswith(";"):
            values.setdefault(key.strip(), []).append(ini_value(value))
    return {key: vals[0] for key, vals in values.items() if len(vals) == 1}


def _qm_messages(data: bytes, path: Path) -> bytes:
    if not data.startswith(_QM_MAGIC):
        raise CorpusError(f"{path} is not a Qt .qm catalog")
    pos = len(_QM_MAGIC)
    while pos + 5 <= len(data):
        tag, length = data[pos], struct.unpack_from(">I", data, pos + 1)[0]
        if tag == _QM_MESSAGES:
            if pos + 5 + length > len(data):
                raise CorpusError(f"{path}: a truncated Qt .qm catalog (its messages end past the file)")
            return data[pos + 5:pos + 5 + length]
        pos += 5 + length
    return b""


def read_qm(path: Path) -> list[tuple[str, str]]:
    """(source text, translation) of a compiled Qt catalog, for messages with one translation (plural
    forms, several translations of one source, have no single counterpart) and their source text kept."""
    try:
        return _qm_pairs(_qm_messages(path.read_bytes(), path), path)
    except (struct.error, IndexError) as exc:      # cut short: a length or tag past the end
        raise CorpusError(f"{path}: a truncated Qt .qm catalog ({exc})") from exc


def _qm_pairs(messages: bytes, path: Path) -> list[tuple[str, str]]:
    pos, pairs = 0, []
    source, translations = None, []
    while pos < len(messages):
        tag, pos = messages[pos], pos + 1
        if tag == _QM_END:
            if source and len(translations) == 1:
                pairs.append((source, translations[0]))
            source, translations = None, []
        elif tag == _QM_OBSOLETE1:
            pos += 4
        elif tag in (_QM_TRANSLATION, _QM_SOURCE, _QM_CONTEXT, _QM_COMMENT):
            length, pos = struct.unpack_from(">I", messages, pos)[0], pos + 4
            if length == 0xFFFFFFFF:                 # a null string
                continue
            if pos + length > len(messages):
                raise CorpusError(f"{path}: a truncated Qt .qm catalog (a string ends past its messages)")
            value, pos = messages[pos:pos + length], pos + length
            if tag == _QM_TRANSLATION:
                translations.append(value.decode("utf-16-be", errors="replace"))
            elif tag == _QM_SOURCE:
                source = value.decode("utf-8", errors="replace")
        else:
            raise CorpusError(f"{path}: unknown .qm message tag {tag:#x} at byte {pos - 1}")
    return pairs


def _pairs(en_de: Iterable[tuple[str, str]], origin: str) -> Iterator[Pair]:
    """Pairs of (English, German) texts, cleaned."""
    for en, de in en_de:
        cleaned = clean_pair(de, en)
        if cleaned:
            yield Pair(de=cleaned[0], en=cleaned[1], origin=origin, sentence=is_sentence(*cleaned))


def _by_key(en_path: Path, de_path: Path) -> list[tuple[str, str]]:
    en, de = read_keyed(en_path), read_keyed(de_path)
    return [(en[key], de[key]) for key in sorted(en.keys() & de.keys())]


def _frontend(path: Path) -> list[tuple[str, str]]:
    """Qt's UI strings cleaned as gettext's are (accelerators, markup, entities)."""
    return [cleaned for en, de in read_qm(path) if (cleaned := gettext_pair(en, de))]


def read(roots: dict[str, Path]) -> Iterator[Pair]:
    """Every pair of the unpacked package ``roots["hedgewars-data"]``; origins ``hedgewars:lua``,
    ``hedgewars:engine``, ``hedgewars:missions``, ``hedgewars:campaigns`` and ``hedgewars:frontend``."""
    locale = roots["hedgewars-data"] / LOCALE_DIR
    missing = [name for name in LOCALE_FILES if not (locale / name).is_file()]
    if missing:
        raise CorpusError(f"{roots['hedgewars-data']} lacks {', '.join(missing)} in {LOCALE_DIR}")
    yield from _pairs(read_lua_table(locale / "de.lua").items(), "hedgewars:lua")
    yield from _pairs(_by_key(locale / "en.txt", locale / "de.txt"), "hedgewars:engine")
    for name in ("missions", "campaigns"):
        yield from _pairs(_by_key(locale / f"{name}_en.txt", locale / f"{name}_de.txt"), f"hedgewars:{name}")
    yield from _pairs(_frontend(locale / "hedgewars_de.qm"), "hedgewars:frontend")
