"""The streamed formats: each reads a text stream as records (the segment to translate, and what is needed to
write the record back) and writes a record back with its translation, one record at a time, so memory does
not grow with the file. A record whose segment is empty or blank is written back as it was: an empty line
stays an empty line, and the output stays aligned with the input."""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Iterator, TextIO

from ..documents.records import Record
from .options import BulkOptions

SUFFIXES = {".txt": "txt", ".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".po": "po",
            ".pot": "po", ".srt": "srt", ".vtt": "vtt", ".md": "md", ".markdown": "md",
            ".html": "html", ".htm": "html", ".xhtml": "html",
            ".docx": "docx", ".pptx": "pptx", ".odt": "odt", ".odp": "odp"}
DOCUMENTS = ("docx", "pptx", "odt", "odp")    # read and written whole: bulk/document.py, service/documents/



class Lines:
    """txt: one segment per line; the line ending is kept (a last line without one stays without one)."""

    def __init__(self, options: BulkOptions):
        self.options = options

    def read(self, stream: TextIO) -> Iterator[Record]:
        for line in stream:
            body = line.rstrip("\r\n")
            yield Record(body, line[len(body):])

    def write(self, record: Record, translation: str) -> str:
        # A translation is one line: a line break in it would shift every line after it.
        return " ".join(translation.splitlines()) + record.raw


class Columns:
    """tsv (cells split at tabs, no quoting: as cut and paste write them) and csv (Python's csv, quoting as
    Excel's): one column translated in place, the other cells copied."""

    def __init__(self, options: BulkOptions, *, delimiter: str):
        self.options, self.delimiter = options, delimiter
        self.index = int(options.column) - 1 if options.column.isdigit() else None

    def read(self, stream: TextIO) -> Iterator[Record]:
        rows = csv.reader(stream) if self.delimiter == "," else (
            line.rstrip("\r\n").split("\t") for line in stream)
        for n, row in enumerate(rows):
            if n == 0 and self.options.header:
                if self.index is None:
                    if self.options.column not in row:
                        raise ValueError(f"no column {self.options.column!r} in the header: {row}")
                    self.index = row.index(self.options.column)
                yield Record("", row)
                continue
            if self.index is None:
                raise ValueError(f"--column {self.options.column!r} is a name: it needs --header")
            yield Record(row[self.index] if self.index < len(row) else "", row)

    def write(self, record: Record, translation: str) -> str:
        row = list(record.raw)
        if record.segment.strip():
            row[self.index] = translation
        if self.delimiter == "\t":   # no quoting in TSV: a tab or line break in a cell would move the others
            return "\t".join(" ".join(cell.replace("\t", " ").splitlines()) for cell in row) + "\n"
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerow(row)
        return out.getvalue()


def finite(number: str) -> float:
    """A JSON number as a float, refused (ValueError) where the float could not be written back as JSON: 1e400 is
    infinity to Python, which json.dumps would write as `Infinity` (and NaN, Infinity are not JSON at all)."""
    value = float(number)
    if not math.isfinite(value):
        raise ValueError(f"{number[:24]} is not a finite number")
    return value


class JsonLines:
    """jsonl: one JSON object a line; --field translated, written in place or to --to-field (the source kept).
    A line that is not an object is copied as it is, and so is an object without that text field, which only gets
    --to-field's empty string when there is one (every object has the column)."""

    def __init__(self, options: BulkOptions):
        self.options = options

    def read(self, stream: TextIO) -> Iterator[Record]:
        for n, line in enumerate(stream, 1):
            if not line.strip():
                yield Record("", line)
                continue
            try:
                obj, infinite = json.loads(line, parse_float=finite, parse_constant=finite), None
            except ValueError as e:             # not JSON, or a number a float cannot hold
                obj, infinite = self.loose(line, n), e
            text = obj.get(self.options.field) if isinstance(obj, dict) else None
            if not (isinstance(text, str) or isinstance(obj, dict) and self.options.to_field):
                yield Record("", line)          # copied as written
            elif infinite:
                raise ValueError(f"line {n} cannot be written back as JSON ({infinite})")
            else:
                yield Record(text if isinstance(text, str) else "", obj)

    @staticmethod
    def loose(line: str, n: int) -> object:
        try:
            return json.loads(line)
        except ValueError as e:
            raise ValueError(f"line {n} is not JSON: {e}") from None

    def write(self, record: Record, translation: str) -> str:
        if isinstance(record.raw, str):
            return record.raw
        obj = dict(record.raw)
        if record.segment.strip() or self.options.to_field:
            obj[self.options.to_field or self.options.field] = translation if record.segment.strip() \
                else record.segment
        return json.dumps(obj, ensure_ascii=False, allow_nan=False) + "\n"
