"""The logit processors: what a search changes in a step's log-probs before it picks, one small class each,
applied in order, as CTranslate2 structures it (LogitsProcessor in include/ctranslate2/decoding_utils.h;
its RepetitionPenalty, NoRepeatNgram and SuppressTokens, and apply_min_length in src/decoding.cc) and
transformers' LogitsProcessorList. `logits_processors` builds the list once per search from the options;
a processor that is off is not in it, so it costs a search nothing.

Every processor has

    apply(step, rows, logp, ids, eos_logp) -> None     changes logp (and ids) in place
        step      int: tokens every row has written so far; or (N,), each row's own (a BeamPool's inputs
                  joined at different steps: service/shared/beam_pool.py)
        rows      Rows: the input sentence of each row, and its tokens so far where a processor reads them
        logp      float32 (N, W): log-probs of W candidates per row
        ids       int64 (N, W): their token ids; None when the candidates are the whole vocabulary (W = V, id = column)
        eos_logp  float32 (N,): each row's log-prob of eos (with ids; a decoder's step_top returns it)
    full       True: it changes log-probs outside a row's best few, so the search must read the whole (N, V)
               distribution rather than the decoder's top k (service/shared/search.py)
    history    True: it reads rows.history
    removes    how many of a row's candidates it may remove (-inf): the search asks the decoder for that many more
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .constraints import SuppressPhrases
from .options import RULES, SearchOptions

NEG_INF = np.float32(-np.inf)


@dataclass
class Rows:
    """The rows currently in the decoder."""
    sentence: np.ndarray                                     # (N,) which input sentence each row belongs to
    history: list[list[int]] = field(default_factory=list)   # generated ids per row (when a processor reads them)


class SuppressTokens:
    """Ids a search never writes (pad, bos, language tags): -inf."""
    full, history = False, False

    def __init__(self, ids: Sequence[int]):
        self.ids = np.asarray(ids, dtype=np.int64)
        if (self.ids < 0).any():
            raise ValueError(f"token ids to suppress must be 0 or more, got {sorted(set(self.ids.tolist()))}")
        self.removes = len(self.ids)
        # True at each banned id, one False past the last: take(mode="clip") maps every larger id there.
        self._banned = np.zeros(int(self.ids.max(initial=-1)) + 2, dtype=bool)
        self._banned[self.ids] = True

    def apply(self, step, rows, logp, ids, eos_logp) -> None:
        if ids is None:
            logp[:, self.ids] = NEG_INF
        else:
            # One lookup a candidate and one masked write, two C calls: a broadcast compare against every
            # banned id, and any(), cost a one-sentence beam step 20 µs after the decoder's run.
            np.putmask(logp, self._banned.take(ids, mode="clip"), NEG_INF)     # (N, W)


class RepetitionPenalty:
    """A token a row has written before: its log-prob times `penalty` (> 1: less likely, log-probs being
    negative), as CTranslate2 applies it (Keskar et al. 2019)."""
    full, history, removes = True, True, 0

    def __init__(self, penalty: float):
        self.penalty = penalty

    def apply(self, step, rows, logp, ids, eos_logp) -> None:
        for r, hist in enumerate(rows.history):
            if hist:
                logp[r, np.unique(hist)] *= self.penalty


class NoRepeatNgram:
    """A token that would repeat an n-gram the row has written: -inf."""
    full, history, removes = True, True, 0

    def __init__(self, n: int):
        self.n = n

    def apply(self, step, rows, logp, ids, eos_logp) -> None:
        n = self.n
        for r, hist in enumerate(rows.history):
            if len(hist) >= n:
                prefix = tuple(hist[len(hist) - n + 1:]) if n > 1 else ()
                banned = [hist[i + n - 1] for i in range(len(hist) - n + 1) if tuple(hist[i:i + n - 1]) == prefix]
                logp[r, banned] = NEG_INF


class ForceEosAtBudget:
    """Rule "transformers" (transformers' forced_eos_token_id, which Marian configs set): a row whose token of
    this step is the last its length budget allows may only write eos, with its own log-prob, so scores stay
    honest. (Rule "ctranslate2" has no such processor: CTranslate2 writes any token there and ends the
    hypothesis without eos.)"""
    full, history, removes = False, False, 0

    def __init__(self, max_length: np.ndarray, eos_id: int):
        self.max_length, self.eos_id = max_length, eos_id
        # Before this step no row is at its budget: the steps of one search skip the per-row test. The budgets
        # are read here once; a caller whose inputs change makes new processors (beam_pool.py does).
        self.first_at = int(np.min(max_length, initial=2 ** 62)) - 1

    def rows_at_budget(self, rows: Rows, step: int) -> np.ndarray:
        """(N,) True where a row may only write eos."""
        return self.max_length[rows.sentence] <= step + 1

    def apply(self, step, rows, logp, ids, eos_logp) -> None:
        if isinstance(step, int) and step < self.first_at:
            return
        at = self.rows_at_budget(rows, step)
        if not at.any():
            return
        if ids is None:
            eos = logp[at, self.eos_id]
            logp[at] = NEG_INF
            logp[at, self.eos_id] = eos
        else:   # eos becomes the row's one candidate
            logp[at] = NEG_INF
            logp[at, 0] = eos_logp[at]
            ids[at, 0] = self.eos_id


class MinLength:
    """eos is not a candidate before step `min_length`, except where the budget forces it (the budget wins: a
    row at its limit that may not end either would run past its budget on -inf tokens in greedy search, or end
    with no hypothesis in beam search)."""
    full, history, removes = False, False, 1

    def __init__(self, min_length: int, eos_id: int, budget: ForceEosAtBudget | None):
        self.min_length, self.eos_id, self.budget = min_length, eos_id, budget

    def apply(self, step, rows, logp, ids, eos_logp) -> None:
        if isinstance(step, int) and step >= self.min_length:                        # one search's steps past it
            return
        young = np.asarray(step) < self.min_length                                   # () or (N,)
        if not young.any():
            return
        free = np.broadcast_to(young, rows.sentence.shape)                           # (N,) rows that may not end
        if self.budget is not None:
            free = free & ~self.budget.rows_at_budget(rows, step)
        if ids is None:
            logp[free, self.eos_id] = NEG_INF
        else:
            logp[(ids == self.eos_id) & free[:, None]] = NEG_INF


def logits_processors(options: SearchOptions, *, eos_id: int, max_length: np.ndarray,
                      banned_ids: Sequence[int] = (), terms: list | None = None) -> list:
    """The processors `options` turn on, in the order they apply: suppressed ids, the inputs' excluded phrases
    (`terms`, each input's constraints.Terms or None), the repetition penalty, the n-gram ban, min_length, then
    the budget's forced eos (last, so nothing removes the eos it forces)."""
    if options.length_rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {options.length_rule!r}")
    budget = ForceEosAtBudget(max_length, eos_id) if options.length_rule == "transformers" else None
    out: list = []
    if len(banned_ids):
        out.append(SuppressTokens(banned_ids))
    if terms is not None and any(t is not None and t.exclude for t in terms):
        out.append(SuppressPhrases(terms))
    if options.repetition_penalty != 1.0:
        out.append(RepetitionPenalty(options.repetition_penalty))
    if options.no_repeat_ngram_size > 0:
        out.append(NoRepeatNgram(options.no_repeat_ngram_size))
    if options.min_length > 0:
        out.append(MinLength(options.min_length, eos_id, budget))
    if budget is not None:
        out.append(budget)
    return out
