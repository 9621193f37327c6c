"""The translation workers' batch collector (service/litserve_bridge.py), on a real queue with LitServe's
own queue transport: what it takes, when it stops waiting, and what it tells the HTTP process."""

import queue
import threading
import time

import pytest
from litserve.loops.base import _SENTINEL_VALUE, _StopLoopError
from litserve.transport.process_transport import MPQueueTransport
from litserve.utils import LitAPIStatus

from service import litserve_bridge
from service.litserve_bridge import PromptBatchedLoop, collect
from service.cancel import CancelBoard
from service.config import Settings
from service.translate_api import TranslateAPI


def make(max_batch_size=4, batch_timeout_ms=0.0, request_timeout=60.0):
    api = TranslateAPI(Settings(max_batch_size=max_batch_size, batch_timeout_ms=batch_timeout_ms), CancelBoard())
    api.request_timeout = request_timeout          # LitServer sets this from --request-timeout-s
    loop = PromptBatchedLoop()
    loop._restart_workers = True                   # as in our server: START tells which worker holds a request
    responses = queue.Queue()
    return api, loop, queue.Queue(), MPQueueTransport(None, [responses]), responses


def item(uid, queued_at=None):
    return (0, uid, time.monotonic() if queued_at is None else queued_at, {"uid": uid})


def test_the_translate_api_uses_this_collector():
    api, *_ = make()
    assert isinstance(api.loop, PromptBatchedLoop)


def test_takes_everything_already_queued_up_to_the_batch_size_without_waiting():
    api, loop, requests, transport, responses = make(max_batch_size=4, batch_timeout_ms=0)
    for i in range(6):
        requests.put(item(f"r{i}"))
    payloads, timed_out = collect(loop, api, requests, transport)
    assert [p[1] for p in payloads] == ["r0", "r1", "r2", "r3"] and timed_out == []
    assert payloads[0] == (0, "r0", {"uid": "r0"})
    payloads, _ = collect(loop, api, requests, transport)
    assert [p[1] for p in payloads] == ["r4", "r5"]
    starts = [responses.get_nowait() for _ in range(6)]
    assert [s[0] for s in starts] == [f"r{i}" for i in range(6)]
    assert all(s[1][1] == LitAPIStatus.START for s in starts)


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
