"""Offline preparation of the German-English parallel corpus.

``python -m model.data --out data/de-en`` builds ``train.tsv``, ``dev.tsv``, ``test.tsv`` and
``meta.json`` from sources that are available without a network crawl:

* the Ding dictionary (Debian package ``trans-de-en``, ``German :: English`` per line),
* gettext catalogs (``.po``/``.mo``) of locally installed programs, optionally of Debian
  packages downloaded (never installed) with ``--fetch-deb``,
* user corpora given as TSV (``--tsv``) or Moses-style line-aligned files (``--moses``).

Why the pieces look the way they do:

* Every source is a function that yields :class:`Pair` objects with an ``origin`` tag, so a
  later ``--monolingual`` source only needs another reader plus another writer; cleaning,
  deduplication and splitting never look at where a pair came from, except that dev/test are
  drawn from Ding *sentences* (dictionary terms and UI strings make a poor test set).
* Splits are chosen by a hash of the normalised German side, not by a random generator, so the
  same sentence lands in the same split on every machine and run, and a German sentence with
  several English translations never straddles two splits.
* Text normalisation (NFC, curly quotes to ASCII quotes, no control/format characters,
  single spaces) is applied to every side of every source *before* deduplication and leak
  checks; otherwise ``it’s`` and ``it's`` would count as different sentences.

The module is standard library + ``polib`` only, so it runs on the training machines without
torch being importable.
"""

from __future__ import annotations

import argparse
import functools
import glob
import hashlib
import html
import json
import os
import random
import re
import shlex
import subprocess
import sys
import time
import unicodedata
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

DING_SYSTEM_PATH = Path("/usr/share/trans/de-en")
DING_PACKAGE = "trans-de-en"
DING_IN_PACKAGE = Path("usr/share/trans/de-en")
LOCALE_DIR = Path("/usr/share/locale/de/LC_MESSAGES")
DEB_LOCALE_DIR = Path("usr/share/locale/de/LC_MESSAGES")
DEFAULT_CACHE = Path("~/.cache/transerve/debs")

MAX_CHARS = 250  # per side; longer "pairs" are mostly help texts, not translations
MAX_RATIO = 3.0  # max(len)/max(min(len), RATIO_FLOOR) in characters
RATIO_FLOOR = 10  # short terms ("Ja" / "Yes") must not be judged by their ratio
MAX_GETTEXT_WORDS = 60

DIRECTIONS = ("de-en", "en-de")


class CorpusError(ValueError):
    """A problem with an input corpus that the user has to fix (reported without traceback)."""


@dataclass(frozen=True)
class Pair:
    """One aligned segment pair.

    ``sentence`` is only meaningful for Ding pairs: it marks the example sentences that dev and
    test are drawn from.
    """

    de: str
    en: str
    origin: str
    sentence: bool = False


# --------------------------------------------------------------------------------------------
# Text normalisation
# --------------------------------------------------------------------------------------------

# Typographic quotes are mapped to ASCII so that "it’s" (Ding) and "it's" (most other text)
# are the same string for deduplication, leak checks and the tokenizer.  Guillemets are
# quotation marks in German text, so they become '"' as well.
_QUOTE_MAP = str.maketrans(
    {
        "\u2018": "'",  # ‘
        "\u2019": "'",  # ’
        "\u201a": "'",  # ‚
        "\u201b": "'",  # ‛
        "\u2032": "'",  # ′
        "\u201c": '"',  # “
        "\u201d": '"',  # ”
        "\u201e": '"',  # „
        "\u201f": '"',  # ‟
        "\u2033": '"',  # ″
        "\u00ab": '"',  # «
        "\u00bb": '"',  # »
        "\u2039": "'",  # ‹
        "\u203a": "'",  # ›
    }
)
_WS_RE = re.compile(r"\s+")


@functools.cache
def _invisible_re() -> re.Pattern[str]:
    """Regex of all Cc/Cf characters except the whitespace controls (built once, ~0.2 s)."""
    codes = [
        c
        for c in range(sys.maxunicode + 1)
        if unicodedata.category(chr(c)) in ("Cc", "Cf") and chr(c) not in "\t\n\r\v\f"
    ]
    ranges: list[tuple[int, int]] = []
    for c in codes:
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1] = (ranges[-1][0], c)
        else:
            ranges.append((c, c))
    body = "".join(
        re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}"
        for a, b in ranges
    )
    return re.compile(f"[{body}]+")


def normalize_text(text: str) -> str:
    """NFC, ASCII quotes, no control/format characters, single spaces, stripped.

    Tabs and newlines become spaces (the output is TSV).  Unicode categories Cc (controls) and
    Cf (soft hyphen, zero-width space, BOM, ...) are removed: they are invisible, differ between
    otherwise identical strings and would only waste tokenizer vocabulary.
    """
    text = unicodedata.normalize("NFC", text).translate(_QUOTE_MAP)
    if not (text.isascii() and text.isprintable()):
        text = _invisible_re().sub("", text)
    return _WS_RE.sub(" ", text).strip()


def _match_key(text: str) -> str:
    """Key used for the leak check: case-insensitive, ignoring final punctuation/quotes.

    ``Don't worry`` (a phrase entry) and ``Don't worry.`` (a sentence) must count as the same
    text when one of them is a test sentence.
    """
    return text.casefold().rstrip(" .!?…\"'").strip()


# --------------------------------------------------------------------------------------------
# Ding dictionary
# --------------------------------------------------------------------------------------------

_OPEN = "([{"
_CLOSE = ")]}"


def split_top_level(text: str, sep: str) -> list[str]:
    """Split ``text`` at ``sep`` occurrences outside (), [] and {}.

    Ding puts ``; `` inside parentheticals too (``Amerikaner (Kanadier; Deutscher).``); those
    must not start a new alternative.  Unbalanced closing brackets are ignored.
    """
    if not any(ch in text for ch in _OPEN):
        return text.split(sep)
    parts: list[str] = []
    depth = 0
    start = 0
    for match in re.finditer(r"[()\[\]{}]|" + re.escape(sep), text):
        token = match.group()
        if token in _OPEN:
            depth += 1
        elif token in _CLOSE:
            depth = max(depth - 1, 0)
        elif depth == 0:
            parts.append(text[start : match.start()])
            start = match.end()
    parts.append(text[start:])
    return parts


# Ding's markers: {n} {pl} {vt} {+Gen.} ... / [ugs.] [Am.] [mus.] ... / <> and <rollcall>
_MARKER_RE = re.compile(r"\{[^{}]*\}|\[[^\[\]]*\]|<[^<>]*>")
# Abbreviations and symbols in slashes: "initial public offering /IPO/", "bushel /bu.; bsh./",
# "Smiley /:-)/".  Only a slash group preceded by a space and followed by a space, "; ", "," or
# the end qualifies, so "he/she", "and/or" and "sb. / sth." stay.
# Abbreviations may contain slashes themselves when they have no spaces: "/B/E/", "/CSMA/CD/".
# "~Prozesskostenhilfe" (a related term, "compare"), up to the next separator.
_SEE_ALSO_RE = re.compile(r"(?<!\S)~[^|;]*")
_SLASH_ABBREV_RE = re.compile(
    r"(?<!\S)/(?:[^\s/]+(?:/[^\s/]+)*|(?=[^\s/])[^/]{1,40}(?<=[^\s/]))/(?=[\s;,|(]|$)"
)
# A group glued to the following word keeps the space before it: "war (hoch)anständig" ->
# "war anständig"; otherwise the space before goes too: "Weg (, dieses ...)." -> "Weg.".
_PAREN_RE = re.compile(r"\s*\([^()]*\)(?!\w)|\([^()]*\)")
_SPACE_BEFORE_PUNCT_RE = re.compile(r"\s+(?=[,.;:!?])")


def _tidy(text: str) -> str:
    """Collapse spaces and remove the spaces that deleting an annotation leaves before
    punctuation (``Weg (, dieses Ziel zu erreichen).`` -> ``Weg.``)."""
    text = _WS_RE.sub(" ", text)
    text = _SPACE_BEFORE_PUNCT_RE.sub("", text)
    return text.strip(" ,;:")


def strip_markers(text: str) -> str:
    """Remove Ding's grammar/usage markers: ``{...}``, ``[...]`` and ``<...>``.

    These are never translated text: gender/part of speech (``{f}``, ``{vt}``), register and
    region (``[ugs.]``, ``[Am.]``), subject field (``[mus.]``), separable-particle marks
    (``<>``), alternative spellings (``<rollcall>``) and abbreviations in slashes
    (``/IPO/``) and related-term references (``~Prozesskostenhilfe``).  Loops to handle
    nesting.
    """
    if not ("{" in text or "[" in text or "<" in text or "/" in text or "~" in text):
        return text
    count = 1
    while count:
        text, count = _MARKER_RE.subn(" ", text)
    if "/" in text:
        text = _SLASH_ABBREV_RE.sub(" ", text)
    if "~" in text:
        text = _SEE_ALSO_RE.sub(" ", text)
    return _tidy(text)


def strip_parentheticals(text: str) -> str:
    """Remove ``(...)`` groups (nested ones too), including the space before them.

    Rule (documented in :func:`strip_annotations`): parentheticals are removed on *both* sides
    of every Ding pair, terms and sentences alike.  In terms they are explanations
    (``(zoologische Ordnung)``, ``(of sth.)``).  In sentences they are optional words
    (``Es tut mir (schrecklich) leid.`` / ``I am (awfully) sorry.``), alternatives
    (``auf die Beine (Socken) machen`` / ``make tracks (be off)``) or partial-word options
    (``swath(e)``, ``(be)grudge``).  Keeping them would glue alternatives into the sentence
    (``auf die Beine Socken machen``); removing them always leaves each side a correct
    sentence, and since the bracketed parts are optional on each side independently, the
    shortened sides still translate each other.
    """
    if "(" not in text:
        return text
    count = 1
    while count:
        text, count = _PAREN_RE.subn("", text)
    return _tidy(text)


def strip_annotations(text: str) -> str:
    """Turn one Ding alternative into plain text.

    Removes markers (:func:`strip_markers`) and parentheticals (:func:`strip_parentheticals`).
    Placeholders ``jd./jdn./jdm./jds./etw./sb./sth.`` stay: they are part of the entry's text
    and appear consistently on both sides.  If the text started with a removed parenthetical
    and is a sentence (``(Ganz) wie Sie wollen!``), its first letter is capitalised again.
    """
    text = strip_markers(text)
    starts_with_paren = text.startswith("(")
    text = strip_parentheticals(text)
    if starts_with_paren and text and _ENDS_SENTENCE_RE.search(text) and text[0].islower():
        text = text[0].upper() + text[1:]
    return text


_ENDS_SENTENCE_RE = re.compile(r"[.!?][\"']?$")
# Ding placeholders and abbreviations: "to pass through sth." ends in "." but is no sentence.
_ENDS_ABBREV_RE = re.compile(
    r"(?:^|[\s/(])"
    r"(?:sth|sb|sb's|etw|jd|jdn|jdm|jds|etc|usw|bzw|ugs|o\.ä|u\.a|z\.B|e\.g|i\.e|Abk|vs)"
    r"\.[\"']?$",
    re.IGNORECASE,
)


def _looks_like_sentence(text: str) -> bool:
    """One side of a sentence: >= 4 words, capitalised, ends in . ! ? (not in ``sth.``)."""
    if len(text.split()) < 4 or not _ends_sentence(text):
        return False
    first = next((ch for ch in text if ch.isalnum()), "")
    return bool(first) and (first.isupper() or first.isdigit())


def is_sentence(de: str, en: str) -> bool:
    """A pair is a "sentence" when both sides have >= 4 words and end in ``.``, ``!`` or ``?``.

    Two refinements keep Ding's phrase entries out of dev/test: the first letter must be upper
    case (German and English sentences start capitalised, verb phrases like ``to lament``
    don't) and the final ``.`` must not belong to a placeholder such as ``sth.``/``etw.``.
    """
    return _looks_like_sentence(de) and _looks_like_sentence(en)


def _ends_sentence(text: str) -> bool:
    """Ends in ``.``/``!``/``?`` (optionally a closing quote), not in ``sth.``/``etw.``."""
    return bool(_ENDS_SENTENCE_RE.search(text)) and not _ENDS_ABBREV_RE.search(text)


def _merge_sentences(chunks: Sequence[str], loose: bool = False) -> list[str]:
    """Re-join ``; ``-chunks wherever the left one does not end a sentence.

    A trailing parenthetical does not count (``She is also a valued colleague. (formal);``).
    With ``loose`` a chunk starting with a capital letter also starts a new sentence, for
    Ding's occasional missing full stop (``He died at 80; He died when he was close to 80.``).
    """
    merged: list[str] = []
    for chunk in chunks:
        starts_new = loose and chunk[:1].isupper()
        if merged and not starts_new and not _ends_sentence(strip_parentheticals(merged[-1])):
            merged[-1] = f"{merged[-1]}; {chunk}"
        else:
            merged.append(chunk)
    return merged


def split_alternatives(text: str, sentences: bool = False, loose: bool = False) -> list[str]:
    """Split one sub-entry into its ``; ``-separated alternatives (outside brackets).

    Terms are split at every ``; `` (``to put sb. in a bad mood; to disgruntle sb.``).  Between
    sentences (``sentences=True``) only a ``; `` right after sentence punctuation separates
    alternatives (``The committee has no quorum.; A quorum ... is not present.``); a plain
    ``; `` is part of the sentence (``I haven't made any decisions; I'm going to ...``).
    ``loose`` see :func:`_merge_sentences`.
    """
    chunks = [c.strip() for c in split_top_level(strip_markers(text), "; ")]
    if sentences and len(chunks) > 1:
        chunks = _merge_sentences(chunks, loose)
    return [c for c in chunks if c]


def is_sentence_subentry(text: str) -> bool:
    """Does a sub-entry hold example sentences (at least one sentence alternative)?"""
    alternatives = split_alternatives(text, sentences=True)
    return any(_looks_like_sentence(strip_parentheticals(alt)) for alt in alternatives)


def pair_alternatives(de_alts: Sequence[str], en_alts: Sequence[str]) -> list[tuple[str, str]]:
    """Pair alternatives one-to-one when the counts agree, else only the first of each side.

    Ding lists synonyms in parallel when the counts agree (``A; Ais; As`` / ``A; A sharp;
    A flat``).  With unequal counts there is no alignment to recover, and a cartesian product
    would flood the corpus with loose synonym pairs; the first alternative is the main
    translation.
    """
    if not de_alts or not en_alts:
        return []
    if len(de_alts) == len(en_alts):
        return list(zip(de_alts, en_alts))
    return [(de_alts[0], en_alts[0])]


def _balanced(text: str) -> bool:
    """True when (), [] and {} are properly nested in ``text`` (and none stands alone, as in
    the symbol entry ``runde Klammer / ( /``)."""
    if re.search(r"(?<!\S)[()\[\]{}](?!\S)", text):
        return False
    stack: list[str] = []
    for ch in text:
        if ch in _OPEN:
            stack.append(_CLOSE[_OPEN.index(ch)])
        elif ch in _CLOSE:
            if not stack or stack.pop() != ch:
                return False
    return not stack


def parse_ding_line(line: str, origin: str = "ding") -> list[Pair]:
    """Parse one ``German :: English`` line into cleaned pairs.

    ``' | '`` separates aligned sub-entries (headword, plural, inflections, examples); the
    i-th German sub-entry translates the i-th English one, so a line whose counts differ is
    skipped rather than guessed.  Comment lines (``#``), lines with unbalanced brackets (a
    handful of typos in the dictionary) and malformed lines yield nothing.
    """
    line = line.rstrip("\n")
    if not line.strip() or line.lstrip().startswith("#") or " :: " not in line:
        return []
    de_side, en_side = line.split(" :: ", 1)
    if " :: " in en_side:
        return []
    de_side, en_side = normalize_text(de_side), normalize_text(en_side)
    if not (_balanced(de_side) and _balanced(en_side)):
        return []  # a typo in the dictionary; guessing where the bracket ends misaligns
    de_side, en_side = strip_markers(de_side), strip_markers(en_side)
    de_subs = split_top_level(de_side, " | ")
    en_subs = split_top_level(en_side, " | ")
    if len(de_subs) != len(en_subs):
        return []
    pairs: list[Pair] = []
    for de_sub, en_sub in zip(de_subs, en_subs):
        # Both sides must hold sentences for the sentence rule: "Umsatzsteueridentnummer" ::
        # "VAT number; VAT no." is a term list even though "VAT number; VAT no." looks like one.
        sentences = is_sentence_subentry(de_sub) and is_sentence_subentry(en_sub)
        de_alts = split_alternatives(de_sub, sentences)
        en_alts = split_alternatives(en_sub, sentences)
        if sentences and len(de_alts) != len(en_alts):
            # A missing full stop on one side hides an alternative; accept the looser split
            # only when it makes the counts agree.
            de_loose = split_alternatives(de_sub, True, loose=True)
            en_loose = split_alternatives(en_sub, True, loose=True)
            for de_try, en_try in ((de_alts, en_loose), (de_loose, en_alts), (de_loose, en_loose)):
                if len(de_try) == len(en_try):
                    de_alts, en_alts = de_try, en_try
                    break
        for de_alt, en_alt in pair_alternatives(de_alts, en_alts):
            de, en = strip_annotations(de_alt), strip_annotations(en_alt)
            if de and en:
                pairs.append(Pair(de, en, origin, is_sentence(de, en)))
    return pairs


def read_ding(path: Path, origin: str = "ding") -> Iterator[Pair]:
    """Yield all pairs of a Ding dictionary file."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            yield from parse_ding_line(line, origin)


# --------------------------------------------------------------------------------------------
# Debian packages (download only, never install)
# --------------------------------------------------------------------------------------------


def fetch_deb(name: str, cache: Path) -> Path:
    """``apt-get download`` a package into ``cache`` and ``dpkg -x`` it; return the tree.

    Reuses an earlier download/extraction so a second run works offline.  Nothing is
    installed: ``apt-get download`` only fetches the .deb (it works without root).
    """
    cache = cache.expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    root = cache / "extracted" / name
    if root.is_dir() and any(root.iterdir()):
        return root
    debs = sorted(cache.glob(f"{glob.escape(name)}_*.deb"))
    if not debs:
        try:
            proc = subprocess.run(
                ["apt-get", "download", name], cwd=cache, capture_output=True, text=True
            )
        except FileNotFoundError as exc:
            raise CorpusError(f"cannot download {name}: apt-get is not available") from exc
        if proc.returncode != 0:
            raise CorpusError(
                f"'apt-get download {name}' failed (exit {proc.returncode}): "
                f"{proc.stderr.strip() or proc.stdout.strip()}"
            )
        debs = sorted(cache.glob(f"{glob.escape(name)}_*.deb"))
        if not debs:
            raise CorpusError(f"'apt-get download {name}' produced no {name}_*.deb in {cache}")
    root.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["dpkg", "-x", str(debs[-1]), str(root)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise CorpusError(f"'dpkg -x {debs[-1]}' failed: {proc.stderr.strip()}")
    return root


def find_ding(explicit: Path | None, cache: Path) -> Path:
    """The Ding file: ``--ding``, else the installed one, else a downloaded package copy."""
    if explicit is not None:
        if not explicit.is_file():
            raise CorpusError(f"Ding file not found: {explicit}")
        return explicit
    if DING_SYSTEM_PATH.is_file():
        return DING_SYSTEM_PATH
    path = fetch_deb(DING_PACKAGE, cache) / DING_IN_PACKAGE
    if not path.is_file():
        raise CorpusError(f"package {DING_PACKAGE} has no {DING_IN_PACKAGE}")
    return path


# --------------------------------------------------------------------------------------------
# gettext catalogs
# --------------------------------------------------------------------------------------------

_MARKUP_RE = re.compile(r"</?[A-Za-z][A-Za-z0-9:-]*(?:\s[^<>]*)?/?>")
_FORMAT_RE = re.compile(
    r"%(?:\d+\$)?(?:\([A-Za-z_][A-Za-z0-9_]*\))?[-+ #0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?"
    r"(?:hh|ll|[hlLqjzt])?[diouxXeEfFgGcrsaApSC%]"
    r"|\{[A-Za-z0-9_]*(?:[:!][^{}]*)?\}"
    r"|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?"
)
_ENTITY_RE = re.compile(r"&(?:[A-Za-z]+|#\d+|#x[0-9A-Fa-f]+);")
# "_" + letter/digit that is not part of an identifier such as LC_ALL or KP_Prior.
_UNDERSCORE_ACCEL_RE = re.compile(r"(?<![A-Z]{2})_(?=\w)")
_AMP_ACCEL_RE = re.compile(r"(?<!&)&(?=[^\W_])(?![A-Za-z]+;|#\d+;)")


def _accelerators(text: str, mark: str) -> list[str]:
    """Tokens of ``text`` that contain an accelerator candidate for ``mark`` (``_``/``&``)."""
    pattern = _UNDERSCORE_ACCEL_RE if mark == "_" else _AMP_ACCEL_RE
    return [tok for tok in text.split() if pattern.search(tok)]


def strip_accelerators(msgid: str, msgstr: str) -> tuple[str, str]:
    """Remove keyboard accelerator marks (``_File``/``_Datei``, ``&Open``/``Ö&ffnen``).

    An accelerator is recognised only when *both* sides contain exactly one candidate and the
    marked tokens differ between the sides.  That keeps identifiers that translators copy
    verbatim (``pg_control``, ``cookie_result``, ``AT&T``) and ``a & b`` intact, while GTK/Qt
    style labels lose their marks consistently on both sides.  In Qt strings that had an
    accelerator, ``&&`` (an escaped literal ampersand) becomes ``&``.
    """
    for mark in ("_", "&"):
        src_tokens, tgt_tokens = _accelerators(msgid, mark), _accelerators(msgstr, mark)
        if len(src_tokens) != 1 or len(tgt_tokens) != 1 or src_tokens == tgt_tokens:
            continue
        if mark == "&" and re.fullmatch(r"[A-Z]+&[A-Z]+", src_tokens[0]):
            continue  # R&D, AT&T
        pattern = _UNDERSCORE_ACCEL_RE if mark == "_" else _AMP_ACCEL_RE
        msgid, msgstr = pattern.sub("", msgid, count=1), pattern.sub("", msgstr, count=1)
        if mark == "&":
            msgid, msgstr = msgid.replace("&&", "&"), msgstr.replace("&&", "&")
    return msgid, msgstr


def _has_words(text: str) -> bool:
    """True when something other than format specifiers, digits and punctuation is left."""
    return any(ch.isalpha() for ch in _FORMAT_RE.sub(" ", text))


def gettext_pair(msgid: str, msgstr: str) -> tuple[str, str] | None:
    """Clean one English msgid / German msgstr pair, or None if it is no usable translation.

    Dropped: empty or untranslated strings, format-only strings (``%s``, ``{0}``, ``%d%%``),
    strings without letters, markup (``<b>``; stripping tags from both sides could leave
    mismatched fragments), multi-line strings (mostly help texts wrapped at different widths,
    so their lines do not align) and strings over ``MAX_GETTEXT_WORDS`` words.
    """
    if not msgid or not msgstr:
        return None
    msgid, msgstr = msgid.strip(), msgstr.strip()
    if "\n" in msgid or "\n" in msgstr:
        return None
    if _MARKUP_RE.search(msgid) or _MARKUP_RE.search(msgstr):
        return None
    msgid, msgstr = strip_accelerators(msgid, msgstr)
    if _ENTITY_RE.search(msgid) or _ENTITY_RE.search(msgstr):
        msgid, msgstr = html.unescape(msgid), html.unescape(msgstr)
    if not _has_words(msgid) or not _has_words(msgstr):
        return None
    if len(msgid.split()) > MAX_GETTEXT_WORDS or len(msgstr.split()) > MAX_GETTEXT_WORDS:
        return None
    return msgid, msgstr


def _context_rank(entry: Any) -> tuple[bool, str]:
    """Sort key among msgctxt variants: no context first, then by context."""
    ctx = getattr(entry, "msgctxt", None)
    return (ctx is not None, ctx or "")


def read_gettext(path: Path, origin: str | None = None) -> Iterator[Pair]:
    """Yield German-English pairs from one ``.po`` or ``.mo`` catalog (via polib).

    English ``msgid`` / German ``msgstr``; for plural entries ``msgid`` pairs with
    ``msgstr[0]`` and ``msgid_plural`` with ``msgstr[1]``.  Fuzzy and obsolete entries are
    skipped (fuzzy translations are unreviewed guesses).  Of several entries with the same
    msgid but different ``msgctxt`` only one is used: the one without context, else the one
    with the alphabetically first context (not the first in the file: ``.mo`` files are sorted
    by context, ``.po`` files are not, and both must give the same corpus).
    Origin: ``gettext:<domain>``.
    """
    import polib  # local import: only this reader needs it

    origin = origin or f"gettext:{path.stem}"
    try:
        catalog = polib.mofile(str(path)) if path.suffix == ".mo" else polib.pofile(str(path))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        print(f"warning: skipping unreadable catalog {path}: {exc}", file=sys.stderr)
        return
    chosen: dict[tuple[str, str], Any] = {}
    for entry in catalog:
        if getattr(entry, "obsolete", False) or "fuzzy" in getattr(entry, "flags", ()):
            continue
        if not entry.msgid:  # the header
            continue
        key = (entry.msgid, entry.msgid_plural or "")
        if key not in chosen or _context_rank(entry) < _context_rank(chosen[key]):
            chosen[key] = entry
    for entry in chosen.values():
        if entry.msgid_plural:
            plural = {int(k): v for k, v in entry.msgstr_plural.items()}
            candidates = [(entry.msgid, plural.get(0, "")), (entry.msgid_plural, plural.get(1, ""))]
        else:
            candidates = [(entry.msgid, entry.msgstr)]
        for msgid, msgstr in candidates:
            cleaned = gettext_pair(msgid, msgstr)
            if cleaned is not None:
                yield Pair(de=cleaned[1], en=cleaned[0], origin=origin)


def _is_german_catalog(path: Path) -> bool:
    """``.../de/...`` (e.g. ``locale/de/LC_MESSAGES/x.mo``) or a file named ``de.po``/``de.mo``."""
    return path.stem == "de" or "de" in path.parts[:-1]


def find_catalogs(path: Path, require_de: bool = True) -> list[Path]:
    """Catalog files under ``path`` (a file or a directory, searched recursively), sorted.

    A file named explicitly is always used; in directories only German catalogs are taken
    (``require_de``), so pointing at a whole ``locale/`` tree does not pull in French.
    """
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise CorpusError(f"gettext path not found: {path}")
    found = [p for p in path.rglob("*") if p.suffix in (".po", ".mo") and p.is_file()]
    if require_de:
        found = [p for p in found if _is_german_catalog(p.absolute())]
    return sorted(found)


def catalog_origin(path: Path, prefix: str = "gettext") -> str:
    """``gettext:<domain>``; for ``de.po`` files the domain is the enclosing directory name."""
    domain = path.stem if path.stem != "de" else path.parent.name
    return f"{prefix}:{domain}"


# --------------------------------------------------------------------------------------------
# User corpora
# --------------------------------------------------------------------------------------------


def read_tsv_corpus(path: Path, direction: str = "de-en") -> Iterator[Pair]:
    """Yield pairs from a ``source<TAB>target`` file (German source unless ``en-de``).

    Extra columns are ignored; lines without a tab are reported once and skipped.
    """
    if direction not in DIRECTIONS:
        raise CorpusError(f"unknown TSV direction {direction!r}; use one of {DIRECTIONS}")
    if not path.is_file():
        raise CorpusError(f"TSV file not found: {path}")
    origin = f"tsv:{path.stem}"
    bad = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            cols = line.split("\t")
            if len(cols) < 2:
                bad += 1
                continue
            src, tgt = cols[0], cols[1]
            de, en = (src, tgt) if direction == "de-en" else (tgt, src)
            yield Pair(de=de, en=en, origin=origin)
    if bad:
        print(f"warning: {path}: skipped {bad} line(s) without a tab", file=sys.stderr)


def read_moses(prefix: str) -> Iterator[Pair]:
    """Yield pairs from ``PREFIX.de`` / ``PREFIX.en`` (line i of one translates line i of the
    other); differing line counts mean the files are not aligned, which is an error."""
    de_path, en_path = Path(f"{prefix}.de"), Path(f"{prefix}.en")
    for p in (de_path, en_path):
        if not p.is_file():
            raise CorpusError(f"Moses corpus file not found: {p}")
    de_lines = de_path.read_text(encoding="utf-8", errors="replace").splitlines()
    en_lines = en_path.read_text(encoding="utf-8", errors="replace").splitlines()
    if len(de_lines) != len(en_lines):
        raise CorpusError(
            f"Moses corpus {prefix}: {de_path} has {len(de_lines)} lines but {en_path} has "
            f"{len(en_lines)}; the files must be line-aligned"
        )
    origin = f"moses:{Path(prefix).name}"
    for de, en in zip(de_lines, en_lines):
        yield Pair(de=de, en=en, origin=origin)


# --------------------------------------------------------------------------------------------
# Cleaning, dedup, split
# --------------------------------------------------------------------------------------------


def clean_pair(
    pair: Pair, max_chars: int = MAX_CHARS, max_ratio: float = MAX_RATIO
) -> tuple[Pair | None, str]:
    """Normalise a pair and decide whether to keep it; returns (pair or None, reason).

    Reasons for dropping: an empty side; a side longer than ``max_chars``; a character length
    ratio above ``max_ratio`` (measured against at least ``RATIO_FLOOR`` characters so
    ``Ja``/``Yes`` is fine but ``Ja``/``a forty-character explanation`` is not); identical
    sides of more than one word (untranslated strings copied by translators; single-word
    identical pairs such as ``Name``/``Name`` or ``OK``/``OK`` are real translations).
    """
    de, en = normalize_text(pair.de), normalize_text(pair.en)
    if not de or not en:
        return None, "empty"
    if len(de) > max_chars or len(en) > max_chars:
        return None, "too_long"
    longer, shorter = max(len(de), len(en)), min(len(de), len(en))
    if longer / max(shorter, RATIO_FLOOR) > max_ratio:
        return None, "length_ratio"
    if de == en and len(de.split()) > 1:
        return None, "identical"
    return Pair(de, en, pair.origin, pair.sentence), "kept"


def source_name(origin: str) -> str:
    """Group origins for the summary: all ``gettext:*`` catalogs count as one source."""
    kind, _, rest = origin.partition(":")
    if kind == "gettext":
        return "gettext"
    if kind == "deb":
        return "deb:" + rest.split(":", 1)[0]
    return origin


def clean_corpus(
    pairs: Iterable[Pair], max_chars: int = MAX_CHARS, max_ratio: float = MAX_RATIO
) -> tuple[list[Pair], dict[str, Counter]]:
    """Clean and deduplicate (first origin wins); returns kept pairs and per-source stats
    (``raw``, ``kept``, ``duplicate`` and the drop reasons of :func:`clean_pair`)."""
    stats: dict[str, Counter] = defaultdict(Counter)
    seen: set[tuple[str, str]] = set()
    kept: list[Pair] = []
    for pair in pairs:
        source = source_name(pair.origin)
        stats[source]["raw"] += 1
        cleaned, reason = clean_pair(pair, max_chars, max_ratio)
        if cleaned is None:
            stats[source][reason] += 1
            continue
        key = (cleaned.de, cleaned.en)
        if key in seen:
            stats[source]["duplicate"] += 1
            continue
        seen.add(key)
        stats[source]["kept"] += 1
        kept.append(cleaned)
    return kept, stats


def split_key(de: str) -> bytes:
    """Stable split hash of a German side: blake2b of the normalised, case-folded text.

    Independent of Python's hash seed, platform and input order, so every machine computes
    the same split for the same sentence.
    """
    return hashlib.blake2b(normalize_text(de).casefold().encode("utf-8"), digest_size=8).digest()


def is_eval_candidate(pair: Pair) -> bool:
    """Ding sentence pairs without ``/`` or ``…``/``...``: fit as dev/test references.

    Slashes in Ding sentences are inline alternatives (``That seems/sounds funny to me.``) and
    ellipses mark incomplete sentences; both would make a poor reference translation, so such
    pairs stay in train.
    """
    if not (pair.sentence and pair.origin == "ding"):
        return False
    return not any(bad in side for side in (pair.de, pair.en) for bad in ("/", "…", "..."))


def split_corpus(
    pairs: Sequence[Pair], test_size: int = 1000, dev_size: int = 1000, seed: int = 1234
) -> tuple[dict[str, list[Pair]], int]:
    """Split into train/dev/test; returns the splits and the number of pairs removed as leaks.

    Dev/test candidates (:func:`is_eval_candidate`) are Ding sentence pairs, grouped by German
    side (all translations of one German sentence stay together) and ordered by
    :func:`split_key`; the first groups fill test, the next ones dev.  A dev group sharing a
    side with test is dropped.  Any other pair whose German or English side matches a dev/test
    side (case-insensitive, ignoring final punctuation; German and English sides are pooled)
    leaves train, so neither a repeated sentence nor its translation leaks.  Train is sorted,
    then shuffled with ``seed``.
    """
    groups: dict[str, list[Pair]] = defaultdict(list)
    for pair in pairs:
        if is_eval_candidate(pair):
            groups[normalize_text(pair.de).casefold()].append(pair)
    ordered = sorted(groups, key=lambda k: (split_key(k), k))

    held: set[str] = set()
    splits: dict[str, list[Pair]] = {"train": [], "dev": [], "test": []}
    chosen: set[tuple[str, str]] = set()
    leaks = 0
    pos = 0
    for name, size in (("test", test_size), ("dev", dev_size)):
        while pos < len(ordered) and len(splits[name]) < size:
            group = groups[ordered[pos]]
            pos += 1
            chosen.update((p.de, p.en) for p in group)
            if {_match_key(s) for p in group for s in (p.de, p.en)} & held:
                leaks += len(group)  # shares a side with test: usable for neither split
                continue
            splits[name].extend(group)
        held |= {_match_key(s) for p in splits[name] for s in (p.de, p.en)}
    for name, size in (("test", test_size), ("dev", dev_size)):
        if len(splits[name]) < size:
            print(
                f"warning: only {len(splits[name])} sentence pairs for {name} "
                f"(asked for {size})",
                file=sys.stderr,
            )

    for pair in pairs:
        if (pair.de, pair.en) in chosen:
            continue
        if _match_key(pair.de) in held or _match_key(pair.en) in held:
            leaks += 1
            continue
        splits["train"].append(pair)
    splits["train"].sort(key=lambda p: (p.de, p.en, p.origin))
    random.Random(seed).shuffle(splits["train"])
    return splits, leaks


# --------------------------------------------------------------------------------------------
# Output and reading
# --------------------------------------------------------------------------------------------


def _field(text: str) -> str:
    return re.sub(r"[\t\r\n]+", " ", text)


def write_tsv(path: Path, pairs: Iterable[Pair]) -> None:
    """Write ``de<TAB>en<TAB>origin`` lines (UTF-8, ``\\n`` line ends)."""
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        for p in pairs:
            fh.write(f"{_field(p.de)}\t{_field(p.en)}\t{_field(p.origin)}\n")


def read_pairs(path: str | os.PathLike[str], direction: str = "de-en") -> list[tuple[str, str]]:
    """Read (source, target) pairs for training/evaluation.

    Files written by this module have three columns ``de, en, origin``: ``de-en`` returns
    (de, en), ``en-de`` returns (en, de).  A two-column user file is ``source<TAB>target``
    already and is returned as is whatever the direction.  Blank lines are skipped; a line
    with a single column is an error (it would silently shift nothing but hides broken data).
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, not {direction!r}")
    out: list[tuple[str, str]] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.rstrip("\r\n")
            if not line:
                continue
            cols = line.split("\t")
            if len(cols) < 2:
                raise ValueError(f"{path}:{lineno}: expected at least 2 tab-separated columns")
            if len(cols) >= 3 and direction == "en-de":
                out.append((cols[1], cols[0]))
            else:
                out.append((cols[0], cols[1]))
    return out


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m model.data",
        description="Prepare the German-English parallel corpus offline (Ding dictionary, "
        "gettext catalogs, user TSV/Moses files) into train/dev/test TSV files.",
    )
    p.add_argument("--out", type=Path, default=Path("data/de-en"), help="output directory")
    p.add_argument("--ding", type=Path, help="Ding de-en file (default: installed or downloaded)")
    p.add_argument("--no-ding", action="store_true", help="do not use the Ding dictionary")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="download cache for .debs")
    p.add_argument(
        "--locale-dir", type=Path, default=LOCALE_DIR, help="installed German catalogs to scan"
    )
    p.add_argument("--no-locale", action="store_true", help="do not scan --locale-dir")
    p.add_argument(
        "--gettext", type=Path, action="append", default=[], metavar="PATH",
        help="extra .po/.mo file or directory (repeatable)",
    )
    p.add_argument(
        "--fetch-deb", action="append", default=[], metavar="NAME",
        help="download (not install) a Debian package and use its German catalogs (repeatable)",
    )
    p.add_argument("--tsv", type=Path, action="append", default=[], metavar="PATH",
                   help="user corpus, source<TAB>target per line (repeatable)")
    p.add_argument("--tsv-direction", choices=DIRECTIONS, default="de-en",
                   help="language order of --tsv files (default: de-en)")
    p.add_argument("--moses", action="append", default=[], metavar="PREFIX",
                   help="user corpus PREFIX.de + PREFIX.en (repeatable)")
    p.add_argument("--test-size", type=int, default=1000, help="test sentences (default 1000)")
    p.add_argument("--dev-size", type=int, default=1000, help="dev sentences (default 1000)")
    p.add_argument("--seed", type=int, default=1234, help="seed of the train shuffle")
    p.add_argument("--max-chars", type=int, default=MAX_CHARS, help="max characters per side")
    p.add_argument("--max-ratio", type=float, default=MAX_RATIO, help="max length ratio")
    p.add_argument("--monolingual", action="store_true",
                   help="write German and English monolingual text for the decoder-only model instead "
                   "(see model/mono.py); e.g. --out data/mono")
    from .mono import add_arguments

    add_arguments(p)
    return p


def collect_sources(args: argparse.Namespace) -> tuple[list[Iterable[Pair]], list[str]]:
    """Resolve all inputs (downloading .debs if asked) into readers plus their descriptions.

    Order matters for deduplication (the first origin of a pair is kept): Ding, installed
    catalogs, extra catalogs, downloaded packages, then user corpora.
    """
    readers: list[Iterable[Pair]] = []
    sources: list[str] = []
    if not args.no_ding:
        ding = find_ding(args.ding, args.cache)
        readers.append(read_ding(ding))
        sources.append(f"ding:{ding}")
    catalog_roots = [] if args.no_locale or not args.locale_dir.is_dir() else [args.locale_dir]
    for root in [*catalog_roots, *args.gettext]:
        for cat in find_catalogs(root):
            readers.append(read_gettext(cat, catalog_origin(cat)))
            sources.append(f"gettext:{cat}")
    for name in args.fetch_deb:
        locale = fetch_deb(name, args.cache) / DEB_LOCALE_DIR
        cats = find_catalogs(locale, require_de=False) if locale.is_dir() else []
        if not cats:
            print(f"warning: package {name} has no German catalogs", file=sys.stderr)
        for cat in cats:
            readers.append(read_gettext(cat, f"deb:{name}:{cat.stem}"))
            sources.append(f"deb:{name}:{cat.name}")
    for path in args.tsv:
        if not path.is_file():
            raise CorpusError(f"TSV file not found: {path}")
        readers.append(read_tsv_corpus(path, args.tsv_direction))
        sources.append(f"tsv:{path} ({args.tsv_direction})")
    for prefix in args.moses:
        readers.append(read_moses(prefix))
        sources.append(f"moses:{prefix}")
    return readers, sources


def format_table(stats: dict[str, Counter], splits: dict[str, list[Pair]], leaks: int) -> str:
    """The summary printed after a run."""
    width = max([len("source"), len("total"), *(len(s) for s in stats)])
    lines = [f"{'source':<{width}}  {'raw':>9}  {'kept':>9}", "-" * (width + 22)]
    for name, c in stats.items():
        lines.append(f"{name:<{width}}  {c['raw']:>9}  {c['kept']:>9}")
    lines.append("-" * (width + 22))
    total_raw = sum(c["raw"] for c in stats.values())
    total_kept = sum(c["kept"] for c in stats.values())
    lines.append(f"{'total':<{width}}  {total_raw:>9}  {total_kept:>9}")
    lines.append(
        "splits: " + ", ".join(f"{k}={len(v)}" for k, v in splits.items())
        + f" (removed from train as dev/test leaks: {leaks})"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the preparation; returns 0 (raises SystemExit(2) with a message on input errors)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.monolingual:
        from .mono import main as mono_main

        return mono_main(args, argv)
    start = time.monotonic()
    try:
        readers, sources = collect_sources(args)
        pairs, stats = clean_corpus(
            (pair for reader in readers for pair in reader), args.max_chars, args.max_ratio
        )
    except CorpusError as exc:
        parser.exit(2, f"error: {exc}\n")
    splits, leaks = split_corpus(pairs, args.test_size, args.dev_size, args.seed)

    args.out.mkdir(parents=True, exist_ok=True)
    for name, split_pairs in splits.items():
        write_tsv(args.out / f"{name}.tsv", split_pairs)
    origins = Counter(p.origin for p in pairs)
    meta = {
        "langs": ["de", "en"],
        "columns": ["de", "en", "origin"],
        "counts": {name: {"raw": c["raw"], "kept": c["kept"]} for name, c in stats.items()},
        "dropped": {
            name: {k: v for k, v in c.items() if k not in ("raw", "kept")}
            for name, c in stats.items()
        },
        "origins": dict(sorted(origins.items())),
        "splits": {name: len(v) for name, v in splits.items()},
        "leaks_removed": leaks,
        "sentences_in_train": sum(p.sentence for p in splits["train"]),
        "seed": args.seed,
        "sources": sources,
        "created_by": "python -m model.data " + shlex.join(argv),
    }
    (args.out / "meta.json").write_text(
        json.dumps(meta, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
    )
    print(format_table(stats, splits, leaks))
    print(f"wrote {args.out} in {time.monotonic() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
