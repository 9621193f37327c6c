"""How an inference worker takes requests off its queue: the moment it is free.

LitServe's collector (0.2.19) opens a window of `batch_timeout` whenever the worker asks for work,
queue empty or not, and closes it only when it runs out or the batch is full: a lone request on an
idle worker waits out the rest of the window, and with a window of 0 the worker polls the queue
without sleeping. Ours blocks until a request arrives, takes it with every request already queued
behind it, and then waits for more only up to `batch_timeout` after the first (0: not at all).

Under load nothing is lost by not waiting: requests that arrive while the worker runs a batch queue
up and become the next batch. The window is worth setting only for bursts that arrive spread out by
less than a batch's run time.
"""

from __future__ import annotations

import logging
import time
from queue import Empty, Queue

from fastapi import HTTPException
from litserve import LitAPI
from litserve.callbacks import CallbackRunner, EventTypes
from litserve.loops import BatchedLoop, BatchedStreamingLoop
from litserve.loops.base import _SENTINEL_VALUE, _StopLoopError
from litserve.transport.base import MessageTransport
from litserve.utils import LitAPIStatus, LoopResponseType, PickleableHTTPException

from .metrics import m

log = logging.getLogger("transerve")

IDLE_WAKE_S = 1.0   # an idle worker still returns to its loop this often


class PromptBatchedLoop(BatchedLoop):
    """LitServe's batched loop (decode_request, batch, predict, unbatch, encode_response) with the
    collector above."""

    def get_batch_requests(self, lit_api: LitAPI, request_queue: Queue, transport: MessageTransport):
        return collect(self, lit_api, request_queue, transport)


class PromptBatchedStreamingLoop(BatchedStreamingLoop):
    """LitServe's batched streaming loop (0.2.19) with the collector above. That loop calls LitServe's
    collector directly rather than through `get_batch_requests`, so this is its body, less the
    LitSpec contexts we do not use: decode_request and batch once, then every item predict yields goes
    through unbatch and encode_response and out to each request's HTTP process, then FINISH."""

    def run_batched_streaming_loop(self, lit_api: LitAPI, request_queue: Queue, transport: MessageTransport,
                                   callback_runner: CallbackRunner, lit_spec=None) -> None:
        stream = LoopResponseType.STREAMING
        while True:
            try:
                payloads, timed_out = collect(self, lit_api, request_queue, transport)
            except _StopLoopError:
                return
            for response_queue_id, uid in timed_out:
                self.put_response(transport, response_queue_id, uid, HTTPException(504, "Request timed out"),
                                  LitAPIStatus.ERROR, stream)
            if not payloads:
                continue
            response_queue_ids, uids, inputs = zip(*payloads)
            try:
                callback_runner.trigger_event(EventTypes.BEFORE_DECODE_REQUEST.value, lit_api=lit_api)
                x = [lit_api.decode_request(i) for i in inputs]
                callback_runner.trigger_event(EventTypes.AFTER_DECODE_REQUEST.value, lit_api=lit_api)
                x = lit_api.batch(x)
                callback_runner.trigger_event(EventTypes.BEFORE_PREDICT.value, lit_api=lit_api)
                y = lit_api.predict(x)
                callback_runner.trigger_event(EventTypes.AFTER_PREDICT.value, lit_api=lit_api)
                for y_batch in lit_api.encode_response(lit_api.unbatch(y)):
                    for response_queue_id, y_enc, uid in zip(response_queue_ids, y_batch, uids):
                        self.put_response(transport, response_queue_id, uid, lit_api.format_encoded_response(y_enc),
                                          LitAPIStatus.OK, stream)
                for response_queue_id, uid in zip(response_queue_ids, uids):
                    self.put_response(transport, response_queue_id, uid, "", LitAPIStatus.FINISH_STREAMING, stream)
            except HTTPException as e:
                for response_queue_id, uid in zip(response_queue_ids, uids):
                    self.put_response(transport, response_queue_id, uid, PickleableHTTPException.from_exception(e),
                                      LitAPIStatus.ERROR, stream)
            except Exception as e:
                log.exception("the generation batch failed")
                for response_queue_id, uid in zip(response_queue_ids, uids):
                    self.put_error_response(transport, response_queue_id, uid, e, stream)


def collect(loop: BatchedLoop | BatchedStreamingLoop, lit_api: LitAPI, request_queue: Queue,
            transport: MessageTransport) -> tuple[list, list]:
    """(payloads, timed_out): up to `max_batch_size` requests as `(response_queue_id, uid, payload)`,
    and `(response_queue_id, uid)` of those that waited longer than `request_timeout` (LitServe
    answers them 504). Both empty when nothing arrived within IDLE_WAKE_S."""
    payloads: list = []
    timed_out: list = []
    check_age = lit_api.request_timeout not in (-1, False)
    response_type = LoopResponseType.STREAMING if lit_api.stream else LoopResponseType.REGULAR
    queue_depth = m().queue_depth.labels(lit_api.api_path.strip("/"))

    def take(item) -> None:
        if item == _SENTINEL_VALUE:
            raise _StopLoopError()
        # The one place every queued request passes, served, timed out or failing later: the gauge
        # the HTTP process raised when it queued the request comes down here and nowhere else.
        queue_depth.dec()
        response_queue_id, uid, queued_at, payload = item
        # Tells the HTTP process which worker holds the request (it fails them if that worker dies).
        loop.put_response(transport=transport, response_queue_id=response_queue_id, uid=uid, response_data=(),
                          status=LitAPIStatus.START, response_type=response_type)
        if check_age and time.monotonic() - queued_at > lit_api.request_timeout:
            timed_out.append((response_queue_id, uid))
        else:
            payloads.append((response_queue_id, uid, payload))

    try:
        take(request_queue.get(timeout=IDLE_WAKE_S))
    except Empty:
        return payloads, timed_out
    window_ends = time.monotonic() + lit_api.batch_timeout
    while len(payloads) < lit_api.max_batch_size:
        try:  # a timeout of 0 takes only what is already queued
            take(request_queue.get(timeout=max(0.0, window_ends - time.monotonic())))
        except Empty:
            break
    return payloads, timed_out
