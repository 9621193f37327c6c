"""SIGINT and SIGTERM: the main process drains and stops every process; the others wait to be stopped.

Ctrl+C in a terminal sends SIGINT to the whole process group, as systemd, `docker stop` of a shell wrapper and
`kill -- -PGID` send SIGTERM to it: the main process, LitServe's multiprocessing manager, the HTTP processes
and the inference workers all get the signal at once. Were each to act on it, a worker would die under the
requests in flight, the manager under the main process (whose shutdown wait then fails with EOFError), and an
HTTP process would stop answering while the others lived on holding the port. So only the main process acts
(service/__main__.py): it refuses new requests, lets the admitted ones finish (--drain-timeout-s,
Admission.drain), orders the stop (`Stopping.order`), and LitServe ends the others in turn: the HTTP
processes and the workers with SIGTERM, the manager with a message.

A child acts on SIGINT or SIGTERM only once the stop is ordered, or when the main process is gone (a killed
main process must not leave children that no signal stops), and the kernel sends each child SIGTERM when the
main process dies, however it dies (`die_with_main`). Forked children (the manager, the HTTP
processes) inherit the main process's handler, which leaves them to `child_signal`; the spawned workers set
theirs in setup (`guard`), the HTTP processes theirs over uvicorn's (uvicorn_bridge.hold_signals).
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import multiprocessing.util
import os
import signal
import sys
from types import FrameType
from typing import Callable

SIGNALS = (signal.SIGINT, signal.SIGTERM)
PR_SET_PDEATHSIG = 1     # prctl(2): the signal the kernel sends a process when its parent dies

Handler = Callable[[int, "FrameType | None"], None]


class Stopping:
    """Made in the main process before any child: shared with the forked children by inheritance and
    pickled into the spawned workers."""

    def __init__(self):
        self._ordered = mp.get_context("spawn").Event()   # spawn: picklable into LitServe's workers
        self.main_pid = os.getpid()
        # Forked children (the manager, the HTTP processes) die with the main process from their first line on.
        multiprocessing.util.register_after_fork(self, Stopping.die_with_main)

    def order(self) -> None:
        """The main process has drained: the children may now act on the signals LitServe stops them with."""
        self._ordered.set()

    def obeyed(self) -> bool:
        """Whether a child acts on SIGINT or SIGTERM now: the stop is ordered, or the main process is gone."""
        return self._ordered.is_set() or os.getppid() != self.main_pid

    def die_with_main(self) -> None:
        """In a child: the kernel sends it SIGTERM when the main process dies, even by SIGKILL (Linux's
        PR_SET_PDEATHSIG), which it obeys then: a killed main process leaves no HTTP process holding the port and no
        worker holding the device. The kernel sends it when the thread that made the child ends too; with the main
        process alive the child then ignores it (obeyed())."""
        if sys.platform != "linux" or os.getpid() == self.main_pid:
            return
        if os.getppid() != self.main_pid:
            if not main_alive(self.main_pid):    # it died before the request: nothing will send the signal
                os.kill(os.getpid(), signal.SIGTERM)
            return                               # a grandchild (none of ours is): its parent is not the main process
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != self.main_pid:        # it died between the look and the request
            os.kill(os.getpid(), signal.SIGTERM)

    def guard(self, act: Handler) -> None:
        """In a child process: SIGINT and SIGTERM go to `act` once obeyed(), and are ignored before; the child
        dies with the main process (die_with_main)."""
        def handler(signum: int, frame: FrameType | None) -> None:
            if self.obeyed():
                act(signum, frame)

        for sig in SIGNALS:
            signal.signal(sig, handler)
        # SIGHUP asks the main process to re-read the API keys (service/http/keys.py); sent to the whole
        # process group, it must not end a child, whose default it would be.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.die_with_main()

    def handle_in_main(self, on_signal: Callable[[int], None]) -> None:
        """The main process's handler, `on_signal(signum)`, installed before LitServe forks: a forked child
        that inherits it leaves the signal to child_signal. Set whatever the disposition inherited: a shell
        starts a background job with SIGINT ignored, and Ctrl+C must still stop the server."""
        def handler(signum: int, frame: FrameType | None) -> None:
            if os.getpid() != self.main_pid:
                self.child_signal(signum, frame)
            else:
                on_signal(signum)

        for sig in SIGNALS:
            signal.signal(sig, handler)

    def child_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.obeyed():
            die(signum, frame)


def main_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:      # alive, another user's (a reused pid)
        return True
    return True


def die(signum: int, frame: FrameType | None = None) -> None:
    """What the signal does by default: the process ends, killed by it."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
