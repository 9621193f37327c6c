"""Firefox's user interface text (Debian's ``firefox-esr-l10n-de`` and ``firefox-esr``, MPL-2.0) as
parallel German/English strings: menus, buttons, dialogs, settings, error pages, messages.

The German package holds one language pack, ``usr/lib/firefox-esr/browser/extensions/
langpack-de@firefox-esr.mozilla.org.xpi``; the English text is built into Firefox itself, in the
``omni.ja`` archives of ``usr/lib/firefox-esr`` (toolkit) and of its ``browser/`` folder. All three are
zip files holding the same Fluent (``.ftl``) and ``.properties`` files under a locale folder
(``localization/de/…`` / ``localization/en-US/…``, ``chrome/de/locale/de/…`` / ``chrome/en-US/locale/
en-US/…``; the language pack keeps the browser's files under ``browser/``, as the browser's omni.ja
sits in ``browser/``). With the locale folders taken out, both sides have the same file paths.

A string is aligned by (file path, key) only, never by position: a language pack lags or leads the
English files by a few strings, and a shifted position would pair unrelated text. The key is a
Fluent message id (``.label`` and other attributes as ``id.label``) or a ``.properties`` key.

Dropped, and why:

* keys one side lacks, and German equal to English (untranslated or names: nothing to learn);
* access keys and shortcuts (``.accesskey``, ``.commandkey``, ``.key``, ``.keycode``, ``…AccessKey``,
  anything of one character): letters, not text;
* Fluent values with a select expression (plural, platform and gender variants: no single text to
  pair) or a reference to a term or message whose value is not plain text; plain ones
  (``{ -brand-short-name }``, ``{ learn-more }``) are filled in on both sides, so "Firefox" is text;
* values whose variables differ between the sides (``{ $name }``, ``%S``, ``%1$S``, ``#1``): a
  translation that drops or adds one is not a faithful pair. Matching ones stay in the text, for the
  model to learn to copy (Fluent's as ``{$name}``, one word, ``NUMBER()``/``DATETIME()`` left out);
* ``.properties`` plural lists (``Send tab to device;Send #1 tabs to device``) are cut into their
  forms where both sides have as many, else dropped;
* markup (``<a data-l10n-name="link">``, ``<strong>``) is stripped where both sides have the same
  tags, else the pair is dropped (stripping unequal tags could leave unequal fragments);
* layout values (``.style = width: 36em``) and settings (``intl.accept_languages = de, en-US, en``).

The ``&`` access key marks of Windows dialogs' labels (``Do&n't Save``) are removed as in gettext
catalogs (:func:`model.corpus.catalogs.strip_accelerators`).

Fluent is parsed here, for the subset these files use (messages, terms, attributes, multi-line
values, placeables), rather than with ``fluent.syntax``: that would be a new dependency for what is a
screenful of code, and its AST would still need the rendering and comparing done below.
"""

from __future__ import annotations

import html
import re
import zipfile
from collections import Counter
from pathlib import Path
from typing import Iterator

from .catalogs import strip_accelerators
from .ding import is_sentence
from .text import CorpusError, Pair, normalize_text

PACKAGES = ("firefox-esr-l10n-de", "firefox-esr")
GERMAN_PACKAGE, ENGLISH_PACKAGE = PACKAGES
LICENSE = "MPL-2.0"
APP_DIR = "usr/lib/firefox-esr"
LANGPACK_GLOB = "browser/extensions/langpack-de@*.xpi"
OMNI_ARCHIVES = ("omni.ja", "browser/omni.ja")      # toolkit's and the browser's English text
LOCALES = {"de": "de", "en": "en-US"}

_FTL_ENTRY = re.compile(r"(-?[A-Za-z][\w-]*)[ \t]*=[ \t]*(.*)")
_FTL_ATTRIBUTE = re.compile(r"[ \t]+\.([A-Za-z][\w-]*)[ \t]*=[ \t]*(.*)")
_STRING_LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')
_NUMBER_LITERAL = re.compile(r"-?\d+(?:\.\d+)?")
_TERM_REFERENCE = re.compile(r"(-[A-Za-z][\w-]*)(?:\(.*\))?", re.S)
_MESSAGE_REFERENCE = re.compile(r"([A-Za-z][\w-]*(?:\.[A-Za-z][\w-]*)?)")
_VARIABLE = re.compile(r"(\$[A-Za-z][\w-]*)")
_FORMATTED_VARIABLE = re.compile(r"(?:NUMBER|DATETIME)\(\s*(\$[A-Za-z][\w-]*)\s*[,)].*", re.S)
_PROPERTY = re.compile(r"([^=:\s]+)\s*[=:]?\s*(.*)")
_ESCAPE = re.compile(r"\\(u[0-9A-Fa-f]{4}|.)")
_PRINTF = re.compile(r"%(?:(\d+)\$)?(?:ll|l)?([SsDdUuFfXx@])|#(\d)")
_TAG = re.compile(r"</?([A-Za-z][\w-]*)\b[^<>]*>")
# Fluent's text-level elements, and links (devtools' React components fill in a bare <a>).
_MARKUP_TAGS = {"a", "em", "strong", "small", "s", "cite", "q", "dfn", "abbr", "data", "time", "code", "var",
                "samp", "kbd", "sub", "sup", "i", "b", "u", "mark", "bdi", "bdo", "span", "br", "wbr"}
_LINE_BREAKING_TAGS = {"br", "p", "div", "li"}
# Access keys and shortcuts: ``x.accesskey``, ``fooAccessKey``, ``devtools-commandkey-…``, ``find.key``;
# not ``sec-error-bad-key`` ("Peer's public key is invalid.").
_SHORTCUT_KEY = re.compile(r"access-?key|command-?key|\.key(?:code)?$", re.I)
_LAYOUT_KEY = re.compile(r"\.(?:style|width|height)$|^-.*-style$")
# Settings, not text: the accepted languages, font group and plural rule.
_SETTINGS_FILES = {"intl.properties"}


def locale_path(member: str, locale: str) -> str | None:
    """A localisation file's path with its locale folders taken out (``browser/chrome/de/locale/de/
    devtools/client/x.properties`` -> ``browser/chrome/devtools/client/x.properties``), or None."""
    parts = member.split("/")
    prefix = ["browser"] if parts[0] == "browser" else []
    parts = parts[len(prefix):]
    if parts[:2] == ["localization", locale]:
        rest = parts[2:]
    elif parts[:3] == ["chrome", locale, "locale"]:
        rest = parts[3:]
        rest = rest[1:] if rest[:1] == [locale] else rest      # chrome/de/locale/branding: no second "de"
    else:
        return None
    if not rest or not rest[-1].endswith((".ftl", ".properties")) or rest[-1] in _SETTINGS_FILES:
        return None
    return "/".join(prefix + [parts[0]] + rest)


def archive_files(archive: Path, locale: str, prefix: str = "") -> dict[str, str]:
    """The localisation files of one zip archive (``.xpi``, ``omni.ja``) by their locale-free path."""
    files = {}
    try:
        with zipfile.ZipFile(archive) as zf:
            for member in zf.namelist():
                path = locale_path(prefix + member, locale)
                if path is not None:
                    files[path] = zf.read(member).decode("utf-8", errors="replace")
    except (zipfile.BadZipFile, OSError) as exc:
        raise CorpusError(f"{archive}: not a readable zip archive ({exc})") from exc
    return files


def german_files(root: Path) -> dict[str, str]:
    """The German files of an unpacked ``firefox-esr-l10n-de``, from its language pack."""
    files: dict[str, str] = {}
    for xpi in sorted((root / APP_DIR).glob(LANGPACK_GLOB)):
        files.update(archive_files(xpi, LOCALES["de"]))
    return files


def english_files(root: Path) -> dict[str, str]:
    """The English files of an unpacked ``firefox-esr``; the browser's omni.ja gives them its ``browser/``
    prefix, which is where the language pack keeps the same files."""
    files: dict[str, str] = {}
    for name in OMNI_ARCHIVES:
        archive = root / APP_DIR / name
        if archive.is_file():
            files.update(archive_files(archive, LOCALES["en"], name[: -len("omni.ja")]))
    return files


def parse_fluent(text: str) -> dict[str, str]:
    """A Fluent file's patterns by key: ``id``, ``id.attribute``, ``-term``. A pattern goes on over
    indented and blank lines and, inside a placeable, over any line (a select's ``}`` may stand in
    column 0); its lines are joined with newlines, their indentation dropped (it means nothing once
    spaces are normalised)."""
    entries: dict[str, str] = {}
    key, message, lines, depth = None, None, [], 0
    for line in text.splitlines() + ["#"]:        # a comment ends the last entry
        continues = key is not None and (depth > 0 or not line.strip() or line[0] in " \t")
        attribute = _FTL_ATTRIBUTE.fullmatch(line) if continues and depth == 0 else None
        if not continues or attribute:
            if key and any(part.strip() for part in lines):
                entries[key] = "\n".join(part.strip() for part in lines).strip()
            key, lines, depth = None, [], 0
        if attribute:
            key, lines = f"{message}.{attribute[1]}", [attribute[2]]
        elif continues:
            lines.append(line)
        elif entry := _FTL_ENTRY.fullmatch(line):
            message, key, lines = entry[1], entry[1], [entry[2]]
        if key is not None:
            unquoted = _STRING_LITERAL.sub("", lines[-1])
            depth += unquoted.count("{") - unquoted.count("}")
    return entries


def _closing_brace(pattern: str, start: int) -> int | None:
    """Where the placeable opened at ``start`` ends (nested placeables and string literals skipped)."""
    depth, in_string, i = 0, False, start
    while i < len(pattern):
        ch = pattern[i]
        if in_string:
            i += 1 if ch == "\\" else 0
            in_string = ch != '"'
        elif ch == '"':
            in_string = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _placeable(inner: str, plain: dict[str, str]) -> tuple[str, str | None] | None:
    """A placeable's text and the variable it keeps (``{$name}``), or None where it makes the value
    unusable: a select expression, a reference to a term or message with no plain value."""
    if "->" in inner or "{" in inner:
        return None
    if m := _STRING_LITERAL.fullmatch(inner):
        return _ESCAPE.sub(_unescape, m[1]), None
    if _NUMBER_LITERAL.fullmatch(inner):
        return inner, None
    if m := _TERM_REFERENCE.fullmatch(inner) or _MESSAGE_REFERENCE.fullmatch(inner):
        return (plain[m[1]], None) if m[1] in plain else None
    if m := _VARIABLE.fullmatch(inner) or _FORMATTED_VARIABLE.fullmatch(inner):
        return "{" + m[1] + "}", m[1]       # NUMBER($n, …) and DATETIME($d, …) format a variable
    return None


def render_fluent(pattern: str, plain: dict[str, str]) -> tuple[str, frozenset[str]] | None:
    """A Fluent pattern as text with plain terms and messages filled in, and the variables it keeps."""
    out, variables, i = [], set(), 0
    while (start := pattern.find("{", i)) >= 0:
        end = _closing_brace(pattern, start)
        piece = _placeable(pattern[start + 1:end].strip(), plain) if end is not None else None
        if piece is None:
            return None
        out += [pattern[i:start], piece[0]]
        variables |= {piece[1]} if piece[1] else set()
        i = end + 1
    return "".join(out) + pattern[i:], frozenset(variables)


def plain_values(fluent: dict[str, dict[str, str]]) -> dict[str, str]:
    """Every Fluent value of one side that is plain text once its references are filled in, by the
    name a reference uses (``-brand-short-name``, ``learn-more``, ``pane-general-title.label``):
    references are global in Fluent, not per file."""
    raw = {key: pattern for path in sorted(fluent) for key, pattern in fluent[path].items()}
    plain: dict[str, str] = {}
    for _ in range(3):      # a value built of references resolves once those have
        for key, pattern in raw.items():
            rendered = render_fluent(pattern, plain) if key not in plain else None
            if rendered and not rendered[1]:
                plain[key] = rendered[0]
    return plain


def parse_properties(text: str) -> dict[str, str]:
    """A ``.properties`` file's values by key, escapes (``\\n``, ``\\u00e4``) decoded."""
    entries = {}
    for line in re.sub(r"(?<!\\)((?:\\\\)*)\\\n[ \t]*", r"\1", text).splitlines():
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        m = _PROPERTY.fullmatch(line)
        if m:
            entries[m[1]] = _ESCAPE.sub(_unescape, m[2])
    return entries


def _unescape(escape: re.Match[str]) -> str:
    code = escape[1]
    return chr(int(code[1:], 16)) if len(code) == 5 else {"n": "\n", "t": "\t"}.get(code, code)


def printf_signature(text: str) -> frozenset[str]:
    """``%S``, ``%1$S``, ``#1`` placeholders by position: ``%S %S`` and ``%1$S %2$S`` agree."""
    found, implicit = set(), 0
    for m in _PRINTF.finditer(text):
        implicit += 0 if m[1] or m[3] else 1
        found.add(f"#{m[3]}" if m[3] else f"%{m[1] or implicit}${m[2].upper()}")
    return frozenset(found)


def parse_side(files: dict[str, str]) -> dict[str, dict[str, tuple[str, frozenset[str]]]]:
    """Every file's usable values by key, each with the variables or placeholders it keeps."""
    fluent = {path: parse_fluent(text) for path, text in files.items() if path.endswith(".ftl")}
    plain = plain_values(fluent)
    side = {}
    for path, text in files.items():
        if path in fluent:
            rendered = {key: render_fluent(pattern, plain) for key, pattern in fluent[path].items()
                        if not (key.startswith("-") and "." in key)}    # a term's attributes are not text
            side[path] = {key: value for key, value in rendered.items() if value is not None}
        else:
            side[path] = {key: (value, printf_signature(value)) for key, value in parse_properties(text).items()}
    return side


def _markup(text: str) -> list[str]:
    """The names of the tags in ``text`` that are markup: ``_MARKUP_TAGS`` and elements named for the
    page (``data-l10n-name``); ``<html>`` in a parser message or ``<no label>`` is text."""
    named = {m[1].lower() for m in _TAG.finditer(text) if "data-l10n-name" in m[0]}
    return [m[1].lower() for m in _TAG.finditer(text) if m[1].lower() in _MARKUP_TAGS | named]


def strip_markup(de: str, en: str) -> tuple[str, str] | None:
    """Both sides without their markup, if they have the same tags. Entities are decoded only in
    markup: elsewhere ``&amp;`` is literal text (the HTML parser's messages talk about them)."""
    de_tags, en_tags = _markup(de), _markup(en)
    if Counter(de_tags) != Counter(en_tags):
        return None
    if not en_tags:
        return de, en
    stripped = [_TAG.sub(lambda m: m[0] if m[1].lower() not in en_tags else " " if m[1].lower() in
                         _LINE_BREAKING_TAGS else "", text) for text in (de, en)]
    return html.unescape(stripped[0]), html.unescape(stripped[1])


def _has_words(text: str) -> bool:
    return any(ch.isalpha() for ch in re.sub(r"\{[^{}]*\}", " ", _PRINTF.sub(" ", text)))


def clean_pair(key: str, de: str, en: str) -> tuple[str, str] | None:
    """A German/English value pair ready for the corpus, or None when it is nothing to learn from."""
    if _SHORTCUT_KEY.search(key) or _LAYOUT_KEY.search(key):
        return None
    stripped = strip_markup(de, en)
    if stripped is None:
        return None
    en, de = strip_accelerators(normalize_text(stripped[1]), normalize_text(stripped[0]))
    if min(len(de), len(en)) < 2 or de == en or not (_has_words(de) and _has_words(en)):
        return None
    return de, en


def value_pairs(de: tuple[str, frozenset[str]], en: tuple[str, frozenset[str]]) -> list[tuple[str, str]]:
    """The values of one key as text pairs: none where their variables differ, a plural list
    (``tab;#1 tabs``) form by form where both sides have as many forms."""
    if de[1] != en[1]:
        return []
    de_forms, en_forms = de[0].split(";"), en[0].split(";")
    if len(en_forms) > 1 and "#1" in en[0]:
        if len(de_forms) != len(en_forms):
            return []
        return [(d, e) for d, e in zip(de_forms, en_forms) if printf_signature(d) == printf_signature(e)]
    return [(de[0], en[0])]


def read(roots: dict[str, Path]) -> Iterator[Pair]:
    """Pairs of every file and key both sides hold; ``roots`` maps ``PACKAGES`` to unpacked packages.
    Origin ``firefox:<file path>``, e.g. ``firefox:browser/localization/browser/panelUI.ftl``."""
    german_text, english_text = german_files(roots[GERMAN_PACKAGE]), english_files(roots[ENGLISH_PACKAGE])
    for text, package, where in ((german_text, GERMAN_PACKAGE, LANGPACK_GLOB), (english_text, ENGLISH_PACKAGE,
                                                                            " or ".join(OMNI_ARCHIVES))):
        if not text:      # a package of another layout: say so rather than add a source of no pairs
            raise CorpusError(f"{roots[package]} ({package}) has no localisation files in {APP_DIR}/{where}")
    german, english = parse_side(german_text), parse_side(english_text)
    for path in sorted(german.keys() & english.keys()):
        for key, en in english[path].items():
            de = german[path].get(key)
            for de_value, en_value in value_pairs(de, en) if de else []:
                cleaned = clean_pair(key, de_value, en_value)
                if cleaned is not None:
                    yield Pair(de=cleaned[0], en=cleaned[1], origin=f"firefox:{path}",
                               sentence=is_sentence(cleaned[0], cleaned[1]))
