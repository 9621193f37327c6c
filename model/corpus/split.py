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


def match_key(text: str) -> str:
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


# The origins test-software is drawn from: the corpus it was first drawn from (the machine's catalogs,
# LibreOffice's UI catalogs and help). Sources added later (other packages' catalogs, wheels, the Debian
# Reference) only train, and leave train where they repeat a held-out side, so asking for more data never
# changes a test split and figures stay comparable across corpora.
SOFTWARE_TEST_ORIGINS = ("gettext:", "lohelp:", "deb:libreoffice-l10n-de:")


def is_software_candidate(pair: Pair) -> bool:
    """Sentence pairs of software text (gettext catalogs, LibreOffice's help) without placeholders,
    markup, paths or ellipses: the second held-out test split, ``test-software``."""
    if not pair.sentence or not pair.origin.startswith(SOFTWARE_TEST_ORIGINS):
        return False
    return not any(bad in side for side in (pair.de, pair.en) for bad in ("/", "…", "...", "%", "{", "<", "$"))


def _groups(pairs: Sequence[Pair], candidate) -> tuple[dict[str, list[Pair]], list[str]]:
    """Candidate pairs grouped by German side, and the groups' keys in split-hash order."""
    groups: dict[str, list[Pair]] = defaultdict(list)
    for pair in pairs:
        if candidate(pair):
            groups[normalize_text(pair.de).casefold()].append(pair)
    return groups, sorted(groups, key=lambda k: (split_key(k), k))


def split_corpus(
    pairs: Sequence[Pair], test_size: int = 1000, dev_size: int = 1000, seed: int = 1234,
    software_test_size: int = 0,
) -> tuple[dict[str, list[Pair]], int]:
    """Split into train/dev/test (and test-software); returns the splits and the number of pairs
    removed as leaks.

    Dev/test candidates (:func:`is_eval_candidate`) are Ding sentence pairs, grouped by German
    side (all translations of one German sentence stay together) and ordered by
    :func:`split_key`; the first groups fill test, the next ones dev.  ``software_test_size``
    groups of software-text sentences (:func:`is_software_candidate`) fill ``test-software``
    the same way (the split is there only when asked for).  A group sharing a side with an
    earlier held-out split is dropped.  Any other pair whose German or English side matches a
    held-out side (case-insensitive, ignoring final punctuation; German and English sides are
    pooled) leaves train, so neither a repeated sentence nor its translation leaks.  Train is
    sorted, then shuffled with ``seed``.
    """
    ding = _groups(pairs, is_eval_candidate)
    plan = [("test", test_size, ding), ("dev", dev_size, ding)]
    if software_test_size:
        plan.append(("test-software", software_test_size, _groups(pairs, is_software_candidate)))
    held: set[str] = set()
    splits: dict[str, list[Pair]] = {"train": [], **{name: [] for name, _, _ in plan}}
    chosen: set[tuple[str, str]] = set()
    leaks = 0
    positions = {id(ding): 0}
    for name, size, (groups, ordered) in plan:
        pos = positions.get(id(groups), 0)
        while pos < len(ordered) and len(splits[name]) < size:
            group = groups[ordered[pos]]
            pos += 1
            chosen.update((p.de, p.en) for p in group)
            if {match_key(s) for p in group for s in (p.de, p.en)} & held:
                leaks += len(group)  # shares a side with an earlier split: usable for neither
                continue
            splits[name].extend(group)
        positions[id(groups)] = pos
        held |= {match_key(s) for p in splits[name] for s in (p.de, p.en)}
    for name, size, _ in plan:
        if len(splits[name]) < size:
            print(
                f"warning: only {len(splits[name])} sentence pairs for {name} "
                f"(asked for {size})",
                file=sys.stderr,
            )

    for pair in pairs:
        if (pair.de, pair.en) in chosen:
            continue
        if match_key(pair.de) in held or match_key(pair.en) in held:
            leaks += 1
            continue
        splits["train"].append(pair)
    splits["train"].sort(key=lambda p: (p.de, p.en, p.origin))
    random.Random(seed).shuffle(splits["train"])
    return splits, leaks
