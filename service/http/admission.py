"""Admission: the bound on requests waiting or running, shared by every HTTP process, and the drain on
SIGINT and SIGTERM (service/stopping.py). Each endpoint holds a place for as long as its request is queued
or running:

    with admission.admitted("translate"):
        answer = await workers.call(...)
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from contextlib import contextmanager

from ..tracing import Span, child_span
from ..errors import ApiError
from ..metrics import labelled, metrics

log = logging.getLogger("transerve")


class Admission:
    def __init__(self, max_queue: int):
        self.max_queue = max_queue
        # Shared by every HTTP process (LitServe forks them after this): the bound is global, and a signal's
        # drain in the main process can see when the last request has been answered. The raw values under one
        # lock: a synchronized Value's accessors and an Event's is_set() each take locks of their own, eight
        # lock operations a request where two do.
        self._lock = mp.Lock()
        self._active = mp.RawValue("i", 0)
        self._draining = mp.RawValue("b", 0)

    @property
    def active(self) -> int:
        """Requests admitted and not yet answered, in every HTTP process."""
        return self._active.value

    def draining(self) -> bool:
        return bool(self._draining.value)

    @contextmanager
    def admitted(self, endpoint: str):
        """Holds one of the max_queue places, or refuses with 503 (full, or shutting down); traced as the
        request's admission span (its 503 by type)."""
        with child_span("transerve.admission", endpoint=endpoint) as span:
            self._take(endpoint, span)
        labelled(metrics().in_flight, endpoint).inc()
        try:
            yield
        finally:
            with self._lock:
                self._active.value -= 1
            labelled(metrics().in_flight, endpoint).dec()

    def _take(self, endpoint: str, span: Span) -> None:
        if self._draining.value:
            raise ApiError(503, "shutting_down", "the server is shutting down; retry on another replica",
                           headers={"Retry-After": "1"})
        with self._lock:
            active = self._active.value
            full = active >= self.max_queue
            if not full:
                self._active.value = active = active + 1
        span.set(requests_active=active)
        if full:
            metrics().rejected.labels(endpoint).inc()
            raise ApiError(503, "overloaded", f"{self.max_queue} requests are already waiting; retry later",
                           self.max_queue, {"Retry-After": "1"})

    def drain(self, grace_s: float) -> None:
        """Refuses new requests (and /ready fails), then waits up to grace_s for the admitted ones."""
        self._draining.value = 1
        deadline = time.monotonic() + grace_s
        # Connections accepted just before the signal may not have reached a handler yet: give them a
        # moment to be admitted (or refused with 503) before waiting for the active count to reach 0.
        time.sleep(min(1.0, grace_s))
        while self.active > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        log.info("drained (%d requests still active); stopping", self.active)
