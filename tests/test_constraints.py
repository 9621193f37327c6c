"""Lexically constrained beam search (service/shared/constraints.py): terms written, phrases never written, the
banks' allocation, refusals, and an input's answer the same alone, beside unconstrained inputs and in a BeamPool
it joined late, over the fake decoders of tests/test_search.py and tests/test_beam_pool.py."""

import numpy as np
import pytest

from service.shared.beam_pool import BeamPool
from service.shared.constraints import START, Terms, bank_sizes, best_of, choose
from service.shared.options import SearchOptions
from service.shared.search import decode, finish

from test_beam_pool import AloneDecoder, log_probs, top
from test_search import BOS, EOS, FakeDecoder

BEAM = SearchOptions(beam_size=4, num_hypotheses=2)


def run(terms, n=None, budget=12, options=BEAM, seed=0):
    n = len(terms) if n is None else n
    return finish(decode(FakeDecoder(n, seed=seed), n, options, bos_id=BOS, eos_id=EOS, max_length=[budget] * n,
                         terms=terms))


def contains(tokens: list[int], phrase: tuple[int, ...]) -> bool:
    return any(tuple(tokens[i:i + len(phrase)]) == phrase for i in range(len(tokens) - len(phrase) + 1))


def test_terms_follow_a_phrase_and_start_again_when_it_breaks_off():
    t = Terms.of([[5, 6, 7], [9]])
    s = t.advance(START, 5)
    assert t.allowed(s) == [6] and t.met(s) == 1
    s = t.advance(s, 6)
    assert t.met(s) == 2
    s = t.advance(s, 3)                                              # broken off: back to nothing of it
    assert t.met(s) == 0 and sorted(t.allowed(s)) == [5, 9]
    s = t.advance(t.advance(t.advance(t.advance(s, 9), 5), 6), 7)
    assert t.complete(s) and t.met(s) == 4 and t.allowed(s) == []
    assert t.advance(t.advance(START, 5), 9) == (0b10, -1, 0, True)  # 9 starts (and is) the other term


def test_a_term_broken_off_resumes_from_the_longest_end_that_begins_it():
    t = Terms.of([[3, 3, 4], [6, 3, 8]])
    s = START
    for token in (3, 3, 3, 4):                                       # "a a a b" holds "a a b"
        s = t.advance(s, token)
    assert s == (0b01, -1, 0, True)
    s = START
    for token in (6, 3, 3, 3):                                       # "6 3" breaks off; its "3" and the next go on
        s = t.advance(s, token)
    assert s == (0, 0, 2, False) and t.allowed(s) == [4]


def test_terms_that_start_alike_are_followed_together_until_they_part():
    t = Terms.of([[5, 6, 1], [5, 6, 2]])                           # placeholders XQ1 and XQ2: "▁X", "Q", digit
    s = t.advance(t.advance(START, 5), 6)
    assert sorted(t.allowed(s)) == [1, 2]
    s = t.advance(s, 2)
    assert s[0] == 0b10 and t.allowed(s) == [5]
    assert t.complete(t.advance(t.advance(t.advance(s, 5), 6), 1))


def test_a_term_ends_where_a_word_does_and_eos_waits_for_every_term():
    joiners = np.zeros(12, dtype=bool)
    joiners[[6, 8]] = True                                           # pieces that continue a word
    t = Terms.of([[5], [7]], joiners=joiners)
    row = np.zeros(12)
    t.remove(row, START, False, EOS)
    assert row[EOS] == -np.inf and np.isfinite(np.delete(row, EOS)).all()
    row = np.zeros(12)
    t.remove(row, t.advance(START, 5), False, EOS)                  # "5" just ended a term: no 6 or 8 after it
    assert np.flatnonzero(np.isinf(row)).tolist() == [EOS, 6, 8]
    row = np.zeros(12)
    t.remove(row, t.advance(t.advance(START, 5), 7), True, EOS)     # every term: eos free; at the budget too
    assert np.flatnonzero(np.isinf(row)).tolist() == [6, 8]


def test_bank_sizes_share_the_beam_and_pass_empty_places_down():
    assert bank_sizes(3, 4, [9, 9, 9]) == [1, 1, 2]
    assert bank_sizes(3, 4, [9, 9, 0]) == [1, 3, 0]
    assert bank_sizes(3, 4, [9, 0, 0]) == [4, 0, 0]
    assert bank_sizes(5, 4, [9, 9, 9, 9, 1]) == [0, 0, 0, 3, 1]      # more banks than beams: the top gets the rest
    assert bank_sizes(3, 4, [0, 3, 1]) == [0, 3, 1]                  # what bank 0 passes on is passed on again


def test_best_of_picks_what_a_stable_sort_of_the_whole_row_picks():
    rng = np.random.default_rng(0)
    for n in (1, 3, 9, 40, 64):
        row = rng.integers(-5, 0, 64).astype(np.float32)               # many ties
        row[rng.choice(64, 20, replace=False)] = -np.inf
        assert best_of(row, n).tolist() == np.argsort(-row, kind="stable")[:n].tolist(), n


def test_a_token_that_starts_two_terms_is_one_candidate():
    rng = np.random.default_rng(1)
    t = Terms.of([[5, 7], [5, 9], [5]])
    logp = np.log(rng.dirichlet(np.ones(12), size=4)).astype(np.float32)      # (K, V), one input
    logp[:, 5] = -30.0                                                       # far below the 2K best
    [choice] = choose(np.array([[0.0, -1.0, -2.0, -3.0]]), logp, None, [START] * 4, [t], np.zeros(4, bool), EOS)
    picked = [(k, tok) for k, tok, _, _ in choice.beams]
    assert len(picked) == len(set(picked)) == 4


@pytest.mark.parametrize("seed", range(6))
def test_every_term_is_written_and_excluded_phrases_never(seed):
    rng = np.random.default_rng(seed)
    include = [tuple(int(x) for x in rng.integers(2, 12, size=rng.integers(1, 3))) for _ in range(2)]
    free = run([None], seed=seed)[0][0].tokens
    exclude = [tuple(free[:2])] if len(free) >= 2 else []
    hyps = run([Terms.of(include, exclude)], seed=seed)[0]
    assert hyps[0].unmet == 0 and hyps[0].finished
    for h in hyps:                  # the second best may be one the budget cut short of a term: it says so
        assert (h.unmet == 0) == all(contains(h.tokens, p) for p in include), (include, h)
        assert not any(contains(h.tokens, p) for p in exclude), (exclude, h.tokens)


def test_a_budget_too_short_for_the_terms_still_ends_and_says_what_it_lacks():
    (h, *_), = run([Terms.of([[5, 6, 7], [8, 9, 10]])], budget=3)
    assert h.unmet > 0


def test_an_input_answers_the_same_alone_and_beside_unconstrained_inputs():
    terms = [None, Terms.of([[7, 3]]), None, Terms.of([[4]], [[5]]), Terms.of([], [[2, 6]])]
    together = run(terms)
    for i, t in enumerate(terms):
        alone = finish(decode(FakeDecoder(5), 5, BEAM, bos_id=BOS, eos_id=EOS, max_length=[12] * 5,
                              terms=[t if j == i else None for j in range(5)]))
        assert [h.tokens for h in alone[i]] == [h.tokens for h in together[i]], i
    plain = run([None] * 5)
    assert [h.tokens for h in plain[0]] == [h.tokens for h in together[0]]       # terms beside it change nothing


def test_greedy_search_and_sampling_refuse_terms():
    for options in (SearchOptions(beam_size=1), SearchOptions(sampling=True, beam_size=1)):
        with pytest.raises(ValueError, match="beam search"):
            run([Terms.of([[4]])], options=options)


def test_constrained_inputs_joining_a_pool_late_get_their_hypotheses_alone():
    joins = {0: [(9, 0, Terms.of([[4, 5]]))], 2: [(8, 1, None), (10, 2, Terms.of([[3], [7]], [[9]]))],
             3: [(9, 3, Terms.of([[6]]))]}
    pool = BeamPool(BEAM, eos_id=EOS)
    prefixes, seeds, mine, got, step = [], [], {}, {}, 0
    while step <= max(joins) or len(pool.live):
        for budget, seed, terms in joins.get(step, []):
            (number,) = pool.add(np.array([BOS]), np.array([budget]), [terms])
            mine[number] = (budget, seed, terms)
            prefixes += [()] * BEAM.beam_size
            seeds += [seed] * BEAM.beam_size
        prefixes = [p + (int(t),) for p, t in zip(prefixes, pool.tokens)]
        logp = np.concatenate([log_probs([p], s) for p, s in zip(prefixes, seeds)])
        k = pool.want()
        rows = pool.step(*((logp, None, None) if k is None else top(logp, k)), logp if pool.whole else None)
        prefixes, seeds = [prefixes[r] for r in rows], [seeds[r] for r in rows]
        for number in pool.ended.tolist():
            got[number] = pool.done(number)
        step += 1
    for number, (budget, seed, terms) in mine.items():
        alone = finish(decode(AloneDecoder(seed), 1, BEAM, bos_id=BOS, eos_id=EOS, max_length=[budget],
                              terms=[terms]))[0]
        assert [h.tokens for h in got[number]] == [h.tokens for h in alone], number
