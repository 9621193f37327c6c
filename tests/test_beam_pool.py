"""BeamPool (service/shared/beam_pool.py): inputs that join a pool at different steps get the hypotheses
decode()'s beam search gives each alone, over a fake model whose log-probs depend on a row's own tokens."""

import numpy as np
import pytest

from service.shared.beam_pool import BeamPool
from service.shared.constraints import Terms
from service.shared.options import SearchOptions
from service.shared.search import decode, finish

BOS, EOS, V = 1, 0, 12
TABLE = np.random.default_rng(3).normal(0, 2, (97, V)).astype(np.float32)
TABLE[:, EOS] -= 2                                                   # sentences run a few steps


def log_probs(prefixes: list[tuple[int, ...]], seed: int) -> np.ndarray:
    """(N, V): each row's from its own tokens so far (and its input's seed), nothing else."""
    logits = TABLE[[hash((seed,) + p) % 97 for p in prefixes]]
    return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))


def top(logp: np.ndarray, k: int):
    ids = np.argsort(-logp, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(logp, ids, axis=1), ids, logp[:, EOS].copy()


class AloneDecoder:
    """decode()'s decoder over the fake model, one input: each row's tokens so far kept as a cache would."""

    def __init__(self, seed: int):
        self.prefixes, self.seed = [()], seed

    def step(self, tokens):
        self.prefixes = [p + (int(t),) for p, t in zip(self.prefixes, tokens)]
        return log_probs(self.prefixes, self.seed)

    def step_top(self, tokens, k):
        return top(self.step(tokens), k)

    def select(self, rows):
        self.prefixes = [self.prefixes[r] for r in rows]


def hypotheses_alone(options, budget, seed):
    return finish(decode(AloneDecoder(seed), 1, options, bos_id=BOS, eos_id=EOS, max_length=[budget]))[0]


@pytest.mark.parametrize("options", [
    SearchOptions(beam_size=4, num_hypotheses=2),
    SearchOptions(beam_size=3, min_length=4, length_rule="transformers", length_penalty=0.6),
    SearchOptions(beam_size=4, repetition_penalty=1.4, num_hypotheses=3),          # the whole distribution
])
def test_inputs_joining_a_pool_at_different_steps_get_their_hypotheses_alone(options):
    joins = {0: [(7, 0), (9, 1)], 1: [(5, 2)], 3: [(8, 3), (6, 4), (7, 5)], 4: [(9, 6)]}   # step: (budget, seed)
    pool = BeamPool(options, eos_id=EOS)
    prefixes, seeds, mine, step = [], [], {}, 0
    while step <= max(joins) or len(pool.live):
        for budget, seed in joins.get(step, []):
            (number,) = pool.add(np.array([BOS]), np.array([budget]))
            mine[number] = (budget, seed)
            prefixes += [()] * options.beam_size
        seeds = [mine[int(n)][1] for n in np.repeat(pool.live, options.beam_size)]
        prefixes = [p + (int(t),) for p, t in zip(prefixes, pool.tokens)]
        logp = np.concatenate([log_probs([p], s) for p, s in zip(prefixes, seeds)])
        k = pool.want()
        keep = pool.step(logp, None, None) if k is None else pool.step(*top(logp, k))
        prefixes = [prefixes[r] for r in keep]
        step += 1
    assert len(mine) == 7
    for number, (budget, seed) in mine.items():
        got, want = pool.done(number), hypotheses_alone(options, budget, seed)
        assert [h.tokens for h in got] == [h.tokens for h in want] and got, (number, options)
        assert [h.score for h in got] == [h.score for h in want]


def test_a_phrase_excluded_by_an_input_that_joins_later_is_never_written_by_it():
    """A pool looks for excluded phrases only once an input brings one (BeamPool.excludes): one that joins a pool of
    unconstrained inputs at a later step still never writes its phrase, and the others keep their hypotheses."""
    options = SearchOptions(beam_size=4, num_hypotheses=4)
    alone = hypotheses_alone(options, 8, 2)
    phrase = tuple(alone[0].tokens[:2])                        # what it writes best when free
    pool = BeamPool(options, eos_id=EOS)
    pool.add(np.array([BOS]), np.array([8]))                   # seed 1, unconstrained
    assert not pool.excludes
    seeds, prefixes = {0: 1}, [()] * 4
    for step in range(20):
        if step == 2:
            (number,) = pool.add(np.array([BOS]), np.array([8]), [Terms.of(exclude=[phrase])])
            seeds[number], prefixes = 2, prefixes + [()] * 4
        if not len(pool.live):
            break
        prefixes = [p + (int(t),) for p, t in zip(prefixes, pool.tokens)]
        rows = np.repeat(pool.live, 4)
        logp = np.concatenate([log_probs([p], seeds[int(n)]) for p, n in zip(prefixes, rows)])
        k = pool.want()
        keep = pool.step(logp, None, None) if k is None else pool.step(*top(logp, k))
        prefixes = [prefixes[r] for r in keep]
    assert pool.excludes
    free, excluded = pool.done(0), pool.done(1)
    assert [h.tokens for h in free] == [h.tokens for h in hypotheses_alone(options, 8, 1)]
    assert excluded and not any(tuple(h.tokens[i:i + 2]) == phrase for h in excluded for i in range(len(h.tokens)))


def test_an_input_dropped_leaves_with_its_rows_and_the_others_go_on():
    options = SearchOptions(beam_size=2)
    pool = BeamPool(options, eos_id=EOS)
    pool.add(np.array([BOS, BOS]), np.array([6, 6]))
    rows = pool.drop(np.array([0]))
    assert list(pool.live) == [1] and list(rows) == [2, 3] and len(pool.history) == 2 and pool.tokens.shape == (2,)
