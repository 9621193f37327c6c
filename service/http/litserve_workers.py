"""The HTTP process's way to the inference workers (`Workers`): a request sent (worker/request_sender.py), its
answer or its stream's events awaited, the worker's death, the client's going and the deadline raced; `ready` and
`stop` for the server's life. One side of the boundary LitServe draws between HTTP processes and workers; the other
is worker/litserve_bridge.py's loop. Both touch LitServe's internals (litserve==0.2.19 is pinned for them).

LitServe's timeout only evicts requests still queued, and its monitor does not reach an HTTP process's requests when
a worker dies: without the two bounds in `Workers.call` such a request would wait forever.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import os
import pickle
import time
from collections import deque
from typing import AsyncIterator

import litserve as ls
from fastapi import Request
from litserve import LitAPI
from litserve.server import RegularRequestHandler, StreamingRequestHandler
from litserve.utils import LitAPIStatus, ResponseBufferItem, WorkerSetupStatus
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import ApiError, queue_timeout, worker_failed
from .uvicorn_bridge import CLIENT_GONE
from ..metrics import labelled, metrics
from ..worker.cancel import CancelBoard
from ..worker.litserve_bridge import IDLE_WAKE_S
from ..worker.request_sender import RequestSender
from ..worker.traces import carry

# A request's key in the response buffer and at its worker: this process's id and a count, which cost less than
# the uuid4 LitServe draws (an os.urandom each).
_uids = itertools.count()
_pid = [f"{os.getpid()}."]
os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, f"{os.getpid()}."))   # no getpid() a request

# What a request is lost with (Workers.holder): (endpoint, the worker it was sent to, that worker id's listener count
# as it was sent), or (endpoint, None, None) on LitServe's queues, where any worker of the endpoint may hold it.
Holder = tuple[str, int | None, int | None]

LOST_HOLD_S = IDLE_WAKE_S + 0.5   # new requests wait this long after a worker's loss is seen (Workers._enqueue)


class Settles:
    """What LitServe's consumer sets when an answer arrives (it calls `event.set()`): here a callback."""

    def __init__(self, settle, what: str):
        self.settle, self.what = settle, what

    def set(self) -> None:
        self.settle(self.what)


class Alarm(asyncio.Event):
    """An asyncio.Event that also calls back when set: a request waits for it without a Task of its own."""

    def __init__(self):
        super().__init__()
        self._callbacks: dict = {}                 # as a set, in the order added

    def set(self) -> None:
        super().set()
        for callback in list(self._callbacks):
            callback()

    def on_set(self, callback) -> None:
        if self.is_set():
            callback()
        else:
            self._callbacks[callback] = None

    def forget(self, callback) -> None:
        self._callbacks.pop(callback, None)


async def until_disconnected(request: Request) -> None:
    """Returns when the client goes away. A blocking receive, not polling is_disconnected(): under
    Starlette's BaseHTTPMiddleware the latter never sees the disconnect (its zero-timeout receive
    is cancelled inside the middleware's task group)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class Workers:
    """The inference workers of a LitServer as an HTTP process sees them: `call` for a request with one
    answer, `events` for a request answered step by step, `ready` and `stop` for the server's life.

    A worker that stops being ready fails the requests it holds at once (503, retry), not those its siblings hold;
    twice the queue timeout bounds queue wait plus the longest computation (504)."""

    def __init__(self, server: ls.LitServer, apis: dict[str, LitAPI | None], board: CancelBoard,
                 request_timeout_s: float):
        self.server, self.board, self.request_timeout_s = server, board, request_timeout_s
        self.handlers = {endpoint: (StreamingRequestHandler if api.stream else RegularRequestHandler)(api, server)
                         for endpoint, api in apis.items() if api is not None}
        self._watcher: asyncio.Future | None = None      # see lost(); one per HTTP process
        self._lost: dict[Holder, Alarm] = {}              # see lost() and _gone()
        self._lost_at: dict[str, float] = {}              # when the watcher last saw a worker stop (monotonic)
        self._seen_starts: dict[str, int] | None = None   # the workers' start counts the watcher has acted on

    def serves(self, endpoint: str) -> bool:
        return endpoint in self.handlers

    def count(self, endpoint: str) -> int:
        """The endpoint's inference workers (1 where LitServe's queues are kept)."""
        sender = self._sender(endpoint) if self.serves(endpoint) else None
        return sender.workers if sender is not None else 1

    async def call(self, endpoint: str, payload: dict, request: Request | None,
                   worker: int | None = None) -> dict | None:
        """The worker's answer to `payload`; None when the client went away first (its request is then
        dropped from the worker's queue and from the engine batches not yet run). `worker`: sent to that one."""
        uid, holder = await self._enqueue(endpoint, payload, worker)
        try:
            what, item = await self._outcome(holder, uid, request)
        finally:
            self.server.response_buffer.pop(uid, None)  # a late answer then finds no one waiting
            self._done(endpoint, uid)
        if what == "answered":
            return self._answer(endpoint, *item.response)
        self.board.cancel(payload["number"])  # the worker skips it, queued or between engine batches
        if what == "client gone":
            metrics().cancelled.labels(endpoint).inc()
            return None
        if what == "worker lost":
            raise worker_failed("the inference worker stopped while running this request (it is being "
                                "restarted); retry", retry_after_s=2)
        raise ApiError(504, "timeout", f"no answer within {2 * self.request_timeout_s:g} s",
                       headers={"Retry-After": "5"})

    async def _outcome(self, holder: Holder, uid: str, request: Request | None) -> tuple[str, ResponseBufferItem]:
        """What came first for request `uid`: "answered" (its answer in the item), "worker lost" (`holder`), "client
        gone" or "timeout" (twice the request timeout). One future, settled by a callback each: a Task for each of three
        waits and asyncio.wait over them took about 8% of the HTTP process's samples under load. The client's is
        told by its connection (uvicorn_bridge.ClientGone), or where the server gives none, a Task awaits
        receive()."""
        loop = asyncio.get_running_loop()
        outcome = loop.create_future()

        def settle(what: str) -> None:
            if not outcome.done():
                outcome.set_result(what)

        def on_gone(task: asyncio.Task) -> None:
            if not task.cancelled():
                task.exception()          # retrieved: a receive() that raised has lost the client too
                settle("client gone")
        self.server.response_buffer[uid] = item = ResponseBufferItem(Settles(settle, "answered"))
        lost, on_lost = self.lost(holder), functools.partial(settle, "worker lost")
        lost.on_set(on_lost)
        gone = watch = on_gone_away = None
        if request is not None and (watch := request.scope.get(CLIENT_GONE)) is not None:
            on_gone_away = functools.partial(settle, "client gone")   # told by the connection (uvicorn_bridge)
            watch.callbacks.append(on_gone_away)
            if watch.lost:
                settle("client gone")
        elif request is not None:
            gone = asyncio.ensure_future(until_disconnected(request))
            gone.add_done_callback(on_gone)
        timer = loop.call_later(2 * self.request_timeout_s, settle, "timeout")
        try:
            return await outcome, item
        finally:
            timer.cancel()
            lost.forget(on_lost)
            if gone is not None:
                gone.cancel()
            if on_gone_away is not None:
                watch.callbacks.remove(on_gone_away)

    def _answer(self, endpoint: str, response, status) -> dict:
        if status != LitAPIStatus.ERROR:
            return response
        try:
            self.handlers[endpoint]._handle_error_response(response)   # raises LitServe's HTTPException
        except StarletteHTTPException as e:
            if e.status_code == 504:  # LitServe evicted it from the queue before a worker took it
                raise queue_timeout(self.request_timeout_s) from None
        raise worker_failed("the inference worker failed while running this request; retry")

    async def events(self, endpoint: str, payload: dict) -> AsyncIterator[dict]:
        """Submits to a streaming endpoint's workers and yields their per-step events for this request. Each event,
        the first (queue wait and the prompt's encoding) as the next, comes within twice the request timeout, or the
        request is dropped with a 504 (raised here: a status before the first event, an error event after), as
        `call` bounds a whole answer: a stream that goes on producing is not cut, a stalled one is."""
        uid, holder = await self._enqueue(endpoint, payload)
        available, queue = asyncio.Event(), deque()
        self.server.response_buffer[uid] = ResponseBufferItem(event=available, response_queue=queue)
        stream = self.server.data_streamer(queue, data_available=available, send_status=True)
        # As in call(): a worker that dies sends nothing more, so each wait races the worker watcher.
        lost = asyncio.ensure_future(self.lost(holder).wait())
        step = None
        try:
            while True:
                step = asyncio.ensure_future(anext(stream))
                done, _ = await asyncio.wait({step, lost}, timeout=2 * self.request_timeout_s,
                                             return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    raise ApiError(504, "timeout", f"no answer within {2 * self.request_timeout_s:g} s",
                                   headers={"Retry-After": "5"})
                if not step.done():
                    raise worker_failed("the generation worker stopped while running this request (it is being "
                                        "restarted); retry", retry_after_s=2)
                try:
                    data, status = step.result()
                except StopAsyncIteration:
                    return
                if status == LitAPIStatus.ERROR:
                    self._stream_error(data)
                if data:
                    yield json.loads(data) if isinstance(data, (str, bytes)) else data
        finally:
            lost.cancel()
            if step is not None and not step.done():
                # Worker lost, or this request cancelled (its client went away) while waiting: the
                # streamer must stop running before aclose(), and the cancellation must not stop that wait.
                # A payload still in the queue is skipped by whichever worker takes it (a restarted one).
                self.board.cancel(payload["number"])
                step.cancel()
                await asyncio.shield(asyncio.wait({step}))
            await stream.aclose()
            self.server.response_buffer.pop(uid, None)
            self._done(endpoint, uid)

    def _stream_error(self, data) -> None:
        try:
            err = pickle.loads(data) if isinstance(data, bytes) else data
        except Exception:
            err = None
        if getattr(err, "status_code", None) == 504:
            raise queue_timeout(self.request_timeout_s)
        raise worker_failed("the inference worker failed while running this request; retry")

    def _sender(self, endpoint: str) -> RequestSender | None:
        """The endpoint's RequestSender; None where the server kept LitServe's queues (not on Unix)."""
        senders = getattr(self.server, "request_senders", None)
        return senders.get(self.handlers[endpoint].lit_api.api_path) if senders else None

    def _done(self, endpoint: str, uid: str) -> None:
        if (sender := self._sender(endpoint)) is not None:
            sender.done(uid)

    async def each_worker(self, endpoint: str, payload: dict) -> list[dict]:
        """`payload` sent to every worker of `endpoint` (model control: http/model_control.py), their answers in
        worker order; a worker that dies meanwhile is the 503 of `call`, none listening in time its 504."""
        if not self.serves(endpoint):   # e.g. a server of generation packages only: no such worker to tell
            raise ApiError(409, "no_workers", f"this server runs no {endpoint} workers (none of its packages at "
                           "start-up was of that task)")
        sender = self._sender(endpoint)
        if sender is None:
            raise ApiError(501, "not_supported", "model control needs the workers' Unix sockets (not on this platform)")
        return list(await asyncio.gather(*(self.call(endpoint, payload | {"number": self.board.new_number()}, None, w)
                                           for w in range(sender.workers))))

    async def _enqueue(self, endpoint: str, payload: dict, worker: int | None = None) -> tuple[str, Holder]:
        """Sends a request to a worker (RequestSender); its uid and what it is lost with (`holder`). The queue-depth
        gauge goes up here and down only where a worker takes the request off its queue (collect), whatever happens
        after. With no worker listening for `--request-timeout-s`: 504, as a request LitServe's queue timed out.

        On LitServe's queues (kept where Unix sockets are not), held back for a moment after a worker of
        `endpoint` was lost: those queues live in a manager process, and a get() the dead worker was waiting in
        goes on there until its timeout (IDLE_WAKE_S), handing the next request put on the queue to no one. A
        request put before the loss was seen fails with the others (lost); one put after must wait that get out.
        A dead worker's socket refuses at once, so a request sent there goes to another worker or waits."""
        sender = self._sender(endpoint)
        lost_at = self._lost_at.get(endpoint)
        if sender is None and lost_at is not None and (wait := lost_at + LOST_HOLD_S - time.monotonic()) > 0:
            await asyncio.sleep(wait)
        carry(payload)   # the worker's spans join the request's trace (worker/traces.py), when traces are on
        labelled(metrics().queue_depth, endpoint).inc()   # before the put: the worker may take it at once
        self.board.queued(endpoint, +1)
        try:
            if sender is None:
                return (await self.handlers[endpoint]._submit_request(payload))[0], self.holder(endpoint)
            uid = f"{_pid[0]}{next(_uids)}"   # unique among the live requests (as LitServe's uuid4s)
            try:
                sent_to = await sender.put((self.server.app.response_queue_id, uid, time.monotonic(), payload),
                                           self.request_timeout_s, worker)
            except TimeoutError:
                raise queue_timeout(self.request_timeout_s) from None
            return uid, self.holder(endpoint, sent_to)     # no await since the send: the count is its receiver's
        except BaseException:
            labelled(metrics().queue_depth, endpoint).dec()
            self.board.queued(endpoint, -1)
            raise

    def holder(self, endpoint: str, worker: int | None = None) -> Holder:
        """What a request of `endpoint` sent to `worker` just now is lost with: that worker, not a successor that
        listens at its address later (a worker listens only once it has raised its count,
        CancelBoard.worker_listening); with no worker (LitServe's queues), any of the endpoint's."""
        if worker is None:
            return endpoint, None, None
        return endpoint, worker, self.board.listened(endpoint, worker)

    def lost(self, holder: Holder) -> Alarm:
        """An event set when the worker `holder` names is lost: it stopped being ready (it died; LitServe restarts
        it), or a worker with its id began to listen since the request was sent. On LitServe's queues, where a
        request goes to whichever worker takes it, when any worker of the endpoint is lost: one stops being ready or
        a new one starts. One watcher per HTTP process polls the shared worker states and counts twice a second,
        whatever the load: a small model's new worker can be ready again before the next poll, so its start (its
        listening) is what shows the death."""
        if self._watcher is None or self._watcher.done():
            self._lost, self._watcher = {}, asyncio.ensure_future(self._watch())
        return self._lost.setdefault(holder, Alarm())

    async def _watch(self) -> None:
        status = getattr(self.server, "workers_setup_status", None)
        seen: dict[str, str] = {}
        starts = self._seen_starts = self.board.worker_starts()
        while status is not None:
            await asyncio.sleep(0.5)
            try:
                now = status.copy()  # one round trip to the manager process
            except Exception:  # the manager is gone: shutting down
                return
            stopped = {key for key, state in now.items()
                       if seen.get(key) == WorkerSetupStatus.READY and state != WorkerSetupStatus.READY}
            seen, now_starts, listeners = now, self.board.worker_starts(), self.board.listeners()
            lost = {key.rsplit("_", 1)[0] for key in stopped} | {
                e for e, n in now_starts.items() if n != starts.get(e, n)}
            starts = now_starts
            for endpoint in lost:
                self._lost_at[endpoint] = time.monotonic()
            for holder in [h for h in self._lost if self._gone(h, lost, now, listeners)]:
                self._lost.pop(holder).set()  # requests waiting now fail; later ones get a new event
            self._seen_starts = starts

    @staticmethod
    def _gone(holder: Holder, lost: set[str], states: dict,
              listeners: dict[tuple[str, int], int]) -> bool:
        """Whether the worker(s) `holder` names were lost: (endpoint, None, None) any of the endpoint's (LitServe's
        queues: what changed since the last poll), (endpoint, worker, count) that worker: it is not ready now or a
        successor listens. Its state is read as it is, not as a change since the last poll: a request goes only to a
        worker that listens, which is ready (LitServe sets it so before its loop listens), and only LitServe's
        monitor, after a death, or a failed setup takes it off ready; a change would be missed by a watcher's first
        poll, or where the worker died again within a poll of its restart."""
        endpoint, worker, count = holder
        if worker is None:
            return endpoint in lost
        return (states.get(f"{endpoint}_{worker}") != WorkerSetupStatus.READY
                or listeners.get((endpoint, worker), count) != count)

    def ready(self) -> bool:
        """Every worker loaded and warmed up, and, on LitServe's queues, no restart pending here: one this
        process's watcher has not acted on yet (a request put now could still go to the dead worker's get() and
        fail with those in flight) or whose new requests are still held back (_enqueue)."""
        status = getattr(self.server, "workers_setup_status", None) or {}
        if not status or any(v != WorkerSetupStatus.READY for v in status.values()):
            return False
        if getattr(self.server, "request_senders", None):
            return True
        if self._watcher is not None and not self._watcher.done() and self.board.worker_starts() != self._seen_starts:
            return False
        now = time.monotonic()
        return all(now >= lost_at + LOST_HOLD_S for lost_at in self._lost_at.values())

    def stop(self) -> None:
        self.server._shutdown_event.set()


def serving(server: ls.LitServer) -> bool:
    """Whether server.run() got as far as serving (before, a SIGTERM has nothing to drain)."""
    return getattr(server, "_shutdown_event", None) is not None
