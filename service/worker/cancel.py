"""Which requests' clients went away, how often each endpoint's workers started (and each began to listen) and how
many of its requests are queued: shared by the HTTP processes and the inference workers."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np


class CancelBoard:
    """Numbers of requests whose client disconnected, shared by HTTP processes and workers.

    A ring of the last SIZE cancellations in shared memory: the HTTP side writes, workers read it
    once per decoding step (one numpy isin over 4096 integers), and nothing needs freeing.
    """
    SIZE = 4096

    def __init__(self, endpoints: tuple[str, ...] = (), workers: int = 1):
        # LitServe spawns its workers; locks of the default (fork) context cannot be pickled into them.
        ctx = mp.get_context("spawn")
        self._ring = ctx.Array("q", self.SIZE)
        self._next = ctx.Value("q", 0)
        self._numbers = ctx.Value("q", 0)
        self._endpoints = endpoints
        self._starts = ctx.Array("q", max(1, len(endpoints)))
        self._queued = ctx.Array("q", max(1, len(endpoints)))
        self._workers = workers                   # each endpoint's inference workers
        self._listening = ctx.Array("q", max(1, len(endpoints) * workers))

    def worker_started(self, endpoint: str) -> None:
        """Called by a worker of `endpoint` as its setup begins: a restarted worker is seen by this count
        even where LitServe's not-ready state lasts too short for a poll to catch it."""
        with self._starts.get_lock():
            self._starts[self._endpoints.index(endpoint)] += 1

    def worker_starts(self) -> dict[str, int]:
        return dict(zip(self._endpoints, self._starts[:len(self._endpoints)]))

    def worker_listening(self, endpoint: str, worker_id: int) -> None:
        """Called by worker `worker_id` of `endpoint` as it begins to listen for requests (worker/request_inbox.py):
        the requests an HTTP process sent to this worker id before are its dead predecessors', and only those fail
        (http/litserve_workers.py)."""
        i = self._listener_index(endpoint, worker_id)
        if i is not None:
            with self._listening.get_lock():
                self._listening[i] += 1

    def listeners(self) -> dict[tuple[str, int], int]:
        """(endpoint, worker id) -> how many times a worker with that id began to listen."""
        counts = self._listening[:len(self._endpoints) * self._workers]
        return {(e, w): counts[i * self._workers + w] for i, e in enumerate(self._endpoints)
                for w in range(self._workers)}

    def listened(self, endpoint: str, worker_id: int) -> int:
        """How many times a worker with that id began to listen (0 for one the board does not know): listeners()'s
        one entry, read alone, as every request sent reads it."""
        i = self._listener_index(endpoint, worker_id)
        return 0 if i is None else self._listening.get_obj()[i]

    def _listener_index(self, endpoint: str, worker_id: int) -> int | None:
        if endpoint not in self._endpoints or not 0 <= worker_id < self._workers:
            return None
        return self._endpoints.index(endpoint) * self._workers + worker_id

    def queued(self, endpoint: str, change: int = 0) -> int:
        """Requests of `endpoint` sent to its workers and not taken yet, after adding `change` (the HTTP side +1 as
        it sends one, the worker -1 as it takes one): a busy worker looks at its queue only when this says
        something is there. An endpoint this board does not know: 1."""
        if endpoint not in self._endpoints:
            return 1
        i = self._endpoints.index(endpoint)
        if not change:
            return self._queued[i]
        with self._queued.get_lock():   # the raw array under its lock: each synchronized access would take it again
            counts = self._queued.get_obj()
            counts[i] += change
            return counts[i]

    def cancellations(self) -> int:
        """How many cancellations were written so far: a reader that saw this many before has nothing new."""
        return self._next.value

    def new_number(self) -> int:
        with self._numbers.get_lock():
            numbers = self._numbers.get_obj()
            numbers.value += 1
            return numbers.value

    def cancel(self, number: int) -> None:
        with self._next.get_lock():
            written = self._next.get_obj()
            self._ring.get_obj()[written.value % self.SIZE] = number
            written.value += 1

    def cancelled(self, numbers: np.ndarray) -> np.ndarray:
        # Only the part of the ring written so far (a worker asks at every step that admitted a request, and
        # isin sorts what it is given: 4,096 numbers cost a worker 2% of its CPU while few were cancelled).
        # A copy first: the HTTP side writes the ring while isin reads it, and isin sizes its table
        # from the values it saw first (a later, larger one indexed past it: IndexError).
        written = min(self._next.value, self.SIZE)
        if not written:
            return np.zeros(len(numbers), dtype=bool)
        return np.isin(numbers, np.frombuffer(self._ring.get_obj(), dtype=np.int64)[:written].copy())
