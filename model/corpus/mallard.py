"""GNOME's user documentation (Debian's ``gnome-user-docs``, CC-BY-SA-3.0) as sentence-level parallel text.

The package holds each help document (``gnome-help``, ``system-admin-guide``) as Mallard XML pages, the
English originals under ``usr/share/help/C/<doc>/`` and the German translations, with the same file
names, under ``usr/share/help/de/<doc>/``. The German pages are written by itstool from the English ones
and a catalog, one translation unit per text block (paragraph, title, description), so the blocks of a
page correspond one to one in document order as long as the translation is current. A page whose block
sequence (the tags of its text blocks) differs between the languages was translated from another
version of the English page: nothing says which block became which, so the whole page is refused rather
than risk shifting every pair after the difference.

Left out: code and screen blocks (commands, not prose), editorial comments (the German pages drop them),
the page's credits, blocks with a link whose text Yelp fills in at display time from the target page or
URL (``<link xref="x"/>``: the stored text has a hole), and blocks itstool left in English. Aligned blocks
are cut into sentences where both sides have as many of comparable length (``debref.sentence_pairs``).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Iterator

from .debref import sentence_pairs, translated
from .ding import is_sentence
from .text import Pair, normalize_text, require_dirs

PACKAGES = ("gnome-user-docs",)
LICENSE = "CC-BY-SA-3.0"
HELP_DIRS = {"de": "usr/share/help/de", "en": "usr/share/help/C"}
# Elements whose text is one itstool translation unit: everything else is a container (item, td, note,
# section...) of such blocks or inline markup inside one.
TEXT_BLOCKS = {"p", "title", "subtitle", "desc"}
# Not translated prose: command lines and their output, notes to the writers, names and e-mail addresses.
_SKIPPED = {"screen", "comment", "credit", "revision", "license"}
# Inline sequences whose parts Yelp joins with a separator: Ctrl+C, Settings ▸ Color.
_JOINED = {"keyseq": "+", "guiseq": " ▸ "}

Block = tuple[str, str]     # (tag, text); text "" where the block cannot be used


def _local(tag: str) -> str:
    return tag.rpartition("}")[2] if isinstance(tag, str) else ""


def _inline_text(element: ET.Element) -> str | None:
    """The text of a block with its inline markup, or None where a part of it is missing from the file."""
    tag = _local(element.tag)
    if tag == "link" and not "".join(element.itertext()).strip():
        return None
    parts = [element.text or ""]
    for child in element:
        if _local(child.tag) in _SKIPPED:
            parts.append(child.tail or "")
            continue
        text = _inline_text(child)
        if text is None:
            return None
        parts.extend((text, child.tail or ""))
    if tag in _JOINED:
        return _JOINED[tag].join(normalize_text(p) for p in parts if p.strip())
    return "".join(parts)


def _collect(element: ET.Element, blocks: list[Block]) -> None:
    tag = _local(element.tag)
    if tag in _SKIPPED or tag == "code":     # a code element outside a text block is a code block
        return
    if tag in TEXT_BLOCKS:
        text = _inline_text(element)
        blocks.append((tag, normalize_text(text) if text is not None else ""))
        return
    for child in element:
        _collect(child, blocks)


def read_page_blocks(page: Path) -> list[Block]:
    """A Mallard page's text blocks in document order; [] for a file that is not well-formed XML."""
    try:
        root = ET.parse(page).getroot()
    except ET.ParseError:
        return []
    blocks: list[Block] = []
    _collect(root, blocks)
    return blocks


def align_page(de: list[Block], en: list[Block]) -> list[tuple[str, str]] | None:
    """The block text pairs of two versions of a page, None where their tag sequences differ."""
    if not de or [tag for tag, _ in de] != [tag for tag, _ in en]:
        return None
    return [(d, e) for (_, d), (_, e) in zip(de, en)]


def page_pairs(de_page: Path, en_page: Path, origin: str) -> Iterator[Pair]:
    for de_text, en_text in align_page(read_page_blocks(de_page), read_page_blocks(en_page)) or []:
        if translated(de_text, en_text):
            for de, en in sentence_pairs(de_text, en_text):
                yield Pair(de=de, en=en, origin=origin, sentence=is_sentence(de, en))


def read(roots: dict[str, Path]) -> Iterator[Pair]:
    """Sentence pairs of every page both languages hold, origin ``gnome-user-docs:<doc>/<page>``."""
    root = roots[PACKAGES[0]]
    de_dir, en_dir = root / HELP_DIRS["de"], root / HELP_DIRS["en"]
    require_dirs(de_dir, en_dir)
    for de_page in sorted(de_dir.glob("*/*.page")):
        rel = de_page.relative_to(de_dir)
        en_page = en_dir / rel
        if en_page.is_file():
            yield from page_pairs(de_page, en_page, f"gnome-user-docs:{rel.with_suffix('').as_posix()}")
