"""A request's cost bound (--max-request-cost) and fairness between requests in a translation worker
(issue 27): a large request is refused with the limit in its error, one just under it is served, and a
one-word request beside large ones is scheduled first and answered first, with the same answer it gets
alone. What this buys in latency is measured by benchmarks/fairness.py, not asserted here."""

import queue
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from litserve.transport.process_transport import MPQueueTransport
from litserve.utils import LitAPIStatus

from service.cancel import CancelBoard
from service.config import Settings, parse_settings
from service.engine import Engine
from service.litserve_bridge import PromptBatchedLoop
from service import translate_api
from service.translate_api import Job, TranslateAPI, cost_tier, request_cost

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from fairness import large_texts  # noqa: E402
from conftest import start_server, stop_server  # noqa: E402

DE_EN, LM = ROOT / "models" / "de-en", ROOT / "models" / "lm-small"
SMALL = {"texts": ["Hallo"], "source_lang": "de", "target_lang": "en", "number": 0}


@pytest.fixture(scope="module")
def engine():
    return Engine(DE_EN, device="cpu", intra_op_threads=1)


def make_api(engine, **settings) -> TranslateAPI:
    api = TranslateAPI(Settings(**settings), CancelBoard())
    api.engines = {engine.package.name: engine}
    api.routes = {("de", "en"): engine.package.name}
    return api


def large(n_texts: int, beam: int, request_id: str) -> dict:
    return {"texts": large_texts(n_texts), "source_lang": "de", "target_lang": "en", "beam_size": beam,
            "request_id": request_id, "number": 0}


def cost_of(engine, request) -> int:
    api = make_api(engine)
    return api.decode_request(request).cost


# --- the cost bound ---------------------------------------------------------------------------------

def test_the_cost_is_source_tokens_times_beam(engine):
    request = large(2, 8, "r")
    job = make_api(engine).decode_request(request)
    assert isinstance(job, Job) and job.cost == request_cost(sum(map(len, job.sentences)), 8) == 8 * sum(
        map(len, job.sentences))


def test_over_the_cost_bound_is_413_with_the_limit_and_just_under_is_served(engine):
    request = large(1, 4, "r")
    cost = cost_of(engine, request)
    refused = make_api(engine, max_request_cost=cost - 1).decode_request(request).to_dict()
    assert refused["status"] == 413 and refused["error"]["type"] == "request_too_costly"
    assert refused["error"]["limit"] == cost - 1 and f"costs {cost}" in refused["error"]["message"]
    api = make_api(engine, max_request_cost=cost)
    job = api.decode_request(request)
    assert isinstance(job, Job)
    out = api.encode_response(api.unbatch(api.predict(api.batch([job])))[0])
    assert out["translations"][0]["text"] and "error" not in out


def test_the_default_bound_lets_the_largest_default_request_through_and_refuses_the_issues():
    s = Settings()
    assert request_cost(s.max_request_tokens, 4) <= s.max_request_cost      # any token limit at the default beam
    assert request_cost(8152, 16) > s.max_request_cost                      # 64 x 341 characters at beam 16


def test_the_bound_is_a_flag_with_an_environment_twin(monkeypatch):
    assert parse_settings(["--max-request-cost", "1000"]).max_request_cost == 1000
    monkeypatch.setenv("TRANSERVE_MAX_REQUEST_COST", "2000")
    assert parse_settings([]).max_request_cost == 2000
    with pytest.raises(SystemExit):
        parse_settings(["--max-request-cost", "0"])


def test_over_http_translate_and_generate_answer_413_with_the_limit():
    proc, url = start_server(DE_EN, "--model", str(LM), "--max-request-cost", "400")
    try:
        body = {"text": ["Das Haus ist klein. Der Hund schläft."] * 3, "source_lang": "de", "target_lang": "en"}
        r = httpx.post(url + "/translate", json=body | {"beam_size": 16}, timeout=60)
        assert r.status_code == 413, r.text
        err = r.json()
        assert err["error"]["type"] == "request_too_costly" and err["error"]["limit"] == 400 and err["request_id"]
        assert "the limit is 400" in err["error"]["message"]
        r = httpx.post(url + "/translate", json=body | {"beam_size": 2}, timeout=60)
        assert r.status_code == 200 and len(r.json()["translations"]) == 3, r.text
        r = httpx.post(url + "/generate", json={"prompt": "Die Datei", "max_new_tokens": 100, "beam_size": 8,
                                                "temperature": 0}, timeout=60)
        assert r.status_code == 413 and r.json()["error"]["limit"] == 400, r.text
        r = httpx.post(url + "/generate", json={"prompt": "Die Datei", "max_new_tokens": 5}, timeout=60)
        assert r.status_code == 200, r.text
    finally:
        stop_server(proc)


# --- fairness -----------------------------------------------------------------------------------------

def test_tiers_double():
    assert [cost_tier(c) for c in (1, 1024, 1025, 2048, 2049, 32768)] == [0, 0, 1, 1, 2, 5]


def test_a_small_request_queued_beside_two_large_ones_is_in_the_first_engine_call(engine):
    api = make_api(engine)
    jobs = [api.decode_request(r) for r in (large(4, 8, "a"), large(4, 8, "b"), SMALL | {"request_id": "s"})]
    plan = api.batch(jobs)
    first = plan.batches[0]
    assert {plan.jobs[j].request_id for j, _ in first.rows} == {"s"}
    assert [len(eb.rows) for eb in plan.batches if any(plan.jobs[j].request_id == "s" for j, _ in eb.rows)] == [1]


def test_a_small_request_joining_a_plan_under_way_goes_next_and_answers_as_alone(engine):
    """Two large requests started; a one-word request admitted between two decoder steps runs at the
    next step and is answered first; every sentence's answer is the one it gets alone."""
    api = make_api(engine)
    plan = api.batch([api.decode_request(r) for r in (large(2, 8, "a"), large(2, 8, "b"))])
    for _ in range(3):
        api.advance(plan)
    paused = plan.batches[0]
    assert paused.steps is not None and api.take_finished(plan) == []
    (key,) = api.admit(plan, [api.decode_request(SMALL | {"request_id": "s"})])
    assert plan.batches[0].rows == [(key, 0)] and plan.batches[1] is paused
    answered = []
    while plan.batches:
        api.advance(plan)
        answered += api.take_finished(plan)
    assert answered[0] == key and sorted(answered) == sorted(plan.jobs)
    for job in plan.jobs.values():
        alone = engine.search(job.sentences, job.options)
        assert [h[0].tokens for h in job.hyps] == [h[0].tokens for h in alone]


def test_the_worker_loop_answers_a_small_request_before_the_large_ones_taken_before_it(engine):
    api = make_api(engine, max_batch_size=8)
    api.request_timeout = 60.0
    loop = PromptBatchedLoop()
    loop._restart_workers = True
    requests, responses = queue.Queue(), queue.Queue()
    transport = MPQueueTransport(None, [responses])
    requests.put((0, "small", time.monotonic(), SMALL | {"request_id": "s"}))  # queued meanwhile
    payloads = [(0, "large-a", large(2, 8, "a")), (0, "large-b", large(2, 8, "b"))]
    worker = threading.Thread(target=loop._serve, args=(api, requests, transport, payloads))
    worker.start()
    worker.join(timeout=600)
    answers = []
    while not responses.empty():
        uid, (body, status, *_) = responses.get_nowait()
        if status == LitAPIStatus.OK:
            answers.append((uid, body))
    assert [uid for uid, _ in answers] == ["small", "large-a", "large-b"] or \
        [uid for uid, _ in answers] == ["small", "large-b", "large-a"], [uid for uid, _ in answers]
    assert all("translations" in body for _, body in answers)


def test_a_paused_large_batch_gets_steps_back_under_a_steady_stream_of_small_ones(engine):
    """Bursts of small requests go first; once they have run LEND_S more than the large batch they paused,
    it gets a step between theirs (it would otherwise wait for its timeout under a steady stream)."""
    api = make_api(engine)
    plan = api.batch([api.decode_request(large(2, 8, "a"))])
    api.advance(plan)
    paused = plan.batches[0]
    api.admit(plan, [api.decode_request(SMALL | {"request_id": f"s{i}"}) for i in range(3)])
    small = plan.batches[0]
    api.advance(plan)
    assert small.steps is not None and plan.batches[1] is paused and 0 < plan.lent < translate_api.LEND_S
    plan.lent = translate_api.LEND_S + 0.01      # as after half a second of small requests
    before = plan.lent
    api.advance(plan)                             # the large batch's step: it pays back
    assert plan.lent < before and plan.batches[0] is small


def test_on_cpu_an_engine_batch_holds_at_most_cpu_batch_rows(engine):
    """A decoder step, what an overtaking request may wait for, stays short: rows = sentences x beams."""
    api = make_api(engine)
    plan = api.batch([api.decode_request(large(8, 16, "a"))])
    rows = [len(eb.rows) * 16 for eb in plan.batches]
    assert max(rows) <= translate_api.CPU_BATCH_ROWS and sum(rows) == 16 * len(plan.jobs[0].sentences)
