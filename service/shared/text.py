"""Splitting long texts into sentences and joining the translations back.

The models were trained on sentences; a paragraph fed whole is both slower (attention is
quadratic) and worse. Splitting keeps the separators, so line breaks and paragraph structure
survive the round trip.
"""

from __future__ import annotations

import re

# A sentence ends at . ! ? … (optionally followed by a closing quote or bracket) and whitespace, when
# the next one starts with an upper-case letter, a digit or an opening quote; every line break ends
# one too. Abbreviations such as "Dr." before a capitalised noun are split as well: the cost is a
# slightly worse translation of that sentence, never lost text.
_SPLIT = re.compile(r"\s*\n\s*|(?:(?<=[.!?…])|(?<=[.!?…][\"'»«“”’)\]]))\s+(?=[\"'„“«»(\[]?[A-ZÄÖÜÀ-Þ0-9])")


def split_sentences(text: str) -> tuple[list[str], list[str]]:
    """text -> (sentences, separators), len(separators) == len(sentences) - 1, such that
    join_sentences(sentences, separators) == text.strip()."""
    text = text.strip()
    sentences, separators, pos = [], [], 0
    for m in _SPLIT.finditer(text):
        sentences.append(text[pos:m.start()])
        separators.append(m.group())
        pos = m.end()
    sentences.append(text[pos:])
    return sentences, separators


def join_sentences(sentences: list[str], separators: list[str]) -> str:
    return "".join(s + sep for s, sep in zip(sentences, separators + [""]))
