"""Subtitles, SubRip (.srt) and WebVTT (.vtt), streamed cue by cue: numbers, timings (and WebVTT's cue settings,
identifiers, header, NOTE, STYLE and REGION blocks) written back as they were, the text translated.

A cue's text lines are one sentence broken for display, so they are translated as one text and the
translation is broken again into as many lines (at most two) at the space nearest the middle. A dialogue, every
line a speaker's ("- Kommst du?" / "- Gleich."), keeps a line per speaker: its lines go as one text with line
breaks, which the sentence splitter (shared/text.py) cuts at, so each line is translated alone. Formatting tags
around the whole text (`<i>...</i>`, SubRip's `{\\an8}`, WebVTT's `<c.yellow>`, `<v Anna>`) are kept around
the translation; a tag inside the text is left to the model."""

from __future__ import annotations

import re
from typing import Iterator, TextIO

from .records import Record

TAG = r"(?:<[^<>]*>|\{\\[^{}]*\})"
OUTER = re.compile(rf"^((?:{TAG}\s*)*)(.*?)((?:\s*{TAG})*)$", re.DOTALL)


def balanced(text: str, lines: int) -> list[str]:
    """text broken into `lines` lines (1 or 2) at the space nearest its middle."""
    spaces = [i for i, c in enumerate(text) if c == " "]
    if lines < 2 or not spaces:
        return [text]
    cut = min(spaces, key=lambda i: abs(i - len(text) / 2))
    return [text[:cut], text[cut + 1:]]


class Subtitles:
    """A record is a block: the lines up to a blank one, the blank lines after it kept with it."""

    def read(self, stream: TextIO) -> Iterator[Record]:
        block: list[str] = []
        for line in stream:
            if line.strip() and block and not block[-1].strip():   # text after a blank line: the next block
                yield self.record(block)
                block = []
            block.append(line)
        if block:
            yield self.record(block)

    def record(self, block: list[str]) -> Record:
        timing = next((i for i, line in enumerate(block) if "-->" in line), None)
        if timing is None:                    # WEBVTT, NOTE, STYLE, REGION, blank lines: kept
            return Record("", (block, None))
        text = [line.strip() for line in block[timing + 1:] if line.strip()]
        dashes = [t[: len(t) - len(t.lstrip("-–").lstrip())] for t in text]
        dialogue = len(text) > 1 and all(dashes)
        if dialogue:   # each speaker's line alone, without its dash (put back after)
            text = [t[len(d):] for t, d in zip(text, dashes)]
        prefix, body, suffix = OUTER.match(("\n" if dialogue else " ").join(text)).groups()
        return Record(body, (block, (timing, prefix, suffix, len(text), dashes if dialogue else None)))

    def write(self, record: Record, translation: str) -> str:
        block, cue = record.raw
        if cue is None or not record.segment.strip():
            return "".join(block)
        timing, prefix, suffix, lines, dashes = cue
        end = "\r\n" if block[timing].endswith("\r\n") else "\n"
        text = balanced(" ".join(translation.split()), lines)
        if dashes:
            text = [d + t for d, t in zip(dashes, translation.split("\n"))]
        text[0] = prefix + text[0]
        text[-1] = text[-1] + suffix
        blank = [line for line in block[timing + 1:] if not line.strip()]
        return "".join(block[: timing + 1]) + "".join(t + end for t in text) + "".join(blank)
