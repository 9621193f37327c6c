"""The worker side of LitServe's internals (litserve==0.2.19 is pinned for them): the worker loop that takes requests
off its queue and runs the worker's scheduler (service/worker/scheduler.py, which knows no LitServe), and `Server`,
the LitServer whose requests and answers go over sockets of their own. The HTTP side, `Workers`, is
service/http/litserve_workers.py; the answers' transport worker/answers.py, the requests' request_sender.py and
request_inbox.py.

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
"""

from __future__ import annotations

import contextlib
import functools
import logging
import shutil
import sys
import threading
import time
from queue import Empty, Queue, SimpleQueue

import litserve as ls
from fastapi import HTTPException
from litserve import LitAPI
from litserve.callbacks import CallbackRunner
from litserve.loops.base import _SENTINEL_VALUE, LitLoop, _StopLoopError
from litserve.transport.base import MessageTransport
from litserve.transport.process_transport import MPQueueTransport
from litserve.utils import LitAPIStatus, LoopResponseType

from .answers import SocketAnswers, bundle
from .request_inbox import RequestInbox
from .request_sender import RequestSender
from .traces import WorkerTraces
from .unix_listener import socket_folder
from ..metrics import metrics

log = logging.getLogger("transerve")

IDLE_WAKE_S = 1.0   # an idle worker still returns to its loop this often
HTTP_WATCH_S = 1.0  # the main process looks at its HTTP processes this often
POLL_S = 0.005      # a busy translation worker looks for new requests this often at most (between steps)
QUEUE_CHECK_S = 0.1  # ... and, when the board counts nothing queued, this often (should the count be off)
LOAD_POLL_S = 0.01  # an idle worker loading a model version (worker/model_swap.py) looks for its end this often
STOP_GRACE_S = 1.0  # once drained, an HTTP process's requests left are cut after this (Server)


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
        metrics().worker_starts.labels(lit_api.api_path.strip("/"), str(worker_id)).inc()
        if isinstance(request_queue, RequestInbox):
            if (board := getattr(lit_api, "board", None)) is not None:
                board.worker_listening(lit_api.api_path.strip("/"), worker_id)   # before: none is sent it unseen
            request_queue.listen(worker_id)
        try:
            while True:
                idle_s = LOAD_POLL_S if finish_loads(lit_api) else IDLE_WAKE_S
                try:
                    payloads, timed_out = collect(self, lit_api, request_queue, transport, idle_s=idle_s)
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
                finish_loads(lit_api)
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


def queued(lit_api: LitAPI) -> int:
    """The board's count of the endpoint's queued requests (CancelBoard.queued); 1 when it has no board."""
    board = getattr(lit_api, "board", None)
    return board.queued(lit_api.api_path.strip("/")) if board is not None else 1


def response_type(lit_api: LitAPI) -> LoopResponseType:
    return LoopResponseType.STREAMING if lit_api.stream else LoopResponseType.REGULAR


def finish_loads(lit_api: LitAPI) -> bool:
    """A model version whose load in its thread has ended is served and its control message answered
    (worker/model_swap.py); whether a load still runs. A LitAPI without model control has none."""
    finish = getattr(lit_api, "finish_loads", None)
    return finish is not None and finish()


def collect(loop: LitLoop, lit_api: LitAPI, request_queue: Queue, transport: MessageTransport, wait: bool = True,
            expect: int | None = None, idle_s: float = IDLE_WAKE_S) -> tuple[list, list]:
    """(payloads, timed_out): up to `max_batch_size` requests as `(response_queue_id, uid, payload)`,
    and `(response_queue_id, uid)` of those that waited longer than `request_timeout` (LitServe
    answers them 504). Both empty when nothing arrived within `idle_s` (wait=False: only what is
    already queued, no window). A model control message is handed to `lit_api.control` with the means to answer
    it, now or once its load is done (worker/model_swap.py). `expect`: how many the board counts queued; having
    taken that many it does not ask the queue again (what arrived since waits for the next look; on LitServe's
    queue each ask was a round trip to its manager process)."""
    payloads: list = []
    timed_out: list = []
    check_age = lit_api.request_timeout not in (-1, False)
    endpoint = lit_api.api_path.strip("/")
    queue_depth, board = metrics().queue_depth.labels(endpoint), getattr(lit_api, "board", None)

    def answer(response_queue_id: int, uid: str, response: dict) -> None:
        loop.put_response(transport, response_queue_id, uid, response, LitAPIStatus.OK, response_type(lit_api))

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
        elif isinstance(payload, dict) and "control" in payload:   # model control (worker/model_swap.py)
            lit_api.control(payload, functools.partial(answer, response_queue_id, uid))
        else:
            payloads.append((response_queue_id, uid, payload))

    try:
        take(request_queue.get(timeout=idle_s if wait else 0.0))
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


def manager_gone(record: logging.LogRecord) -> bool:
    """Drops LitServe's "Monitoring worker crashed" when what crashed it is the manager process gone: its monitor
    thread asks the manager's shutdown event at each turn, and on Ctrl+C the manager (in the same process group)
    may end before the thread sees the event set; the pipe it asks through is then broken. Nothing is lost: the
    server is stopping. Any other crash of the monitor is still logged."""
    exc = record.exc_info[1] if record.exc_info else None
    return not (record.getMessage().startswith("Monitoring worker crashed")
                and isinstance(exc, (EOFError, ConnectionError)))


# --- the server: its processes' ways to each other ----------------------------------------------------
class Server(ls.LitServer):
    """LitServer, its requests reaching the workers and their answers the HTTP processes over sockets of their own
    (`RequestSender` to `RequestInbox`; `SocketAnswers`), not through LitServe's manager
    process."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Once the main process has drained (--drain-timeout-s), how long an HTTP process may take to end: uvicorn
        # waits this long for the requests left before it cancels them, and LitServe as long before it kills the
        # process. LitServe's 30 s let requests outlive the drain timeout by up to 30 s per HTTP process.
        self.uvicorn_graceful_timeout = STOP_GRACE_S

    def _init_manager(self, num_api_servers: int):
        manager = super()._init_manager(num_api_servers)
        # Not LitServe's ZeroMQ transport (fast_queue), and only where HTTP processes are forked over Unix sockets.
        if type(self._transport) is MPQueueTransport and sys.platform != "win32":
            self._transport = SocketAnswers(socket_folder("transerve-answers-"))
            self.request_senders = {}
            for api_path in list(self.litapi_request_queues):
                folder = socket_folder("transerve-requests-")
                self.litapi_request_queues[api_path] = RequestInbox(folder)
                workers = len(self._inference_workers_config_for_api(api_path))
                self.request_senders[api_path] = RequestSender(folder, workers)
        return manager

    def _start_worker_monitoring(self, manager, uvicorn_workers: dict) -> None:
        """LitServe's monitor restarts a dead inference worker and says so; it never looks at the HTTP processes.
        Ours says when one ends before the stop (a kill -9, the OOM killer), and stops the server when none is
        left: a main process serving nothing must not look alive to its supervisor (`lost_every_http_process`:
        the exit status is then 1)."""
        logging.getLogger("litserve.server").addFilter(manager_gone)
        super()._start_worker_monitoring(manager, uvicorn_workers)
        self.lost_every_http_process = False
        threading.Thread(target=self._watch_http_processes, args=(uvicorn_workers,), daemon=True,
                         name="transerve-http-processes").start()

    def _watch_http_processes(self, uvicorn_workers: dict) -> None:
        ended: set[int] = set()
        try:
            while not self._shutdown_event.is_set():
                for i, proc in uvicorn_workers.items():
                    if i in ended or not hasattr(proc, "exitcode") or proc.is_alive():
                        continue
                    if self._shutdown_event.is_set():       # stopping: they end as they should
                        return
                    ended.add(i)
                    log.error("HTTP process %d (pid %s) ended (exit code %s) while serving; %d of %d left",
                              i, proc.pid, proc.exitcode, len(uvicorn_workers) - len(ended), len(uvicorn_workers))
                if len(ended) == len(uvicorn_workers):
                    log.error("no HTTP process is left: the server stops")
                    self.lost_every_http_process = True
                    if (stopping := getattr(self, "stopping", None)) is not None:
                        stopping.order()       # the workers obey LitServe's SIGTERM now (service/stopping.py)
                    self._shutdown_event.set()
                    return
                time.sleep(HTTP_WATCH_S)
        except (EOFError, OSError):    # the manager is gone (the server is stopping, or it was killed): nothing to do
            return

    def _perform_graceful_shutdown(self, manager, uvicorn_workers, shutdown_reason: str = "normal"):
        try:
            super()._perform_graceful_shutdown(manager, uvicorn_workers, shutdown_reason)
        finally:
            for inbox in self.litapi_request_queues.values():
                if isinstance(inbox, RequestInbox):
                    shutil.rmtree(inbox.folder, ignore_errors=True)
