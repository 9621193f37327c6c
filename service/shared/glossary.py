"""Glossaries: a user's fixed translations of terms (source term -> target term, for one language pair), matched in
each source sentence; only the entries a sentence holds become its constraints (constraints.py), so a glossary of
thousands of entries costs a sentence only its own terms.

How a source term matches, the choices made:
- As a whole word or words: not inside a longer word ("Bau" does not match in "Gebäude" or "Bauer").
- Case as written, except a term's first letter, which matches in either case: a term starts sentences too
  ("release" matches "Release notes are out"), and German capitalises nouns where English does not.
- Inflected forms are not matched: "Auftrag" does not match "Aufträge" or "Auftrags". Give each form the
  glossary should hold as an entry of its own; the target term is written as given, in every case.
- Terms that overlap: the longest source term wins ("Release Notes" over "Release"), then the earlier entry.
- A target term is held when it appears in the sentence's translation as written (`held`).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from typing import Sequence

MAX_TERM_CHARS = 200           # a term longer than this is refused, with its entry's number


@dataclass(frozen=True)
class Entry:
    source: str
    target: str


class GlossaryError(ValueError):
    """A glossary that cannot be used, with the entry (1-based) or line it names."""


def check_entries(entries: Sequence[Entry]) -> list[Entry]:
    """The entries, stripped, each term non-empty and at most MAX_TERM_CHARS; a duplicate source term refused."""
    out, seen = [], {}
    for n, e in enumerate(entries, 1):
        source, target = e.source.strip(), e.target.strip()
        for side, term in (("source", source), ("target", target)):
            if not term:
                raise GlossaryError(f"glossary entry {n}: its {side} term is empty")
            if len(term) > MAX_TERM_CHARS:
                raise GlossaryError(f"glossary entry {n}: its {side} term has {len(term)} characters; "
                                    f"the limit is {MAX_TERM_CHARS}")
        if source in seen:
            # The entries' numbers, not the term: a message may be logged, and the term is the client's text.
            raise GlossaryError(f"glossary entry {n}: its source term is already entry {seen[source]}")
        seen[source] = n
        out.append(Entry(source, target))
    return out


def parse(text: str, fmt: str = "tsv") -> list[Entry]:
    """Entries from DeepL's glossary formats: "tsv" (source TAB target a line) or "csv" (source,target a line, RFC
    4180 quoting; DeepL's optional third and fourth columns, the languages, are refused: one pair a glossary).
    Blank lines are skipped."""
    if fmt not in ("tsv", "csv"):
        raise GlossaryError(f"glossary format must be tsv or csv, not {fmt!r}")
    lines = (csv.reader(io.StringIO(text)) if fmt == "csv"
             else (line.split("\t") for line in text.splitlines()))
    entries, n = [], 0
    try:
        for n, fields in enumerate(lines, 1):
            if not any(f.strip() for f in fields):
                continue
            if len(fields) != 2:
                raise GlossaryError(f"glossary line {n}: {len(fields)} fields; each line holds a source term and a "
                                    f"target term, separated by a {'tab' if fmt == 'tsv' else 'comma'}")
            entries.append(Entry(fields[0], fields[1]))
    except csv.Error as e:          # a field over csv's limit (128 KiB), a NUL byte: the client's CSV, not our fault
        raise GlossaryError(f"glossary line {n + 1}: not CSV that can be read ({e})") from None
    return check_entries(entries)


def _pattern(term: str) -> re.Pattern:
    first = re.escape(term[0])
    if term[0].lower() != term[0].upper():
        first = f"[{re.escape(term[0].lower())}{re.escape(term[0].upper())}]"
    return re.compile(rf"(?<!\w){first}{re.escape(term[1:])}(?!\w)")


def matches(sentence: str, entries: Sequence[Entry]) -> list[int]:
    """The entries whose source term `sentence` holds (indices, in the order they stand in it); see the module
    docstring for what matches."""
    found = []                                           # (start, end, entry)
    for i, e in enumerate(entries):
        # A term's letters after its first match as written: a substring test skips the entries a sentence cannot
        # hold before a pattern is made (10,000 entries: 8-11 ms a sentence, benchmarks/glossary_cost.py)
        if e.source[1:] in sentence:
            found += [(m.start(), m.end(), i) for m in _pattern(e.source).finditer(sentence)]
    found.sort(key=lambda f: (-(f[1] - f[0]), f[2]))
    taken: list[tuple[int, int, int]] = []
    for start, end, i in found:
        if all(end <= s or start >= e for s, e, _ in taken):
            taken.append((start, end, i))
    out: list[int] = []
    for _, _, i in sorted(taken):
        if i not in out:
            out.append(i)
    return out


def held(translation: str, target: str) -> bool:
    """Whether a translation holds a target term as written, as a whole word or words."""
    return re.search(rf"(?<!\w){re.escape(target)}(?!\w)", translation) is not None
