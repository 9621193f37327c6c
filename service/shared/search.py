"""Decoding algorithms over any incremental decoder: greedy, beam search and sampling.

Pure NumPy, no torch and no onnxruntime: the same code drives the onnxruntime engine in the
service and the PyTorch reference in `model.evaluate`, so BLEU measured in training is measured
on the search that is served.

A decoder is anything with two methods (one object per batch of already-encoded sources):

    step(tokens: int64 (N,)) -> float32 (N, V)   log-probabilities of the next token for each row;
                                                  appends `tokens` to each row's key/value cache
    select(rows: int64 (M,)) -> None              keeps rows `rows` of every cached tensor, in that
                                                  order (expands sources into beams, follows beam
                                                  back-pointers, drops finished sentences)

A decoder may also offer the k best next tokens, so searches that need no more than those skip
the whole (N, V) distribution (the ONNX decoder computes them in the graph):

    step_top(tokens: int64 (N,), k: int) -> (top_log_probs float32 (N, k), top_ids int64 (N, k),
                                            eos_log_probs float32 (N,))
                                                  like step(), but returns each row's k best tokens,
                                                  best first, and its log-prob of eos; None or
                                                  absent = not offered

The arrays step() and step_top() return may be overwritten by the next call (the ONNX decoder reuses
them): a search reads or copies them before it steps again.

Beam search and greedy search use it unless repetition_penalty or no_repeat_ngram_size is on
(they change log-probs outside the top k). Banned ids, min_length and the length budget only
remove candidates or force eos, so the top (2 × beam + banned + 1) still hold every candidate the
full distribution would yield, and the search returns the same hypotheses either way.

Row r of a fresh decoder is source r. Beam search follows fairseq and CTranslate2: top-k over
2 × beam candidates so that hypotheses ending in </s> can be set aside without shrinking the beam,
one length-penalty normalisation when a hypothesis is finished, and finished sentences dropped
from the batch so later steps only compute rows that still matter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Generator, Protocol, Sequence

import numpy as np

from .options import DEFAULTS, RULES, SearchOptions  # noqa: F401  (SearchOptions re-exported)

NEG_INF = np.float32(-np.inf)
# `rule`, where transformers' and CTranslate2's searches differ; the same weights and inputs give each one's
# tokens. "transformers" (the default; Marian's generate() with its config's forced_eos_token_id): a row at
# its length budget may only write eos, so a hypothesis cut by the budget has max_length - 1 tokens and eos.
# "ctranslate2" (CTranslate2 4.x, BeamSearch::search and GreedySearch::search in src/decoding.cc): the last
# step the budget allows takes the best candidates whatever their token (beam search: its beam_size best,
# all finished there), so a cut hypothesis has max_length tokens and no eos (finished=False); and with
# length_penalty 0 a beam search sentence stops once its best candidate of some step was eos and it has
# num_hypotheses finished ones (CTranslate2's allow_early_exit), not at beam_size finished ones.
# RULES names them (in options.py, for SearchOptions.length_rule, which the engine passes as `rule`).


class IncrementalDecoder(Protocol):
    def step(self, tokens: np.ndarray) -> np.ndarray: ...
    def select(self, rows: np.ndarray) -> None: ...


@dataclass
class Hypothesis:
    tokens: list[int]          # generated ids, without bos, without the final eos
    score: float               # sum of log-probs / length ** length_penalty (length counts the eos)
    log_prob: float            # plain sum of log-probs, eos included
    finished: bool = True      # False when stopped from outside (see `cancel`) before its eos


@dataclass
class _Rows:
    """Book-keeping for the rows currently in the decoder."""
    sentence: np.ndarray                     # (N,) which input sentence each row belongs to
    history: list[list[int]] = field(default_factory=list)  # generated ids per row


def max_lengths(source_lengths: Sequence[int], *, a: float = 0.0, b: int = 256, cap: int = 512) -> np.ndarray:
    """Output length budget per sentence: min(a * source_length + b, cap). a=0 makes it a constant b."""
    src = np.asarray(source_lengths, dtype=np.float64)
    return np.minimum(np.floor(a * src + b), cap).astype(np.int64)


def _adjust(logp: np.ndarray, rows: _Rows, step: int, max_len: np.ndarray, *, eos_id: int, min_length: int,
            no_repeat_ngram_size: int, repetition_penalty: float, banned_ids: Sequence[int],
            rule: str = "transformers") -> np.ndarray:
    """Applies the constraints shared by every algorithm to a (N, V) block of log-probs, in place."""
    if banned_ids:
        logp[:, banned_ids] = NEG_INF
    if repetition_penalty != 1.0:
        for r, hist in enumerate(rows.history):
            if hist:
                ids = np.unique(hist)
                # Log-probs are negative: multiplying by a penalty > 1 makes a seen token less likely.
                logp[r, ids] *= repetition_penalty
    if no_repeat_ngram_size > 0:
        n = no_repeat_ngram_size
        for r, hist in enumerate(rows.history):
            if len(hist) >= n:
                prefix = tuple(hist[len(hist) - n + 1:]) if n > 1 else ()
                banned = [hist[i + n - 1] for i in range(len(hist) - n + 1) if tuple(hist[i:i + n - 1]) == prefix]
                logp[r, banned] = NEG_INF
    # Rows at their length budget may only end; eos keeps its own log-prob, so scores stay honest.
    at_limit = _forced_eos(max_len, rows, step, rule)
    if step < min_length:
        # The budget wins over min_length: a row at its limit that may not end either would run past
        # its budget on -inf (banned) tokens in greedy search, or end with no hypothesis in beam search.
        logp[~at_limit, eos_id] = NEG_INF
    if at_limit.any():
        eos_logp = logp[at_limit, eos_id]
        logp[at_limit] = NEG_INF
        logp[at_limit, eos_id] = eos_logp
    return logp


def _at_budget(max_len: np.ndarray, rows: _Rows, step: int) -> np.ndarray:
    """(N,) True where a row's token of this step is the last its length budget allows."""
    return max_len[rows.sentence] <= step + 1


def _forced_eos(max_len: np.ndarray, rows: _Rows, step: int, rule: str) -> np.ndarray:
    """(N,) True where a row may only write eos: at its budget under the "transformers" rule (transformers'
    forced_eos_token_id, which Marian configs set); never under "ctranslate2" (CTranslate2 writes any token
    at its max_decoding_length and ends the hypothesis there, without eos)."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    if rule == "transformers":
        return _at_budget(max_len, rows, step)
    return np.zeros(len(rows.sentence), dtype=bool)


def _top_candidates(decoder, tokens: np.ndarray, width: int, rows: _Rows, step: int, max_len: np.ndarray, *,
                    eos_id: int, min_length: int, banned_ids: Sequence[int],
                    rule: str = "transformers") -> tuple[np.ndarray, np.ndarray]:
    """step_top() with the constraints of `_adjust` applied: (log-probs (N, k), ids (N, k)), where `width`
    candidates per row survive whatever the constraints remove; removed entries are -inf."""
    logp, ids, eos_logp = decoder.step_top(tokens, width + len(banned_ids) + 1)
    logp = logp.astype(np.float32, copy=True)
    ids = ids.astype(np.int64, copy=True)
    at_limit = _forced_eos(max_len, rows, step, rule)
    # A broadcast compare: np.isin's set machinery costs more than the (N, k, banned) compare here.
    bad = ((ids[:, :, None] == np.asarray(banned_ids)[None, None, :]).any(axis=2) if banned_ids
           else np.zeros(ids.shape, dtype=bool))
    if step < min_length:
        bad |= (ids == eos_id) & ~at_limit[:, None]
    logp[bad] = NEG_INF
    if at_limit.any():
        # Rows at their length budget may only end: eos, with its own log-prob, is their one candidate.
        logp[at_limit] = NEG_INF
        logp[at_limit, 0] = eos_logp[at_limit]
        ids[at_limit, 0] = eos_id
    return logp, ids


def _uses_top(decoder, repetition_penalty: float, no_repeat_ngram_size: int):
    """decoder.step_top when the search may use it (see the module docstring), else None."""
    if repetition_penalty != 1.0 or no_repeat_ngram_size > 0:
        return None
    return getattr(decoder, "step_top", None)


def greedy_search(decoder: IncrementalDecoder, batch_size: int, *, bos_id: int, eos_id: int,
                  max_length: Sequence[int] | np.ndarray, min_length: int = DEFAULTS.min_length,
                  no_repeat_ngram_size: int = DEFAULTS.no_repeat_ngram_size,
                  repetition_penalty: float = DEFAULTS.repetition_penalty, banned_ids: Sequence[int] = (),
                  start_tokens: np.ndarray | None = None, rule: str = "transformers") -> list[Hypothesis]:
    """Arg-max decoding; one Hypothesis per input sentence.

    min_length: 0 = off. no_repeat_ngram_size: 0 = off. repetition_penalty: 1.0 = off.
    start_tokens: what each row reads first (a prompt's last token); None = bos for every row.
    rule: at the length budget, "transformers" (default) writes eos, "ctranslate2" any token (see beam_steps).
    """
    return finish(greedy_steps(decoder, batch_size, bos_id=bos_id, eos_id=eos_id, max_length=max_length,
                               min_length=min_length, no_repeat_ngram_size=no_repeat_ngram_size,
                               repetition_penalty=repetition_penalty, banned_ids=banned_ids,
                               start_tokens=start_tokens, rule=rule))


@dataclass
class Step:
    """What one decoding step chose: row r of the batch continues input `sentence[r]` with `tokens[r]`
    (eos when that input just finished)."""
    sentence: np.ndarray       # (N,)
    tokens: np.ndarray         # (N,)


# A generator of Steps whose return value is the list of Hypotheses, one per input.
Steps = Generator[Step, None, list[Hypothesis]]
# beam_steps: nothing per step (beams are not streamed); returns each input's hypotheses.
BeamSteps = Generator[None, None, list[list[Hypothesis]]]


def finish(steps: Steps | BeamSteps) -> list:
    """Runs a step generator to the end; returns its hypotheses."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def greedy_steps(decoder: IncrementalDecoder, batch_size: int, *, cancel: set[int] | None = None, **kw) -> Steps:
    """greedy_search, one Step at a time (for streaming); see `_paths` for `cancel`."""
    return _paths(decoder, batch_size, None, cancel=cancel, **kw)


def _paths(decoder: IncrementalDecoder, batch_size: int, pick: Callable | None, *, bos_id: int, eos_id: int,
           max_length, min_length: int = 0, no_repeat_ngram_size: int = 0, repetition_penalty: float = 1.0,
           banned_ids: Sequence[int] = (), start_tokens: np.ndarray | None = None,
           cancel: set[int] | None = None, rule: str = "transformers") -> Steps:
    """The loop shared by greedy search and sampling: `pick(logp (N, V), sentence (N,)) -> (N,)` ids;
    None = arg-max (greedy search), which reads only the best few tokens when the decoder offers them.

    Yields a Step after every decoder call. Inputs the caller adds to `cancel` while iterating (a
    stop sequence seen, a client gone) end after the step just yielded, with finished=False, as do rows
    whose budget ends on a token other than eos (rule "ctranslate2").
    """
    cancel = cancel if cancel is not None else set()
    results: list[Hypothesis | None] = [None] * batch_size
    max_len = np.asarray(max_length, dtype=np.int64)
    # Each input's tokens by step, written a whole step at a time: no per-row Python while rows continue.
    written = np.zeros((batch_size, int(max_len.max(initial=0)) + 1), dtype=np.int64)
    rows = _Rows(sentence=np.arange(batch_size))
    sums = np.zeros(batch_size, dtype=np.float64)
    tokens = (np.full(batch_size, bos_id, dtype=np.int64) if start_tokens is None
              else np.asarray(start_tokens, dtype=np.int64).copy())
    top = _uses_top(decoder, repetition_penalty, no_repeat_ngram_size) if pick is None else None
    step = 0
    while len(rows.sentence):
        every = np.arange(len(tokens))
        if top is not None:
            logp, ids = _top_candidates(decoder, tokens, 1, rows, step, max_len, eos_id=eos_id,
                                        min_length=min_length, banned_ids=banned_ids, rule=rule)
            best = logp.argmax(axis=1)                                        # first candidate not removed
            tokens = ids[every, best]
            sums += logp[every, best]
        else:
            logp = decoder.step(tokens).astype(np.float32, copy=True)
            if repetition_penalty != 1.0 or no_repeat_ngram_size > 0:         # they read each row's history
                rows.history = [written[s, :step].tolist() for s in rows.sentence]
            logp = _adjust(logp, rows, step, max_len, eos_id=eos_id, min_length=min_length,
                           no_repeat_ngram_size=no_repeat_ngram_size, repetition_penalty=repetition_penalty,
                           banned_ids=banned_ids, rule=rule)
            tokens = np.asarray(logp.argmax(axis=1) if pick is None else pick(logp, rows.sentence), dtype=np.int64)
            sums += logp[every, tokens]
        yield Step(rows.sentence.copy(), tokens.copy())
        written[rows.sentence, step] = tokens
        ended = tokens == eos_id
        stop = ended | _at_budget(max_len, rows, step)
        if cancel:
            stop |= np.isin(rows.sentence, list(cancel))
        for r in np.flatnonzero(stop):
            s = int(rows.sentence[r])
            # An eos is not part of the text; a row stopped on another token keeps it (finished=False).
            results[s] = Hypothesis(written[s, :step + 1 - ended[r]].tolist(), float(sums[r]), float(sums[r]),
                                    bool(ended[r]))
        if stop.any():
            keep = np.flatnonzero(~stop)
            rows = _Rows(rows.sentence[keep])
            sums, tokens = sums[keep], tokens[keep]
            if len(keep):
                decoder.select(keep)
        step += 1
    return results  # type: ignore[return-value]


def beam_search(decoder: IncrementalDecoder, batch_size: int, **kw) -> list[list[Hypothesis]]:
    """Batched beam search; for each input sentence its `num_hypotheses` best hypotheses, best first
    (the options: beam_steps)."""
    return finish(beam_steps(decoder, batch_size, **kw))


def beam_steps(decoder: IncrementalDecoder, batch_size: int, *, bos_id: int, eos_id: int,
               beam_size: int = DEFAULTS.beam_size, max_length: Sequence[int] | np.ndarray,
               length_penalty: float = DEFAULTS.length_penalty, num_hypotheses: int = DEFAULTS.num_hypotheses,
               min_length: int = DEFAULTS.min_length, no_repeat_ngram_size: int = DEFAULTS.no_repeat_ngram_size,
               repetition_penalty: float = DEFAULTS.repetition_penalty, banned_ids: Sequence[int] = (),
               start_tokens: np.ndarray | None = None, rule: str = "transformers") -> BeamSteps:
    """beam_search, yielding None after every decoder call (so a caller can run other work between the
    steps: the translate worker's fairness) and returning what beam_search returns.

    length_penalty: a finished hypothesis scores sum(log p) / length ** length_penalty (0 = off,
    1.0 = average log-prob). min_length: 0 = off. no_repeat_ngram_size: 0 = off.
    repetition_penalty: 1.0 = off. start_tokens: each input's first token (a prompt's last);
    None = bos. A sentence stops once it has `beam_size` finished hypotheses; the best
    `num_hypotheses` of them are returned. rule: "transformers" (default) or "ctranslate2" (see RULES).
    """
    if not 1 <= num_hypotheses <= beam_size:
        raise ValueError(f"num_hypotheses must be between 1 and beam_size ({beam_size}), got {num_hypotheses}")
    K = beam_size
    max_len = np.asarray(max_length, dtype=np.int64)
    finished: list[list[Hypothesis]] = [[] for _ in range(batch_size)]
    active = np.arange(batch_size)                                  # sentences still in the decoder
    decoder.select(np.repeat(active, K))                            # (B*K) rows: K beams per sentence
    rows = _Rows(sentence=np.repeat(active, K), history=[[] for _ in range(batch_size * K)])
    # Only the first beam of each sentence is live at step 0, or the K beams would be K copies.
    beam_scores = np.tile(np.array([0.0] + [-np.inf] * (K - 1)), batch_size).reshape(batch_size, K)
    tokens = (np.full(batch_size * K, bos_id, dtype=np.int64) if start_tokens is None
              else np.repeat(np.asarray(start_tokens, dtype=np.int64), K))
    top = _uses_top(decoder, repetition_penalty, no_repeat_ngram_size)
    early_exit = rule == "ctranslate2" and length_penalty == 0    # CTranslate2's allow_early_exit
    top_ended = np.zeros(batch_size, dtype=bool)
    step = 0
    while len(active):
        if top is not None:
            # Each row's best 2K are enough: a sentence's 2K best over all its beams are among them.
            logp, ids = _top_candidates(decoder, tokens, 2 * K, rows, step, max_len, eos_id=eos_id,
                                        min_length=min_length, banned_ids=banned_ids, rule=rule)  # (A*K, W)
        else:
            logp, ids = decoder.step(tokens).astype(np.float32, copy=True), None        # (A*K, V)
            logp = _adjust(logp, rows, step, max_len, eos_id=eos_id, min_length=min_length,
                           no_repeat_ngram_size=no_repeat_ngram_size, repetition_penalty=repetition_penalty,
                           banned_ids=banned_ids, rule=rule)
        cand, cand_scores = _best_2k(beam_scores, logp, K)                 # (A, 2K) each, best first
        picked, still_active, last = [], [], _at_budget(max_len, rows, step)
        for a, s in enumerate(active):
            chosen, top_ended[s] = _next_beams(cand[a], cand_scores[a], a, logp.shape[1], K, ids, rows, eos_id,
                                               finished[s], length_penalty, last[a * K], top_ended[s])
            done = (top_ended[s] and len(finished[s]) >= num_hypotheses) if early_exit else len(finished[s]) >= K
            if not done and len(chosen) == K:   # else the sentence is done: drop its rows
                picked += chosen
                still_active.append(a)
        if not still_active:
            break
        decoder.select(np.asarray([row for row, _, _ in picked], dtype=np.int64))
        active = active[still_active]
        rows = _Rows(sentence=np.repeat(active, K), history=[rows.history[row] + [tok] for row, tok, _ in picked])
        beam_scores = np.asarray([score for _, _, score in picked], dtype=np.float64).reshape(len(active), K)
        tokens = np.asarray([tok for _, tok, _ in picked], dtype=np.int64)
        step += 1
        yield None
    return [sorted(f, key=lambda h: -h.score)[:num_hypotheses] for f in finished]


def _best_2k(beam_scores: np.ndarray, logp: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray]:
    """The step function: each sentence's best 2K (beam, candidate) pairs over all its K beams, best first,
    as flat indices into its K * W candidates, with their scores. 2K, so that K of them remain when some
    end in eos."""
    A, W = beam_scores.shape[0], logp.shape[1]
    total = (beam_scores.reshape(A * K, 1) + logp).reshape(A, K * W)     # (A, K*W)
    n = min(2 * K, K * W)
    if K * W > 256:                      # the whole distribution: set the best 2K apart first
        cand = np.argpartition(-total, n - 1, axis=1)[:, :n]             # (A, 2K) unsorted
        order = np.argsort(-np.take_along_axis(total, cand, axis=1), axis=1, kind="stable")
        cand = np.take_along_axis(cand, order, axis=1)
    else:                                # each row's best few (step_top): one sort costs less
        cand = np.argsort(-total, axis=1, kind="stable")[:, :n]           # (A, 2K)
    return cand, total[np.arange(A)[:, None], cand]


def _next_beams(cand: np.ndarray, scores: np.ndarray, a: int, W: int, K: int, ids: np.ndarray | None, rows: _Rows,
                eos_id: int, finished: list[Hypothesis], length_penalty: float, last: bool,
                top_ended: bool) -> tuple[list[tuple[int, int, float]], bool]:
    """Sentence a's next beams as (row, token, score), at most K, from its candidates best first, and whether
    its best candidate has ended at this step or before. A candidate among the first K that ends in eos, or
    any of them at the last step its budget allows (`last`), becomes a finished hypothesis, length-normalised
    once, here; every such one is kept, as both transformers and CTranslate2 keep them. Its length counts the eos,
    as both count it (transformers: cur_len + 1 - prompt length; CTranslate2 scores hypotheses with their eos and
    drops it afterwards), so an eos at the first step is "" of length 1: min_length=1 (the default) keeps it out."""
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


def sample(decoder: IncrementalDecoder, batch_size: int, *, bos_id: int, eos_id: int,
           max_length: Sequence[int] | np.ndarray, seeds: Sequence[int | None],
           temperature: float = DEFAULTS.temperature, top_k: int = DEFAULTS.top_k, top_p: float = DEFAULTS.top_p,
           min_length: int = DEFAULTS.min_length, no_repeat_ngram_size: int = DEFAULTS.no_repeat_ngram_size,
           repetition_penalty: float = DEFAULTS.repetition_penalty, banned_ids: Sequence[int] = (),
           start_tokens: np.ndarray | None = None) -> list[Hypothesis]:
    """Ancestral sampling; one Hypothesis per input row.

    temperature: 1.0 = the model's distribution (must be > 0; use greedy_search for 0). top_k: 0 = off.
    top_p: 1.0 = off. Each row draws from its own generator seeded by `seeds[r]` (None = random), so a
    seeded request samples the same text alone or batched with others.
    """
    return finish(sample_steps(decoder, batch_size, bos_id=bos_id, eos_id=eos_id, max_length=max_length,
                               seeds=seeds, temperature=temperature, top_k=top_k, top_p=top_p,
                               min_length=min_length, no_repeat_ngram_size=no_repeat_ngram_size,
                               repetition_penalty=repetition_penalty, banned_ids=banned_ids,
                               start_tokens=start_tokens))


def sample_steps(decoder: IncrementalDecoder, batch_size: int, *, seeds: Sequence[int | None],
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, cancel: set[int] | None = None,
                 **kw) -> Steps:
    """sample, one Step at a time (for streaming); see `_paths` for `cancel`."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for sampling (e.g. 0.7), got {temperature}")
    rngs = [np.random.default_rng(s) for s in seeds]

    def pick(logp: np.ndarray, sentence: np.ndarray) -> np.ndarray:
        return [_sample_one(logp[r], rngs[sentence[r]], temperature, top_k, top_p) for r in range(len(logp))]

    return _paths(decoder, batch_size, pick, cancel=cancel, **kw)


def _sample_one(logp: np.ndarray, rng: np.random.Generator, temperature: float, top_k: int, top_p: float) -> int:
    z = logp.astype(np.float64) / temperature
    if top_k > 0 and top_k < z.size:
        kth = np.partition(z, -top_k)[-top_k]
        z[z < kth] = -np.inf
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        cut = int(np.searchsorted(cum, top_p)) + 1
        mask = np.zeros_like(p, dtype=bool)
        mask[order[:cut]] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    return int(rng.choice(p.size, p=p))
