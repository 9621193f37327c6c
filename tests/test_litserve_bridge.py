"""The worker side of service/worker/litserve_bridge.py, on a real queue with LitServe's own queue transport: the
batch collector (what it takes, when it stops waiting, what it tells the HTTP process) and the loop that
runs a LitAPI's scheduler (each request answered when done, the requests that arrive meanwhile joining;
a generation request's events streamed; a scheduler that raises failing its requests, not the loop)."""

import logging
import json
import pickle
import queue
import sys
import threading
import time
from pathlib import Path

import pytest
from litserve.loops.base import _SENTINEL_VALUE, _StopLoopError
from litserve.transport.process_transport import MPQueueTransport
from litserve.utils import LitAPIStatus, LoopResponseType

from service.worker import litserve_bridge
from service.worker.cancel import CancelBoard
from service.config import Settings
from service.inference.engine import Engine
from service.worker.generate_api import GenerateAPI
from service.worker.answers import unbundled
from service.worker.litserve_bridge import SchedulerLoop, collect
from service.worker.translate_api import TranslateAPI
from service.http.gateway import generate_payload, translate_payload
from service.shared.schemas import GenerateRequest
from service.shared.schemas import TranslateRequest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from fairness import large_texts  # noqa: E402
from test_generate_scheduler import EchoLM  # noqa: E402

DE_EN = ROOT / "models" / "de-en"
SMALL = translate_payload(TranslateRequest(text="Hallo", source_lang="de", target_lang="en"), ["Hallo"],
                       Settings().max_output_tokens) | {"number": 0}


def generation(**fields) -> dict:
    """A generate worker's payload as the Gateway makes it."""
    return generate_payload(GenerateRequest(**fields), Settings().max_output_tokens)


def make(max_batch_size=4, batch_timeout_ms=0.0, request_timeout=60.0):
    api = TranslateAPI(Settings(max_batch_size=max_batch_size, batch_timeout_ms=batch_timeout_ms),
                       CancelBoard(endpoints=("translate", "generate")))
    api.request_timeout = request_timeout          # LitServer sets this from --request-timeout-s
    loop = SchedulerLoop()
    loop._restart_workers = True                   # as in our server (LitServe's loops would send START then)
    responses = queue.Queue()
    return api, loop, queue.Queue(), MPQueueTransport(None, [responses]), responses


def item(uid, queued_at=None):
    return (0, uid, time.monotonic() if queued_at is None else queued_at, {"uid": uid})


def test_the_translate_api_uses_this_collector():
    api, *_ = make()
    assert isinstance(api.loop, SchedulerLoop)
    assert isinstance(GenerateAPI(Settings(), CancelBoard()).loop, SchedulerLoop)


def test_takes_everything_already_queued_up_to_the_batch_size_without_waiting():
    api, loop, requests, transport, responses = make(max_batch_size=4, batch_timeout_ms=0)
    for i in range(6):
        requests.put(item(f"r{i}"))
    payloads, timed_out = collect(loop, api, requests, transport)
    assert [p[1] for p in payloads] == ["r0", "r1", "r2", "r3"] and timed_out == []
    assert payloads[0] == (0, "r0", {"uid": "r0"})
    payloads, _ = collect(loop, api, requests, transport)
    assert [p[1] for p in payloads] == ["r4", "r5"]
    assert responses.empty()     # no START: nothing in an HTTP process reads which worker took a request


@pytest.mark.parametrize("window_ms,together", [(0, False), (3000, True)])
def test_after_the_first_request_it_waits_only_for_the_window(window_ms, together):
    """Window 0: a request arriving 0.3 s after the first is left for the next batch. A 3 s window:
    the batch waits for it (and no longer than that: the batch size is not reached)."""
    api, loop, requests, transport, _ = make(max_batch_size=8, batch_timeout_ms=window_ms)
    requests.put(item("first"))
    late = threading.Timer(0.3, lambda: requests.put(item("late")))
    late.start()
    try:
        payloads, _ = collect(loop, api, requests, transport)
    finally:
        late.join()
    assert [p[1] for p in payloads] == (["first", "late"] if together else ["first"])
    if not together:
        assert [p[1] for p in collect(loop, api, requests, transport)[0]] == ["late"]


def test_an_idle_worker_blocks_until_a_request_comes(monkeypatch):
    monkeypatch.setattr(litserve_bridge, "IDLE_WAKE_S", 5.0)
    api, loop, requests, transport, _ = make()
    threading.Timer(0.2, lambda: requests.put(item("r0"))).start()
    payloads, _ = collect(loop, api, requests, transport)
    assert [p[1] for p in payloads] == ["r0"]


def test_nothing_queued_returns_empty_after_the_idle_wake(monkeypatch):
    monkeypatch.setattr(litserve_bridge, "IDLE_WAKE_S", 0.05)
    api, loop, requests, transport, _ = make()
    assert collect(loop, api, requests, transport) == ([], [])


def test_requests_older_than_the_request_timeout_are_set_aside():
    api, loop, requests, transport, _ = make(request_timeout=1.0)
    requests.put(item("stale", queued_at=time.monotonic() - 5))
    requests.put(item("fresh"))
    payloads, timed_out = collect(loop, api, requests, transport)
    assert [p[1] for p in payloads] == ["fresh"] and timed_out == [(0, "stale")]


def test_the_shutdown_sentinel_stops_the_loop():
    api, loop, requests, transport, _ = make()
    requests.put(item("r0"))
    requests.put(_SENTINEL_VALUE)
    with pytest.raises(_StopLoopError):
        collect(loop, api, requests, transport)


def test_the_boards_count_of_queued_requests_comes_down_as_they_are_taken():
    """The HTTP side counts each request it queues on the board; the collector counts it down as it takes it,
    so a busy worker looks at the queue (a round trip to LitServe's manager) only when something is there."""
    api, loop, requests, transport, _ = make(max_batch_size=2)
    for i in range(3):
        api.board.queued("translate", +1)
        requests.put(item(f"r{i}"))
    assert api.board.queued("translate") == 3 and litserve_bridge.queued(api) == 3
    collect(loop, api, requests, transport)
    assert api.board.queued("translate") == 1
    collect(loop, api, requests, transport, wait=False)
    assert api.board.queued("translate") == 0 and api.board.queued("generate") == 0


class CountingQueue(queue.Queue):
    def __init__(self):
        super().__init__()
        self.gets = 0

    def get(self, *args, **kwargs):
        self.gets += 1
        return super().get(*args, **kwargs)


def test_a_busy_worker_asks_the_queue_no_more_often_than_the_board_counts_requests():
    """Between steps the collector takes as many requests as the board counts queued and stops there: one more ask
    would be a round trip to the manager process only to hear the queue is empty. A count that is off costs at
    most a look later: fewer queued than counted stops at the first empty ask, more waits for the next look."""
    api, loop, _, transport, _ = make(max_batch_size=8)
    requests = CountingQueue()
    for i in range(3):
        requests.put(item(f"r{i}"))
    payloads, _ = collect(loop, api, requests, transport, wait=False, expect=2)
    assert [p[1] for p in payloads] == ["r0", "r1"] and requests.gets == 2
    payloads, _ = collect(loop, api, requests, transport, wait=False, expect=3)
    assert [p[1] for p in payloads] == ["r2"] and requests.gets == 4
    assert collect(loop, api, requests, transport, wait=False, expect=0) == ([], []) and requests.gets == 5


# --- the loop around the scheduler ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine():
    return Engine(DE_EN, device="cpu", intra_op_threads=1)


def large(n_texts: int, beam: int, request_id: str) -> dict:
    texts = large_texts(n_texts)
    body = TranslateRequest(text=texts, source_lang="de", target_lang="en", beam_size=beam)
    return translate_payload(body, texts, Settings().max_output_tokens) | {"request_id": request_id, "number": 0}


def answers(loop: SchedulerLoop, responses: queue.Queue) -> list[tuple[str, object, LitAPIStatus]]:
    """(uid, body, status) of every response sent (the loop's sender thread done first), in order."""
    loop._outbox_flush()
    out = []
    while not responses.empty():
        for uid, (body, status, *_) in unbundled(responses.get_nowait()):
            out.append((uid, body, status))
    return out


def test_the_worker_loop_takes_a_small_request_that_arrives_meanwhile_ahead_of_waiting_work(engine):
    """Two large requests fill the running batch's budget; a one-word request queued meanwhile is taken between
    steps and joins ahead of the large ones' waiting sentences (as room frees: running rows are not paused),
    so it is answered before the large request whose sentences wait."""
    api, loop, requests, transport, responses = make(max_batch_size=8)
    api.use_engines({engine.package.name: engine})
    api.board.queued("translate", +1)                  # as the HTTP side counts what it queues
    requests.put((0, "small", time.monotonic(), SMALL | {"request_id": "s", "received": time.monotonic()}))
    payloads = [(0, "large-a", large(2, 8, "a")), (0, "large-b", large(2, 8, "b"))]
    worker = threading.Thread(target=loop._serve, args=(api, requests, transport, payloads))
    worker.start()
    worker.join(timeout=600)
    answered = [(uid, body) for uid, body, status in answers(loop, responses) if status == LitAPIStatus.OK]
    order = [uid for uid, _ in answered]
    assert sorted(order) == ["large-a", "large-b", "small"] and order.index("small") < order.index("large-b"), order
    assert all("translations" in body for _, body in answered)


def test_a_generation_request_is_streamed_step_by_step_and_finished():
    _, loop, requests, transport, responses = make()
    api = GenerateAPI(Settings(), CancelBoard())
    api.use_engines({"lm": EchoLM()})
    payloads = [(0, "ok", generation(prompt="abc", temperature=0, max_new_tokens=8, stop=["c"])),
                (0, "bad", generation(prompt="abc" * 30))]     # beyond EchoLM's 64 positions
    assert loop._serve(api, requests, transport, payloads)
    sent = answers(loop, responses)
    events = {uid: [json.loads(body) for u, body, status in sent if u == uid and status == LitAPIStatus.OK]
              for uid in ("ok", "bad")}
    assert events["bad"] == [{"error": {"type": "too_many_tokens", "message": events["bad"][0]["error"]["message"],
                                        "limit": 64}, "status": 413}]
    assert "".join(p["text"] for e in events["ok"] for p in e["pieces"]) == "ab"
    assert events["ok"][-1]["done"]["choices"] == [{"index": 0, "finish_reason": "stop", "tokens": 3}]
    finished = [uid for uid, _, status in sent if status == LitAPIStatus.FINISH_STREAMING]
    assert sorted(finished) == ["bad", "ok"] and sent[-1][2] == LitAPIStatus.FINISH_STREAMING


def test_a_scheduler_that_raises_fails_its_requests_and_the_loop_goes_on(engine, monkeypatch):
    api, loop, requests, transport, responses = make()
    api.use_engines({engine.package.name: engine})
    monkeypatch.setattr(api.scheduler, "step", lambda: 1 / 0)
    payloads = [(0, "a", SMALL | {"request_id": "a"}), (0, "b", SMALL | {"request_id": "b", "texts": ["Welt"]})]
    assert loop._serve(api, requests, transport, payloads)
    sent = answers(loop, responses)
    assert [(uid, status) for uid, _, status in sent] == [("a", LitAPIStatus.ERROR), ("b", LitAPIStatus.ERROR)]
    assert isinstance(pickle.loads(sent[0][1]), ZeroDivisionError)
    assert not api.scheduler.busy and not api.scheduler.jobs


def test_answers_leave_in_the_order_handed_over_and_all_before_the_loop_returns():
    """The worker's sender thread (put_response) keeps the order, and the loop sends whatever it holds before it
    returns: a stopping server's last answers are not lost."""
    api, loop, requests, transport, responses = make()
    for i in range(200):
        loop.put_response(transport, 0, f"r{i}", i, LitAPIStatus.OK, LoopResponseType.STREAMING)
    requests.put(_SENTINEL_VALUE)        # the server stops: the loop returns at its next look at the queue
    loop(api, "cpu", 0, requests, transport, {}, None)
    sent = [uid for uid, _, _ in answers(loop, responses)]
    assert sent == [f"r{i}" for i in range(200)]


def test_what_one_step_answers_goes_out_as_one_message():
    """Three streams running together: each step's events travel as one message (a bundle), not one each (each
    message is a round trip through LitServe's manager process); unbundled, every stream's events are in order."""
    _, loop, requests, transport, responses = make()
    api = GenerateAPI(Settings(), CancelBoard())
    api.use_engines({"lm": EchoLM()})
    payloads = [(0, uid, generation(prompt=prompt, temperature=0, max_new_tokens=8))
                for uid, prompt in (("a", "abcd"), ("b", "bcde"), ("c", "cdef"))]
    assert loop._serve(api, requests, transport, payloads)
    loop._outbox_flush()
    messages = [responses.get_nowait() for _ in range(responses.qsize())]
    sent = [m for message in messages for m in unbundled(message)]
    assert len(messages) < len(sent)
    assert any({uid for uid, _ in unbundled(m)} == {"a", "b", "c"} for m in messages)
    for uid, prompt in (("a", "abcd"), ("b", "bcde"), ("c", "cdef")):
        events = [body for u, (body, status, *_) in sent if u == uid and status == LitAPIStatus.OK]
        assert "".join(p["text"] for e in events for p in json.loads(e)["pieces"]) == prompt
        assert [status for u, (_, status, *_) in sent if u == uid][-1] == LitAPIStatus.FINISH_STREAMING


def test_the_monitors_crash_on_a_manager_gone_is_dropped_and_any_other_is_logged():
    from service.worker.litserve_bridge import manager_gone

    def record(exc: BaseException) -> logging.LogRecord:
        try:
            raise exc
        except BaseException:
            return logging.LogRecord("litserve.server", logging.ERROR, __file__, 1, "Monitoring worker crashed",
                                     None, sys.exc_info())

    assert not manager_gone(record(BrokenPipeError(32, "Broken pipe")))
    assert not manager_gone(record(EOFError()))
    assert manager_gone(record(RuntimeError("a real fault")))
    other = logging.LogRecord("litserve.server", logging.ERROR, __file__, 1, "something else", None, None)
    assert manager_gone(other)
