"""Which documents exist, and load(): a file's bytes as a Document (`texts`, `render(translations) -> bytes`),
or a DocumentError that says what is wrong with it. Every refusal is one of ours, never a library's
exception: a file that passed the container's checks and still breaks a library is an unreadable file (400)."""

from __future__ import annotations

import zipfile

from ..shared import html_text
from .limits import DocumentError, Limits
from .plain import refuse_empty

# extension (without its dot) -> the media type a translated file is served with
MEDIA_TYPES = {
    "txt": "text/plain; charset=utf-8",
    "html": "text/html; charset=utf-8",
    "po": "text/x-gettext-translation; charset=utf-8",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    "odt": "application/vnd.oasis.opendocument.text",
    "odp": "application/vnd.oasis.opendocument.presentation",
    "srt": "application/x-subrip; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
    "md": "text/markdown; charset=utf-8",
}
ALIASES = {"htm": "html", "pot": "po", "markdown": "md"}
EXTENSIONS = [*MEDIA_TYPES, *ALIASES]     # what LibreTranslate's supportedFilesFormat lists (with dots)


def format_of(filename: str) -> str | None:
    """The format of a file by its extension, None for one that is not a document here."""
    ext = filename.rsplit(".", 1)[-1].lower() if "." in filename else ""
    return ALIASES.get(ext, ext if ext in MEDIA_TYPES else None)


def load(fmt: str, data: bytes, limits: Limits):
    """The Document of `data` in format `fmt` (a key of MEDIA_TYPES)."""
    if len(data) > limits.max_bytes:
        raise DocumentError(413, "file_too_large", f"the file has {len(data)} bytes; the limit is {limits.max_bytes}",
                            limits.max_bytes)
    if not data:      # said as such for every format (a zip's would be "not a zip archive"); blank text: decode's
        refuse_empty("", fmt)
    try:
        document = _open(fmt, data, limits)
    except DocumentError:
        raise
    except html_text.MarkupError as e:     # a paragraph of more differently formatted runs than it takes
        raise DocumentError(e.status, "too_complex", f"a paragraph is too complex: {e.message}", detail=e.detail) \
            from None
    except (zipfile.BadZipFile, KeyError, ValueError, TypeError, AttributeError, IndexError, OSError,
            SyntaxError) as e:   # lxml's XMLSyntaxError is a SyntaxError; python-docx's missing parts KeyErrors
        raise DocumentError(400, "unreadable_document", f"the .{fmt} file cannot be read", detail=str(e)) from None
    if len(document.texts) > limits.max_texts:
        raise DocumentError(413, "too_many_texts", f"the document has {len(document.texts)} texts to translate "
                            f"(paragraphs, cells, runs in other formatting); the limit is {limits.max_texts}",
                            limits.max_texts)
    return document


def _open(fmt: str, data: bytes, limits: Limits):
    if fmt == "docx":
        from .word import WordDocument
        return WordDocument(data, limits)
    if fmt == "pptx":
        from .slides import Presentation
        return Presentation(data, limits)
    if fmt in ("odt", "odp"):
        from .opendocument import OpenDocument
        return OpenDocument(data, fmt, limits)
    from .plain import Html, Lines, decode
    if fmt == "txt":
        return Lines(data)
    if fmt == "html":
        return Html(data)
    if fmt == "po":
        from .catalog import Catalog
        return Catalog(decode(data, "po"))
    if fmt in ("srt", "vtt", "md"):
        from .markdown import Markdown
        from .streamed import Streamed
        from .subtitles import Subtitles
        return Streamed(Markdown() if fmt == "md" else Subtitles(), data, fmt)
    raise DocumentError(400, "unsupported_format", f"no document format {fmt!r}; one of {', '.join(MEDIA_TYPES)}")
