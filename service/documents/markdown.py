"""Markdown (CommonMark's blocks, GitHub's tables), streamed block by block: the structure written back as it
was, the text translated.

A record is a line, or a paragraph: lines of plain text after one another are one text (the model sees the
sentence whole) and are written back as one line, which Markdown renders the same. Kept as written: fenced and
indented code, blank lines, thematic breaks, table rules, HTML blocks, link reference definitions. A heading's
`#`s, a list item's marker (and task box), a quote's `>`s, a table row's pipes and a paragraph's indentation
are kept around the text.

Inside the text, the markup is never shown to the model: inline code, a link's or image's target, autolinks
and URLs, HTML tags, emphasis marks and footnote references cut the text into runs, and the runs go as one
text with line breaks between them, which the sentence splitter (shared/text.py) cuts at, so each is
translated alone, here or by a service; the pieces are put back in order. A table row's cells go the same
way. The price: a sentence cut by markup is translated in parts."""

from __future__ import annotations

import re
from typing import Iterator, TextIO

from .records import Record

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
# Kept whole: blank, thematic break, table rule, HTML block, link reference definition, indented code.
KEPT = re.compile(r"^(\s*$|\s{0,3}([-*_])(\s*\2){2,}\s*$|\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$|\s{0,3}<"
                  r"|\s{0,3}\[[^\]]+\]:\s|( {4}|\t))")
# A block's own marks, kept before its text: heading, quote, list item (with a task box).
LEAD = re.compile(r"^(\s{0,3}#{1,6}\s+|\s*(>\s?)+|\s*([-*+]|\d{1,9}[.)])\s+(\[[ xX]\]\s+)?)")
# A paragraph's indentation, kept too: inside a list item it is what keeps the paragraph in the item.
INDENT = re.compile(r"[ \t]*")
INLINE = re.compile(r"""
    `+[^`]*`+                               # inline code
  | !?\[ | \]\([^)]*\) | \]\[[^\]]*\] | \]  # a link's or image's brackets and target
  | \[\^[^\]]*\]                            # a footnote reference
  | <[^<>]+>                                # autolinks and HTML tags
  | https?://\S+                            # bare URLs
  | \*+ | (?<!\w)_+ | _+(?!\w) | ~~         # emphasis, strikethrough
  | \s+\#+\s*$                              # a heading's closing #s
""", re.VERBOSE)


def cut(text: str, pattern: re.Pattern) -> tuple[list[str], list[str]]:
    """text -> (runs to translate, the pieces around them): text == pieces[0] + runs[0] + pieces[1] + ... A run
    has a letter, and no space or punctuation at either end that joins it to the markup."""
    runs, pieces, pos, keep = [], [], 0, ""
    for m in [*pattern.finditer(text), None]:
        part = text[pos:m.start() if m else len(text)]
        core = part.strip(" \t:;,") if any(c.isalpha() for c in part) else ""
        if core:
            start = part.index(core)
            pieces.append(keep + part[:start])
            runs.append(core)
            keep = part[start + len(core):]
        else:
            keep += part
        if m:
            keep += m.group()
            pos = m.end()
    return runs, pieces + [keep]


class Markdown:
    def read(self, stream: TextIO) -> Iterator[Record]:
        fence, paragraph = "", []
        for line in stream:
            m = FENCE.match(line)
            if fence or m:                       # code: kept, up to the fence that closes it
                yield from self.flush(paragraph)
                if m and (not fence or m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence)):
                    fence = "" if fence else m.group(1)
                yield Record("", line)
            elif KEPT.match(line) or LEAD.match(line) or "|" in line:
                yield from self.flush(paragraph)
                yield self.record([line]) if not KEPT.match(line) else Record("", line)
            else:
                paragraph.append(line)
        yield from self.flush(paragraph)

    def flush(self, paragraph: list[str]) -> Iterator[Record]:
        if paragraph:
            yield self.record(list(paragraph))
            paragraph.clear()

    def record(self, lines: list[str]) -> Record:
        """A block: its lead marks, its text cut into runs (a table row: at its pipes too), its line ending."""
        first = lines[0]
        end = first[len(first.rstrip("\r\n")):] or "\n"
        lead = (LEAD.match(first) or INDENT.match(first)).group()
        text = " ".join([first[len(lead):].strip()] + [line.strip() for line in lines[1:]])
        pattern = re.compile(INLINE.pattern + r"| \|", re.VERBOSE) if "|" in text else INLINE
        runs, pieces = cut(text, pattern)
        return Record("\n".join(runs), (lines, lead, pieces, end))

    def write(self, record: Record, translation: str) -> str:
        if isinstance(record.raw, str):
            return record.raw
        lines, lead, pieces, end = record.raw
        if not record.segment:
            return "".join(lines)
        runs = translation.split("\n")
        return lead + "".join(p + r for p, r in zip(pieces, runs + [""])) + end
