"""The translation scheduler (service/worker/translate_scheduler.py), driven directly as the worker loop drives it,
without a server or LitServe: the running batch (issue 36: requests join at the next step, one decoder call holds
every row whatever its options, the token budget, a one-word request beside large ones joins first and is answered
first, with the same answer it gets alone) on models/de-en, and what a small fake engine shows plainly: a request
failing alone, a client that went away. What fairness buys in latency is measured by benchmarks/fairness.py, not
asserted here."""

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from service.worker.cancel import CancelBoard
from service.config import Settings
from service.inference import running_batch
from service.inference.engine import Engine
from service.worker import scheduler as scheduling, translate_scheduler
from service.worker.scheduler import Failure
from service.worker.translate_scheduler import Job, TranslationScheduler, cost_tier, request_cost
from service.shared.options import SearchOptions
from service.shared.text import split_sentences

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from fairness import large_texts  # noqa: E402

DE_EN = ROOT / "models" / "de-en"


@pytest.fixture(scope="module")
def engine():
    return Engine(DE_EN, device="cpu", intra_op_threads=1)


def translation(engine, texts: list[str], beam: int, request_id: str, number: int = 0) -> Job:
    """A request as TranslateAPI.decode_request makes it: its texts' sentences, tokenized, and its cost."""
    sentences, spans, separators = [], [], []
    for text in texts:
        sents, sep = split_sentences(text)
        spans.append((len(sentences), len(sentences) + len(sents)))
        separators.append(sep)
        sentences += sents
    ids = engine.source_ids(sentences, "en")
    options = SearchOptions(beam_size=beam, max_length=Settings().max_output_tokens)
    return Job(request_id, engine.package.name, "de", "en", options, ids, spans, separators, time.monotonic(),
               number, request_cost(sum(map(len, ids)), beam))


def large(engine, n_texts: int, beam: int, request_id: str) -> Job:
    return translation(engine, large_texts(n_texts), beam, request_id)


def small(engine, request_id: str) -> Job:
    return translation(engine, ["Hallo"], 4, request_id)


def scheduler_for(engine) -> TranslationScheduler:
    return TranslationScheduler({engine.package.name: engine}, CancelBoard(), Settings().max_batch_tokens)


# --- translation: the running batch, its budget and fairness ------------------------------------------

def test_tiers_double():
    assert [cost_tier(c) for c in (1, 1024, 1025, 2048, 2049, 32768)] == [0, 0, 1, 1, 2, 5]


def assert_answers_as_alone(engine, answered) -> None:
    for _, job in answered:
        assert job.failure is None
        for src, hyps in zip(job.sentences, job.hyps):
            alone = engine.search([src], job.options)[0]
            assert [h.tokens for h in hyps] == [h.tokens for h in alone]


def test_a_small_request_joins_the_running_batch_at_the_next_step_and_is_answered_first(engine):
    """A large request under way; a one-word request admitted between two decoder steps has its rows in the
    very next decoder call, beside the large one's, and is answered first; every sentence's answer is the one
    it gets alone."""
    s = scheduler_for(engine)
    s.admit({"a": large(engine, 1, 4, "a")})
    for _ in range(3):
        s.step()
    (batch,) = s.batches.values()
    before = batch.rows
    assert before > 0 and s.take_finished() == [] and not s.waiting
    s.admit({"s": small(engine, "s")})
    s.step()
    assert [r.key for r in s.running if r.key == "s"] == ["s"] and len(s.batches) == 1
    assert batch.rows == before + 4 or "a" not in {r.key for r in s.running}
    answered = []
    while s.busy:
        s.step()
        answered += s.take_finished()
    assert answered[0][0] == "s" and sorted(key for key, _ in answered) == ["a", "s"] and not s.jobs
    assert_answers_as_alone(engine, answered)


def test_a_small_request_waits_for_room_ahead_of_large_ones_waiting_sentences(engine):
    """Two large requests fill the budget; a one-word request admitted between two steps goes ahead of their
    waiting sentences: no sentence of theirs joins before it, and it joins once running sentences that ended
    have made room."""
    s = scheduler_for(engine)
    s.admit({"a": large(engine, 2, 8, "a"), "b": large(engine, 2, 8, "b")})
    for _ in range(3):
        s.step()
    assert s.waiting and s.take_finished() == []
    s.admit({"s": small(engine, "s")})
    assert s.waiting[0][2] == "s"
    answered = []
    while s.waiting[0][2] == "s":
        waiting = len(s.waiting)
        s.step()
        assert s.waiting[0][2] != "s" or len(s.waiting) == waiting
        answered += s.take_finished()
    assert "s" in {r.key for r in s.running} and s.used <= s.max_batch_tokens
    while s.busy:
        s.step()
        answered += s.take_finished()
    assert sorted(key for key, _ in answered) == ["a", "b", "s"] and not s.jobs
    assert_answers_as_alone(engine, [(k, j) for k, j in answered if k == "s"])


def test_requests_with_different_options_share_one_decoder_call_a_step_per_beam_size(engine, monkeypatch):
    """Beam 4 with two alternatives, with a length penalty of 0.5 and with a repetition penalty (the whole
    distribution) share one decoder call a step; greedy search has a call of its own (rows per source fix
    the cross-attention's grouping, RunningBatch)."""
    calls = []
    run = type(engine.graph.session).run_with_iobinding

    def counted(session, io, *args):
        calls.append(1)
        return run(session, io, *args)
    s = scheduler_for(engine)
    jobs = {"greedy": translation(engine, ["Das geht zu weit.", "Hallo Welt."], 1, "greedy"),
            "nbest": translation(engine, ["Die Datei wird gelöscht."], 4, "nbest"),
            "short": translation(engine, ["Wir sehen uns morgen."], 4, "short"),
            "penalty": translation(engine, ["Wo ist der Bahnhof?"], 4, "penalty")}
    jobs["nbest"].options = SearchOptions(beam_size=4, num_hypotheses=2)
    jobs["short"].options = SearchOptions(beam_size=4, length_penalty=0.5)
    jobs["penalty"].options = SearchOptions(beam_size=4, repetition_penalty=1.3)
    s.admit(jobs)
    s.step()                                   # all join; the first step runs their rows
    monkeypatch.setattr(type(engine.graph.session), "run_with_iobinding", counted)
    rows = {key: batch.rows for key, batch in s.batches.items()}
    s.step()
    assert len(calls) == 2 and rows == {(engine.package.name, 1): 2, (engine.package.name, 4): 3 * 4}
    monkeypatch.undo()
    assert sorted(drain(s)) == sorted(jobs)
    assert_answers_as_alone(engine, jobs.items())
    assert len(jobs["nbest"].hyps[0]) == 2


def test_sentences_wait_for_room_in_the_budget_and_join_as_it_frees(engine):
    """--max-batch-tokens bounds what the running sentences hold (sentence_cost: beams x (padded source +
    output budget)); the rest wait, and join as sentences end."""
    job = large(engine, 2, 4, "a")
    probe = scheduler_for(engine)
    costs = [probe.sentence_cost(job, k)[0] for k in range(len(job.sentences))]
    budget = 3 * max(costs)
    s = TranslationScheduler({engine.package.name: engine}, CancelBoard(), max_batch_tokens=budget)
    s.admit({"a": job})
    peak, joined_later = 0, False
    while s.busy:
        waiting = len(s.waiting)
        s.step()
        joined_later |= 0 < len(s.waiting) < waiting and len(s.running) > 0
        assert s.used <= budget and s.used == sum(r.held()[0] for r in s.running)
        peak = max(peak, len(s.running))
        s.take_finished()
    assert joined_later and s.used == 0 and not s.waiting
    assert_answers_as_alone(engine, [("a", job)])


def test_a_sentence_that_could_never_fit_the_budget_runs_alone(engine):
    s = TranslationScheduler({engine.package.name: engine}, CancelBoard(), max_batch_tokens=1)
    job = translation(engine, ["Das geht zu weit. Hallo Welt. Wir sehen uns."], 4, "a")
    s.admit({"a": job})
    while s.busy:
        s.step()
        assert len(s.running) <= 1
    assert_answers_as_alone(engine, s.take_finished())


def test_a_small_request_admitted_after_a_large_one_is_first_in_turn(engine):
    """The large request's rows fill the budget and its other sentences wait; a one-word request admitted
    after it joins before them (its turn: its arrival; theirs: their arrival + TIER_WAIT_S per tier)."""
    big = large(engine, 4, 8, "a")
    s = TranslationScheduler({engine.package.name: engine}, CancelBoard(), max_batch_tokens=4096)
    s.admit({"a": big})
    s.step()
    assert s.waiting and cost_tier(big.cost) > 0 and s.wants_new_requests()
    s.admit({"s": small(engine, "s")})
    assert s.waiting[0][2] == "s"
    s.abandon()


def test_a_large_request_that_waited_long_enough_joins_before_later_small_ones(engine):
    big = large(engine, 4, 8, "a")
    big.received -= cost_tier(big.cost) * translate_scheduler.TIER_WAIT_S + 1
    s = TranslationScheduler({engine.package.name: engine}, CancelBoard(), max_batch_tokens=4096)
    s.admit({"a": big, "s": small(engine, "s")})
    assert s.waiting[0][2] == "a" and s.waiting[-1][2] == "s"
    s.abandon()


def test_it_wants_new_requests_while_it_has_room_or_what_waits_is_large(engine):
    s = scheduler_for(engine)
    assert s.wants_new_requests()                 # empty: room
    s.admit({f"s{i}": small(engine, f"s{i}") for i in range(3)})
    s.step()
    assert s.wants_new_requests()                 # three words: room left
    s.abandon()
    s = TranslationScheduler({engine.package.name: engine}, CancelBoard(), max_batch_tokens=1)
    s.admit({"s": small(engine, "s"), "t": small(engine, "t")})
    s.step()
    assert not s.wants_new_requests()             # full, a tier-0 request waits: leave the queue to others
    s.abandon()


def test_on_cpu_the_running_batch_holds_at_most_cpu_batch_rows(engine):
    """A decoder step, what a joining request may wait for, stays short: rows = sentences x beams."""
    s = TranslationScheduler({engine.package.name: engine}, CancelBoard(), max_batch_tokens=10**9)
    s.admit({"a": large(engine, 8, 16, "a")})
    s.step()
    (batch,) = s.batches.values()
    assert 0 < batch.rows <= scheduling.CPU_BATCH_ROWS and s.waiting
    s.abandon()


def test_a_full_pool_hands_new_requests_to_a_new_one_and_both_answer_as_alone(engine, monkeypatch):
    """A pool takes POOL_INPUTS sentences (2 here), then requests of its options start another beside it."""
    monkeypatch.setattr(running_batch, "POOL_INPUTS", 2)
    s = scheduler_for(engine)
    texts = ["Das geht zu weit.", "Guten Morgen.", "Die Datei wird gespeichert."]
    jobs = {i: translation(engine, [t], 4, str(i)) for i, t in enumerate(texts)}
    s.admit({0: jobs[0], 1: jobs[1]})
    s.step()                                         # 0 and 1 join one pool (at one step: encoded together)
    s.admit({2: jobs[2]})
    s.step()
    (batch,) = s.batches.values()
    assert len(batch.members) == 2                   # that pool is full: 2 starts the next
    done = drain(s)
    for i, job in jobs.items():
        (alone,) = engine.search(job.sentences, job.options)
        assert [h.tokens for h in done[i].hyps[0]] == [h.tokens for h in alone]


# --- translation: failures and cancellation, on a fake engine ------------------------------------------

class EchoSearch:
    """A search that echoes its sources after as many steps as the longest has tokens."""

    def __init__(self, src_ids):
        self.src, self.left, self.want, self.result, self.error = src_ids, max(map(len, src_ids)), "step", None, None
        self.row_source = list(range(len(src_ids)))     # each row's source: all of them until the end


class EchoTranslationBatch:
    """EchoTranslator's running batch: each step one call for every member's rows (logged), a search that
    has taken as many steps as its longest source has tokens ends."""
    def __init__(self, log):
        self.members, self.log = [], log

    @property
    def rows(self):
        return sum(len(m.src) for m in self.members)

    bytes = 0

    def step(self):
        self.log.append(self.rows)
        for m in self.members:
            m.left -= 1
            if m.left == 0:
                m.want, m.result = None, [[SimpleNamespace(tokens=list(s), score=-1.0)] for s in m.src]
        self.members = [m for m in self.members if m.want is not None]

    def join(self, encoded, options, sizes, terms=None):
        """An EchoSearch a request: `sizes` requests' sources in turn."""
        if any(99 in s for s in encoded):
            raise RuntimeError("engine failure")
        searches = [EchoSearch(encoded[sum(sizes[:i]):sum(sizes[:i + 1])]) for i in range(len(sizes))]
        self.members += searches
        return searches

    def leave(self, m):
        self.members.remove(m)

    def close(self):
        self.members = []


class EchoTranslator:
    """A translation engine that echoes each source; a search holding token 99 raises at its start, as does
    that sentence alone. Counts the searches it starts and the rows of each decoder call."""
    device_type = "cpu"

    def __init__(self):
        self.searches, self.rows_per_step = 0, []

    def running_batch(self, group):
        return EchoTranslationBatch(self.rows_per_step)

    def encode_sources(self, src_ids, options):
        self.searches += 1
        return src_ids

    def search(self, src_ids, options, terms=None):
        if any(99 in s for s in src_ids):
            raise RuntimeError("engine failure")
        return [[SimpleNamespace(tokens=list(s), score=-1.0)] for s in src_ids]


def echo_job(ids: list[list[int]], request_id: str, number: int = 0) -> Job:
    return Job(request_id, "echo", "de", "en", SearchOptions(), ids, [(0, len(ids))], [[]], time.monotonic(),
               number, request_cost(sum(map(len, ids)), 4))


def drain(s: TranslationScheduler) -> dict:
    """Steps to the end, as the worker loop does: every request taken meanwhile."""
    done = {}
    while s.busy:
        s.step()
        done.update(s.take_finished())
    return done


def test_a_failing_sentence_fails_its_request_alone():
    """A search that raises is run again one sentence at a time, and only the request whose sentence fails
    is answered 500; a Failure admitted with them (a bad request) is answerable at once."""
    s = TranslationScheduler({"echo": EchoTranslator()}, CancelBoard(), 8192)
    bad = Failure(400, "unsupported_language_pair", "no model")
    s.admit({"a": echo_job([[5, 6]], "a"), "bad": bad, "b": echo_job([[7], [99]], "b"), "c": echo_job([[8]], "c")})
    assert s.take_finished() == [("bad", bad)] and len(s.waiting) == 4
    done = drain(s)
    assert done["b"].failure == Failure(500, "internal_error", "the engine failed on this text")
    assert [h[0].tokens for h in done["a"].hyps] == [[5, 6]] and done["a"].failure is None
    assert [h[0].tokens for h in done["c"].hyps] == [[8]] and done["c"].failure is None
    assert not s.jobs


def test_a_request_whose_client_went_away_leaves_the_waiting_list_and_the_running_batch():
    board, echo = CancelBoard(), EchoTranslator()
    s = TranslationScheduler({"echo": echo}, board, 8192)
    s.admit({"gone": echo_job([[5]], "gone", number=7), "here": echo_job([[6, 6, 6, 6]], "here", number=8)})
    board.cancel(7)
    s.step()                                   # "here" joins and steps without it
    ((key, job),) = s.take_finished()
    assert key == "gone" and job.failure.status == 499 and [r.key for r in s.running] == ["here"]
    assert echo.rows_per_step == [1]
    board.cancel(8)
    s.step()                                   # its rows leave before the next decoder call
    assert [(key, job.failure.status) for key, job in s.take_finished()] == [("here", 499)]
    assert echo.rows_per_step == [1] and not s.busy and s.used == 0
    board.cancel(9)
    s.admit({"later": echo_job([[5]], "later", number=9)})
    s.step()
    assert [(key, job.failure.status) for key, job in s.take_finished()] == [("later", 499)]
    assert echo.searches == 1 and not s.busy


def test_abandon_forgets_everything_and_closes_started_searches(engine):
    """Beam searches (pooled) and a greedy one (a coroutine of its own): all end, every block goes back."""
    s = scheduler_for(engine)
    before = engine.pool.lent_bytes
    s.admit({"a": large(engine, 1, 4, "a"), "g": translation(engine, ["Guten Morgen."], 1, "g")})
    s.step()
    started = [r.member for r in s.running]
    assert len(started) == 2 and engine.pool.lent_bytes > before
    s.abandon()
    assert not s.busy and not s.jobs and s.take_finished() == []
    assert all(m.want is None for m in started) and engine.pool.lent_bytes == before
    assert all(m.search.gi_frame is None for m in started if hasattr(m, "search"))


# --- the scheduler's metrics (issue 36), on models/de-en and models/lm-small -----------------------------

def sample(name: str, **labels) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


def scheduler_samples(endpoint: str, model: str) -> dict[str, float]:
    labels = {"endpoint": endpoint, "model": model}
    return {"running": sample("transerve_scheduler_running_rows", **labels),
            "waiting": sample("transerve_scheduler_waiting_requests", endpoint=endpoint),
            "cache": sample("transerve_cache_bytes", **labels),
            "calls": sample("transerve_step_batch_rows_count", **labels),
            "rows": sample("transerve_step_batch_rows_sum", **labels)}


def test_translation_scheduler_metrics_follow_its_rows_requests_cache_and_decoder_calls(engine):
    """A budget that fits one sentence at beam 4: while it decodes (4 rows, its cache held) the other request
    waits for room; at the end nothing runs, waits or holds cache."""
    s = scheduler_for(engine)
    name = engine.package.name
    a, b = translation(engine, ["Das geht zu weit."], 4, "a"), translation(engine, ["Guten Morgen."], 2, "b")
    s.max_batch_tokens = s.sentence_cost(a, 0)[0]
    before = scheduler_samples("translate", name)
    s.admit({"a": a, "b": b})
    assert scheduler_samples("translate", name)["waiting"] == 2
    s.step()
    now = scheduler_samples("translate", name)
    assert now["running"] == 4 and now["waiting"] == 1 and now["cache"] > before["cache"]
    assert now["calls"] == before["calls"] + 1 and now["rows"] == before["rows"] + 4
    drain(s)
    end = scheduler_samples("translate", name)
    assert end["running"] == 0 and end["waiting"] == 0 and end["cache"] == before["cache"]
    assert end["calls"] > now["calls"] + 2
