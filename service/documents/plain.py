"""Text formats as documents: .txt (a line each, blank lines and line endings kept) and .html (LibreTranslate's
format=html parser, shared/html_text.py: its runs of text, the markup as written). A text file must be UTF-8:
one that is not (a zip, an image, a document given a .txt name) is refused, not translated as mojibake, and so is
one with nothing but whitespace in it. An HTML DOCTYPE with an internal DTD subset is refused too (refuse_dtd)."""

from __future__ import annotations

import re

from ..shared import html_text
from .limits import DocumentError

# <!DOCTYPE ... [: an internal subset begins (a `<` ends the search, so a file of unclosed doctypes is scanned once).
INTERNAL_SUBSET = re.compile(r"<!DOCTYPE[^<>\[]*\[", re.IGNORECASE)


def refuse_empty(text: str, kind: str) -> None:
    """A text with nothing but whitespace has nothing to translate: refused, so the client hears so instead of
    getting back an empty file (or, for a .po, polib's bare header)."""
    if not text.strip():
        raise DocumentError(400, "empty_file", f"the file is empty{' (only whitespace)' if text else ''}: a .{kind} "
                            "file with nothing to translate")


def refuse_dtd(text: str) -> None:
    """HTML has no internal DTD subset: html.parser ends `<!DOCTYPE html [ <!ENTITY b "x"> ]>` at the entity's
    `>`, so ` ]>` became text and `&b;` a stray `&`, both escaped. Refused rather than kept: keeping it would
    hand the entity declarations on to whatever reads the result next (an XML parser, for XHTML), an entity
    bomb passed through; refusing expands nothing, as container.py refuses a DTD in a zip's XML parts."""
    if m := INTERNAL_SUBSET.search(text):
        raise DocumentError(400, "html_dtd", f"the HTML's DOCTYPE has an internal DTD subset (its [...] at "
                            f"character {m.end() - 1}): entity declarations are not supported; remove them and "
                            "write the entities' text out")


def decode(data: bytes, kind: str) -> str:
    if data.startswith(b"PK\x03\x04"):
        raise DocumentError(400, "wrong_kind", f"the file is named .{kind} but is a zip archive (a .docx, .pptx, "
                            ".odt or .odp?): its content does not match its extension")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DocumentError(400, "wrong_kind", f"the file is named .{kind} but is not UTF-8 text (byte {e.start})") \
            from None
    if "\x00" in text:
        raise DocumentError(400, "wrong_kind", f"the file is named .{kind} but holds NUL characters: not text")
    refuse_empty(text, kind)
    return text


class Lines:
    """.txt: each line with a letter is a text; the others, and every line ending, are written back as they were."""

    def __init__(self, data: bytes):
        self.lines = decode(data, "txt").splitlines(keepends=True)
        self.todo = [i for i, line in enumerate(self.lines) if any(c.isalpha() for c in line)]
        self.texts = [self.lines[i].rstrip("\r\n") for i in self.todo]

    def render(self, translations: list[str]) -> bytes:
        lines = list(self.lines)
        for i, text in zip(self.todo, translations):
            ending = lines[i][len(lines[i].rstrip("\r\n")):]
            lines[i] = " ".join(text.splitlines()) + ending
        return "".join(lines).encode("utf-8")


class Html:
    """.html: each run of text (a paragraph's sentences whole) and its inline elements alone, html_text's way."""

    def __init__(self, data: bytes):
        text = decode(data, "html")
        refuse_dtd(text)
        try:
            self.document = html_text.parse(text)
        except html_text.MarkupError as e:
            raise DocumentError(e.status, "invalid_html", e.message) from None
        self.texts = html_text.texts([self.document], leaves=True)

    def render(self, translations: list[str]) -> bytes:
        return html_text.render([self.document], translations, leaves=True)[0].encode("utf-8")
