"""decode() (service/shared/search.py) and its logit processors (service/shared/processors.py), without a
server: on a small fake decoder whose log-probs depend on each row's whole history (so a search that follows
the wrong beam back-pointer or drops the wrong row gets other numbers), on a random Transformer in PyTorch,
and on the tiny fixtures (the training side's translate() runs the served search with every option)."""

import numpy as np
import pytest

from service.shared.options import SearchOptions
from service.shared.processors import (ForceEosAtBudget, MinLength, NoRepeatNgram, RepetitionPenalty, Rows,
                                       SuppressTokens, logits_processors)
from service.shared.search import Hypothesis, Step, _sample_rows, beam_step, decode, finish

from oracles import sample_one

BOS, EOS, V = 1, 0, 12


class FakeDecoder:
    """Log-probs from a fixed random table, indexed by a hash of each row's tokens so far (its "cache");
    `eos_first` makes eos the best token at the first step. It offers step_top like the ONNX decoder, and its
    arrays are read-only: the ONNX decoder's are its own, overwritten by its next step, so a search that wrote
    into them (a processor that forgot to copy) fails here."""

    def __init__(self, rows: int, *, seed: int = 0, eos_first: bool = False, top: bool = True):
        rng = np.random.default_rng(seed)
        self.table = rng.normal(0, 2, (97, V)).astype(np.float32)             # (R, V)
        self.table[:, EOS] -= 3                                                 # sentences run a few steps
        if eos_first:
            self.table[BOS % 97, EOS] = 10
        self.state = np.zeros(rows, dtype=np.int64)                             # (N,) hash of the history
        self.out = np.empty((rows, V), dtype=np.float32)
        self.calls = 0
        if not top:
            self.step_top = None

    def step(self, tokens: np.ndarray) -> np.ndarray:
        self.calls += 1
        self.state = (self.state * 31 + tokens) % 97 if self.calls > 1 else tokens % 97
        logits = self.table[self.state]                                         # (N, V)
        self.out = read_only(logits - np.log(np.exp(logits).sum(axis=1, keepdims=True)))
        return self.out

    def step_top(self, tokens: np.ndarray, k: int):
        logp = self.step(tokens)
        ids = np.argsort(-logp, axis=1, kind="stable")[:, :k]                    # (N, k)
        return read_only(np.take_along_axis(logp, ids, axis=1)), read_only(ids), read_only(logp[:, EOS].copy())

    def select(self, rows: np.ndarray) -> None:
        self.state = self.state[rows]


def read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def search(options: SearchOptions, n: int = 3, budget: int = 8, **kw):
    decoder = kw.pop("decoder", None) or FakeDecoder(n)
    return finish(decode(decoder, n, options, bos_id=BOS, eos_id=EOS, max_length=[budget] * n, **kw))


def tokens(hyps: list[list[Hypothesis]]) -> list[list[list[int]]]:
    return [[h.tokens for h in hs] for hs in hyps]


# --- the strategy, chosen in one place --------------------------------------------------------------------

def test_decode_picks_greedy_beam_or_sampling_from_the_options():
    n = 3
    greedy = decode(FakeDecoder(n), n, SearchOptions(beam_size=1), bos_id=BOS, eos_id=EOS, max_length=[8] * n)
    assert isinstance(next(greedy), Step)                          # greedy search streams its steps
    beam = decode(FakeDecoder(n), n, SearchOptions(beam_size=4), bos_id=BOS, eos_id=EOS, max_length=[8] * n)
    assert next(beam) is None                                      # beam search does not
    found = finish(beam)
    assert all(len(hs) == 1 for hs in found)
    nbest = search(SearchOptions(beam_size=4, num_hypotheses=3), n)
    assert all(len(hs) == 3 and hs[0].score >= hs[1].score >= hs[2].score for hs in nbest)
    sampled = search(SearchOptions(sampling=True, temperature=1.5), n, seeds=[1, 2, 3])
    assert tokens(sampled) == tokens(search(SearchOptions(sampling=True, temperature=1.5), n, seeds=[1, 2, 3]))
    assert tokens(search(SearchOptions(sampling=True, top_k=1), n, seeds=[1, 2, 3])) == \
        tokens(search(SearchOptions(beam_size=1), n))             # top_k 1 is greedy search


def test_a_seeded_input_samples_the_same_alone_and_batched():
    opts = SearchOptions(sampling=True, temperature=2.0)
    batched = search(opts, 4, seeds=[5, 6, 7, 8], decoder=FakeDecoder(4))
    for i, seed in enumerate([5, 6, 7, 8]):
        alone = search(opts, 1, seeds=[seed], decoder=FakeDecoder(1))
        # Row 0 of a fresh decoder has the same table as row i: the state depends only on the row's tokens.
        assert alone[0][0].tokens == batched[i][0].tokens
    seeded = SearchOptions(sampling=True, seed=9)
    assert tokens(search(seeded, 2)) == tokens(search(seeded, 2, seeds=[9, 9]))   # no seeds: options.seed each


@pytest.mark.parametrize("options", [dict(beam_size=4, num_hypotheses=5), dict(beam_size=1, num_hypotheses=2),
                                     dict(sampling=True, num_hypotheses=2), dict(num_hypotheses=0)])
def test_more_hypotheses_than_the_search_keeps_are_refused_with_the_options(options):
    with pytest.raises(ValueError, match="num_hypotheses must be between 1 and"):
        SearchOptions(**options)


def test_sampling_needs_a_positive_temperature():
    with pytest.raises(ValueError, match="temperature must be at least 1e-05 for sampling"):
        decode(FakeDecoder(1), 1, SearchOptions(sampling=True, temperature=0.0), bos_id=BOS, eos_id=EOS,
               max_length=[4])


# --- the processors --------------------------------------------------------------------------------------

def test_options_that_are_off_give_no_processors_and_the_rest_apply_in_order():
    off = SearchOptions(min_length=0, length_rule="ctranslate2")
    assert logits_processors(off, eos_id=EOS, max_length=np.array([8])) == []
    every = SearchOptions(min_length=2, repetition_penalty=1.5, no_repeat_ngram_size=2)
    kinds = [type(p) for p in logits_processors(every, eos_id=EOS, max_length=np.array([8]), banned_ids=[3])]
    assert kinds == [SuppressTokens, RepetitionPenalty, NoRepeatNgram, MinLength, ForceEosAtBudget]


@pytest.mark.parametrize("top", [True, False])
def test_processors_change_copies_never_the_decoders_arrays(top):
    """The decoder's arrays are read-only here: with no processor the search reads them as they are (no copy),
    with processors it changes a copy."""
    off = SearchOptions(beam_size=4, min_length=0, length_rule="ctranslate2")
    every = SearchOptions(beam_size=4, min_length=3, repetition_penalty=1.2, no_repeat_ngram_size=2)
    for options, banned in ((off, ()), (every, [2])):
        assert search(options, 3, decoder=FakeDecoder(3, top=top), banned_ids=banned)
    logp = np.zeros((2, V), dtype=np.float32)
    for p in logits_processors(SearchOptions(min_length=3), eos_id=EOS, max_length=np.array([6, 6]), banned_ids=[2]):
        p.apply(0, Rows(np.arange(2)), logp, None, None)
    assert np.isneginf(logp[:, [2, EOS]]).all() and np.isfinite(np.delete(logp, [2, EOS], axis=1)).all()


@pytest.mark.parametrize("options, budget", [(dict(beam_size=1), 8), (dict(beam_size=4, num_hypotheses=3), 8),
                                             (dict(beam_size=1, min_length=5), 8), (dict(beam_size=4, min_length=9), 6),
                                             (dict(beam_size=3, length_rule="ctranslate2"), 4),
                                             (dict(beam_size=4, length_rule="ctranslate2", length_penalty=0.0), 8)])
def test_the_top_k_path_equals_the_full_distribution(options, budget):
    """Processors that only remove candidates or force eos give the same hypotheses over the decoder's best few
    as over the whole distribution (the module docstring's claim)."""
    o = SearchOptions(**options)
    fast = search(o, 5, budget, decoder=FakeDecoder(5), banned_ids=[2, 3])
    full = search(o, 5, budget, decoder=FakeDecoder(5, top=False), banned_ids=[2, 3])
    assert tokens(fast) == tokens(full)
    np.testing.assert_allclose([h.score for hs in fast for h in hs], [h.score for hs in full for h in hs], atol=1e-6)
    assert not {2, 3} & {t for hs in fast for h in hs for t in h.tokens}


@pytest.mark.parametrize("beam", [1, 4])
def test_no_repeat_ngram_and_repetition_penalty(beam):
    plain = search(SearchOptions(beam_size=beam, min_length=12), 4, budget=14)
    assert any(len(set(hs[0].tokens)) < len(hs[0].tokens) for hs in plain)      # it does repeat itself
    once = search(SearchOptions(beam_size=beam, min_length=10, no_repeat_ngram_size=1), 4, budget=11)
    assert all(len(set(hs[0].tokens)) == len(hs[0].tokens) for hs in once)
    bigrams = search(SearchOptions(beam_size=beam, min_length=12, no_repeat_ngram_size=2), 4, budget=14)
    for hs in bigrams:
        pairs = list(zip(hs[0].tokens, hs[0].tokens[1:]))
        assert len(set(pairs)) == len(pairs)
    penalised = search(SearchOptions(beam_size=beam, min_length=12, repetition_penalty=5.0), 4, budget=14)
    assert sum(len(set(hs[0].tokens)) for hs in penalised) > sum(len(set(hs[0].tokens)) for hs in plain)


# --- lengths: min_length, the budget, the score -----------------------------------------------------------

@pytest.mark.parametrize("beam", [1, 4])
def test_min_length_1_keeps_the_empty_hypothesis_out(beam):
    """eos is the best first token: with min_length 0 the search returns "" (score log p(eos) / 1, its length
    counting the eos as CTranslate2 and transformers count it); the default, 1, forbids eos at the first step
    as CTranslate2's translate_batch does."""
    empty = search(SearchOptions(beam_size=beam, min_length=0), 3, decoder=FakeDecoder(3, eos_first=True))
    assert all(hs[0].tokens == [] for hs in empty)
    assert all(hs[0].score == pytest.approx(hs[0].log_prob) for hs in empty)
    found = search(SearchOptions(beam_size=beam), 3, decoder=FakeDecoder(3, eos_first=True))
    assert SearchOptions().min_length == 1 and all(hs[0].tokens for hs in found)


def test_a_finished_hypothesis_scores_its_log_prob_per_token_eos_counted():
    for hs in search(SearchOptions(beam_size=4, num_hypotheses=4), 3, budget=12):
        for h in hs:
            if h.finished:
                assert h.score == pytest.approx(h.log_prob / (len(h.tokens) + 1))
    for hs in search(SearchOptions(beam_size=4, num_hypotheses=4, length_penalty=0.0), 3):
        assert all(h.score == h.log_prob for h in hs)


@pytest.mark.parametrize("beam", [1, 4])
def test_the_budget_ends_in_eos_or_cuts_by_rule(beam):
    """"transformers": the budget's last place may only be eos (max_length - 1 tokens); "ctranslate2": any token
    (max_length tokens, finished=False). min_length past the budget loses to the budget either way."""
    long = SearchOptions(beam_size=beam, min_length=20)
    for hs in search(long, 3, budget=5):
        assert len(hs[0].tokens) == 4 and hs[0].finished and np.isfinite(hs[0].score)
    for hs in search(SearchOptions(beam_size=beam, min_length=20, length_rule="ctranslate2"), 3, budget=5):
        assert len(hs[0].tokens) == 5 and not hs[0].finished and np.isfinite(hs[0].score)


def test_greedy_rows_end_on_cancel_and_their_steps_stream_the_tokens():
    cancel: set[int] = set()
    steps = decode(FakeDecoder(3), 3, SearchOptions(beam_size=1, min_length=9), bos_id=BOS, eos_id=EOS,
                   max_length=[10] * 3, cancel=cancel)
    streamed: dict[int, list[int]] = {0: [], 1: [], 2: []}
    while True:
        try:
            step = next(steps)
        except StopIteration as done:
            hyps = done.value
            break
        for s, t in zip(step.sentence, step.tokens):
            if t != EOS:
                streamed[int(s)].append(int(t))
        if len(streamed[1]) == 2:
            cancel.add(1)
    assert [hs[0].tokens for hs in hyps] == [streamed[i] for i in range(3)]
    assert len(hyps[1][0].tokens) == 2 and not hyps[1][0].finished and hyps[0][0].finished


# --- beam search's step, no decoder in it ------------------------------------------------------------------

def test_beam_step_keeps_k_beams_and_sets_finished_ones_aside():
    """Two sentences, K=2, over candidates given directly: sentence 0's best candidate is eos (finished, scored
    once, length 1 with its eos) and the next two non-eos candidates become its beams; sentence 1 continues
    both its beams' best tokens."""
    o = SearchOptions(beam_size=2)
    scores = np.array([[0.0, -np.inf], [-1.0, -1.05]])                              # (A, K)
    logp = np.log(np.array([[.5, .3, .2, 1e-9], [.5, .3, .2, 1e-9],
                            [1e-9, .6, .3, .1], [1e-9, .05, .05, .9]], dtype=np.float32))  # (A*K, V)
    rows = Rows(np.array([0, 0, 1, 1]), [[], [], [5], [6]])
    finished: list[list[Hypothesis]] = [[], []]
    top_ended = np.zeros(2, dtype=bool)
    picked, going_on = beam_step(scores, logp, None, rows, np.array([0, 1]), finished, top_ended,
                                 np.zeros(4, dtype=bool), o, EOS, False)
    assert going_on.tolist() == [0, 1] and top_ended.tolist() == [True, False]
    assert list(zip(picked.rows.tolist(), picked.tokens.tolist())) == [(0, 1), (0, 2), (3, 3), (2, 1)]
    assert [(h.tokens, round(h.score, 4)) for h in finished[0]] == [([], round(float(np.log(.5)), 4))]
    assert finished[1] == []


@pytest.mark.parametrize("seed", range(40))
def test_beam_step_picks_and_finishes_as_the_loop_it_replaced(seed):
    """The vectorised beam_step against tests/oracles.py's loop, a sentence and a candidate at a time, on random
    steps: eos and budget ends among the candidates, banned (-inf) ones, beams not live yet, the whole
    distribution or each row's top k, both stopping rules."""
    from oracles import beam_step_loop

    rng = np.random.default_rng(seed)
    K, V = int(rng.integers(1, 5)), int(rng.integers(6, 12))
    A = int(rng.integers(1, 6))
    o = SearchOptions(beam_size=K, num_hypotheses=int(rng.integers(1, K + 1)),
                      length_penalty=float(rng.choice([0.0, 0.6, 1.0])))
    scores = np.log(rng.uniform(0.01, 1, (A, K)))
    scores[rng.uniform(size=(A, K)) < 0.2] = -np.inf                     # beams not live (first step)
    scores[:, 0] = np.log(rng.uniform(0.01, 1, A))
    logp = np.log(rng.dirichlet(np.ones(V), A * K)).astype(np.float32)   # (A*K, V)
    logp[rng.uniform(size=logp.shape) < 0.15] = -np.inf                  # banned by a processor
    ids = None
    if rng.uniform() < 0.5:                                              # each row's top k, as step_top gives
        k = min(V, 2 * K + 1)
        ids = np.argsort(-logp, axis=1, kind="stable")[:, :k]
        logp = np.take_along_axis(logp, ids, axis=1)
    history = [[int(t) for t in rng.integers(4, V, int(rng.integers(0, 5)))] for _ in range(A * K)]
    rows = Rows(np.repeat(np.arange(A), K), history)
    active = np.sort(rng.choice(A + 3, A, replace=False))                # sentences' numbers, in order
    last = np.repeat(rng.uniform(size=A) < 0.2, K)
    early_exit = bool(rng.uniform() < 0.5)
    eos = int(rng.integers(0, V))

    def run(step):
        finished = [[Hypothesis([1], -0.5, -0.5)] * int(rng_copy.integers(0, K)) for _ in range(A + 3)]
        top_ended = rng_copy.uniform(size=A + 3) < 0.2
        out = step(scores, logp, ids, rows, active, finished, top_ended, last, o, eos, early_exit)
        return out, finished, top_ended
    rng_copy = np.random.default_rng(seed + 1000)
    (picked, going_on), finished, top_ended = run(beam_step)
    rng_copy = np.random.default_rng(seed + 1000)
    (want_picked, want_going_on), want_finished, want_top_ended = run(beam_step_loop)
    assert going_on.tolist() == want_going_on
    assert list(zip(picked.rows.tolist(), picked.tokens.tolist(), picked.scores.reshape(-1).tolist())) == \
        [(int(r), int(t), float(s)) for r, t, s in want_picked]
    assert finished == want_finished and top_ended.tolist() == want_top_ended.tolist()


# --- over PyTorch (moved from tests/test_transformer.py) ----------------------------------------------------

def test_beam_search_finds_better_or_equal_scores_than_greedy_and_is_sorted():
    torch = pytest.importorskip("torch")
    from model.batching import pad
    from model.decoding import TorchDecoder

    model = random_transformer(torch)
    src = pad([[11, 12, 13, 14, 3], [15, 16, 3], [17, 18, 19, 3]])
    common = dict(bos_id=2, eos_id=3, max_length=[8, 8, 8])
    greedy = finish(decode(TorchDecoder(model, src), 3, SearchOptions(beam_size=1), **common))
    beams = finish(decode(TorchDecoder(model, src), 3, SearchOptions(beam_size=5, length_penalty=0.0,
                                                                     num_hypotheses=3), **common))
    for (g,), hyps in zip(greedy, beams):
        assert len(hyps) == 3
        assert [h.score for h in hyps] == sorted([h.score for h in hyps], reverse=True)
        assert hyps[0].score >= g.score - 1e-4


def test_beam_search_scores_are_the_models_log_probs():
    torch = pytest.importorskip("torch")
    from model.batching import pad
    from model.decoding import TorchDecoder
    from model.transformer import causal_mask, padding_mask

    model = random_transformer(torch)
    src = pad([[11, 12, 13, 14, 3]])
    hyp = finish(decode(TorchDecoder(model, src), 1, SearchOptions(beam_size=4, length_penalty=1.0), bos_id=2,
                        eos_id=3, max_length=[6]))[0][0]
    tgt = torch.tensor([[2, *hyp.tokens]])
    with torch.no_grad():
        lp = torch.log_softmax(model(src, tgt, padding_mask(src, 0), causal_mask(tgt.size(1))), -1)[0]
    total = sum(lp[i, t].item() for i, t in enumerate(hyp.tokens)) + lp[len(hyp.tokens), 3].item()
    assert hyp.log_prob == pytest.approx(total, abs=1e-4)
    assert hyp.score == pytest.approx(total / (len(hyp.tokens) + 1), abs=1e-4)


def random_transformer(torch):
    from model.transformer import Transformer, preset

    torch.manual_seed(0)
    return Transformer(preset("tiny", vocab_size=97)).eval()


# --- the training side runs the served search, every option -----------------------------------------------

@pytest.mark.parametrize("options", [dict(beam_size=4, no_repeat_ngram_size=1, repetition_penalty=1.5),
                                     dict(beam_size=1, min_length=12, max_length_b=20, no_repeat_ngram_size=2),
                                     dict(beam_size=3, length_rule="ctranslate2", max_length_a=0.5, max_length_b=2)])
def test_the_training_sides_translate_runs_the_served_search_with_every_option(tiny_run, tiny_package, options):
    """model.decoding.translate (training-time BLEU) dropped the repetition and n-gram options the service
    applies; now both run decode() with the same options and give the same translations."""
    pytest.importorskip("torch")
    from conftest import pairs64, torch_reference
    from model.decoding import translate
    from service.inference.engine import Engine

    sources = [de for de, _ in pairs64()]
    engine = Engine(tiny_package, device="cpu", intra_op_threads=1)
    served = [t.text for t in engine.translate(sources, source_lang="de", target_lang="en", **options)]
    for model, tok in torch_reference(tiny_run):
        assert translate(model, tok, sources, settings=SearchOptions(**options)) == served
    if "no_repeat_ngram_size" in options and options["no_repeat_ngram_size"] == 1:
        assert served != [t.text for t in engine.translate(sources, source_lang="de", target_lang="en",
                                                           beam_size=4)]  # the options change the outputs


@pytest.mark.parametrize("vocab", [7, 64, 8000, 8003])
@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (1.0, 0, 0.9),
                                                       (0.8, 40, 0.95), (1.0, 1, 1.0), (1.0, 0, 0.0)])
def test_sampling_all_rows_at_once_picks_what_generator_choice_picks_row_by_row(vocab, temperature, top_k, top_p):
    """_sample_rows must give each row the id the per-row Generator.choice oracle gives for the same seed, so a
    seeded request's text is the same whatever its batch-mates (and the same as before rows were sampled at once)."""
    data = np.random.default_rng(vocab)
    for trial in range(20):
        rows = int(data.integers(1, 9))
        logits = data.normal(scale=float(data.choice([0.5, 3.0, 12.0])), size=(rows, vocab))
        logp = (logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))).astype(np.float32)    # (N, V)
        seeds = [int(s) for s in data.integers(0, 2**31, size=rows)]
        expected = [sample_one(logp[r], np.random.default_rng(seeds[r]), temperature, top_k, top_p)
                    for r in range(rows)]
        u = np.array([np.random.default_rng(seed).random() for seed in seeds])
        assert _sample_rows(logp, u, temperature, top_k, top_p).tolist() == expected, (trial, rows)
