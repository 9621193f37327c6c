"""The user's own parallel corpora: ``source<TAB>target`` files (``--tsv``) and Moses-style line-aligned
``PREFIX.de`` / ``PREFIX.en`` files (``--moses``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

from .text import DIRECTIONS, CorpusError, Pair


def read_tsv_corpus(path: Path, direction: str = "de-en") -> Iterator[Pair]:
    """Yield pairs from a ``source<TAB>target`` file (German source unless ``en-de``).

    Extra columns are ignored; lines without a tab are reported once and skipped.
    """
    if direction not in DIRECTIONS:
        raise CorpusError(f"unknown TSV direction {direction!r}; use one of {DIRECTIONS}")
    if not path.is_file():
        raise CorpusError(f"TSV file not found: {path}")
    origin = f"tsv:{path.stem}"
    bad = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            cols = line.split("\t")
            if len(cols) < 2:
                bad += 1
                continue
            src, tgt = cols[0], cols[1]
            de, en = (src, tgt) if direction == "de-en" else (tgt, src)
            yield Pair(de=de, en=en, origin=origin)
    if bad:
        print(f"warning: {path}: skipped {bad} line(s) without a tab", file=sys.stderr)


def read_moses(prefix: str) -> Iterator[Pair]:
    """Yield pairs from ``PREFIX.de`` / ``PREFIX.en`` (line i of one translates line i of the
    other); differing line counts mean the files are not aligned, which is an error."""
    de_path, en_path = Path(f"{prefix}.de"), Path(f"{prefix}.en")
    for p in (de_path, en_path):
        if not p.is_file():
            raise CorpusError(f"Moses corpus file not found: {p}")
    de_lines = de_path.read_text(encoding="utf-8", errors="replace").splitlines()
    en_lines = en_path.read_text(encoding="utf-8", errors="replace").splitlines()
    if len(de_lines) != len(en_lines):
        raise CorpusError(
            f"Moses corpus {prefix}: {de_path} has {len(de_lines)} lines but {en_path} has "
            f"{len(en_lines)}; the files must be line-aligned"
        )
    origin = f"moses:{Path(prefix).name}"
    for de, en in zip(de_lines, en_lines):
        yield Pair(de=de, en=en, origin=origin)
