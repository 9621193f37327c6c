"""Beam search over inputs that joined at different steps, one vectorised step for all of them.

decode()'s beam search (search._beam) steps the inputs it started with together; the translate worker's
running batch (service/inference/pooled.py) starts a request's sentences whenever they arrive, so a
beam search per request would cost one Python step per request per decoder call. A `BeamPool` holds the
beams of every input of one set of options, each input at its own step: one call of the processors, one
`_best_2k` and one `beam_step` a decoder call for all of them.

Every operation of a step is per row or per input (the processors read each row's own step and budget,
`beam_step` picks each input's beams from its own candidates), so an input's hypotheses are those decode()
gives it alone (tests/test_batch_invariance.py).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .constraints import START, State, Terms, rank
from .options import SearchOptions
from .processors import Rows, logits_processors
from .search import Hypothesis, beam_step, terms_beam_step


class BeamPool:
    """The live inputs' K beams each, rows input by input in the order they were added (an input keeps its
    place: `beam_step` keeps the inputs' order). Inputs are numbered as added (`add`); `want()` says what
    the next decoder call must give, `step` takes it and says which rows go on; `done(i)` an input's
    hypotheses once it left."""

    def __init__(self, options: SearchOptions, *, eos_id: int, banned_ids: Sequence[int] = (), top_k: bool = True):
        self.options, self.K, self.eos_id, self.banned_ids = options, options.beam_size, eos_id, banned_ids
        self.early_exit = options.length_rule == "ctranslate2" and options.length_penalty == 0   # CTranslate2's
        self.live = np.zeros(0, dtype=np.int64)            # (A,) the inputs still searched, in row order
        self.ended = np.zeros(0, dtype=np.int64)           # the inputs that ended at the last step
        self.scores = np.zeros((0, self.K))                # (A, K) their beams' scores
        self.tokens = np.zeros(0, dtype=np.int64)          # (A*K,) each row's token for the next call
        self.history: list[list[int]] = []                 # (A*K) each row's tokens so far
        # Per input ever added, by its number: its finished hypotheses, budget, steps taken, best ended.
        self.finished: list[list[Hypothesis]] = []
        self.max_len = np.zeros(0, dtype=np.int64)
        self.steps = np.zeros(0, dtype=np.int64)
        self.top_ended = np.zeros(0, dtype=bool)
        self.terms: list[Terms | None] = []                # its constraints (constraints.py), or None
        self.excludes = False                              # whether any input's terms exclude a phrase
        self.states: list[State] = []                      # (A*K) each row's constraint state
        self.top_k = top_k                                 # whether the caller answers with the k best
        self._processors()

    def _processors(self) -> None:
        """The processors over every input's budget (made again when inputs join: they hold the array). The terms
        only when one excludes a phrase: logits_processors looks at each input's to know, and a pool of thousands
        of inputs paid for that look at every add (an add and a drop, 16 inputs live: 107 us at 4,096 inputs, 43 at
        256; 37-41 at either without the look)."""
        self.processors = logits_processors(self.options, eos_id=self.eos_id, max_length=self.max_len,
                                            banned_ids=self.banned_ids, terms=self.terms if self.excludes else None)
        self.full = not self.top_k or any(p.full for p in self.processors)
        self.extra, self.copy = sum(p.removes for p in self.processors), bool(self.processors)

    def add(self, first: np.ndarray, max_len: np.ndarray, terms: Sequence[Terms | None] | None = None) -> np.ndarray:
        """Inputs whose rows join at the next call, each starting from its token in `first` with budget
        `max_len` and its `terms` (None: none); their numbers. Only the first beam of each is live at its first
        step, as in _beam."""
        B, K = len(first), self.K
        terms = [None] * B if terms is None else [t if t is not None and (t.include or t.exclude) else None
                                                  for t in terms]
        self.terms += terms
        self.excludes = self.excludes or any(t is not None and t.exclude for t in terms)
        self.states += [START] * (B * K)
        numbers = np.arange(len(self.finished), len(self.finished) + B)
        self.finished += [[] for _ in range(B)]
        self.max_len = np.concatenate([self.max_len, np.asarray(max_len, dtype=np.int64)])
        self.steps = np.concatenate([self.steps, np.zeros(B, dtype=np.int64)])
        self.top_ended = np.concatenate([self.top_ended, np.zeros(B, dtype=bool)])
        self.live = np.concatenate([self.live, numbers])
        self.scores = np.concatenate([self.scores, np.tile([0.0] + [-np.inf] * (K - 1), (B, 1))])
        self.tokens = np.concatenate([self.tokens, np.repeat(np.asarray(first, dtype=np.int64), K)])
        self.history += [[] for _ in range(B * K)]
        self._processors()
        return numbers

    def drop(self, numbers: np.ndarray) -> np.ndarray:
        """Inputs that leave before they end (their client went away); the rows that stay."""
        stay = ~np.isin(self.live, numbers)
        rows = np.flatnonzero(np.repeat(stay, self.K))
        self.live, self.scores, self.tokens = self.live[stay], self.scores[stay], self.tokens[rows]
        self.history = [self.history[r] for r in rows]
        self.states = [self.states[r] for r in rows]
        return rows

    def want(self) -> int | None:
        """The candidates a row needs from the next call: its best k, or None for the whole distribution."""
        return None if self.full else 2 * self.K + self.extra

    @property
    def whole(self) -> bool:
        """Whether the next call must give the whole distribution too (a live input has terms to write: its step
        reads their log-probs wherever they rank)."""
        return not self.full and self._constrained()

    def step(self, logp: np.ndarray, ids: np.ndarray | None, eos_logp: np.ndarray | None,
             whole: np.ndarray | None = None) -> np.ndarray:
        """One beam step of every live input from the call's outputs for its rows (logp (A*K, W), ids and
        eos_logp as step_top gives them, and the whole distribution `whole` when want() asked for it, or ids None
        with the whole distribution as logp): the rows that go on, in
        their new order (each input's K, inputs in order); inputs that ended leave `live` (`ended`: those)."""
        K = self.K
        rows = Rows(sentence=np.repeat(self.live, K), history=self.history)
        steps = self.steps[rows.sentence]                                    # (A*K,) each row's step
        logp = logp.astype(np.float32, copy=self.copy)
        ids = None if ids is None else ids.astype(np.int64, copy=self.copy)
        whole = None if whole is None else whole.astype(np.float32, copy=self.copy)
        for p in self.processors:
            p.apply(steps, rows, logp, ids, eos_logp)
            if whole is not None:
                p.apply(steps, rows, whole, None, None)
        last = self.max_len[rows.sentence] <= steps + 1
        if self._constrained():
            picked, still, self.states = terms_beam_step(self.scores, logp, ids, whole, rows, self.live,
                                                         self.finished, self.top_ended, last, self.options,
                                                         self.eos_id, self.early_exit, self.terms, self.states)
        else:
            picked, still = beam_step(self.scores, logp, ids, rows, self.live, self.finished, self.top_ended,
                                      last, self.options, self.eos_id, self.early_exit)
            self.states = [START] * len(picked.rows)
        self.steps[self.live] += 1
        gone = np.ones(len(self.live), dtype=bool)
        gone[still] = False
        self.ended, self.live = self.live[gone], self.live[still]
        self.history = [self.history[r] + [t] for r, t in zip(picked.rows.tolist(), picked.tokens.tolist())]
        self.scores = picked.scores.astype(np.float64)
        self.tokens = picked.tokens.astype(np.int64)
        return picked.rows.astype(np.int64)

    def _constrained(self) -> bool:
        """Whether a live input has terms to write."""
        return any(self.terms[i] is not None and self.terms[i].include for i in self.live.tolist())

    def done(self, number: int) -> list[Hypothesis]:
        """An input's hypotheses, best first, once it has left `live` (once: the pool forgets them)."""
        finished, self.finished[number] = self.finished[number], []
        return rank(finished, self.options.num_hypotheses)
