"""A streamed format's unit (bulk/formats.py's txt, TSV/CSV and JSONL; subtitles.py; markdown.py): the segment to
translate and what the format needs to write the record back around its translation."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Record:
    segment: str        # the text translated; "" for nothing (a blank line, a header, a missing field)
    raw: object         # the format's own: what write() needs to give the record back
