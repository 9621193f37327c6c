"""Lexically constrained beam search: target-side terms a translation must contain (a glossary's targets, a span kept
as written) and phrases it must never contain, kept by the search itself rather than pasted in after it.

Dynamic beam allocation (Post and Vilar 2018, "Fast Lexically Constrained Decoding with Dynamic Beam Allocation";
Sockeye's and fairseq's `--constraints`, after Hokamp and Liu 2017's grid beam search): every hypothesis tracks
which of its input's constraint tokens it has met (`Terms.advance`), and each step's K beams are divided into banks
by that count, so that hypotheses which wrote a term early and those still on the way share the beam, and a
finished hypothesis carries every term without the beam filling with poor ones. A step's candidates are a
sentence's 2K best over its beams (as unconstrained), every beam's continuations of its constraints
(`Terms.allowed`: the next token of the term it is inside, or the first token of each it still lacks) and every
beam's own best token.

What it does at the edges, each a choice:
- eos is not a candidate for a hypothesis that lacks a term, except at the last step its length budget allows: a
  sentence too short for its terms still ends, and its hypothesis says how many constraint tokens it lacks
  (`Hypothesis.unmet`); hypotheses with every term rank ahead of those without (`rank`).
- A term is met by its tokens written in a row; a term broken off half way must start again. Two terms starting
  with the same token: the first one listed is followed. A term listed twice must appear twice.
- An excluded phrase (`exclude`) never completes: its last token is removed where the row's tokens end with the
  rest of it (`SuppressPhrases`, a processor; a one-token phrase is never written).
- Only beam search takes terms: greedy search and sampling have one row an input and no beam to allocate,
  so a search with terms and beam_size 1 is refused (`check`).
- An input without terms in the same batch is searched by the unconstrained step (search.beam_step), so its
  answer is the one it gets alone.

Pure NumPy, shared by the onnxruntime engine, the running batch's pools (beam_pool.py) and the PyTorch reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

NEG_INF = -np.inf
# A row's constraint state: (bit mask of the terms met, the term it is inside or -1, tokens of it written so far).
State = tuple[int, int, int]
START: State = (0, -1, 0)


@dataclass(frozen=True)
class Terms:
    """One input's constraints, as target token ids: `include` must each appear (in any order), `exclude` never.
    Empty sequences are ignored."""
    include: tuple[tuple[int, ...], ...] = ()
    exclude: tuple[tuple[int, ...], ...] = ()
    starts: dict = field(default_factory=dict, compare=False, repr=False)   # first token -> the terms it starts

    @classmethod
    def of(cls, include: Sequence[Sequence[int]] = (), exclude: Sequence[Sequence[int]] = ()) -> "Terms":
        terms = cls(tuple(tuple(int(t) for t in p) for p in include if len(p)),
                    tuple(tuple(int(t) for t in p) for p in exclude if len(p)))
        for j, phrase in enumerate(terms.include):
            terms.starts.setdefault(phrase[0], []).append(j)
        return terms

    @property
    def tokens(self) -> int:
        """Constraint tokens in all: the highest bank."""
        return sum(len(p) for p in self.include)

    def met(self, state: State) -> int:
        """Constraint tokens a row in `state` has met (its bank)."""
        mask, _, m = state
        return sum(len(p) for j, p in enumerate(self.include) if mask >> j & 1) + m

    def complete(self, state: State) -> bool:
        return state[0] == (1 << len(self.include)) - 1

    def advance(self, state: State, token: int) -> State:
        """The state after writing `token`."""
        mask, j, m = state
        if j >= 0:
            phrase = self.include[j]
            if phrase[m] == token:
                return (mask | 1 << j, -1, 0) if m + 1 == len(phrase) else (mask, j, m + 1)
        for k in self.starts.get(token, ()):
            if not mask >> k & 1:
                return (mask | 1 << k, -1, 0) if len(self.include[k]) == 1 else (mask, k, 1)
        return (mask, -1, 0)

    def allowed(self, state: State) -> list[int]:
        """The tokens that would take a row in `state` further into its terms."""
        mask, j, m = state
        if j >= 0:
            return [self.include[j][m]]
        return [p[0] for k, p in enumerate(self.include) if not mask >> k & 1]


def check(terms: Sequence[Terms | None] | None, strategy: str) -> None:
    """Refuses terms where the search cannot keep them (see the module docstring)."""
    if terms is not None and strategy != "beam" and any(t is not None and (t.include or t.exclude) for t in terms):
        raise ValueError("terms (a glossary, kept spans) need beam search: beam_size of 2 or more, not sampling")


def any_terms(terms: Sequence[Terms | None] | None) -> bool:
    return terms is not None and any(t is not None and (t.include or t.exclude) for t in terms)


def rank(hypotheses: list, n: int) -> list:
    """The n best: those with every term first, then by score."""
    return sorted(hypotheses, key=lambda h: (h.unmet, -h.score))[:n]


def bank_sizes(banks: int, beam: int, counts: Sequence[int]) -> list[int]:
    """The beam's K places over banks 0..banks-1 (constraint tokens met): an equal share each, the remainder to
    the highest; then, from the highest down, places a bank has no candidates for pass to the bank below (and
    from bank 0 to the highest), as Post and Vilar allocate them."""
    share = beam // banks
    sizes = [share] * banks
    sizes[-1] += beam - share * banks
    for i in reversed(range(banks)):
        spare = sizes[i] - counts[i]
        if spare > 0:
            sizes[i] -= spare
            sizes[(i - 1) % banks] += spare
    return sizes


class SuppressPhrases:
    """A processor (processors.py): a token that would complete one of its input's excluded phrases, -inf.
    `terms[input]` is each input's Terms or None (a list the caller may extend as inputs join)."""
    full, history = True, True

    def __init__(self, terms: list[Terms | None]):
        self.terms = terms
        self.removes = 0

    def apply(self, step, rows, logp, ids, eos_logp) -> None:
        for r, s in enumerate(rows.sentence.tolist()):
            t = self.terms[s]
            if t is None or not t.exclude:
                continue
            hist = rows.history[r]
            for p in t.exclude:
                if len(p) == 1 or tuple(hist[len(hist) - len(p) + 1:]) == p[:-1]:
                    if ids is None:
                        logp[r, p[-1]] = NEG_INF
                    else:
                        logp[r][ids[r] == p[-1]] = NEG_INF


@dataclass
class Choice:
    """What one input's constrained step chose, candidates best first: `ended` (beam, token, score, unmet) the
    hypotheses that end here, `beams` (beam, token, score, state) the next beams (at most K), `top_ended` whether
    its best candidate ended."""
    ended: list[tuple[int, int, float, int]]
    beams: list[tuple[int, int, float, State]]
    top_ended: bool


def choose(total: np.ndarray, states: Sequence[State], terms: Terms, last: np.ndarray, eos_id: int) -> Choice:
    """One input's dynamic beam allocation over its K beams' candidates. total (K, V): each beam's score plus each
    token's log-prob (-inf: removed, or a beam not live); states (K,); last (K,): whether this step is the last its
    budget allows. A candidate that ends (eos, or any at the last step) among the K best becomes a hypothesis; the
    others are banked by the constraint tokens they have met and K of them chosen (bank_sizes)."""
    K, V = total.shape
    total = total.copy()
    for k in range(K):
        if not last[k] and not terms.complete(states[k]):
            total[k, eos_id] = NEG_INF                          # not before every term is written
    flat = total.reshape(-1)
    n = min(2 * K, flat.size)
    best = np.argpartition(-flat, n - 1)[:n]                    # (2K,) unsorted
    pairs = {(int(i) // V, int(i) % V) for i in best}
    for k in range(K):
        if np.isfinite(total[k]).any():
            pairs.add((k, int(total[k].argmax())))              # each beam's own best
            pairs.update((k, t) for t in terms.allowed(states[k]))
    # Best first; ties by beam, then token, so the order never depends on a set's.
    cands = sorted(((float(total[k, t]), k, t) for k, t in pairs if np.isfinite(total[k, t])),
                   key=lambda c: (-c[0], c[1], c[2]))
    ended, going = [], []
    for place, (score, k, t) in enumerate(cands):
        if t == eos_id or last[k]:
            if place < K:
                state = states[k] if t == eos_id else terms.advance(states[k], t)
                ended.append((k, t, score, terms.tokens - terms.met(state)))
        else:
            state = terms.advance(states[k], t)
            going.append((k, t, score, state, terms.met(state)))
    banks = terms.tokens + 1
    counts = [0] * banks
    for c in going:
        counts[c[4]] += 1
    room = bank_sizes(banks, K, counts)
    beams = []
    for k, t, score, state, bank in going:
        if room[bank] > 0:
            room[bank] -= 1
            beams.append((k, t, score, state))
    return Choice(ended, beams, bool(cands) and (cands[0][2] == eos_id or bool(last[cands[0][1]])))
