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
  sentence too short for its terms still ends, and its hypothesis says how many terms it lacks
  (`Hypothesis.unmet`); hypotheses with every term rank ahead of those without (`rank`).
- A term is met by its tokens written in a row; a term broken off half way starts again (from the longest end of
  what was written that begins a term: "a a a b" holds "a a b"). Terms that start with the same tokens are
  followed together until they part. A term listed twice must appear twice.
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
# A row's constraint state: (bit mask of the terms met, the term it is inside or -1, tokens of it written so far,
# whether its last token ended a term: then the next may not continue that word).
State = tuple[int, int, int, bool]
START: State = (0, -1, 0, False)


@dataclass(frozen=True)
class Terms:
    """One input's constraints, as target token ids: `include` must each appear (in any order), `exclude` never.
    Empty sequences are ignored. `joiners` (V,) bool: the ids that continue the word before them (a piece without
    SentencePiece's "▁" that starts with a letter or digit); a term is a whole word, so none follows its last
    token ("forest" is not met by "forests"). None: any may."""
    include: tuple[tuple[int, ...], ...] = ()
    exclude: tuple[tuple[int, ...], ...] = ()
    joiners: np.ndarray | None = field(default=None, compare=False, repr=False)
    starts: dict = field(default_factory=dict, compare=False, repr=False)   # first token -> the terms it starts
    memo: dict = field(default_factory=dict, compare=False, repr=False)     # state -> met(state)
    # (state, token) -> advance's state, and state -> allowed's tokens: a search asks the same few again and again
    # (its K beams share states, each step revisits them), and one dict look-up costs less than the loops.
    moves: dict = field(default_factory=dict, compare=False, repr=False)
    nexts: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, include: Sequence[Sequence[int]] = (), exclude: Sequence[Sequence[int]] = (),
           joiners: np.ndarray | None = None) -> "Terms":
        terms = cls(tuple(tuple(int(t) for t in p) for p in include if len(p)),
                    tuple(tuple(int(t) for t in p) for p in exclude if len(p)), joiners)
        for j, phrase in enumerate(terms.include):
            terms.starts.setdefault(phrase[0], []).append(j)
        return terms

    @property
    def tokens(self) -> int:
        """Constraint tokens in all: the highest bank."""
        return sum(len(p) for p in self.include)

    def met(self, state: State) -> int:
        """Constraint tokens a row in `state` has met (its bank)."""
        n = self.memo.get(state)
        if n is None:
            mask, _, m, _ = state
            n = self.memo[state] = sum(len(p) for j, p in enumerate(self.include) if mask >> j & 1) + m
        return n

    def missing(self, state: State) -> int:
        """Terms a row in `state` has not written whole (one half written counts as missing)."""
        return len(self.include) - bin(state[0]).count("1")

    def complete(self, state: State) -> bool:
        return state[0] == (1 << len(self.include)) - 1

    def advance(self, state: State, token: int) -> State:
        """The state after writing `token`."""
        key = (state, token)
        after = self.moves.get(key)
        if after is None:
            after = self.moves[key] = self._advance(state, token)
        return after

    def _advance(self, state: State, token: int) -> State:
        mask, j, m, _ = state
        if j >= 0:
            for k in self._sharing(mask, j, m):          # the term it is inside, or one that starts the same way
                phrase = self.include[k]
                if phrase[m] == token:
                    return (mask | 1 << k, -1, 0, True) if m + 1 == len(phrase) else (mask, k, m + 1, False)
            return self._resume(mask, self.include[j][:m] + (token,))
        return self._resume(mask, (token,))

    def _resume(self, mask: int, written: tuple[int, ...]) -> State:
        """The state after `written` (the tokens of a term broken off, the last one new): the longest end of it
        that begins an unmet term, as KMP's failure function finds it (here on the fly: terms are a few tokens
        and advance memoises), so "a a a b" meets the term "a a b"."""
        for s in range(1 if len(written) > 1 else 0, len(written)):
            tail = written[s:]
            for k in self.starts.get(tail[0], ()):
                phrase = self.include[k]
                if not mask >> k & 1 and phrase[:len(tail)] == tail:
                    return (mask | 1 << k, -1, 0, True) if len(tail) == len(phrase) else (mask, k, len(tail), False)
        return (mask, -1, 0, False)

    def allowed(self, state: State) -> list[int]:
        """The tokens that would take a row in `state` further into its terms."""
        tokens = self.nexts.get(state)
        if tokens is None:
            mask, j, m, _ = state
            if j >= 0:
                tokens = list({self.include[k][m] for k in self._sharing(mask, j, m)})
            else:
                tokens = [p[0] for k, p in enumerate(self.include) if not mask >> k & 1]
            self.nexts[state] = tokens
        return tokens

    def _sharing(self, mask: int, j: int, m: int) -> list[int]:
        """Term j and the unmet terms whose first m tokens are its first m (placeholders XQ1 and XQ2 share two)."""
        phrase = self.include[j]
        return [j] + [k for k in self.starts.get(phrase[0], ()) if k != j and not mask >> k & 1
                      and len(self.include[k]) > m and self.include[k][:m] == phrase[:m]]

    def remove(self, total: np.ndarray, state: State, last: bool, eos_id: int) -> None:
        """What a row in `state` may not write next, -inf in its candidates `total` (V,): eos before every term is
        written (except at its budget's last step), a piece that would continue the term it just ended."""
        if not last and not self.complete(state):
            total[eos_id] = NEG_INF
        if state[3] and self.joiners is not None:
            total[self.joiners] = NEG_INF


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
    for _ in range(banks):              # places passed from bank 0 to the highest may be spare there too
        moved = False
        for i in reversed(range(banks)):
            spare = sizes[i] - counts[i]
            if spare > 0:
                sizes[i] -= spare
                sizes[(i - 1) % banks] += spare
                moved = True
        if not moved:
            break
    return sizes


class SuppressPhrases:
    """A processor (processors.py): a token that would complete one of its input's excluded phrases, -inf.
    `terms[input]` is each input's Terms or None (a list the caller may extend as inputs join)."""
    full, history = False, True

    def __init__(self, terms: list[Terms | None]):
        self.terms = terms
        self.removes = max((len(t.exclude) for t in terms if t is not None), default=0)

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


def choose(beam_scores: np.ndarray, logp: np.ndarray, top: tuple[np.ndarray, np.ndarray] | None,
           states: Sequence[State], terms: Sequence[Terms], last: np.ndarray, eos_id: int) -> list[Choice]:
    """Dynamic beam allocation for C inputs of K beams each: beam_scores (C, K) (-inf: a beam not live), logp
    (C*K, V) the step's log-probs (-inf: removed), `top` each row's best few (log-probs (C*K, W), ids (C*K, W),
    best first, the same values; None: found here), states (C*K,), terms (C,), last (C*K,): whether this step is
    the last a row's budget allows. What each row may not write (Terms.remove) is taken out of its best few, for
    all rows at once; a row left with fewer than 2K (one that just ended a term, whose best few are mostly pieces
    that would continue its word) takes its best from its whole distribution. The candidates' scores are float64,
    as beam_step's, per input (`_bank`)."""
    C, K = beam_scores.shape
    n = 2 * K
    if top is None:
        top_ids = np.argsort(-logp, axis=1, kind="stable")[:, :n + 1]               # (C*K, W)
        top_logp = np.take_along_axis(logp, top_ids, axis=1)
    else:
        top_logp, top_ids = top[0].astype(np.float32), top[1].copy()               # copies: changed below
    scores = beam_scores.reshape(-1)                                                # (C*K,)
    live = np.isfinite(scores)
    owner = [terms[r // K] for r in range(C * K)]
    no_eos = np.array([not last[r] and not owner[r].complete(states[r]) for r in range(C * K)], dtype=bool)
    top_logp[no_eos[:, None] & (top_ids == eos_id)] = NEG_INF
    for r in range(C * K):
        if states[r][3] and owner[r].joiners is not None:             # it just ended a term
            top_logp[r, owner[r].joiners[top_ids[r]]] = NEG_INF
    W = top_ids.shape[1]
    for r in np.flatnonzero(live & (np.isfinite(top_logp).sum(axis=1) < min(n, W))).tolist():
        row = logp[r].astype(np.float32)                                            # a copy, for this row alone
        owner[r].remove(row, states[r], bool(last[r]), eos_id)
        top_ids[r] = best_of(row, W)
        top_logp[r] = row[top_ids[r]]
    total = (scores[:, None] + top_logp).reshape(C, K * W)                          # (C, K*W) float64
    best = np.argsort(-total, axis=1, kind="stable")[:, :n]                         # (C, 2K) flat k*W + j
    firsts = top_logp.argmax(axis=1)                                                # (C*K,) each row's own best
    return [_bank(c, total[c], best[c].tolist(), top_ids, firsts, logp, scores, states, owner, last, eos_id, K)
            for c in range(C)]


def best_of(row: np.ndarray, n: int) -> np.ndarray:
    """The ids of row's n best values, best first, ties by id (as a stable argsort of the whole row gives them):
    argpartition sets them apart first, since a sort of all V costs ten times more."""
    if n >= len(row):
        return np.argsort(-row, kind="stable")
    kth = np.partition(-row, n - 1)[n - 1]                     # the n-th best's negation
    ids = np.flatnonzero(-row <= kth)                          # the n best and any tied with the n-th, in id order
    return ids[np.argsort(-row[ids], kind="stable")][:n]


def _candidates_of(c: int, total: np.ndarray, best: list[int], top_ids: np.ndarray, firsts: np.ndarray,
                   logp: np.ndarray, scores: np.ndarray, states: Sequence[State], terms: Terms, last: np.ndarray,
                   eos_id: int, K: int) -> list[tuple[float, int, int]]:
    """Input c's candidates as (-score, beam, token), best first: its 2K best over its K beams, each live beam's
    own best and its terms' next tokens (their log-probs from the whole distribution). Negated scores, so that
    a plain sort of the tuples orders them (best first, then by beam and token) without a key function."""
    W, rows = top_ids.shape[1], slice(c * K, (c + 1) * K)
    ids, own_best, beam_scores = top_ids[rows].tolist(), firsts[rows].tolist(), scores[rows].tolist()
    values = total.tolist()                                   # K*W floats: list look-ups cost less than numpy's
    seen: set[tuple[int, int]] = set()
    cands = []
    for f in best + [k * W + own_best[k] for k in range(K)]:
        k, j = divmod(f, W)
        if values[f] != NEG_INF and (k, ids[k][j]) not in seen:
            seen.add((k, ids[k][j]))
            cands.append((-values[f], k, ids[k][j]))
    for k in range(K):
        r = c * K + k
        if beam_scores[k] == NEG_INF:
            continue
        for t in terms.allowed(states[r]):
            if (k, t) not in seen and not _removed(t, states[r], terms, bool(last[r]), eos_id):
                lp = float(logp[r, t])
                if lp != NEG_INF:
                    seen.add((k, t))                  # two terms may start with the same token
                    cands.append((-(beam_scores[k] + lp), k, t))
    cands.sort()
    return cands


def _removed(t: int, state: State, terms: Terms, last: bool, eos_id: int) -> bool:
    """Terms.remove's rule for one token."""
    if t == eos_id and not last and not terms.complete(state):
        return True
    return bool(state[3] and terms.joiners is not None and terms.joiners[t])


def _bank(c: int, total: np.ndarray, best: list[int], top_ids: np.ndarray, firsts: np.ndarray, logp: np.ndarray,
          scores: np.ndarray, states: Sequence[State], owner: list[Terms], last: np.ndarray, eos_id: int,
          K: int) -> Choice:
    """Input c's candidates (_candidates_of), banked by the constraint tokens they have met: one that ends (eos, or
    any at the last step) among the K best of its bank becomes a hypothesis, and K of the others are chosen
    (bank_sizes). Plain Python: a few dozen candidates cost less so than in numpy calls."""
    terms, rows = owner[c * K], slice(c * K, (c + 1) * K)
    cands = _candidates_of(c, total, best, top_ids, firsts, logp, scores, states, terms, last, eos_id, K)
    states, last = states[rows], last[rows].tolist()
    banks = terms.tokens + 1
    ended, going, counts = [], [], [0] * banks
    moves, met, starts = terms.moves, terms.memo, terms.starts     # read here first: the hot loop
    for negated, k, t in cands:
        score, state = -negated, states[k]
        if t == eos_id:
            pass
        elif state[1] < 0 and t not in starts:       # outside every term, and not starting one: advance's answer
            state = (state[0], -1, 0, False) if state[3] else state
        else:
            state = moves.get((state, t)) or terms.advance(state, t)
        bank = met.get(state)
        if bank is None:
            bank = terms.met(state)
        if t == eos_id or last[k]:
            # Among the K best of its bank, not of all: a hypothesis with every term competes with those that
            # have them too, not with shorter ones still short of a term.
            if counts[bank] < K:
                ended.append((k, t, score, terms.missing(state)))
        else:
            going.append((k, t, score, state, bank))
        counts[bank] += 1
    top_ended = bool(cands) and (cands[0][2] == eos_id or last[cands[0][1]])
    counts = [0] * banks
    for c in going:
        counts[c[4]] += 1
    room = bank_sizes(banks, K, counts)
    beams = []
    for k, t, score, state, bank in going:
        if room[bank] > 0:
            room[bank] -= 1
            beams.append((k, t, score, state))
    return Choice(ended, beams, top_ended)
