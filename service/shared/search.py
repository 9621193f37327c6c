"""The search: `decode()` runs greedy search, beam search or sampling over any incremental decoder, chosen in
this one place from the SearchOptions, with the logit processors the options turn on (processors.py).

Pure NumPy, no torch and no onnxruntime: the same code drives the onnxruntime engine in the service and
the PyTorch reference in `model.decoding`, so BLEU measured in training is measured on the search that is
served, with every option.

A decoder is anything with two methods (one object per batch of already-encoded sources):

    step(tokens: int64 (N,)) -> float32 (N, V)   log-probs of the next token for each row;
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

Greedy search and beam search use step_top unless a processor changes log-probs outside the top k (the
repetition penalty, the n-gram ban: `full`). The others only remove candidates or force eos, so the top
(width + what they may remove) still hold every candidate the full distribution would yield, and the
search returns the same hypotheses either way.

A search is a coroutine underneath (`searcher()`): it yields a `Want` (these tokens, the k best or the whole
distribution) where it needs a decoder step, and is sent the step's outputs; `decode()` answers each Want
from its decoder. A caller that steps many searches' rows in one decoder call (the translate worker's running
batch, service/inference/decoders.py) answers them itself: each search stays a pure step over its own rows'
log-probs, its `select` calls bookkeeping of its own rows.

Row r of a fresh decoder is source r. Beam search follows fairseq and CTranslate2: top-k over
2 × beam candidates so that hypotheses ending in </s> can be set aside without shrinking the beam,
one length-penalty normalisation when a hypothesis is finished, and finished sentences dropped
from the batch so later steps only compute rows that still matter.

`rule` (SearchOptions.length_rule), where transformers' and CTranslate2's searches differ; the same weights
and inputs give each one's tokens. "transformers" (the default; Marian's generate() with its config's
forced_eos_token_id): a row at its length budget may only write eos, so a hypothesis cut by the budget has
max_length - 1 tokens and eos. "ctranslate2" (CTranslate2 4.x, BeamSearch::search and GreedySearch::search in
src/decoding.cc): the last step the budget allows takes the best candidates whatever their token (beam search:
its beam_size best, all finished there), so a cut hypothesis has max_length tokens and no eos (finished=False);
and with length_penalty 0 a beam search sentence stops once its best candidate of some step was eos and it has
num_hypotheses finished ones (CTranslate2's allow_early_exit), not at beam_size finished ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generator, NamedTuple, Protocol, Sequence

import numpy as np

from .constraints import START, Choice, State, Terms, any_terms, check, choose, rank
from .options import GREEDY_BELOW, SearchOptions
from .processors import Rows, logits_processors


class IncrementalDecoder(Protocol):
    def step(self, tokens: np.ndarray) -> np.ndarray: ...
    def select(self, rows: np.ndarray) -> None: ...


@dataclass
class Hypothesis:
    tokens: list[int]          # generated ids, without bos, without the final eos
    score: float               # sum of log-probs / length ** length_penalty (length counts the eos)
    log_prob: float            # plain sum of log-probs, eos included
    finished: bool = True      # False when stopped from outside (see `cancel`) before its eos
    unmet: int = 0             # terms it lacks (constraints.py): 0 = every term, or none asked


@dataclass
class Step:
    """What one decoding step chose: row r of the batch continues input `sentence[r]` with `tokens[r]`
    (eos when that input just finished)."""
    sentence: np.ndarray       # (N,)
    tokens: np.ndarray         # (N,)


@dataclass
class Want:
    """What a search needs next (searcher()): a decoder step of its rows with these tokens (N,), its outputs
    sent back as step_top's triple (log-probs (N, k), ids (N, k), eos log-probs (N,)) when k is given, else
    (log-probs (N, V), None, None)."""
    tokens: np.ndarray         # (N,)
    k: int | None
    whole: bool = False        # with k: the whole distribution too, sent as a fourth element (N, V)


# decode(): a Step per decoder call (greedy search, sampling) or None (beam search, which does not stream);
# returns each input's hypotheses, best first.
Search = Generator[Step | None, None, list[list[Hypothesis]]]
# One decoder step's candidates, a generator that yields its Want and returns log-probs (N, W) and their ids
# (N, W), ids None when W is the vocabulary.
NEG_INF_SCORE = float("-inf")
Candidates = Callable[[np.ndarray, int, Rows, int], Generator[Want, tuple, tuple[np.ndarray, np.ndarray | None]]]


def max_lengths(source_lengths: Sequence[int], *, a: float = 0.0, b: int = 256, cap: int = 512) -> np.ndarray:
    """Output length budget per sentence: min(a * source_length + b, cap). a=0 makes it a constant b."""
    src = np.asarray(source_lengths, dtype=np.float64)
    return np.minimum(np.floor(a * src + b), cap).astype(np.int64)


def continuation_budgets(prompts: Sequence[Sequence[int]], *, max_length: int, max_positions: int) -> list[int]:
    """Tokens each prompt may be continued by (eos included): max_length, or fewer where the model's positions
    run out after the prompt."""
    return [min(max_length, max_positions - len(p)) for p in prompts]


def finish(steps: Generator) -> list:
    """Runs a step generator to the end; returns its hypotheses."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def decode(decoder: IncrementalDecoder, batch_size: int, options: SearchOptions, *, bos_id: int, eos_id: int,
           max_length: Sequence[int] | np.ndarray, banned_ids: Sequence[int] = (),
           start_tokens: np.ndarray | None = None, seeds: Sequence[int | None] | None = None,
           cancel: set[int] | None = None, terms: Sequence[Terms | None] | None = None) -> Search:
    """The search `options` choose (options.strategy) over a fresh decoder's `batch_size` rows: sampling, greedy
    search or beam search. A generator: each next() runs one decoder step; it returns, for each
    input, its hypotheses best first (num_hypotheses of them with beam search, else one).

    max_length: each input's budget in tokens, eos included (max_lengths() gives a translation's).
    banned_ids: ids never written; () = none. start_tokens: each input's first token (a prompt's last);
    None = bos. seeds: sampling only, one per input; None = options.seed for every input.
    cancel: greedy search and sampling only; inputs the caller adds to it while iterating end after the
    step just yielded, with finished=False (a stop sequence seen, a client gone); None = none.
    terms: beam search only, each input's constraints (constraints.py: terms it must write, phrases it must not)
    or None; None = none.
    """
    top = getattr(decoder, "step_top", None) is not None
    return _answered(decoder, eos_id, searcher(decoder, batch_size, options, bos_id=bos_id, eos_id=eos_id,
                                       max_length=max_length, banned_ids=banned_ids, start_tokens=start_tokens,
                                       seeds=seeds, cancel=cancel, top_k=top, terms=terms))


def searcher(decoder: IncrementalDecoder, batch_size: int, options: SearchOptions, *, bos_id: int, eos_id: int,
             max_length: Sequence[int] | np.ndarray, banned_ids: Sequence[int] = (),
             start_tokens: np.ndarray | None = None, seeds: Sequence[int | None] | None = None,
             cancel: set[int] | None = None, top_k: bool = True,
             terms: Sequence[Terms | None] | None = None) -> Generator:
    """decode()'s search as a coroutine whose caller runs the decoder steps: it yields a `Want` where it needs
    one (send it the outputs) and, like decode(), a Step (greedy search, sampling) or None (beam search) after
    each. `decoder` needs only `select` here; top_k: whether the caller answers Wants for the k best."""
    max_len = np.asarray(max_length, dtype=np.int64)
    check(terms, options.strategy)
    terms = list(terms) if any_terms(terms) else None
    processors = logits_processors(options, eos_id=eos_id, max_length=max_len, banned_ids=banned_ids, terms=terms)
    first = (np.full(batch_size, bos_id, dtype=np.int64) if start_tokens is None
             else np.asarray(start_tokens, dtype=np.int64).copy())
    if options.strategy == "sampling":
        seeds = list(seeds) if seeds is not None else [options.seed] * batch_size
        return _paths(decoder, first, _sampler(options, seeds), processors, eos_id, max_len, cancel, top_k)
    if options.strategy == "greedy":
        return _paths(decoder, first, None, processors, eos_id, max_len, cancel, top_k)
    return _beam(decoder, first, options, processors, eos_id, max_len, top_k, terms)


def _answered(decoder, eos_id: int, search: Generator) -> Search:
    """`search` (searcher()) with each Want answered by `decoder`'s step_top or step; the rest passes on."""
    reply = None
    while True:
        try:
            out = search.send(reply)
        except StopIteration as done:
            return done.value
        if isinstance(out, Want):
            if out.k is None:
                reply = (decoder.step(out.tokens), None, None)
            elif out.whole:
                reply = _top_and_whole(decoder, out.tokens, out.k, eos_id)
            else:
                reply = decoder.step_top(out.tokens, out.k)
        else:
            reply = None
            yield out


def _candidates(top_k: bool, processors: list, full: bool, whole: bool = False) -> Candidates:
    """candidates(tokens, width, rows, step) for one search: a decoder step (its Want) with the processors
    applied, as (log-probs (N, W), ids (N, W), None) from the decoder's best few when it offers them (top_k) and no
    processor needs more (W = width + what the processors may remove), else (log-probs (N, V), None, None); with
    `whole` (a constrained search's) the best few and the whole distribution (N, V) as the third. The decoder's
    arrays are copied only when a processor will change them."""
    top = top_k and not full
    extra, copy = sum(p.removes for p in processors), bool(processors)

    def candidates(tokens: np.ndarray, width: int, rows: Rows, step: int):
        all_logp = None
        if top and whole:
            logp, ids, eos_logp, all_logp = yield Want(tokens, width + extra, whole=True)
            all_logp = all_logp.astype(np.float32, copy=copy)                                      # (N, V)
        elif top:
            logp, ids, eos_logp = yield Want(tokens, width + extra)
        else:
            logp, _, _ = yield Want(tokens, None)
            logp, ids, eos_logp = logp.astype(np.float32, copy=copy), None, None                # (N, V)
        if ids is not None:
            logp, ids = logp.astype(np.float32, copy=copy), ids.astype(np.int64, copy=copy)   # (N, W) each
        for p in processors:
            p.apply(step, rows, logp, ids, eos_logp)
            if all_logp is not None:
                p.apply(step, rows, all_logp, None, None)
        return logp, ids, all_logp
    return candidates


def _top_and_whole(decoder, tokens: np.ndarray, k: int, eos_id: int) -> tuple:
    """A Want for the best k and the whole distribution: the decoder's step_whole, or step's with its best k
    found here (the same values; a decoder that offers no top k)."""
    step_whole = getattr(decoder, "step_whole", None)
    if step_whole is not None:
        return step_whole(tokens, k)
    logp = decoder.step(tokens)
    ids = np.argsort(-logp, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(logp, ids, axis=1), ids, logp[:, eos_id].copy(), logp


def _at_budget(max_len: np.ndarray, rows: Rows, step: int) -> np.ndarray:
    """(N,) True where a row's token of this step is the last its length budget allows."""
    return max_len[rows.sentence] <= step + 1


def _paths(decoder: IncrementalDecoder, tokens: np.ndarray, pick: Callable | None, processors: list, eos_id: int,
           max_len: np.ndarray, cancel: set[int] | None, top_k: bool) -> Generator:
    """Greedy search and sampling, one row per input: `pick(logp (N, V), sentence (N,)) -> (N,)` ids; None =
    arg-max (greedy search), which reads only the best few tokens when the decoder offers them.

    Yields a Step after every decoder call. Inputs in `cancel` end after the step just yielded, with
    finished=False, as do rows whose budget ends on a token other than eos (rule "ctranslate2").
    """
    B = len(tokens)
    cancel = cancel if cancel is not None else set()
    results: list[Hypothesis | None] = [None] * B
    # Each input's tokens by step, written a whole step at a time: no per-row Python while rows continue.
    written = np.zeros((B, int(max_len.max(initial=0)) + 1), dtype=np.int64)
    rows = Rows(sentence=np.arange(B))
    sums = np.zeros(B, dtype=np.float64)
    candidates = _candidates(top_k, processors, pick is not None or any(p.full for p in processors))
    history = any(p.history for p in processors)
    step = 0
    while len(rows.sentence):
        every = np.arange(len(tokens))
        if history:
            rows.history = [written[s, :step].tolist() for s in rows.sentence]
        logp, ids, _ = yield from candidates(tokens, 1, rows, step)
        if ids is not None:
            best = logp.argmax(axis=1)                                        # first candidate not removed
            tokens = ids[every, best]
            sums += logp[every, best]
        else:
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
            rows = Rows(rows.sentence[keep])
            sums, tokens = sums[keep], tokens[keep]
            if len(keep):
                decoder.select(keep)
        step += 1
    return [[h] for h in results]  # type: ignore[list-item]


def _beam(decoder: IncrementalDecoder, tokens: np.ndarray, options: SearchOptions, processors: list, eos_id: int,
          max_len: np.ndarray, top_k: bool, terms: list[Terms | None] | None = None) -> Generator:
    """Batched beam search, yielding None after every decoder call (so a caller can run other work between the
    steps: the translate worker's fairness); each input's `num_hypotheses` best hypotheses, best first.
    A sentence stops once it has `beam_size` finished hypotheses (see the module docstring for rule
    "ctranslate2" with length_penalty 0)."""
    B, K = len(tokens), options.beam_size
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    active = np.arange(B)                                           # sentences still in the decoder
    decoder.select(np.repeat(active, K))                            # (B*K) rows: K beams per sentence
    rows = Rows(sentence=np.repeat(active, K), history=[[] for _ in range(B * K)])
    # Only the first beam of each sentence is live at step 0, or the K beams would be K copies.
    beam_scores = np.tile(np.array([0.0] + [-np.inf] * (K - 1)), B).reshape(B, K)
    tokens = np.repeat(tokens, K)
    # A constrained step reads its terms' log-probs wherever they rank: the whole distribution too.
    candidates = _candidates(top_k, processors, any(p.full for p in processors), whole=terms is not None)
    early_exit = options.length_rule == "ctranslate2" and options.length_penalty == 0   # CTranslate2's
    top_ended = np.zeros(B, dtype=bool)
    states: list[State] = [START] * (B * K)                         # each row's constraint state, if any
    step = 0
    while len(active):
        # Each row's best 2K are enough: a sentence's 2K best over all its beams are among them.
        logp, ids, whole = yield from candidates(tokens, 2 * K, rows, step)         # (A*K, W), (A*K, V)
        last = _at_budget(max_len, rows, step)
        if terms is None:
            picked, still_active = beam_step(beam_scores, logp, ids, rows, active, finished, top_ended, last,
                                             options, eos_id, early_exit)
        else:
            picked, still_active, states = terms_beam_step(beam_scores, logp, ids, whole, rows, active, finished,
                                                           top_ended, last, options, eos_id, early_exit, terms,
                                                           states)
        if not len(still_active):
            break
        decoder.select(picked.rows.astype(np.int64))
        active = active[still_active]
        rows = Rows(sentence=np.repeat(active, K),
                    history=[rows.history[r] + [t] for r, t in zip(picked.rows.tolist(), picked.tokens.tolist())])
        beam_scores = picked.scores.astype(np.float64)
        tokens = picked.tokens.astype(np.int64)
        step += 1
        yield None
    return [rank(f, options.num_hypotheses) for f in finished]


class Picked(NamedTuple):
    """The beams a beam step keeps, each going-on sentence's K in order, sentences in order: the row each continues
    (A'*K,), the token it appends (A'*K,) and its score (A', K)."""
    rows: np.ndarray
    tokens: np.ndarray
    scores: np.ndarray


def beam_step(beam_scores: np.ndarray, logp: np.ndarray, ids: np.ndarray | None, rows: Rows, active: np.ndarray,
              finished: list[list[Hypothesis]], top_ended: np.ndarray, last: np.ndarray, options: SearchOptions,
              eos_id: int, early_exit: bool) -> tuple[Picked, np.ndarray]:
    """One step of beam search, no decoder in it: from the beams' scores (A, K) and the step's candidates
    (log-probs (A*K, W), ids or None), each active sentence's next K beams (`Picked`), and the positions in
    `active` of the sentences that go on. Hypotheses finished here are appended to `finished[sentence]`;
    `top_ended[sentence]` records that a sentence's best candidate has ended; `last` (A*K,) marks rows at the
    last step their budget allows.

    Each sentence's candidates, best first (its best 2K over its K beams): a candidate among the first K that
    ends in eos, or any of them at the last step its budget allows, becomes a finished hypothesis,
    length-normalised once, here; every such one is kept, as both transformers and CTranslate2 keep them. Its
    length counts the eos, as both count it (transformers: cur_len + 1 - prompt length; CTranslate2 scores
    hypotheses with their eos and drops it afterwards), so an eos at the first step is "" of length 1:
    min_length=1 (the default) keeps it out. The first K candidates that do not end are the next beams; a
    sentence with fewer, or done (K finished, or with early_exit its best ended and num_hypotheses finished),
    leaves. Vectorised over the sentences: only the finished hypotheses are made one by one
    (tests/test_search.py holds it to the loop it replaced, tests/oracles.py's `beam_step_loop`)."""
    K = options.beam_size
    cand, cand_scores = _best_2k(beam_scores, logp, K)                 # (A, C) each, best first; C = 2K
    A, C = cand.shape
    row, column = np.divmod(cand, logp.shape[1])                       # (A, C) the beam each extends, its column
    row += np.arange(0, A * K, K)[:, None]                             # (A, C) the row each extends
    token = column if ids is None else ids[row, column]                # (A, C)
    # Scores sorted best first: the finite ones are a prefix (an -inf candidate was banned or not a beam).
    valid = np.isfinite(cand_scores)
    ends = token == eos_id
    ends |= last[::K, None]                                            # (A, C) each sentence's rows share it
    hypothesis = ends & valid                                          # (A, C) finished here: among the first K
    hypothesis[:, K:] = False
    top_ended[active] |= hypothesis[:, 0]
    goes_on = valid & ~ends
    chosen = goes_on & (goes_on.cumsum(axis=1) <= K)                   # (A, C) the first K that go on
    lp = options.length_penalty
    for a, c in zip(*np.nonzero(hypothesis)):
        r, tok, score = int(row[a, c]), int(token[a, c]), float(cand_scores[a, c])
        history = rows.history[r]
        norm = (len(history) + 1) ** lp if lp else 1.0
        finished[active[a]].append(Hypothesis(history + ([] if tok == eos_id else [tok]), score / norm, score,
                                              tok == eos_id))
    counts = np.fromiter((len(finished[s]) for s in active.tolist()), dtype=np.int64, count=A)
    done = (top_ended[active] & (counts >= options.num_hypotheses)) if early_exit else counts >= K
    still = np.flatnonzero(~done & (chosen.sum(axis=1) == K))
    if len(still) < A:                                                 # some sentences leave
        row, token, cand_scores, chosen = row[still], token[still], cand_scores[still], chosen[still]
    # K each, in candidate order
    return Picked(row[chosen], token[chosen], cand_scores[chosen].reshape(len(still), K)), still


def terms_beam_step(beam_scores: np.ndarray, logp: np.ndarray, ids: np.ndarray | None, whole: np.ndarray | None,
                    rows: Rows, active: np.ndarray, finished: list[list[Hypothesis]], top_ended: np.ndarray,
                    last: np.ndarray, options: SearchOptions, eos_id: int, early_exit: bool,
                    terms: Sequence[Terms | None], states: list[State]) -> tuple[Picked, np.ndarray, list[State]]:
    """beam_step where inputs may have terms (`terms[input]`, constraints.py): an input with terms to write steps
    by dynamic beam allocation (constraints.choose), the others by beam_step on their own rows, so no input's beams
    depend on another's. The step's candidates: each row's best few (logp, ids) and the whole distribution
    (`whole`), or the whole distribution alone (logp, ids None). Also returns the next beams' constraint states
    (`states`: the rows' now)."""
    K, A = options.beam_size, len(active)
    constrained = np.array([terms[s] is not None and bool(terms[s].include) for s in active.tolist()], dtype=bool)
    going: dict[int, tuple] = {}         # position in active -> (rows (K,), tokens (K,), scores (K,), states)
    plain = np.flatnonzero(~constrained)
    if len(plain):
        own = (plain[:, None] * K + np.arange(K)).reshape(-1)                       # (P*K,) their rows
        picked, still = beam_step(beam_scores[plain], logp[own], None if ids is None else ids[own],
                                  Rows(rows.sentence[own], [rows.history[r] for r in own]), active[plain], finished,
                                  top_ended, last[own], options, eos_id, early_exit)
        for i, a in enumerate(plain[still].tolist()):
            beams = slice(i * K, (i + 1) * K)
            going[a] = (own[picked.rows[beams]], picked.tokens[beams], picked.scores[i], [START] * K)
    cons = np.flatnonzero(constrained)
    if len(cons):
        own = (cons[:, None] * K + np.arange(K)).reshape(-1)                        # (C*K,) their rows
        every = len(cons) == A                       # a pool of constrained inputs: no copy of the (N, V) log-probs
        dist = logp if ids is None else whole
        top = None if ids is None else ((logp, ids) if every else (logp[own], ids[own]))
        choices = choose(beam_scores[cons], dist if every else dist[own], top, [states[r] for r in own],
                         [terms[s] for s in active[cons].tolist()], last[own], eos_id)
        for a, choice in zip(cons.tolist(), choices):
            next_beams = _constrained_step(a, choice, rows, int(active[a]), finished, top_ended, options, eos_id,
                                           early_exit)
            if next_beams is not None:
                going[a] = next_beams
    still = np.array(sorted(going), dtype=np.int64)
    parts = [going[a] for a in still.tolist()]
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return Picked(empty, empty, np.zeros((0, K))), still, []
    return (Picked(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                   np.stack([p[2] for p in parts]).astype(np.float64)), still,
            [st for p in parts for st in p[3]])


def _constrained_step(a: int, choice: Choice, rows: Rows, s: int, finished: list[list[Hypothesis]],
                      top_ended: np.ndarray, options: SearchOptions, eos_id: int, early_exit: bool) -> tuple | None:
    """terms_beam_step's step of input `s`, at position `a` of the active ones (rows a*K...), from what
    constraints.choose chose: its hypotheses that ended go to finished[s]; returns its next K beams (rows, tokens,
    scores, states; lists), or None once it ends. Fewer than K candidates: the last one repeated at -inf, never
    chosen again."""
    K, r0, lp = options.beam_size, a * options.beam_size, options.length_penalty
    top_ended[s] |= choice.top_ended
    for k, tok, score, unmet in choice.ended:
        history = rows.history[r0 + k]
        norm = (len(history) + 1) ** lp if lp else 1.0
        finished[s].append(Hypothesis(history + ([] if tok == eos_id else [tok]), score / norm, score,
                                      tok == eos_id, unmet))
    n = len(finished[s])
    if ((top_ended[s] and n >= options.num_hypotheses) if early_exit else n >= K) or not choice.beams:
        return None
    k, t, _, state = choice.beams[-1]
    beams = choice.beams + [(k, t, NEG_INF_SCORE, state)] * (K - len(choice.beams))
    return ([r0 + b[0] for b in beams], [b[1] for b in beams], [b[2] for b in beams],   # lists: terms_beam_step
            [b[3] for b in beams])                                                      # makes arrays once


def _best_2k(beam_scores: np.ndarray, logp: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray]:
    """Each sentence's best 2K (beam, candidate) pairs over all its K beams, best first, as flat indices into
    its K * W candidates, with their scores. 2K, so that K of them remain when some end in eos."""
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


def _sampler(options: SearchOptions, seeds: Sequence[int | None]) -> Callable:
    """pick(logp (N, V), sentence (N,)) -> ids for ancestral sampling: each input draws from its own generator
    seeded by `seeds[input]` (None = random), so a seeded request samples the same text alone or batched.
    temperature: 1.0 = the model's distribution (> 0; beam_size 1 without sampling is greedy search).
    top_k: 0 = off. top_p: 1.0 = off."""
    if options.temperature < GREEDY_BELOW:
        raise ValueError(f"temperature must be at least {GREEDY_BELOW:g} for sampling (e.g. 0.7; below it, greedy "
                         f"search), got {options.temperature}")
    rngs = [np.random.default_rng(s) for s in seeds]
    t, k, p = options.temperature, options.top_k, options.top_p

    def pick(logp: np.ndarray, sentence: np.ndarray) -> np.ndarray:
        # One uniform draw per row from its input's generator, as Generator.choice(V, p=...) draws it.
        u = np.array([rngs[s].random() for s in sentence], dtype=np.float64)      # (N,)
        return _sample_rows(logp, u, t, k, p)
    return pick


def _sample_rows(logp: np.ndarray, u: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """Each row's token for its uniform draw u: Generator.choice(V, p=row's distribution) for all rows at once,
    the same ids to the bit (tests/test_search.py holds it to the per-row oracle): numpy's exp runs per row, as
    its SIMD tail may differ from the same values in a longer run."""
    z = logp.astype(np.float64) / temperature                                  # (N, V)
    if 0 < top_k < z.shape[1]:
        kth = np.partition(z, -top_k, axis=1)[:, -top_k, None]                 # (N, 1)
        z[z < kth] = -np.inf
    z -= z.max(axis=1, keepdims=True)
    for row in z:
        np.exp(row, out=row)
    probs = z                                                                  # (N, V)
    probs /= probs.sum(axis=1, keepdims=True)
    if top_p < 1.0:
        order = np.argsort(-probs, axis=1, kind="stable")                      # (N, V) most likely first
        cum = np.cumsum(np.take_along_axis(probs, order, axis=1), axis=1)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        cut = (cum < top_p).sum(axis=1) + 1                                    # (N,)
        keep = np.zeros_like(probs, dtype=bool)
        np.put_along_axis(keep, order, np.arange(probs.shape[1])[None, :] < cut[:, None], axis=1)
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum(axis=1, keepdims=True)
    cdf = np.cumsum(probs, axis=1)
    cdf /= cdf[:, -1:]
    return (cdf <= u[:, None]).sum(axis=1)                                     # (N,) searchsorted(cdf, u, "right")
