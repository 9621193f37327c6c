"""The Debian Reference (Debian's ``debian-reference-de`` and ``debian-reference-en``, GPL-2+) as
sentence-level parallel text.

Both packages hold the same DocBook-generated HTML pages (``usr/share/debian-reference/ch02.de.html`` /
``ch02.en.html``), translated with po4a paragraph by paragraph: the German page keeps the English one's
sections (``<a id="_package_configuration"/>`` in each heading) and, inside them, its paragraphs, list
items, table cells and headings in the same order. A page aligns block for block where both languages
have the same sequence of blocks; otherwise section by section, keeping the sections whose sequences
agree (po4a adds or drops nothing inside a section unless the translation is out of date). Paragraphs
po4a left in English (untranslated or outdated strings) are dropped, and aligned paragraphs are cut
into sentences where both sides have as many (as LibreOffice's help is).
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Iterator

from .ding import is_sentence
from .lohelp import aligned_sentences
from .man import detect_lang
from .text import Pair, normalize_text

PACKAGES = {"de": "debian-reference-de", "en": "debian-reference-en"}
PAGE_DIR = "usr/share/debian-reference"
LICENSE = "GPL-2+"
# Elements whose own text is one translation unit (po4a's): the innermost one owns its text.
_BLOCKS = {"p", "td", "th", "dt", "caption", "h1", "h2", "h3", "h4", "h5", "h6", "title"}
# Screen output and command lines: not prose, and po4a leaves them untranslated.
_SKIP = {"pre", "script", "style"}
# "2.1.1. " or "A.3. " before a heading: the same on both sides, no text to learn.
_NUMBERING = re.compile(r"^(?:[A-Z]|\d+)(?:\.\d+)*\.\s+")


class BlockParser(HTMLParser):
    """A page as (section id, tag, text) blocks in document order; the section id is the last heading
    anchor (``<a id="_…"/>``) seen. Other DocBook-made pages (``handbook``) override ``opens_block`` and
    ``skips``, where a block or a skipped element is told by its class rather than its tag."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.blocks: list[tuple[str, str, str]] = []
        self.section = ""
        self._open: list[tuple[str, int, list[str]]] = []     # the open blocks, innermost last
        self._skipped: list[tuple[str, int]] = []               # the open skipped elements
        # How many elements of each tag are open: the </div> that ends a <div class="para"> is the one
        # that brings the count of open divs back to where it was.
        self._nesting: dict[str, int] = {}

    def opens_block(self, tag: str, attrs: dict[str, str | None]) -> bool:
        return tag in _BLOCKS

    def skips(self, tag: str, attrs: dict[str, str | None]) -> bool:
        return tag in _SKIP

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        ident = attrs.get("id") or ""
        if tag == "a" and ident.startswith("_"):
            self.section = ident
        level = self._nesting.get(tag, 0)
        self._nesting[tag] = level + 1
        if self.skips(tag, attrs):
            self._skipped.append((tag, level))
        elif not self._skipped and self.opens_block(tag, attrs):     # a table of contents' items are no blocks
            self._open.append((tag, level, []))

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)            # <a id="_x"/>: an anchor with nothing inside
        self.handle_endtag(tag)

    def handle_endtag(self, tag):
        level = self._nesting[tag] = max(0, self._nesting.get(tag, 0) - 1)
        if self._skipped and self._skipped[-1][0] == tag and self._skipped[-1][1] >= level:
            self._skipped.pop()
        elif any(t == tag and lvl >= level for t, lvl, _ in self._open):
            while self._open:
                open_tag, open_level, text = self._open.pop()
                if open_tag == tag and open_level >= level:
                    self.blocks.append((self.section, tag, normalize_text("".join(text))))
                    break

    def handle_data(self, data):
        if self._open and not self._skipped:
            self._open[-1][2].append(data)


def read_blocks(page: Path, parser: type[BlockParser] = BlockParser) -> list[tuple[str, str, str]]:
    blocks = parser()
    blocks.feed(page.read_text(encoding="utf-8", errors="replace"))
    blocks.close()
    return blocks.blocks


def _by_section(blocks: list[tuple[str, str, str]]) -> dict[str, list[tuple[str, str, str]]]:
    sections: dict[str, list[tuple[str, str, str]]] = {}
    for block in blocks:
        sections.setdefault(block[0], []).append(block)
    return sections


def align_blocks(de: list[tuple[str, str, str]], en: list[tuple[str, str, str]]) -> list[tuple[str, str]]:
    """Text pairs of two pages' blocks: all of them where the (section, tag) sequences agree, else those of
    the sections whose sequences agree."""
    shape = [b[:2] for b in de]
    if shape == [b[:2] for b in en]:
        return [(d[2], e[2]) for d, e in zip(de, en)]
    de_sections, en_sections = _by_section(de), _by_section(en)
    pairs = []
    for section, de_blocks in de_sections.items():
        en_blocks = en_sections.get(section, [])
        if [b[1] for b in de_blocks] == [b[1] for b in en_blocks]:
            pairs.extend((d[2], e[2]) for d, e in zip(de_blocks, en_blocks))
    return pairs


def translated(de: str, en: str) -> bool:
    """False for a block po4a left in English (the same text, or English words on the German side)."""
    return bool(de) and bool(en) and de != en and detect_lang(de) != "en"


def sentence_pairs(de: str, en: str) -> list[tuple[str, str]]:
    """A block pair cut into sentence pairs (``lohelp.aligned_sentences``), but kept whole where a sentence
    pair is more than twice as long on one side: the counts agreed by chance (a full stop after "usw."
    read as an abbreviation on one side, two sentences merged and two split on the other)."""
    pairs = aligned_sentences(de, en)
    if len(pairs) > 1 and any(not 0.5 <= len(d) / max(1, len(e)) <= 2.0 for d, e in pairs):
        return [(de, en)]
    return pairs


def read_debian_reference(de_root: Path, en_root: Path) -> Iterator[Pair]:
    """Sentence pairs of every page both unpacked packages hold, origin ``debref:<page>``."""
    de_dir, en_dir = de_root / PAGE_DIR, en_root / PAGE_DIR
    for de_page in sorted(de_dir.glob("*.de.html")):
        page = de_page.name.removesuffix(".de.html")
        en_page = en_dir / f"{page}.en.html"
        if not en_page.is_file():
            continue
        for de_text, en_text in align_blocks(read_blocks(de_page), read_blocks(en_page)):
            de_text, en_text = _NUMBERING.sub("", de_text), _NUMBERING.sub("", en_text)
            if not translated(de_text, en_text):
                continue
            for de, en in aligned_sentences(de_text, en_text):
                yield Pair(de=de, en=en, origin=f"debref:{page}", sentence=is_sentence(de, en))
