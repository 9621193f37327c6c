"""An HTTP process's way to an endpoint's inference workers: each request written to the socket of one worker
(request_inbox.py, the other side), the worker with the fewest of this process's requests
unanswered, ties taken in turn.

LitServe's one queue per endpoint let whichever worker was free take the next request; a request here is sent to
one worker, which admits it at its next step (its running batch takes new work between decoder steps), so the
count of what each worker holds is what keeps them evenly loaded. Each HTTP process counts its own requests: with
several (--api-servers) each spreads its share.

A worker that is not listening (starting, or restarted after it died) is skipped; when none is, the request
waits, without blocking the event loop, for one to listen. A request sent to a worker that then dies is lost with
it, as one it had taken off LitServe's queue was: Workers.lost() fails those (503, retry).

A send is one write on the event loop's thread. It would block only with the worker's socket buffer full, which
its reader threads keep empty unless the worker is stopped altogether (SIGSTOP).
"""

from __future__ import annotations

import asyncio
import os
import pickle
import time
from multiprocessing.connection import Client, Connection

from .request_inbox import request_address

RETRY_S = 0.02   # with no worker listening: how often a waiting request tries again


class RequestSender:
    """Made in the main process beside the endpoint's RequestInbox (the same `folder`); inherited by the forked
    HTTP processes, each of which opens its own connections."""

    def __init__(self, folder: str, workers: int):
        self.folder, self.workers = folder, workers
        self._pid = None
        self._out: dict[int, Connection] = {}      # worker id -> this process's connection to it
        self._held: list[int] = [0] * workers      # worker id -> this process's requests it holds unanswered
        self._where: dict[str, int] = {}           # uid -> the worker it was sent to, until done()
        self._turn = 0                             # the worker a tie goes to first

    async def put(self, item: tuple, timeout_s: float, worker: int | None = None) -> int:
        """Sends LitServe's request tuple (response queue id, uid, queued at, payload) to a worker (`worker`: that
        one, as model control sends to each); the worker it went to. TimeoutError when no worker listened within
        `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while (sent_to := self._send(item, worker)) is None:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no worker listened within {timeout_s:g} s")
            await asyncio.sleep(RETRY_S)
        return sent_to

    def done(self, uid: str) -> None:
        """The request `uid` was answered, failed or given up: its worker holds one fewer of this process's."""
        worker = self._where.pop(uid, None)
        if worker is not None:
            self._held[worker] -= 1

    def _send(self, item: tuple, only: int | None = None) -> int | None:
        if self._pid != os.getpid():               # a forked HTTP process: the parent's connections are not its own
            self._pid, self._out, self._where, self._held = os.getpid(), {}, {}, [0] * self.workers
        n = self.workers
        order = [only] if only is not None else sorted(range(n), key=lambda w: (self._held[w], (w - self._turn) % n))
        for worker in order:
            try:
                connection = self._out.get(worker) or self._connect(worker)
                connection.send_bytes(pickle.dumps(item, pickle.HIGHEST_PROTOCOL))   # read by unix_listener
            except OSError:                        # not listening (yet), or gone since the last send
                dropped = self._out.pop(worker, None)
                if dropped is not None:
                    dropped.close()
                continue
            self._held[worker] += 1
            self._where[item[1]] = worker
            self._turn = (worker + 1) % n
            return worker
        return None

    def _connect(self, worker: int) -> Connection:
        connection = Client(request_address(self.folder, worker), family="AF_UNIX")
        self._out[worker] = connection
        return connection
