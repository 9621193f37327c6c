"""Token-budget batches from length buckets, and the collate step that builds padded tensors and masks.

Sorting examples by length before cutting batches keeps padding small; a token budget (rows ×
longest row) rather than a fixed row count keeps every batch about the same cost, so short
sentences travel in big batches and long ones in small ones.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

import torch

from .tokenizer import BOS_ID, EOS_ID, PAD_ID
from .transformer import causal_mask, padding_mask


@dataclass
class Example:
    src: list[int]   # encoder input, eos included (and a <2xx> tag first for multi-direction models)
    tgt: list[int]   # target pieces, no bos/eos


@dataclass
class Batch:
    src: torch.Tensor | None       # (B, S) padded; None for a decoder-only model
    src_mask: torch.Tensor | None  # (B, 1, 1, S)
    tgt_in: torch.Tensor           # (B, T) <s> y1 … y_{T-1}
    tgt_out: torch.Tensor          # (B, T) y1 … y_{T-1} </s>, pad elsewhere
    tgt_mask: torch.Tensor         # (B, 1, T, T) padding & causal
    n_tokens: int                  # real target tokens (the loss denominator)

    def to(self, device: torch.device | str) -> "Batch":
        move = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return Batch(move(self.src), move(self.src_mask), move(self.tgt_in), move(self.tgt_out),
                     move(self.tgt_mask), self.n_tokens)


def pad(seqs: Sequence[Sequence[int]], pad_id: int = PAD_ID) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out


def collate(examples: Sequence[Example], decoder_only: bool = False) -> Batch:
    """Pads a list of examples and builds both masks. A decoder-only model reads `tgt` alone."""
    tgt_in = pad([[BOS_ID] + e.tgt for e in examples])                          # (B, T)
    tgt_out = pad([e.tgt + [EOS_ID] for e in examples])                         # (B, T)
    tgt_mask = padding_mask(tgt_in, PAD_ID) & causal_mask(tgt_in.size(1))       # (B, 1, T, T)
    n_tokens = int((tgt_out != PAD_ID).sum())
    if decoder_only:
        return Batch(None, None, tgt_in, tgt_out, tgt_mask, n_tokens)
    src = pad([e.src for e in examples])                                        # (B, S)
    return Batch(src, padding_mask(src, PAD_ID), tgt_in, tgt_out, tgt_mask, n_tokens)


def token_batches(examples: Sequence[Example], max_tokens: int, *, shuffle: bool = True, seed: int = 0,
                  bucket_size: int = 100_000) -> list[list[int]]:
    """Indices of `examples` grouped into batches of at most `max_tokens` padded tokens
    (rows × max(source, target+1) length). Buckets of `bucket_size` examples are sorted by length,
    cut into batches, and the batches shuffled, so each epoch sees a different order."""
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
