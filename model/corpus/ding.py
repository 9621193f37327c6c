"""The Ding dictionary (Debian package ``trans-de-en``, ``German :: English`` per line) as pairs.

A line holds aligned sub-entries (headword, plural, inflections, example sentences), each with
``; ``-separated alternatives and markers (``{f}``, ``[ugs.]``, ``/IPO/``); the parser keeps the
alternatives it can align and strips what is never translated text.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator, Sequence

from .debian import fetch_deb
from .text import CorpusError, Pair, normalize_text

DING_SYSTEM_PATH = Path("/usr/share/trans/de-en")
DING_PACKAGE = "trans-de-en"
DING_IN_PACKAGE = Path("usr/share/trans/de-en")

_WS_RE = re.compile(r"\s+")

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
