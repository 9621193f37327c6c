"""What a document may cost before it is refused, and the error that refuses it. The numbers are settings
(service/config.py defines their defaults once); this layer only receives them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_bytes: int            # the file as uploaded or read
    max_unpacked_bytes: int   # a zip's entries decompressed, all together (a zip bomb's)
    max_entries: int          # a zip's entries
    max_elements: int         # XML start tags over all of a document's XML parts (a document of a million runs)
    max_texts: int            # paragraphs (texts to translate) per document


class DocumentError(Exception):
    """A file refused: `status` 400 (unreadable, wrong kind, DTD) or 413 (over a limit), `code` a short name.
    `message` says what is wrong without a word of the file: a DeepL job stores it and serves it on every poll
    (api/deepl_documents.py). `detail` is the part of the file that shows it (an entry's name, a line, a
    library's words, which quote part names): only an answer given within the request (LibreTranslate's
    translate_file, the translate command) shows it, as str(e)."""

    def __init__(self, status: int, code: str, message: str, limit: int | None = None, detail: str | None = None):
        super().__init__(f"{message} ({detail})" if detail else message)
        self.status, self.code, self.message, self.limit, self.detail = status, code, message, limit, detail
