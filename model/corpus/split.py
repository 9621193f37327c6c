"""Train/dev/test splits of the parallel corpus.

Splits are chosen by a hash of the normalised German side, not by a random generator, so the same
sentence lands in the same split on every machine and run, and a German sentence with several English
translations never straddles two splits.
"""

from __future__ import annotations

import hashlib
import random
import sys
from collections import defaultdict
from typing import Sequence

from .text import Pair, normalize_text


def _match_key(text: str) -> str:
    """Key used for the leak check: case-insensitive, ignoring final punctuation/quotes.

    ``Don't worry`` (a phrase entry) and ``Don't worry.`` (a sentence) must count as the same
    text when one of them is a test sentence.
    """
    return text.casefold().rstrip(" .!?…\"'").strip()


def split_key(de: str) -> bytes:
    """Stable split hash of a German side: blake2b of the normalised, case-folded text.

    Independent of Python's hash seed, platform and input order, so every machine computes
    the same split for the same sentence.
    """
    return hashlib.blake2b(normalize_text(de).casefold().encode("utf-8"), digest_size=8).digest()


def is_eval_candidate(pair: Pair) -> bool:
    """Ding sentence pairs without ``/`` or ``…``/``...``: fit as dev/test references.

    Slashes in Ding sentences are inline alternatives (``That seems/sounds funny to me.``) and
    ellipses mark incomplete sentences; both would make a poor reference translation, so such
    pairs stay in train.
    """
    if not (pair.sentence and pair.origin == "ding"):
        return False
    return not any(bad in side for side in (pair.de, pair.en) for bad in ("/", "…", "..."))


def split_corpus(
    pairs: Sequence[Pair], test_size: int = 1000, dev_size: int = 1000, seed: int = 1234
) -> tuple[dict[str, list[Pair]], int]:
    """Split into train/dev/test; returns the splits and the number of pairs removed as leaks.

    Dev/test candidates (:func:`is_eval_candidate`) are Ding sentence pairs, grouped by German
    side (all translations of one German sentence stay together) and ordered by
    :func:`split_key`; the first groups fill test, the next ones dev.  A dev group sharing a
    side with test is dropped.  Any other pair whose German or English side matches a dev/test
    side (case-insensitive, ignoring final punctuation; German and English sides are pooled)
    leaves train, so neither a repeated sentence nor its translation leaks.  Train is sorted,
    then shuffled with ``seed``.
    """
    groups: dict[str, list[Pair]] = defaultdict(list)
    for pair in pairs:
        if is_eval_candidate(pair):
            groups[normalize_text(pair.de).casefold()].append(pair)
    ordered = sorted(groups, key=lambda k: (split_key(k), k))

    held: set[str] = set()
    splits: dict[str, list[Pair]] = {"train": [], "dev": [], "test": []}
    chosen: set[tuple[str, str]] = set()
    leaks = 0
    pos = 0
    for name, size in (("test", test_size), ("dev", dev_size)):
        while pos < len(ordered) and len(splits[name]) < size:
            group = groups[ordered[pos]]
            pos += 1
            chosen.update((p.de, p.en) for p in group)
            if {_match_key(s) for p in group for s in (p.de, p.en)} & held:
                leaks += len(group)  # shares a side with test: usable for neither split
                continue
            splits[name].extend(group)
        held |= {_match_key(s) for p in splits[name] for s in (p.de, p.en)}
    for name, size in (("test", test_size), ("dev", dev_size)):
        if len(splits[name]) < size:
            print(
                f"warning: only {len(splits[name])} sentence pairs for {name} "
                f"(asked for {size})",
                file=sys.stderr,
            )

    for pair in pairs:
        if (pair.de, pair.en) in chosen:
            continue
        if _match_key(pair.de) in held or _match_key(pair.en) in held:
            leaks += 1
            continue
        splits["train"].append(pair)
    splits["train"].sort(key=lambda p: (p.de, p.en, p.origin))
    random.Random(seed).shuffle(splits["train"])
    return splits, leaks
