"""Two books shipped as DocBook-made HTML in both languages, as sentence-level parallel text: the Debian
Administrator's Handbook (``debian-handbook``, GPL-2+ or CC-BY-SA-3.0) and GnuCash's manuals
(``gnucash-docs``, GFDL without invariant sections).

- ``debian-handbook`` holds Publican's HTML under ``usr/share/doc/debian-handbook/html/<de-DE|en-US>/``,
  one file per section with the same name in every language. The German book is built from the English
  DocBook and a .po catalog, paragraph by paragraph (``<div class="para">``), so the two files have the
  same blocks in the same order; strings the translators have not caught up with stay in English.
- ``gnucash-docs`` holds DocBook XSL's HTML of the Guide and the Help under
  ``usr/share/doc/gnucash-docs/gnucash-<guide|help>-<de|en>/`` (and their DocBook sources under
  ``usr/share/help``). The German manuals are DocBook sources of their own, translated by hand and not
  kept in step with the English ones (other chapters, other chunks), so only about half of the files
  with the same name still hold the same blocks.

Both are read with the Debian Reference's block parser (``debref``: paragraphs, headings, list items
and table cells in document order, innermost block owning its text, screens and program listings left
out) and aligned file by file, block for block. A file whose block sequence (the tags of its blocks)
differs between the languages is refused whole: a paragraph added, dropped or split on one side would
shift every pair after it, and nothing in the HTML says where. Aligned blocks still in English, or
equal on both sides, are dropped; the others are cut into sentences where both sides have as many of
comparable length (``debref.sentence_pairs``). Navigation bars, tables of contents (repeats of the
headings) and the URLs Publican prints after a link are not part of the text.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

from .debref import BlockParser, read_blocks, sentence_pairs, translated
from .ding import is_sentence
from .text import Pair, require_dirs

HANDBOOK_PACKAGES = ("debian-handbook",)
HANDBOOK_LICENSE = "GPL-2+ or CC-BY-SA-3.0"
HANDBOOK_DIRS = {"de": "usr/share/doc/debian-handbook/html/de-DE", "en": "usr/share/doc/debian-handbook/html/en-US"}
GNUCASH_PACKAGES = ("gnucash-docs",)
GNUCASH_LICENSE = "GFDL-NIV-1.1+"
GNUCASH_DIR = "usr/share/doc/gnucash-docs"
GNUCASH_BOOKS = ("guide", "help")
# "Kapitel 6. ", "Abbildung 2.1. ", "6.1.2. " before a heading or caption: labels the stylesheet adds,
# worded differently per language but no text to learn.
_LABEL = re.compile(
    r"^(?:(?:Kapitel|Chapter|Anhang|Appendix|Teil|Part|Abschnitt|Section|Beispiel|Example|Abbildung|Figure"
    r"|Tabelle|Table)\s+)?(?:[A-Z]|[IVX]+|\d+)(?:\.\d+)*\.\s+"
)
# List items and definitions carry text of their own where DocBook's <listitem> had no <para>.
_MORE_BLOCKS = {"li", "dd"}
_NOT_TEXT = {"url", "navheader", "navfooter", "docnav", "toc"}

Blocks = list[tuple[str, str, str]]


def _classes(attrs: dict[str, str | None]) -> set[str]:
    return set((attrs.get("class") or "").split())


class DocBookBlocks(BlockParser):
    """The Debian Reference's blocks plus Publican's ``<div class="para">`` paragraphs, list items and
    definitions, without the page furniture."""

    def opens_block(self, tag, attrs):
        return (super().opens_block(tag, attrs) or tag in _MORE_BLOCKS
                or (tag == "div" and "para" in _classes(attrs)))

    def skips(self, tag, attrs):
        return super().skips(tag, attrs) or bool(_classes(attrs) & _NOT_TEXT)


def align_file(de: Blocks, en: Blocks) -> list[tuple[str, str]] | None:
    """The block text pairs of two versions of a file, None where their tag sequences differ."""
    if not de or [b[1] for b in de] != [b[1] for b in en]:
        return None
    return [(d[2], e[2]) for d, e in zip(de, en)]


def file_pairs(de_file: Path, en_file: Path, origin: str) -> Iterator[Pair]:
    aligned = align_file(read_blocks(de_file, DocBookBlocks), read_blocks(en_file, DocBookBlocks))
    for de_text, en_text in aligned or []:
        de_text, en_text = _LABEL.sub("", de_text), _LABEL.sub("", en_text)
        if translated(de_text, en_text):
            for de, en in sentence_pairs(de_text, en_text):
                yield Pair(de=de, en=en, origin=origin, sentence=is_sentence(de, en))


def _both_languages(de_dir: Path, en_dir: Path, origin_prefix: str) -> Iterator[Pair]:
    for de_file in sorted(de_dir.glob("*.html")):
        en_file = en_dir / de_file.name
        if en_file.is_file():
            yield from file_pairs(de_file, en_file, f"{origin_prefix}{de_file.stem}")


def read_handbook(roots: dict[str, Path]) -> Iterator[Pair]:
    """Sentence pairs of the Debian Administrator's Handbook, origin ``debian-handbook:<file>``."""
    root = roots[HANDBOOK_PACKAGES[0]]
    require_dirs(root / HANDBOOK_DIRS["de"], root / HANDBOOK_DIRS["en"])
    yield from _both_languages(root / HANDBOOK_DIRS["de"], root / HANDBOOK_DIRS["en"], "debian-handbook:")


def read_gnucash(roots: dict[str, Path]) -> Iterator[Pair]:
    """Sentence pairs of GnuCash's Guide and Help, origin ``gnucash:<guide|help>/<file>``."""
    docs = roots[GNUCASH_PACKAGES[0]] / GNUCASH_DIR
    require_dirs(docs / "gnucash-guide-de", docs / "gnucash-guide-en")
    for book in GNUCASH_BOOKS:
        yield from _both_languages(docs / f"gnucash-{book}-de", docs / f"gnucash-{book}-en", f"gnucash:{book}/")
