"""Test oracles: the plain, per-example Python that the fast code was written against, kept to test it (and as
the baselines of benchmarks/train_input.py). Nothing outside tests/ and benchmarks/ uses them."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Sequence

from model.batching import Example
from model.corpus.tsv import read_pairs
from model.tokenizer import Tokenizer


def token_batches(examples: Sequence[Example], max_tokens: int, *, shuffle: bool = True, seed: int = 0,
                  bucket_size: int = 100_000) -> list[list[int]]:
    """model.batching.batch_indices one example at a time in Python: the readable reference it is tested
    against (and the baseline of benchmarks/train_input.py)."""
    rng = random.Random(seed)
    order = list(range(len(examples)))
    if shuffle:
        rng.shuffle(order)
    batches: list[list[int]] = []
    for start in range(0, len(order), bucket_size):
        bucket = sorted(order[start:start + bucket_size],
                        key=lambda i: (len(examples[i].tgt), len(examples[i].src)))
        batch: list[int] = []
        width = 0
        for i in bucket:
            n = max(len(examples[i].src), len(examples[i].tgt) + 1)
            if batch and max(width, n) * (len(batch) + 1) > max_tokens:
                batches.append(batch)
                batch, width = [], 0
            batch.append(i)
            width = max(width, n)
        if batch:
            batches.append(batch)
    if shuffle:
        rng.shuffle(batches)
    return batches


def load_examples(path: Path, tok: Tokenizer, directions: list[tuple[str, str]], tagged: bool,
                  max_positions: int) -> list[Example]:
    """model.train.encode_pairs one example at a time in Python, every direction's columns tokenized again:
    the readable reference it is tested against (and the baseline of benchmarks/train_input.py)."""
    examples: list[Example] = []
    for src_lang, tgt_lang in directions:
        pairs = read_pairs(path, direction=f"{src_lang}-{tgt_lang}")
        srcs = tok.encode_batch([s for s, _ in pairs])
        tgts = tok.encode_batch([t for _, t in pairs])
        tag = [tok.lang_id(tgt_lang)] if tagged else []
        for s, t in zip(srcs, tgts):
            if 0 < len(s) < max_positions and 0 < len(t) < max_positions:
                examples.append(Example(tag + s + [tok.special.eos], t))
    return examples
