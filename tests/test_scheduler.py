"""The worker's scheduler (service/scheduler.py), driven directly as the worker loop drives it, without a
server or LitServe: fairness between translation requests (issue 27: a one-word request beside large ones
is scheduled first and answered first, with the same answer it gets alone) on models/de-en, and what a
small fake engine shows plainly: a request failing alone, a client that went away. What fairness buys in
latency is measured by benchmarks/fairness.py, not asserted here."""

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from service.cancel import CancelBoard
from service.config import Settings
from service.engine import Engine
from service import scheduler as scheduling
from service.scheduler import Failure, Job, TranslationScheduler, cost_tier, request_cost
from service.shared.options import SearchOptions
from service.text import split_sentences

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


# --- translation: tiers and fairness --------------------------------------------------------------------

def test_tiers_double():
    assert [cost_tier(c) for c in (1, 1024, 1025, 2048, 2049, 32768)] == [0, 0, 1, 1, 2, 5]


def test_a_small_request_queued_beside_two_large_ones_is_in_the_first_engine_call(engine):
    s = scheduler_for(engine)
    s.admit({"a": large(engine, 4, 8, "a"), "b": large(engine, 4, 8, "b"), "s": small(engine, "s")})
    first = s.batches[0]
    assert {s.jobs[j].request_id for j, _ in first.rows} == {"s"}
    assert [len(eb.rows) for eb in s.batches if any(s.jobs[j].request_id == "s" for j, _ in eb.rows)] == [1]


def test_a_small_request_joining_a_plan_under_way_goes_next_and_answers_as_alone(engine):
    """Two large requests started; a one-word request admitted between two decoder steps runs at the
    next step and is answered first; every sentence's answer is the one it gets alone."""
    s = scheduler_for(engine)
    s.admit({"a": large(engine, 2, 8, "a"), "b": large(engine, 2, 8, "b")})
    for _ in range(3):
        s.step()
    paused = s.batches[0]
    assert paused.steps is not None and s.take_finished() == []
    s.admit({"s": small(engine, "s")})
    assert s.batches[0].rows == [("s", 0)] and s.batches[1] is paused
    answered = []
    while s.busy:
        s.step()
        answered += s.take_finished()
    assert answered[0][0] == "s" and sorted(key for key, _ in answered) == ["a", "b", "s"] and not s.jobs
    for _, job in answered:
        alone = engine.search(job.sentences, job.options)
        assert [h[0].tokens for h in job.hyps] == [h[0].tokens for h in alone]


def test_it_wants_new_requests_only_while_a_batch_above_tier_0_runs(engine):
    """The worker loop looks at its queue between steps only when a request arriving now would overtake."""
    s = scheduler_for(engine)
    assert not s.wants_new_requests()
    s.admit({"s": small(engine, "s")})
    assert not s.wants_new_requests()       # tier 0: a request arriving now would wait its turn anyway
    s.abandon()
    s.admit({"a": large(engine, 2, 8, "a")})
    assert s.batches[0].tier > 0 and s.wants_new_requests()
    s.abandon()


def test_a_paused_large_batch_gets_steps_back_under_a_steady_stream_of_small_ones(engine):
    """Bursts of small requests go first; once they have run LEND_S more than the large batch they paused,
    it gets a step between theirs (it would otherwise wait for its timeout under a steady stream)."""
    s = scheduler_for(engine)
    s.admit({"a": large(engine, 2, 8, "a")})
    s.step()
    paused = s.batches[0]
    s.admit({f"s{i}": small(engine, f"s{i}") for i in range(3)})
    first_small = s.batches[0]
    s.step()
    assert first_small.steps is not None and s.batches[1] is paused and 0 < s.lent < scheduling.LEND_S
    s.lent = scheduling.LEND_S + 0.01         # as after half a second of small requests
    before = s.lent
    s.step()                                   # the large batch's step: it pays back
    assert s.lent < before and s.batches[0] is first_small
    s.abandon()


def test_on_cpu_an_engine_batch_holds_at_most_cpu_batch_rows(engine):
    """A decoder step, what an overtaking request may wait for, stays short: rows = sentences x beams."""
    s = scheduler_for(engine)
    s.admit({"a": large(engine, 8, 16, "a")})
    rows = [len(eb.rows) * 16 for eb in s.batches]
    assert max(rows) <= scheduling.CPU_BATCH_ROWS and sum(rows) == 16 * len(s.jobs["a"].sentences)


def test_max_batch_tokens_cuts_engine_batches(engine):
    """--max-batch-tokens bounds an engine batch's padded source tokens times its beams."""
    s = TranslationScheduler({engine.package.name: engine}, CancelBoard(), max_batch_tokens=256)
    s.admit({"a": large(engine, 2, 4, "a")})
    for eb in s.batches:
        assert max(map(len, eb.src_ids)) * len(eb.rows) <= 256 // 4


# --- translation: failures and cancellation, on a fake engine ------------------------------------------

class EchoTranslator:
    """A translation engine that echoes each source; a batch holding token 99 raises, as does that sentence
    alone. Counts the searches it starts."""
    device_type = "cpu"

    def __init__(self):
        self.searches = 0

    def search_steps(self, src_ids, options):
        self.searches += 1
        if any(99 in s for s in src_ids):
            raise RuntimeError("engine failure")
        yield None
        return [[SimpleNamespace(tokens=list(s), score=-1.0)] for s in src_ids]

    def search(self, src_ids, options):
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
    """The engine batch raises: it is run again one sentence at a time, and only the request whose sentence
    fails is answered 500; a Failure admitted with them (a bad request) is answerable at once."""
    s = TranslationScheduler({"echo": EchoTranslator()}, CancelBoard(), 8192)
    bad = Failure(400, "unsupported_language_pair", "no model")
    s.admit({"a": echo_job([[5, 6]], "a"), "bad": bad, "b": echo_job([[7], [99]], "b"), "c": echo_job([[8]], "c")})
    assert s.take_finished() == [("bad", bad)] and len(s.batches) == 1
    done = drain(s)
    assert done["b"].failure == Failure(500, "internal_error", "the engine failed on this text")
    assert [h[0].tokens for h in done["a"].hyps] == [[5, 6]] and done["a"].failure is None
    assert [h[0].tokens for h in done["c"].hyps] == [[8]] and done["c"].failure is None
    assert not s.jobs


def test_a_request_whose_client_went_away_is_dropped_before_its_engine_batch_starts():
    board, echo = CancelBoard(), EchoTranslator()
    s = TranslationScheduler({"echo": echo}, board, 8192)
    s.admit({"gone": echo_job([[5]], "gone", number=7), "here": echo_job([[6]], "here", number=8)})
    board.cancel(7)
    s.step()                                   # the engine batch starts without it
    ((key, job),) = s.take_finished()
    assert key == "gone" and job.failure.status == 499 and s.batches[0].rows == [("here", 0)]
    s.step()
    assert [(key, job.failure) for key, job in s.take_finished()] == [("here", None)]
    board.cancel(9)
    s.admit({"later": echo_job([[5]], "later", number=9)})
    s.step()
    assert [(key, job.failure.status) for key, job in s.take_finished()] == [("later", 499)]
    assert echo.searches == 1 and not s.busy


def test_abandon_forgets_everything_and_closes_started_searches(engine):
    s = scheduler_for(engine)
    s.admit({"a": large(engine, 1, 4, "a")})
    s.step()
    started = s.batches[0].steps
    s.abandon()
    assert not s.busy and not s.jobs and s.take_finished() == [] and started.gi_frame is None
