"""An inference worker's way in: the requests the HTTP processes send it, over a Unix socket it listens on.

LitServe's request queue lives in its manager process: each put from an HTTP process was a round trip there that
blocked the event loop (18-25% of the HTTP process's samples in a py-spy profile), and each get or look from a
worker another, between decoder steps. Here an HTTP process writes a request to the socket of the worker it
picks (service/worker/request_sender.py, the other side), and the worker's threads read what arrives into a queue
in its own memory: a put is one write, a worker's look at what is queued costs a lock, not a trip to another
process. The worker loop (litserve_bridge.SchedulerLoop) reads `RequestInbox` as it read LitServe's queue.

Each worker listens at `folder`/requests-<worker id>; a restarted worker takes over its predecessor's address.
The folder is made by the main process (mode 0700: only the server's user can connect, so no handshake) and
removed by it when the server stops. Nothing a peer does stops the others: an HTTP process that dies mid-write,
or a request that cannot be read, ends or skips only its own.
"""

from __future__ import annotations

import contextlib
import os
import socket
from queue import SimpleQueue

from .unix_listener import listen


def request_address(folder: str, worker_id: int) -> str:
    """Where worker `worker_id` of an endpoint listens for its requests."""
    return os.path.join(folder, f"requests-{worker_id}")


class RequestInbox:
    """The requests sent to one inference worker, read as a queue: `get(timeout)` raises queue.Empty when nothing
    came in time. Made in the main process and handed (pickled) to every worker of an endpoint; each listens
    (`listen(worker_id)`) before it first reads."""

    def __init__(self, folder: str):
        self.folder = folder
        self._items: SimpleQueue | None = None   # worker side, once listening: the requests read so far
        self._listener: socket.socket | None = None

    def __reduce__(self):
        return (RequestInbox, (self.folder,))

    def listen(self, worker_id: int) -> None:
        """Listens at this worker's address (a dead predecessor's socket file taken over); each HTTP process that
        connects is read by a thread of its own (unix_listener.py)."""
        address = request_address(self.folder, worker_id)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(address)
        self._items = items = SimpleQueue()

        def deliver(request) -> bool:
            items.put(request)
            return True
        self._listener = listen(address, deliver, "requests")

    def get(self, timeout: float | None = None):
        """The next request; queue.Empty when none came within `timeout` seconds (0: only one already here)."""
        if self._items is None:
            raise RuntimeError("RequestInbox.get() before listen()")
        if timeout is not None and timeout <= 0:
            return self._items.get_nowait()
        return self._items.get(timeout=timeout)

    def close(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)    # wakes its accept()
            self._listener.close()

