"""Text formats as documents: .txt (a line each, blank lines and line endings kept) and .html (LibreTranslate's
format=html parser, shared/html_text.py: its runs of text, the markup as written). A text file must be UTF-8:
one that is not (a zip, an image, a document given a .txt name) is refused, not translated as mojibake, and so is
one with nothing but whitespace in it. An HTML DOCTYPE with an internal DTD subset is refused too
(shared/html_text.parse)."""

from __future__ import annotations

from ..shared import html_text
from .limits import DocumentError

def refuse_empty(text: str, kind: str) -> None:
    """A text with nothing but whitespace has nothing to translate: refused, so the client hears so instead of
    getting back an empty file (or, for a .po, polib's bare header)."""
    if not text.strip():
        raise DocumentError(400, "empty_file", f"the file is empty{' (only whitespace)' if text else ''}: a .{kind} "
                            "file with nothing to translate")


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
        try:
            self.document = html_text.parse(text)     # an internal DTD subset refused there (html_dtd)
        except html_text.MarkupError as e:
            raise DocumentError(e.status, e.code, e.message, detail=e.detail) from None
        self.texts = html_text.texts([self.document], leaves=True)

    def render(self, translations: list[str]) -> bytes:
        return html_text.render([self.document], translations, leaves=True)[0].encode("utf-8")
