"""A worker's part of each request's trace (service/tracing.py; nothing here when traces are off). The HTTP
process puts its request span's context in the payload (`carry`, in http/litserve_workers.Workers); the worker
loop (litserve_bridge.SchedulerLoop) tells `WorkerTraces` what happens to the requests it takes:

    transerve.queue         the wait: from the put on LitServe's queue in the HTTP process to the admission
                            into this worker's batch (its --batch-timeout-ms window included), as queue_ms
    transerve.batch         the request in this worker's batch: from its admission into the scheduler to its
                            answer (a generation's steps as events)
    transerve.engine.search the searches of the translation requests that join the running batch at one step
                            (child of its first request's batch span, linked to the others': they serve
                            several traces), each decoder step an event
    transerve.engine.encode its encoder's run, inside the search

each under the request's span in the HTTP process, in the same trace. The two processes share the machine's
clock, so the queue span's start, taken in the HTTP process, is comparable with its end.
"""

from __future__ import annotations

import time
from typing import Generator, Hashable

from .scheduler import Failure
from ..tracing import NOOP, Span, current_carrier, enabled, error_type, start_span


def carry(payload: dict) -> None:
    """Adds the current span's context and the time now to a payload about to be queued (HTTP process)."""
    if enabled():
        payload["trace"] = {"context": current_carrier(), "queued_ns": time.time_ns()}


class WorkerTraces:
    """The worker spans of the requests a worker holds (by their uid), until each is answered."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.requests: dict[Hashable, Span] = {}
        self.searching: Span = NOOP     # the engine search being stepped now

    def watch(self, scheduler) -> None:
        """Wraps the scheduler's engine searches (a translation scheduler's `traced`) and hears its engines'
        encoder runs."""
        if not enabled():
            return
        if hasattr(scheduler, "traced"):
            scheduler.traced = self.search
        for engine in scheduler.engines.values():
            if hasattr(engine, "on_encode"):
                engine.on_encode = self._encoded

    def admitted(self, payloads: list, jobs: dict) -> None:
        """Requests taken off the queue (payloads as `(response_queue_id, uid, payload)`) and decoded (`jobs`,
        by uid): each one's queue span, ended now, and its batch span, begun."""
        if not enabled():
            return
        now = time.time_ns()
        for _, uid, payload in payloads:
            carried = payload.get("trace")
            if not carried:
                continue
            start_span("transerve.queue", parent=carried["context"], start_ns=carried["queued_ns"],
                          endpoint=self.endpoint).end(now)
            job = jobs[uid]
            span = start_span("transerve.batch", parent=carried["context"], start_ns=now, endpoint=self.endpoint,
                                 batch_requests=len(payloads), model=getattr(job, "model", None),
                                 sentences=len(getattr(job, "sentences", None) or ()) or None)
            if isinstance(job, Failure):   # refused by decode_request: answered at once
                span.fail(job.type)
            self.requests[uid] = span

    def step(self, uid: Hashable, **attributes) -> None:
        """An event on a request's batch span (a generation step that brought it new text)."""
        self.requests.get(uid, NOOP).event("step", **attributes)

    def answered(self, uid: Hashable, response=None) -> None:
        """The request's answer went out (an error dict: its span failed by the error's type)."""
        span = self.requests.pop(uid, None)
        if span is None:
            return
        if isinstance(response, dict) and isinstance(response.get("error"), dict):
            span.fail(response["error"].get("type", "internal_error"))
        span.end()

    def abandoned(self, error_type: str) -> None:
        """The scheduler failed: every request held fails."""
        for span in self.requests.values():
            span.fail(error_type)
            span.end()
        self.requests.clear()

    def search(self, steps: Generator, keys: list[Hashable]) -> Generator:
        """`steps` (the searches of requests that joined together, for these requests' sentences) traced, when
        any of them is."""
        spans = [self.requests[k] for k in dict.fromkeys(keys) if k in self.requests]
        return self._traced(steps, spans, len(keys)) if spans else steps

    def _traced(self, steps: Generator, spans: list[Span], rows: int) -> Generator:
        search = start_span("transerve.engine.search", parent=spans[0], links=spans[1:], endpoint=self.endpoint,
                               sentences=rows, requests=len(spans))
        n, reply = 0, None
        try:
            while True:
                self.searching = search      # the encoder's run, if this step has one, goes under it
                try:
                    want = steps.send(reply)
                finally:
                    self.searching = NOOP
                n += 1
                search.event("step", step=n)
                reply = yield want
        except StopIteration as done:
            search.set(steps=n)
            return done.value
        except GeneratorExit:           # closed before its end (the scheduler abandoned its work)
            search.set(steps=n, closed=True)
            raise
        except BaseException as e:
            search.fail(error_type(e))
            raise
        finally:
            steps.close()
            search.end()

    def _encoded(self, start_ns: int, end_ns: int, rows: int) -> None:
        if self.searching is NOOP:   # a search not traced (a failed batch's sentences retried alone)
            return
        start_span("transerve.engine.encode", parent=self.searching, start_ns=start_ns, rows=rows).end(end_ns)
