"""The workers' answers on their way to the HTTP processes: `SocketAnswers`, LitServe's message transport as one
object for both sides (pickled into each worker, which writes; inherited by the forked HTTP processes, each of which
reads into a `Mailbox`), and `bundle`, what one decoder step answers to one HTTP process as one message.

The answers' way back, each hop measured (benchmarks/results/serving-cpu.md): a worker sends no START message
(only LitServe's monitor read it, in another process), sends answers and stream events from a thread of its own
(litserve_bridge.SchedulerLoop.put_response: the next decoder step need not wait for a send), what one step answers
as one message per HTTP process (a bundle: eight streams cost one send a step, not eight), and over a socket of its
own to each HTTP process, not through LitServe's manager process; each HTTP process reads its workers' answers on
its event loop (Frames), not in a thread of its own per worker (each message then cost a thread's wake-up, the GIL
taken from the loop and a call_soon_threadsafe) nor a thread-pool call per message.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import logging
import shutil
import struct
import time
from collections import deque
from multiprocessing.connection import Client, Connection

from litserve.transport.base import MessageTransport


log = logging.getLogger("transerve")

BUNDLE = "transerve-bundle"   # a message that holds several (LitServe's uids are uuid4 strings)


def bundle(messages: list[tuple]) -> tuple:
    """LitServe's messages (uid, (data, status, response type, worker id)) as one: a message alone as it is."""
    return messages[0] if len(messages) == 1 else (BUNDLE, messages)


def unbundled(message: tuple | None) -> list:
    """The messages `bundle` made one, in order; any other (the closing transport's None) as it is."""
    return message[1] if isinstance(message, tuple) and message[0] == BUNDLE else [message]


class SocketAnswers(MessageTransport):
    """The workers' answers to the HTTP processes, each worker writing to each HTTP process over a Unix socket of
    their own (`multiprocessing.connection`'s framing, pickled). LitServe's transport put every answer and every
    streamed event on a queue held by its manager process: a round trip there from the worker and another from the
    HTTP process, a third process to wake on cores the workers keep busy. Here a send is one write, and the HTTP
    process reads it on its event loop.

    Made in the main process, with `folder` (mode 0700, as the manager's own socket: only the server's user can
    connect, so no handshake); the HTTP processes (forked) listen at `folder`/answers-N when they first read, the
    workers (spawned: this object pickled) connect when they first send. Nothing a peer does stops the others: a
    worker that dies mid-write, or a message that cannot be read, ends or skips only its own; a worker whose HTTP
    process has gone drops its answers (they had no one to go to) and tries again after DEAD_S. An HTTP process
    that stops altogether (SIGSTOP) would hold its workers' sends once its socket buffer is full."""

    CONNECT_S = 60.0   # how long a worker waits for an HTTP process to listen the first time (it does at start-up)
    DEAD_S = 5.0       # after an HTTP process stops answering: how long its answers are dropped unsent

    def __init__(self, folder: str):
        self.folder = folder
        self._closed = False
        self._out: dict[int, Connection] = {}                   # worker side: consumer id -> its connection
        self._dead_until: dict[int, float] = {}                 # worker side: consumer id -> when to try again
        self._inboxes: dict[tuple[int, int], Mailbox] = {}  # HTTP side: (pid, consumer id) -> answers
        self._listeners: list[asyncio.AbstractServer] = []

    def __reduce__(self):
        return (SocketAnswers, (self.folder,))

    def address(self, consumer_id: int) -> str:
        return os.path.join(self.folder, f"answers-{consumer_id}")

    # --- the worker side: one thread (the loop's sender) sends ---------------------------------------------
    def send(self, item, consumer_id: int) -> None:
        """Writes `item` to HTTP process `consumer_id`; raises when it cannot (the answer is lost with it)."""
        connection = self._out.get(consumer_id) or self._connect(consumer_id)
        try:
            connection.send_bytes(pickle.dumps(item, pickle.HIGHEST_PROTOCOL))   # half ForkingPickler's cost
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
    async def _start(self, consumer_id: int) -> Mailbox:
        """Listens for this HTTP process's workers on its event loop: each connection's frames read as they come
        (Frames), no thread between the socket and the loop."""
        loop = asyncio.get_running_loop()
        inbox = Mailbox(loop)
        self._inboxes[os.getpid(), consumer_id] = inbox
        self._listeners.append(await loop.create_unix_server(lambda: Frames(inbox), self.address(consumer_id),
                                                             backlog=64))
        return inbox

    async def areceive(self, consumer_id: int, timeout: float | None = None, block: bool = True):
        """The next answer; None after a second without one (LitServe's loop then asks again)."""
        if self._closed:
            raise asyncio.CancelledError("Transport closed")
        inbox = self._inboxes.get((os.getpid(), consumer_id))
        if inbox is None:
            inbox = await self._start(consumer_id)
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
            with contextlib.suppress(Exception):    # its loop may have closed already
                listener.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class Frames(asyncio.Protocol):
    """One worker's connection to this HTTP process, read on the event loop: `multiprocessing.connection`'s frames
    (a 4-byte big-endian length, or -1 and an 8-byte one, then the pickle), each message handed to the Mailbox as
    it is whole. A message that cannot be unpickled is dropped alone (its frame was read whole); a worker that dies
    mid-write ends only its own connection, its part-frame dropped with it."""

    def __init__(self, inbox: Mailbox):
        self.inbox, self.buffer = inbox, bytearray()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        messages: list = []
        while (frame := take_frame(self.buffer)) is not None:
            try:
                messages += unbundled(pickle.loads(frame))
            except Exception:
                log.exception("an answer could not be read; it is dropped")
        if messages:
            self.inbox.put_all(messages)


def take_frame(buffer: bytearray) -> bytes | None:
    """The first whole frame of `buffer`, taken off it; None while it is not whole yet."""
    if len(buffer) < 4:
        return None
    (size,), start = struct.unpack_from("!i", buffer), 4
    if size == -1:                                   # over 2 GiB: an 8-byte length follows
        if len(buffer) < 12:
            return None
        (size,), start = struct.unpack_from("!Q", buffer, 4), 12
    if len(buffer) < start + size:
        return None
    frame = bytes(buffer[start:start + size])
    del buffer[:start + size]
    return frame


class Mailbox:
    """An HTTP process's answers, handed over on its event loop as their frames arrive (Frames), read one at a time
    by LitServe's consumer: asyncio.Queue's get() under asyncio.wait_for cost a Task and a timer an answer."""

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
