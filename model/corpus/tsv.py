"""The parallel corpus files: ``de<TAB>en<TAB>origin`` lines written by ``model.data``, read as
(source, target) pairs for training and evaluation (a user's two-column file too)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable

from .text import DIRECTIONS, Pair


def _field(text: str) -> str:
    return re.sub(r"[\t\r\n]+", " ", text)


def write_tsv(path: Path, pairs: Iterable[Pair]) -> None:
    """Write ``de<TAB>en<TAB>origin`` lines (UTF-8, ``\\n`` line ends)."""
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        for p in pairs:
            fh.write(f"{_field(p.de)}\t{_field(p.en)}\t{_field(p.origin)}\n")


def read_pairs(path: str | os.PathLike[str], direction: str = "de-en") -> list[tuple[str, str]]:
    """Read (source, target) pairs for training/evaluation.

    Files written by this module have three columns ``de, en, origin``: ``de-en`` returns
    (de, en), ``en-de`` returns (en, de).  A two-column user file is ``source<TAB>target``
    already and is returned as is whatever the direction.  Blank lines are skipped; a line
    with a single column is an error (it would silently shift nothing but hides broken data).
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, not {direction!r}")
    out: list[tuple[str, str]] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.rstrip("\r\n")
            if not line:
                continue
            cols = line.split("\t")
            if len(cols) < 2:
                raise ValueError(f"{path}:{lineno}: expected at least 2 tab-separated columns")
            if len(cols) >= 3 and direction == "en-de":
                out.append((cols[1], cols[0]))
            else:
                out.append((cols[0], cols[1]))
    return out


def read_origins(path: str | os.PathLike[str]) -> list[str]:
    """Each pair's origin (the third column; "" where a line has none), in read_pairs' order (blank lines
    skipped likewise)."""
    with open(path, encoding="utf-8") as fh:
        return [(cols[2] if len(cols) >= 3 else "") for cols in
                (line.rstrip("\r\n").split("\t") for line in fh) if cols != [""]]
