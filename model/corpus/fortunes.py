"""Monolingual everyday text from Debian's fortune cookie packages, for back-translation (model/back_translate.py).

A cookie file is entries separated by lines holding only ``%``: jokes, anecdotes, proverbs, quotations, short
dialogues, wrapped at about 70 columns. An entry is joined into one paragraph and split into sentences; its
attribution line (``-- Mark Twain``) and drawings are left out. ``fortunes-de`` is German (GPL-2+),
``fortunes`` and ``fortunes-min`` English (the BSD licence of the University of California, their copyright
file's free text); the German package's ``translations`` file holds English originals beside German, which
``looks_like`` drops line by line.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

from .text import normalize_text

# package -> (language, licence as its /usr/share/doc/PACKAGE/copyright gives it, cookie directory)
PACKAGES = {
    "fortunes-de": ("de", "GPL-2+", "usr/share/games/fortunes/de"),
    "fortunes": ("en", "BSD-3-Clause (University of California; free-text copyright file)", "usr/share/games/fortunes"),
    "fortunes-min": ("en", "BSD-3-Clause (University of California; free-text copyright file)",
                     "usr/share/games/fortunes"),
}
# Files of drawings, not sentences.
SKIPPED_FILES = {"asciiart", "ascii-art", "art"}
MIN_WORDS, MAX_WORDS = 4, 80

# A sentence ends at . ! ? (and a closing quote) before a space and a capital or an opening quote; not after an
# abbreviation or a single letter (initials, "z. B.").
_SPLIT = re.compile(r"(?<=[.!?])[\"')]?\s+(?=[\"'(]?[A-ZÄÖÜ])")
_ABBREVIATIONS = re.compile(r"(?:\b(?:Mr|Mrs|Ms|Dr|St|Prof|Nr|Hr|Fr|bzw|usw|ca|vgl|etc|Jr|Sr|vs|No|z\.B|u\.a|d\.h)"
                            r"|\b[A-Za-z]|\d)\.$")
_ATTRIBUTION = re.compile(r"^\s*(--|—|-\s|\(?[A-Z][a-z]+ \d{4}\)?$)")
_GERMAN = {"der", "die", "das", "und", "ist", "nicht", "ich", "sie", "ein", "eine", "zu", "mit", "auf", "den",
           "es", "wir", "du", "sich", "auch", "dem", "wenn", "aber", "noch", "wie", "man", "nur", "hat", "war"}
_ENGLISH = {"the", "and", "is", "not", "you", "of", "to", "a", "that", "it", "in", "with", "for", "was", "are",
            "be", "have", "this", "what", "he", "she", "they", "but", "if", "on", "my", "your", "we"}


def cookie_files(root: Path, package: str) -> list[Path]:
    """An unpacked package's cookie files: its cookie directory's plain files, without the .dat indexes and the
    .u8 links, and without drawings."""
    directory = root / PACKAGES[package][2]
    return sorted(p for p in directory.iterdir() if p.is_file() and not p.is_symlink() and not p.suffix
                  and p.name not in SKIPPED_FILES)


def entries(path: Path) -> Iterator[str]:
    """A cookie file's entries, each joined into one paragraph (attribution lines left out)."""
    lines: list[str] = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines() + ["%"]:
        if line.strip() == "%":
            if lines:
                yield normalize_text(" ".join(lines))
            lines = []
        elif line.strip() and not _ATTRIBUTION.match(line):
            lines.append(line.strip())


def sentences(paragraph: str) -> Iterator[str]:
    """A paragraph's sentences, cut where a sentence ends (not after an abbreviation or an initial)."""
    start = 0
    for m in _SPLIT.finditer(paragraph):
        head = paragraph[start:m.start()].rstrip("\"')")
        if _ABBREVIATIONS.search(head):
            continue
        yield paragraph[start:m.end()].strip()
        start = m.end()
    yield paragraph[start:].strip()


def balanced(text: str) -> str:
    """A sentence cut out of a quotation keeps one of its quotes: an unpaired quote at either end goes."""
    if text.count('"') % 2:
        text = text[1:] if text.startswith('"') else text[:-1] if text.endswith('"') else text
    return text.strip()


def looks_like(text: str, lang: str) -> bool:
    """Running text of `lang`: 4-80 words, mostly letters, capitalised, ended like a sentence, and more of
    `lang`'s function words than of the other language's (drops the English originals in German files, code,
    tables and lists)."""
    words = text.split()
    if not MIN_WORDS <= len(words) <= MAX_WORDS:
        return False
    letters = sum(c.isalpha() for c in text)
    if letters < 0.7 * len(text.replace(" ", "")) or not text.lstrip("\"'(").strip()[:1].isupper():
        return False
    if not text.rstrip("\"')").endswith((".", "!", "?")):
        return False
    lower = [w.strip(".,;:!?\"'()").lower() for w in words]
    de, en = sum(w in _GERMAN for w in lower), sum(w in _ENGLISH for w in lower)
    return de > en if lang == "de" else en > de


def read(root: Path, package: str) -> Iterator[str]:
    """The sentences of an unpacked fortune package in its language (duplicates left to the caller)."""
    lang = PACKAGES[package][0]
    for path in cookie_files(root, package):
        for paragraph in entries(path):
            for sentence in map(balanced, sentences(paragraph)):
                if looks_like(sentence, lang):
                    yield sentence
