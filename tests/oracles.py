"""Test oracles: the plain Python that the fast code was written against, kept to test it (and as the baselines
of benchmarks/train_input.py and benchmarks/decode.py). Nothing outside tests/ and benchmarks/ uses them."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from model.batching import Example
from model.corpus.tsv import read_pairs
from model.tokenizer import PAD_ID, Tokenizer
from model.transformer import Transformer, causal_mask, padding_mask


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


class UncachedTorchDecoder:
    """The naive loop the cache exists to avoid: every step re-runs the decoder over the whole prefix
    and the cross-attention projections over the whole memory. Same protocol and outputs as
    `TorchDecoder`; kept as the baseline `benchmarks/decode.py` measures the engine against."""

    def __init__(self, model: Transformer, src: torch.Tensor):
        self.model = model
        self.src_mask = padding_mask(src, PAD_ID)                            # (B, 1, 1, S)
        self.memory = model.encode(src, self.src_mask)                       # (B, S, d_model)
        self.prefix = torch.empty(src.size(0), 0, dtype=torch.long, device=src.device)  # (N, T)

    @torch.no_grad()
    def step(self, tokens: np.ndarray) -> np.ndarray:
        new = torch.as_tensor(tokens, dtype=torch.long, device=self.prefix.device)[:, None]  # (N, 1)
        self.prefix = torch.cat([self.prefix, new], dim=1)                  # (N, T)
        logits, _ = self.model.decode(self.prefix, causal_mask(self.prefix.size(1), self.prefix.device),
                                      memory=self.memory, src_mask=self.src_mask)  # (N, T, V)
        return torch.log_softmax(logits[:, -1].float(), dim=-1).cpu().numpy()  # (N, V)

    def select(self, rows: np.ndarray) -> None:
        idx = torch.as_tensor(rows, dtype=torch.long, device=self.prefix.device)
        self.prefix, self.memory, self.src_mask = self.prefix[idx], self.memory[idx], self.src_mask[idx]


class TorchPromptDecoder:
    """The PyTorch reference for decoder-only generation: each row keeps its own whole sequence and
    every step re-runs the model over it, without padding, masks beyond the causal one, or a cache.
    Nothing is shared with the engine's padded, cached graph but the weights, which is what
    makes it a reference. Same step/select protocol; `start_tokens` are the prompts' last tokens."""

    def __init__(self, model: Transformer, prompts: Sequence[Sequence[int]]):
        self.model = model
        self.seqs = [list(p[:-1]) for p in prompts]
        self.start_tokens = np.array([p[-1] for p in prompts], dtype=np.int64)

    @torch.no_grad()
    def step(self, tokens: np.ndarray) -> np.ndarray:
        out = []
        for seq, tok in zip(self.seqs, tokens):
            seq.append(int(tok))
            ids = torch.tensor([seq], dtype=torch.long, device=self.model.embed.weight.device)  # (1, T)
            logits, _ = self.model.decode(ids, causal_mask(ids.size(1), ids.device))           # (1, T, V)
            out.append(torch.log_softmax(logits[0, -1].float(), dim=-1).cpu().numpy())
        return np.stack(out)                                                                     # (N, V)

    def select(self, rows: np.ndarray) -> None:
        self.seqs = [list(self.seqs[r]) for r in rows]


def sample_one(logp: np.ndarray, rng: np.random.Generator, temperature: float, top_k: int, top_p: float) -> int:
    """One row of ancestral sampling with Generator.choice, as service.shared.search sampled row by row before
    _sample_rows: the reference that _sample_rows must match id for id (a seeded request's text stays the same)."""
    z = logp.astype(np.float64) / temperature
    if top_k > 0 and top_k < z.size:
        kth = np.partition(z, -top_k)[-top_k]
        z[z < kth] = -np.inf
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        cut = int(np.searchsorted(cum, top_p)) + 1
        mask = np.zeros_like(p, dtype=bool)
        mask[order[:cut]] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    return int(rng.choice(p.size, p=p))


def beam_step_loop(beam_scores: np.ndarray, logp: np.ndarray, ids: np.ndarray | None, rows, active: np.ndarray,
                   finished: list, top_ended: np.ndarray, last: np.ndarray, options, eos_id: int,
                   early_exit: bool) -> tuple[list[tuple[int, int, float]], list[int]]:
    """service/shared/search.py's beam_step as it was, a sentence and a candidate at a time: each active
    sentence's next K beams as (row, token, score) and the positions in `active` of those that go on."""
    from service.shared.search import _best_2k

    K = options.beam_size
    cand, cand_scores = _best_2k(beam_scores, logp, K)
    picked: list[tuple[int, int, float]] = []
    still_active: list[int] = []
    for a, s in enumerate(active):
        chosen, top_ended[s] = _next_beams(cand[a], cand_scores[a], a, logp.shape[1], K, ids, rows, eos_id,
                                           finished[s], options.length_penalty, last[a * K], top_ended[s])
        done = (top_ended[s] and len(finished[s]) >= options.num_hypotheses) if early_exit else len(finished[s]) >= K
        if not done and len(chosen) == K:
            picked += chosen
            still_active.append(a)
    return picked, still_active


def _next_beams(cand: np.ndarray, scores: np.ndarray, a: int, W: int, K: int, ids: np.ndarray | None, rows,
                eos_id: int, finished: list, length_penalty: float, last: bool,
                top_ended: bool) -> tuple[list[tuple[int, int, float]], bool]:
    """Sentence a's next beams as (row, token, score), at most K, from its candidates best first, and whether
    its best candidate has ended at this step or before. A candidate among the first K that ends in eos, or
    any of them at the last step its budget allows (`last`), becomes a finished hypothesis, length-normalised
    once, here; every such one is kept, as both transformers and CTranslate2 keep them. Its length counts the eos,
    as both count it (transformers: cur_len + 1 - prompt length; CTranslate2 scores hypotheses with their eos and
    drops it afterwards), so an eos at the first step is "" of length 1: min_length=1 (the default) keeps it out."""
    from service.shared.search import Hypothesis

    chosen: list[tuple[int, int, float]] = []
    for c in range(len(cand)):
        score = scores[c]
        if not np.isfinite(score):
            break
        beam, tok = divmod(int(cand[c]), W)
        row = a * K + beam
        if ids is not None:
            tok = int(ids[row, tok])
        if tok == eos_id or last:
            # An eos outside the top K is not a hypothesis the beam would have kept.
            if c < K:
                top_ended |= c == 0
                tokens = rows.history[row] + ([] if tok == eos_id else [tok])
                norm = (len(rows.history[row]) + 1) ** length_penalty if length_penalty else 1.0
                finished.append(Hypothesis(tokens, float(score) / norm, float(score), tok == eos_id))
            continue
        chosen.append((row, tok, score))
        if len(chosen) == K:
            break
    return chosen, top_ended
