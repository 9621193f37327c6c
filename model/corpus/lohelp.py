"""LibreOffice's help (Debian's ``libreoffice-help-de`` and ``libreoffice-help-en-us``, MPL-2.0) as
sentence-level parallel text.

Both packages hold the same static HTML pages under ``usr/share/libreoffice/help/{de,en-US}/text/``,
with the same relative paths and the same paragraph ids (``par_id…``, ``hd_id…``): a paragraph is
aligned by (page, id), and cut into sentences where both sides have the same number of them.
Platform variants (``switchinline`` spans: MAC, UNX, WIN, default) keep their ``default`` text only.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Iterator

from .ding import is_sentence
from .text import Pair, normalize_text

HELP_PACKAGES = {"de": "libreoffice-help-de", "en": "libreoffice-help-en-us"}
HELP_DIRS = {"de": "usr/share/libreoffice/help/de/text", "en": "usr/share/libreoffice/help/en-US/text"}
LICENSE = "MPL-2.0"
_PARAGRAPH_ID = re.compile(r"(?:par|hd)_id\w+")
# A sentence ends in . ! or ? before a space and a capital letter (or a digit): no split inside "z. B."
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-ZÄÖÜ0-9\"(])")
_ABBREVIATION = re.compile(r"(?:\b(?:z|B|d|h|u|a|bzw|ggf|evtl|usw|etc|e\.g|i\.e|vs|Nr|ca|Abb|Fig)\.)$")


class _Paragraphs(HTMLParser):
    """Text of every element whose id is a paragraph id, with hidden platform variants left out."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.paragraphs: dict[str, str] = {}
        self._stack: list[tuple[str, str | None, bool]] = []     # (tag, paragraph id, hidden variant)
        self._text: list[str] = []

    def _hidden(self) -> bool:
        return any(hidden for _, _, hidden in self._stack)

    def _open_id(self) -> str | None:
        return next((pid for _, pid, _ in reversed(self._stack) if pid), None)

    def handle_starttag(self, tag, attrs):
        if tag in ("br", "img", "input", "meta", "link", "hr"):
            return
        a = dict(attrs)
        ident = a.get("id") or ""
        pid = ident if _PARAGRAPH_ID.fullmatch(ident) and self._open_id() is None else None
        hidden = a.get("hidden") is not None and not ident.startswith("default")
        if pid:
            self._text = []
        self._stack.append((tag, pid, hidden))

    def handle_endtag(self, tag):
        while self._stack:
            open_tag, pid, _ = self._stack.pop()
            if pid:
                self.paragraphs[pid] = normalize_text("".join(self._text))
            if open_tag == tag:
                break

    def handle_data(self, data):
        if self._open_id() is not None and not self._hidden():
            self._text.append(data)


def read_paragraphs(page: Path) -> dict[str, str]:
    parser = _Paragraphs()
    parser.feed(page.read_text(encoding="utf-8", errors="replace"))
    parser.close()
    return parser.paragraphs


def split_sentences(text: str) -> list[str]:
    pieces, out = _SENTENCE_END.split(text), []
    for piece in pieces:
        if out and _ABBREVIATION.search(out[-1]):
            out[-1] += " " + piece
        else:
            out.append(piece)
    return out


def aligned_sentences(de: str, en: str) -> list[tuple[str, str]]:
    """A paragraph pair as sentence pairs where both sides cut into as many sentences, else whole."""
    de_s, en_s = split_sentences(de), split_sentences(en)
    return list(zip(de_s, en_s)) if len(de_s) == len(en_s) else [(de, en)]


def read_libreoffice_help(de_root: Path, en_root: Path) -> Iterator[Pair]:
    """Sentence pairs of every page both trees hold (unpacked packages: ``de_root``/HELP_DIRS["de"]...),
    origin ``lohelp:<page>``; ``sentence`` set where both sides look like sentences."""
    de_dir, en_dir = de_root / HELP_DIRS["de"], en_root / HELP_DIRS["en"]
    for de_page in sorted(de_dir.rglob("*.html")):
        rel = de_page.relative_to(de_dir)
        en_page = en_dir / rel
        if not en_page.is_file():
            continue
        de_pars, en_pars = read_paragraphs(de_page), read_paragraphs(en_page)
        for pid, de_text in de_pars.items():
            en_text = en_pars.get(pid)
            if not de_text or not en_text or de_text == en_text:
                continue
            for de, en in aligned_sentences(de_text, en_text):
                yield Pair(de=de, en=en, origin=f"lohelp:{rel.with_suffix('')}", sentence=is_sentence(de, en))
