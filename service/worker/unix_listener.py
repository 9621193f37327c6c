"""A Unix socket's listener whose connections each bring pickled messages (`multiprocessing.connection`'s framing):
what the workers' request inboxes (request_inbox.py) listen with. (The HTTP processes read their answers on their
event loops instead: answers.Frames.)

Nothing a peer does stops the others: each connection is read by a thread of its own, a peer that dies mid-write
ends only its own connection, and a message that cannot be unpickled is skipped (its frame was read whole).
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from typing import Callable

log = logging.getLogger("transerve")
SUN_PATH_MAX = 107   # the longest path a Unix socket binds to, in bytes (sun_path's 108 with its NUL)


def socket_base(longest: int = 44) -> str:
    """Where Unix sockets are made: the temporary directory when a socket's path `longest` bytes below it fits in
    SUN_PATH_MAX (ours: /transerve-requests-XXXXXXXX/requests-N; multiprocessing's manager:
    /pymp-XXXXXXXX/listener-XXXXXXXX), else /tmp. A long TMPDIR, as a test runner's, made a bind fail with
    "AF_UNIX path too long": the manager's at start-up, or a worker's, whose requests then waited for it."""
    for base in (tempfile.gettempdir(), "/tmp"):
        if len(os.fsencode(base)) + longest <= SUN_PATH_MAX and os.access(base, os.W_OK | os.X_OK):
            return base
    raise OSError(f"the temporary directory {tempfile.gettempdir()!r} is too long for Unix sockets' paths "
                  f"({SUN_PATH_MAX} bytes) and /tmp cannot be written: set TMPDIR to a shorter path")


def socket_folder(prefix: str) -> str:
    """A new private folder for Unix sockets (socket_base's)."""
    return tempfile.mkdtemp(prefix=prefix, dir=socket_base())


def listen(address: str, deliver: Callable[[object], bool], what: str) -> socket.socket:
    """Listens at `address`; each message read is given to deliver(message), which returns False when this
    process can take no more (that connection then ends). `what` names the messages in threads and logs. Close
    the listener to stop accepting."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    threading.Thread(target=_accept, args=(listener, deliver, what), name=f"{what}-accept", daemon=True).start()
    return listener


def _accept(listener: socket.socket, deliver: Callable[[object], bool], what: str) -> None:
    while True:
        try:
            peer, _ = listener.accept()
        except OSError:
            if listener.fileno() < 0:          # closed
                return
            time.sleep(0.1)                    # out of file descriptors, say: the peers already connected go on
            continue
        threading.Thread(target=_read, args=(Connection(peer.detach()), deliver, what), name=what,
                         daemon=True).start()


def _read(connection: Connection, deliver: Callable[[object], bool], what: str) -> None:
    with connection:
        while True:
            try:
                frame = connection.recv_bytes()
            except (EOFError, OSError):        # that peer stopped, perhaps mid-write
                return
            try:
                message = pickle.loads(frame)
            except Exception:                  # the frame is whole: the next one can still be read
                log.exception("a message (%s) could not be read; it is dropped", what)
                continue
            if not deliver(message):
                return
