"""Markdown (CommonMark's blocks, GitHub's tables), streamed block by block: the structure written back as it
was, the text translated.

A record is a line, or a paragraph: lines of plain text after one another are one text (the model sees the sentence
whole) and are written back as one line, which Markdown renders the same; but a hard line break (two spaces or a
backslash at a line's end) ends the text, each side translated alone, the break kept. Kept as written: fenced and
indented code, blank lines, thematic breaks, setext headings' underlines (on their own line), table rules, an HTML
block's first line (as CommonMark starts one: a block-level tag, a comment, a tag alone on its line; not an inline
tag or an autolink, which start a paragraph; a comment, script, pre, style or textarea whole, to its end marker),
link reference definitions. Inside a list item, code is indented 4 columns past the item's text, as in
CommonMark: a line indented less is the item's paragraph or list, translated;
and an indented line right after a paragraph's text goes on with it. A heading's `#`s, a list item's marker (and
task box), a quote's `>`s, a table row's pipes, a footnote definition's `[^1]:` and a paragraph's indentation are
kept around the text.

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
# Kept whole: blank, thematic break, table rule, link reference definition. (Indented code is told by its
# indentation, which counts from the open list item's text: see Markdown.read; HTML blocks by HTML_BLOCK.)
KEPT = re.compile(r"^(\s*$|\s{0,3}([-*_])(\s*\2){2,}\s*$|\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$"
                  r"|\s{0,3}\[(?!\^)[^\]]+\]:\s)")
# An HTML block's first line, kept: CommonMark's start conditions 1 to 6 (a raw-text element, a comment, a
# processing instruction, a declaration, CDATA, a block-level tag), which may interrupt a paragraph...
BLOCK_TAGS = ("address|article|aside|base|basefont|blockquote|body|caption|center|col|colgroup|dd|details|dialog|"
              "dir|div|dl|dt|fieldset|figcaption|figure|footer|form|frame|frameset|h[1-6]|head|header|hr|html|"
              "iframe|legend|li|link|main|menu|menuitem|nav|noframes|ol|optgroup|option|p|param|search|section|"
              "summary|table|tbody|td|tfoot|th|thead|title|tr|track|ul")
HTML_BLOCK = re.compile(rf"\s{{0,3}}(<(script|pre|style|textarea)(\s|>|$)|<!--|<\?|<![a-z]|<!\[CDATA\["
                        rf"|</?({BLOCK_TAGS})(\s|/?>|$))", re.IGNORECASE)
# ... and 7: any other whole tag alone on its line, which may not. An inline tag (<b>, <kbd>, <a href=...>) or
# an autolink with text after it starts a paragraph, translated around its tags.
ATTRIBUTE = r"""\s+[A-Za-z_:][\w.:-]*(\s*=\s*([^\s"'=<>`]+|'[^']*'|"[^"]*"))?"""
HTML_TAG_LINE = re.compile(rf"\s{{0,3}}(<[A-Za-z][A-Za-z0-9-]*({ATTRIBUTE})*\s*/?>|</[A-Za-z][A-Za-z0-9-]*\s*>)\s*$")
# Raw HTML blocks (CommonMark's start conditions 1 to 5) and the marker that ends each: their lines up to it are
# kept whole, none translated (a script, a <pre>, a comment over several lines).
RAW_HTML = ((re.compile(r"\s{0,3}<(script|pre|style|textarea)(\s|>|$)", re.I),
             re.compile(r"</(script|pre|style|textarea)>", re.I)),
            (re.compile(r"\s{0,3}<!--"), re.compile(r"-->")),
            (re.compile(r"\s{0,3}<\?"), re.compile(r"\?>")),
            (re.compile(r"\s{0,3}<![A-Za-z]"), re.compile(r">")),
            (re.compile(r"\s{0,3}<!\[CDATA\["), re.compile(r"\]\]>")))
# A block's own marks, kept before its text: heading, quote, list item (with a task box), footnote definition.
# Matched on a line less its list items' indentation once indented code is ruled out, so its heading may be
# indented past 3 (in a list item).
LEAD = re.compile(r"^([ \t]*#{1,6}\s+|\s*(>\s?)+|\s*([-*+]|\d{1,9}[.)])\s+(\[[ xX]\]\s+)?|\s{0,3}(\[\^[^\]]+\]:)\s*)")
# A paragraph's indentation, kept too: inside a list item it is what keeps the paragraph in the item.
INDENT = re.compile(r"[ \t]*")
# A setext heading's underline, after a paragraph's text (a line of `-`s alone is a thematic break).
SETEXT = re.compile(r" {0,3}(=+|-+)\s*$")
# A list item's marker and the spaces after it: the item's text starts after them.
ITEM = re.compile(r"([ \t]*(?:[-*+]|\d{1,9}[.)]))([ \t]*)")
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


def hard_break(line: str) -> str:
    """The mark of a hard line break ending line: two or more spaces, or a backslash (not itself escaped)."""
    body = line.rstrip("\r\n")
    if body.endswith("  "):
        return body[len(body.rstrip(" ")):]
    return "\\" if (len(body) - len(body.rstrip("\\"))) % 2 else ""


def columns(text: str) -> int:
    """How far text's leading spaces and tabs reach (a tab stops at the next multiple of 4, as in CommonMark)."""
    return len(INDENT.match(text).group().expandtabs(4))


def outdent(line: str, width: int) -> str:
    """line less its indentation up to width columns: what a block inside a list item starts with."""
    i = column = 0
    while i < len(line) and line[i] in " \t" and column < width:
        column = column + 1 if line[i] == " " else column + 4 - column % 4
        i += 1
    return line[i:]


def item_column(line: str) -> int:
    """The column a list item's text starts at: after its marker and 1 to 4 spaces (one if it has more, the
    rest then being the text's indentation)."""
    m = ITEM.match(line)
    marker = len(m.group(1).expandtabs(4))
    spaces = len(m.group().expandtabs(4)) - marker
    return marker + (spaces if 1 <= spaces <= 4 else 1)


def raw_html_end(rest: str) -> re.Pattern | None:
    """The end marker of the raw HTML block that `rest` starts (RAW_HTML), when it does not end on this line."""
    for start, end in RAW_HTML:
        if start.match(rest):
            # From the tag's third character: "<!-->" and "<!--->" are whole comments (CommonMark 0.31)
            return None if end.search(rest, rest.index("<") + 2) else end
    return None


def starts_block(rest: str) -> bool:
    """Whether a line (less its list items' indentation) starts a block, which ends a paragraph before it. A tag
    alone on its line (HTML_TAG_LINE) does not: CommonMark lets it start an HTML block only outside a paragraph."""
    return bool(FENCE.match(rest) or KEPT.match(rest) or HTML_BLOCK.match(rest) or LEAD.match(rest) or "|" in rest)


class Markdown:
    def read(self, stream: TextIO) -> Iterator[Record]:
        """Lines to records. items holds the column of each open list item's text, outermost first: a line
        indented to it is inside the item (its paragraph, its list, its fence), and is code only 4 columns
        further, as in CommonMark. open_text: a paragraph (or a list item's, a quote's, a table row's text) runs
        on: a line that starts no block goes on with it, however it is indented."""
        fence, fence_base, paragraph, items, open_text, raw_end = "", 0, [], [], False, None
        for line in stream:
            if raw_end:                          # a raw HTML block: kept, up to its end marker
                if raw_end.search(line):
                    raw_end = None
                yield Record("", line)
                continue
            if fence:                            # code: kept, up to the fence that closes it
                m = FENCE.match(outdent(line, fence_base))
                if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                    fence = ""
                yield Record("", line)
                continue
            indent, base = columns(line), items[-1] if items else 0
            if paragraph and SETEXT.match(outdent(line, base)):     # the paragraph was a heading: its text ends
                yield from self.flush(paragraph)
                yield Record("", line)
                open_text = False
                continue
            if line.strip() and open_text and (indent >= base + 4 or not starts_block(outdent(line, base))):
                yield from self.add(paragraph, line)     # the paragraph goes on (a lazy or indented line)
                continue
            yield from self.flush(paragraph)
            if not line.strip():                 # a blank line: list items stay open
                yield Record("", line)
                open_text = False
                continue
            while items and items[-1] > indent:  # a line left of an item's text ends the item
                items.pop()
            base = items[-1] if items else 0
            rest, open_text = outdent(line, base), False
            if indent >= base + 4:               # indented code
                yield Record("", line)
            elif m := FENCE.match(rest):
                fence, fence_base = m.group(1), base
                yield Record("", line)
            elif KEPT.match(rest) or HTML_BLOCK.match(rest) or HTML_TAG_LINE.match(rest):
                raw_end = raw_html_end(rest)
                yield Record("", line)
            elif (lead := LEAD.match(rest)) or "|" in line:
                if lead and lead.group(3):       # a list item: its text's column
                    items.append(item_column(line))
                elif lead and lead.group(5):     # a footnote: its paragraphs are indented 4 (GitHub's)
                    items.append(columns(line) + 4)
                open_text = not (lead and lead.group().lstrip().startswith("#"))     # a heading is one line
                yield self.record([line])
            else:
                yield from self.add(paragraph, line)
                open_text = True
        yield from self.flush(paragraph)

    def add(self, paragraph: list[str], line: str) -> Iterator[Record]:
        """A paragraph's line. After a hard line break the record ends, the break kept at its end: joined to the
        next line it would be lost (and a backslash shown); each side is translated alone."""
        paragraph.append(line)
        if hard_break(line):
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
        parts = [first[len(lead):], *lines[1:]]
        last = parts[-1].rstrip("\r\n")
        tail = hard_break(last)                  # kept after the text, not shown to the model
        parts[-1] = last[:len(last) - len(tail)]
        text = " ".join(part.strip() for part in parts)
        pattern = re.compile(INLINE.pattern + r"| \|", re.VERBOSE) if "|" in text else INLINE
        runs, pieces = cut(text, pattern)
        return Record("\n".join(runs), (lines, lead, pieces[:-1] + [pieces[-1] + tail], end))

    def write(self, record: Record, translation: str) -> str:
        if isinstance(record.raw, str):
            return record.raw
        lines, lead, pieces, end = record.raw
        if not record.segment:
            return "".join(lines)
        runs = translation.split("\n")
        return lead + "".join(p + r for p, r in zip(pieces, runs + [""])) + end
