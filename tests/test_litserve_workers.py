"""The HTTP process's way to the workers (service/http/litserve_workers.py): when it says the workers are ready."""

from __future__ import annotations

import asyncio
import time

from service.http.litserve_workers import LOST_HOLD_S, Workers
from service.worker.cancel import CancelBoard


def test_ready_waits_until_a_restarted_worker_is_acted_on_and_its_hold_back_has_passed():
    """A worker restarted between two polls of the watcher: until the watcher has failed the requests that may
    have gone with it, and the dead worker's get() on LitServe's queue has timed out, a request put now could
    be lost, so the HTTP process says it is not ready (a probe, a client waiting for /ready)."""
    from types import SimpleNamespace

    from litserve.utils import WorkerSetupStatus

    board = CancelBoard(("generate",))
    server = SimpleNamespace(workers_setup_status={"generate_0": WorkerSetupStatus.READY})
    workers = Workers(server, {}, board, request_timeout_s=10)

    async def run():
        assert workers.ready()
        lost = workers.lost(workers.holder("generate"))   # a request waits: the watcher runs
        await asyncio.sleep(0.1)
        board.worker_started("generate")             # died and started again, ready before any poll saw it
        assert not workers.ready()
        await asyncio.wait_for(lost.wait(), 5)       # the watcher's next poll fails the waiting requests
        assert not workers.ready()

        async def until_ready():
            while not workers.ready():
                await asyncio.sleep(0.05)
        await asyncio.wait_for(until_ready(), 10)
        return time.monotonic()

    ready_at = asyncio.run(run())
    assert ready_at >= workers._lost_at["generate"] + LOST_HOLD_S


def two_listening_workers():
    """(board, server, Workers) for two translation workers, both ready and listening, as a fake server shows them."""
    from types import SimpleNamespace

    from litserve.utils import WorkerSetupStatus

    board = CancelBoard(("translate",), workers=2)
    server = SimpleNamespace(workers_setup_status={"translate_0": WorkerSetupStatus.READY,
                                                   "translate_1": WorkerSetupStatus.READY})
    board.worker_listening("translate", 0)
    board.worker_listening("translate", 1)
    return board, server, Workers(server, {}, board, request_timeout_s=10)


def test_a_restart_fails_the_requests_of_the_dead_worker_only():
    """Worker 0 died and its successor listens before a poll saw it: the request sent to the dead one fails; one
    sent to its sibling and one sent to the successor do not (they were all failed before, with the endpoint)."""
    board, server, workers = two_listening_workers()

    async def run():
        dead, sibling = workers.lost(workers.holder("translate", 0)), workers.lost(workers.holder("translate", 1))
        await asyncio.sleep(0.1)
        board.worker_listening("translate", 0)       # died; its successor listens at its address
        successor = workers.lost(workers.holder("translate", 0))
        await asyncio.wait_for(dead.wait(), 5)
        await asyncio.sleep(1.2)                     # two more polls
        return sibling.is_set(), successor.is_set()

    assert asyncio.run(run()) == (False, False)


def test_a_worker_found_not_ready_fails_its_requests_though_no_poll_saw_it_ready():
    """The watcher's first poll (it starts with a process's first request) finds worker 0 already restarting, or a
    worker died again within a poll of its restart: no change from ready was seen, and its successor may never listen
    (a setup that fails). The request sent to it fails all the same; its sibling's does not."""
    from litserve.utils import WorkerSetupStatus

    board, server, workers = two_listening_workers()

    async def run():
        dead, sibling = workers.lost(workers.holder("translate", 0)), workers.lost(workers.holder("translate", 1))
        server.workers_setup_status["translate_0"] = WorkerSetupStatus.STARTING   # before the watcher's first poll
        await asyncio.wait_for(dead.wait(), 5)
        server.workers_setup_status["translate_0"] = WorkerSetupStatus.ERROR      # its successor's setup failed
        await asyncio.sleep(1.2)
        return sibling.is_set()

    assert asyncio.run(run()) is False
