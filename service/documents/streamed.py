"""The streamed formats of `transerve translate` (subtitles.py, markdown.py: a `read` of records and a `write` of
each record with its translation) as whole documents, for LibreTranslate's /translate_file: the file is read
into its records at once (its size is bounded by --max-file-bytes) and written back record by record."""

from __future__ import annotations

import io

from .plain import decode


class Streamed:
    def __init__(self, fmt, data: bytes, kind: str):
        self.fmt = fmt
        self.records = list(fmt.read(io.StringIO(decode(data, kind), newline="")))
        self.todo = [i for i, r in enumerate(self.records) if r.segment.strip()]
        self.texts = [self.records[i].segment for i in self.todo]

    def render(self, translations: list[str]) -> bytes:
        out = dict(zip(self.todo, translations))
        return "".join(self.fmt.write(r, out.get(i, r.segment)) for i, r in enumerate(self.records)).encode("utf-8")
