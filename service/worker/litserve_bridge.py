"""The one module that touches LitServe's internals (litserve==0.2.19 is pinned for them): the worker loop
that takes requests off a queue and runs the worker's scheduler (service/worker/scheduler.py, which knows no
LitServe), and the HTTP side's way into and out of the workers (`Workers`).

How an inference worker takes requests off its queue: the moment it is free. LitServe's collector opens
a window of `batch_timeout` whenever the worker asks for work, queue empty or not, and closes it only
when it runs out or the batch is full: a lone request on an idle worker waits out the rest of the
window, and with a window of 0 the worker polls the queue without sleeping. Ours blocks until a request
arrives, takes it with every request already queued behind it, and then waits for more only up to
`batch_timeout` after the first (0: not at all). Under load nothing is lost by not waiting: requests
that arrive while the worker runs a batch queue up and become the next batch. The window is worth
setting only for bursts that arrive spread out by less than a batch's run time.

The requests' way in: each HTTP process sends a request to one worker over a Unix socket the worker listens on
(request_sender.py, request_inbox.py), and the worker reads its `RequestInbox` as it read LitServe's queue, which
lived in LitServe's manager process: a blocking round trip there for every put on the HTTP process's event loop,
and another for every look from a worker between steps.

The HTTP side: LitServe's timeout only evicts requests still queued, and its monitor does not reach an
HTTP process's requests when a worker dies: without the two bounds in `Workers.call` such a request
would wait forever.

The answers' way back, each hop measured (benchmarks/results/serving-cpu.md): a worker sends no START message
(only LitServe's monitor read it, in another process), sends answers and stream events from a thread of its own
(`SchedulerLoop.put_response`: the next decoder step need not wait for a send), what one step answers as one
message per HTTP process (a bundle: eight streams cost one send a step, not eight), and over a socket of its own
to each HTTP process (`SocketAnswers`), not through LitServe's manager process; each HTTP process reads a worker's
answers in one thread, not in a thread-pool call per message.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import pickle
import shutil
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from multiprocessing.connection import Client, Connection
from queue import Empty, Queue, SimpleQueue
from typing import AsyncIterator

import litserve as ls
from fastapi import HTTPException, Request
from litserve import LitAPI
from litserve.callbacks import CallbackRunner
from litserve.loops.base import _SENTINEL_VALUE, LitLoop, _StopLoopError
from litserve.server import RegularRequestHandler, StreamingRequestHandler
from litserve.transport.base import MessageTransport
from litserve.transport.process_transport import MPQueueTransport
from litserve.utils import LitAPIStatus, LoopResponseType, ResponseBufferItem, WorkerSetupStatus
from starlette.exceptions import HTTPException as StarletteHTTPException

from .cancel import CancelBoard
from .request_inbox import RequestInbox
from .request_sender import RequestSender
from .traces import WorkerTraces, carry
from ..errors import ApiError, queue_timeout, worker_failed
from ..metrics import metrics

log = logging.getLogger("transerve")

IDLE_WAKE_S = 1.0   # an idle worker still returns to its loop this often
LOST_HOLD_S = IDLE_WAKE_S + 0.5   # new requests wait this long after a worker's loss is seen (Workers._enqueue)
POLL_S = 0.005      # a busy translation worker looks for new requests this often at most (between steps)
QUEUE_CHECK_S = 0.1  # ... and, when the board counts nothing queued, this often (should the count be off)


# --- the worker side -----------------------------------------------------------------------------
class SchedulerLoop(LitLoop):
    """The inference worker's loop: LitServe's queue and transport around a LitAPI's scheduler
    (service/worker/scheduler.py, `lit_api.scheduler`), with the collector described above. The requests it takes
    are decoded (`lit_api.decode_request`) and admitted; the scheduler then runs one step at a time, and
    after each step whatever it has ready goes out through `lit_api.encode_response`: a translation once,
    when done, a generation request (a streaming LitAPI) as every step brings it new text. Between steps
    (every POLL_S at most, so that what arrives meanwhile joins together, and only while the scheduler wants
    them) requests that arrived join the work under way, so a one-word request does not wait for the large ones
    taken before it."""

    def __call__(self, lit_api: LitAPI, device: str, worker_id: int, request_queue: Queue,
                 transport: MessageTransport, workers_setup_status: dict, callback_runner: CallbackRunner) -> None:
        if isinstance(request_queue, RequestInbox):
            request_queue.listen(worker_id)
        try:
            while True:
                try:
                    payloads, timed_out = collect(self, lit_api, request_queue, transport)
                except _StopLoopError:
                    return
                self._time_out(lit_api, transport, timed_out)
                if payloads and not self._serve(lit_api, request_queue, transport, payloads):
                    return
        finally:
            self._outbox_flush()

    def put_response(self, transport: MessageTransport, response_queue_id: int, uid: str, response_data,
                     status: LitAPIStatus, response_type: LoopResponseType) -> None:
        """Hands an answer (or a stream's event) to the worker's sender thread, in order: the next decoder step need
        not wait for the send (onnxruntime releases the GIL while it runs). Inside `one_message()` it is held until
        the block ends."""
        message = (transport, response_queue_id, (uid, (response_data, status, response_type, self.worker_id)))
        if getattr(self, "_held", None) is not None:
            self._held.append(message)
            return
        self._hand_over([message])

    @contextlib.contextmanager
    def one_message(self):
        """The answers put in this block go out together: one message per HTTP process (`bundle`)."""
        self._held = []
        try:
            yield
        finally:
            held, self._held = self._held, None
            if held:
                self._hand_over(held)

    def _hand_over(self, messages: list) -> None:
        if getattr(self, "_outbox", None) is None:
            self._outbox: SimpleQueue = SimpleQueue()
            self._sender = threading.Thread(target=self._send_all, name="answers", daemon=True)
            self._sender.start()
        self._outbox.put(messages)

    def _send_all(self) -> None:
        """Sends what was handed over, in order; what waits in the outbox when the sender gets to it goes out with
        it, one message per HTTP process (its queue)."""
        while True:
            messages = self._outbox.get()
            last = messages is None
            while not last:
                try:
                    more = self._outbox.get_nowait()
                except Empty:
                    break
                last = more is None
                messages += more or []
            queues: dict[tuple, list] = {}
            for transport, queue_id, message in messages or []:
                queues.setdefault((transport, queue_id), []).append(message)
            for (transport, queue_id), group in queues.items():
                # SocketAnswers (and a test's MPQueueTransport) unbundle; LitServe's ZeroMQ transport does not.
                bundles = isinstance(transport, (SocketAnswers, MPQueueTransport))
                try:
                    for message in [bundle(group)] if bundles else group:
                        transport.send(message, consumer_id=queue_id)
                except Exception:      # the HTTP process is gone (the server is stopping): nothing more can be sent
                    log.exception("sending an answer to the HTTP process failed")
            if last:
                return

    def _outbox_flush(self) -> None:
        """Every answer handed over is sent before the worker's loop returns (the server is stopping)."""
        if getattr(self, "_outbox", None) is not None:
            self._outbox.put(None)
            self._sender.join(timeout=30)
            self._outbox = None

    def _time_out(self, lit_api: LitAPI, transport: MessageTransport, timed_out: list) -> None:
        for response_queue_id, uid in timed_out:
            self.put_response(transport, response_queue_id, uid, HTTPException(504, "Request timed out"),
                              LitAPIStatus.ERROR, response_type(lit_api))

    def _serve(self, lit_api: LitAPI, request_queue: Queue, transport: MessageTransport, payloads: list) -> bool:
        """Runs the scheduler until every request it holds, those that joined included, is answered; False
        when the server is stopping (the work under way is finished first)."""
        scheduler, waiting = lit_api.scheduler, {}     # waiting: uid -> response queue id, until answered
        if getattr(self, "traces", None) is None:      # each request's spans in this worker (worker/traces.py)
            self.traces = WorkerTraces(lit_api.api_path.strip("/"))
            self.traces.watch(scheduler)
        more, polled = True, time.monotonic()
        try:
            self._admit(lit_api, payloads, waiting)
            while True:
                self._answer(lit_api, transport, waiting)
                if not scheduler.busy:
                    return more
                since = time.monotonic() - polled
                if more and since >= POLL_S and scheduler.wants_new_requests() and (
                        since >= QUEUE_CHECK_S or queued(lit_api) > 0):
                    more = self._admit_arrivals(lit_api, request_queue, transport, waiting)
                    polled = time.monotonic()
                scheduler.step()
        except Exception as e:
            log.exception("the %s worker's scheduler failed; its %d unanswered requests fail",
                          lit_api.api_path.strip("/"), len(waiting))
            scheduler.abandon()
            self.traces.abandoned("internal_error")
            with self.one_message():
                for uid, response_queue_id in waiting.items():
                    self.put_error_response(transport, response_queue_id, uid, e, response_type(lit_api))
            return more

    def _admit(self, lit_api: LitAPI, payloads: list, waiting: dict) -> None:
        waiting.update({uid: response_queue_id for response_queue_id, uid, _ in payloads})
        jobs = {uid: lit_api.decode_request(payload) for _, uid, payload in payloads}
        self.traces.admitted(payloads, jobs)
        lit_api.scheduler.admit(jobs)

    def _admit_arrivals(self, lit_api: LitAPI, request_queue: Queue, transport: MessageTransport,
                        waiting: dict) -> bool:
        """Admits what is queued now, without waiting; False when the server is stopping."""
        board = getattr(lit_api, "board", None)
        try:
            payloads, timed_out = collect(self, lit_api, request_queue, transport, wait=False,
                                          expect=queued(lit_api) if board is not None else None)
        except _StopLoopError:
            return False
        self._time_out(lit_api, transport, timed_out)
        if payloads:
            self._admit(lit_api, payloads, waiting)
        return True

    def _answer(self, lit_api: LitAPI, transport: MessageTransport, waiting: dict) -> None:
        """A translation is answered once, when done; a generation request (a streaming LitAPI) gets each
        step's new text as an event, and FINISH once over. What one step answers goes out as one message."""
        with self.one_message():
            self._answer_step(lit_api, transport, waiting)

    def _answer_step(self, lit_api: LitAPI, transport: MessageTransport, waiting: dict) -> None:
        if not lit_api.stream:
            for uid, job in lit_api.scheduler.take_finished():
                response = lit_api.encode_response(job)
                self.put_response(transport, waiting.pop(uid), uid, response, LitAPIStatus.OK,
                                  LoopResponseType.REGULAR)
                self.traces.answered(uid, response)
            return
        stream = LoopResponseType.STREAMING
        for uid, job, over in lit_api.scheduler.take_progress():
            if event := lit_api.encode_response(job):
                self.put_response(transport, waiting[uid], uid, lit_api.format_encoded_response(event),
                                  LitAPIStatus.OK, stream)
                self.traces.step(uid, pieces=len(event.get("pieces", ())) if isinstance(event, dict) else None)
            if over:
                self.put_response(transport, waiting.pop(uid), uid, "", LitAPIStatus.FINISH_STREAMING, stream)
                self.traces.answered(uid, event)


BUNDLE = "transerve-bundle"   # a message that holds several (LitServe's uids are uuid4 strings)


def bundle(messages: list[tuple]) -> tuple:
    """LitServe's messages (uid, (data, status, response type, worker id)) as one: a message alone as it is."""
    return messages[0] if len(messages) == 1 else (BUNDLE, messages)


def unbundled(message: tuple | None) -> list:
    """The messages `bundle` made one, in order; any other (the closing transport's None) as it is."""
    return message[1] if isinstance(message, tuple) and message[0] == BUNDLE else [message]


def queued(lit_api: LitAPI) -> int:
    """The board's count of the endpoint's queued requests (CancelBoard.queued); 1 when it has no board."""
    board = getattr(lit_api, "board", None)
    return board.queued(lit_api.api_path.strip("/")) if board is not None else 1


def response_type(lit_api: LitAPI) -> LoopResponseType:
    return LoopResponseType.STREAMING if lit_api.stream else LoopResponseType.REGULAR


def collect(loop: LitLoop, lit_api: LitAPI, request_queue: Queue,
            transport: MessageTransport, wait: bool = True, expect: int | None = None) -> tuple[list, list]:
    """(payloads, timed_out): up to `max_batch_size` requests as `(response_queue_id, uid, payload)`,
    and `(response_queue_id, uid)` of those that waited longer than `request_timeout` (LitServe
    answers them 504). Both empty when nothing arrived within IDLE_WAKE_S (wait=False: only what is
    already queued, no window). `expect`: how many the board counts queued; having taken that many it does
    not ask the queue again (what arrived since waits for the next look; on LitServe's queue each ask was a round
    trip to its manager process)."""
    payloads: list = []
    timed_out: list = []
    check_age = lit_api.request_timeout not in (-1, False)
    endpoint = lit_api.api_path.strip("/")
    queue_depth, board = metrics().queue_depth.labels(endpoint), getattr(lit_api, "board", None)

    def take(item) -> None:
        if item == _SENTINEL_VALUE:
            raise _StopLoopError()
        # The one place every queued request passes, served, timed out or failing later: the gauge and
        # the board's count the HTTP process raised when it queued the request come down here and nowhere else.
        queue_depth.dec()
        if board is not None:
            board.queued(endpoint, -1)
        response_queue_id, uid, queued_at, payload = item
        # No START message (LitServe's loops send one so that its monitor can fail a dead worker's requests): that
        # monitor runs in the main process, whose response buffer is not the HTTP processes', so it never reached
        # them; Workers.lost() fails them instead. Each START was a round trip through the manager process here
        # and a thread hop and another round trip in the HTTP process, for every request.
        if check_age and time.monotonic() - queued_at > lit_api.request_timeout:
            timed_out.append((response_queue_id, uid))
        else:
            payloads.append((response_queue_id, uid, payload))

    try:
        take(request_queue.get(timeout=IDLE_WAKE_S if wait else 0.0))
    except Empty:
        return payloads, timed_out
    window_ends = time.monotonic() + (lit_api.batch_timeout if wait else 0.0)
    most = lit_api.max_batch_size if expect is None else min(lit_api.max_batch_size, max(1, expect))
    while len(payloads) + len(timed_out) < most:
        try:  # a timeout of 0 takes only what is already queued
            take(request_queue.get(timeout=max(0.0, window_ends - time.monotonic())))
        except Empty:
            break
    return payloads, timed_out


# --- the HTTP side --------------------------------------------------------------------------------
class Server(ls.LitServer):
    """LitServer, its requests reaching the workers and their answers the HTTP processes over sockets of their own
    (`RequestSender` to `RequestInbox`; `SocketAnswers`), not through LitServe's manager
    process."""

    def _init_manager(self, num_api_servers: int):
        manager = super()._init_manager(num_api_servers)
        # Not LitServe's ZeroMQ transport (fast_queue), and only where HTTP processes are forked over Unix sockets.
        if type(self._transport) is MPQueueTransport and sys.platform != "win32":
            self._transport = SocketAnswers(tempfile.mkdtemp(prefix="transerve-answers-"))
            self.request_senders = {}
            for api_path in list(self.litapi_request_queues):
                folder = tempfile.mkdtemp(prefix="transerve-requests-")
                self.litapi_request_queues[api_path] = RequestInbox(folder)
                workers = len(self._inference_workers_config_for_api(api_path))
                self.request_senders[api_path] = RequestSender(folder, workers)
        return manager

    def _perform_graceful_shutdown(self, manager, uvicorn_workers, shutdown_reason: str = "normal"):
        try:
            super()._perform_graceful_shutdown(manager, uvicorn_workers, shutdown_reason)
        finally:
            for inbox in self.litapi_request_queues.values():
                if isinstance(inbox, RequestInbox):
                    shutil.rmtree(inbox.folder, ignore_errors=True)


class SocketAnswers(MessageTransport):
    """The workers' answers to the HTTP processes, each worker writing to each HTTP process over a Unix socket of
    their own (`multiprocessing.connection`'s framing, pickled). LitServe's transport put every answer and every
    streamed event on a queue held by its manager process: a round trip there from the worker and another from the
    HTTP process, a third process to wake on cores the workers keep busy. Here a send is one write, and the HTTP
    process reads it in one thread per worker, which hands it to the event loop.

    Made in the main process, with `folder` (mode 0700, as the manager's own socket: only the server's user can
    connect, so no handshake); the HTTP processes (forked) listen at `folder`/answers-N when they first read, the
    workers (spawned: this object pickled) connect when they first send. Nothing a peer does stops the others: a
    worker that dies mid-write, or a message that cannot be read, ends or skips only its own; a worker whose HTTP
    process has gone drops its answers (they had no one to go to) and tries again after DEAD_S. An HTTP process
    whose threads stop altogether (SIGSTOP) would hold its workers' sends once its socket buffer is full."""

    CONNECT_S = 60.0   # how long a worker waits for an HTTP process to listen the first time (it does at start-up)
    DEAD_S = 5.0       # after an HTTP process stops answering: how long its answers are dropped unsent

    def __init__(self, folder: str):
        self.folder = folder
        self._closed = False
        self._out: dict[int, Connection] = {}                   # worker side: consumer id -> its connection
        self._dead_until: dict[int, float] = {}                 # worker side: consumer id -> when to try again
        self._inboxes: dict[tuple[int, int], Mailbox] = {}  # HTTP side: (pid, consumer id) -> answers
        self._listeners: list[socket.socket] = []

    def __reduce__(self):
        return (SocketAnswers, (self.folder,))

    def address(self, consumer_id: int) -> str:
        return os.path.join(self.folder, f"answers-{consumer_id}")

    # --- the worker side: one thread (the loop's sender) sends ---------------------------------------------
    def send(self, item, consumer_id: int) -> None:
        """Writes `item` to HTTP process `consumer_id`; raises when it cannot (the answer is lost with it)."""
        connection = self._out.get(consumer_id) or self._connect(consumer_id)
        try:
            connection.send(item)
        except OSError:
            del self._out[consumer_id]
            connection.close()
            self._dead_until[consumer_id] = time.monotonic() + self.DEAD_S
            raise

    def _connect(self, consumer_id: int) -> Connection:
        """Waits up to CONNECT_S for a listener the first time; later, one try (its HTTP process has stopped)."""
        if time.monotonic() < self._dead_until.get(consumer_id, 0.0):
            raise ConnectionRefusedError(f"HTTP process {consumer_id} stopped answering")
        deadline = time.monotonic() + (0.0 if consumer_id in self._dead_until else self.CONNECT_S)
        while True:
            try:
                connection = Client(self.address(consumer_id), family="AF_UNIX")
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() >= deadline:
                    self._dead_until[consumer_id] = time.monotonic() + self.DEAD_S
                    raise
                time.sleep(0.05)
        self._out[consumer_id] = connection
        return connection

    # --- the HTTP side ---------------------------------------------------------------------------------
    def _start(self, consumer_id: int) -> Mailbox:
        """Listens for this HTTP process's workers; each connection is read by a thread of its own."""
        loop = asyncio.get_running_loop()
        inbox = Mailbox(loop)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.address(consumer_id))
        listener.listen(64)
        self._listeners.append(listener)

        def accept() -> None:
            while True:
                try:
                    peer, _ = listener.accept()
                except OSError:
                    if self._closed or listener.fileno() < 0:
                        return
                    time.sleep(0.1)       # out of file descriptors, say: the workers already connected go on
                    continue
                threading.Thread(target=read, args=(Connection(peer.detach()),), name=f"answers-{consumer_id}",
                                 daemon=True).start()

        def read(connection: Connection) -> None:
            with connection:
                while True:
                    try:
                        frame = connection.recv_bytes()
                    except (EOFError, OSError):      # that worker stopped, perhaps mid-write
                        return
                    try:
                        item = pickle.loads(frame)
                    except Exception:                  # the frame is whole: the next one can still be read
                        log.exception("an answer from a worker could not be read; it is dropped")
                        continue
                    try:
                        loop.call_soon_threadsafe(inbox.put_all, unbundled(item))
                    except RuntimeError:               # the event loop has closed: this process is stopping
                        return

        threading.Thread(target=accept, name=f"answers-{consumer_id}-accept", daemon=True).start()
        self._inboxes[os.getpid(), consumer_id] = inbox
        return inbox

    async def areceive(self, consumer_id: int, timeout: float | None = None, block: bool = True):
        """The next answer; None after a second without one (LitServe's loop then asks again)."""
        if self._closed:
            raise asyncio.CancelledError("Transport closed")
        inbox = self._inboxes.get((os.getpid(), consumer_id))
        if inbox is None:
            inbox = self._start(consumer_id)
        try:
            return await inbox.get(1.0 if timeout is None else min(timeout, 1.0))
        except asyncio.TimeoutError:
            if timeout is not None and timeout <= 1.0:
                raise
            return None

    def close(self, send_sentinel: bool = True) -> None:
        """Stops listening and removes the sockets' folder (the main process calls it as the server stops; the HTTP
        processes are stopped next)."""
        self._closed = True
        for connection in self._out.values():
            connection.close()
        self._out.clear()
        for listener in self._listeners:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)      # wakes its accept()
            listener.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class Mailbox:
    """An HTTP process's answers, handed over on its event loop by the reader threads and read one at a time by
    LitServe's consumer: asyncio.Queue's get() under asyncio.wait_for cost a Task and a timer an answer."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.items, self.waiter = loop, deque(), None

    def put_all(self, items: list) -> None:
        self.items.extend(items)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def get(self, timeout: float):
        """The next answer; asyncio.TimeoutError after `timeout` seconds without one."""
        if not self.items:
            self.waiter = waiter = self.loop.create_future()
            timer = self.loop.call_later(timeout, lambda: waiter.done() or waiter.set_result(None))
            try:
                await waiter
            finally:
                timer.cancel()
                self.waiter = None
        if not self.items:
            raise asyncio.TimeoutError
        return self.items.popleft()


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

    A worker that stops being ready fails the requests in flight at once (503, retry); twice the queue
    timeout bounds queue wait plus the longest computation (504)."""

    def __init__(self, server: ls.LitServer, apis: dict[str, LitAPI | None], board: CancelBoard,
                 request_timeout_s: float):
        self.server, self.board, self.request_timeout_s = server, board, request_timeout_s
        self.handlers = {endpoint: (StreamingRequestHandler if api.stream else RegularRequestHandler)(api, server)
                         for endpoint, api in apis.items() if api is not None}
        self._watcher: asyncio.Future | None = None      # see lost(); one per HTTP process
        self._lost: dict[str, asyncio.Event] = {}
        self._lost_at: dict[str, float] = {}              # when the watcher last saw a worker stop (monotonic)
        self._seen_starts: dict[str, int] | None = None   # the workers' start counts the watcher has acted on

    def serves(self, endpoint: str) -> bool:
        return endpoint in self.handlers

    async def call(self, endpoint: str, payload: dict, request: Request | None) -> dict | None:
        """The worker's answer to `payload`; None when the client went away first (its request is then
        dropped from the worker's queue and from the engine batches not yet run)."""
        uid = await self._enqueue(endpoint, payload)
        # One future settled by whichever comes first, each by a callback: a Task for each of the four waits,
        # and asyncio.wait over them, cost the HTTP process a tenth of its CPU a request.
        loop = asyncio.get_running_loop()
        outcome = loop.create_future()

        def settle(what: str) -> None:
            if not outcome.done():
                outcome.set_result(what)
        self.server.response_buffer[uid] = item = ResponseBufferItem(Settles(settle, "answered"))
        lost, on_lost = self.lost(endpoint), functools.partial(settle, "worker lost")
        lost.on_set(on_lost)
        gone = None
        if request is not None:
            gone = asyncio.ensure_future(until_disconnected(request))
            gone.add_done_callback(lambda task: task.cancelled() or settle("client gone"))
        deadline = 2 * self.request_timeout_s
        timer = loop.call_later(deadline, settle, "timeout")
        try:
            what = await outcome
        finally:
            timer.cancel()
            lost.forget(on_lost)
            if gone is not None:
                gone.cancel()
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
        raise ApiError(504, "timeout", f"no answer within {deadline:g} s", headers={"Retry-After": "5"})

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
        """Submits to a streaming endpoint's workers and yields their per-step events for this request."""
        uid = await self._enqueue(endpoint, payload)
        available, queue = asyncio.Event(), deque()
        self.server.response_buffer[uid] = ResponseBufferItem(event=available, response_queue=queue)
        stream = self.server.data_streamer(queue, data_available=available, send_status=True)
        # As in call(): a worker that dies sends nothing more, so each wait races the worker watcher.
        lost = asyncio.ensure_future(self.lost(endpoint).wait())
        step = None
        try:
            while True:
                step = asyncio.ensure_future(anext(stream))
                await asyncio.wait({step, lost}, return_when=asyncio.FIRST_COMPLETED)
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

    async def _enqueue(self, endpoint: str, payload: dict) -> str:
        """Sends a request to a worker (RequestSender); its uid. The queue-depth gauge goes up here and down only
        where a worker takes the request off its queue (collect), whatever happens after. With no worker
        listening for `--request-timeout-s`: 504, as a request LitServe's queue timed out.

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
        metrics().queue_depth.labels(endpoint).inc()   # before the put: the worker may take it at once
        self.board.queued(endpoint, +1)
        try:
            if sender is None:
                return (await self.handlers[endpoint]._submit_request(payload))[0]
            uid = str(uuid.uuid4())
            try:
                await sender.put((self.server.app.response_queue_id, uid, time.monotonic(), payload),
                                 self.request_timeout_s)
            except TimeoutError:
                raise queue_timeout(self.request_timeout_s) from None
            return uid
        except BaseException:
            metrics().queue_depth.labels(endpoint).dec()
            self.board.queued(endpoint, -1)
            raise

    def lost(self, endpoint: str) -> Alarm:
        """An event set when a worker of `endpoint` stops being ready or a new one starts (it died;
        LitServe restarts it). One watcher per HTTP process polls the shared worker states and start
        counts twice a second, whatever the load: a small model's new worker can be ready again before
        the next poll, so its start is what shows the death."""
        if self._watcher is None or self._watcher.done():
            self._lost, self._watcher = {}, asyncio.ensure_future(self._watch())
        return self._lost.setdefault(endpoint, Alarm())

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
            lost = {key.rsplit("_", 1)[0] for key, state in now.items()
                    if seen.get(key) == WorkerSetupStatus.READY and state != WorkerSetupStatus.READY}
            seen, now_starts = now, self.board.worker_starts()
            lost |= {e for e, n in now_starts.items() if n != starts.get(e, n)}
            starts = now_starts
            for endpoint in lost:
                self._lost_at[endpoint] = time.monotonic()
                event = self._lost.pop(endpoint, None)
                if event is not None:
                    event.set()  # requests waiting now fail; later ones get a new event
            self._seen_starts = starts

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
