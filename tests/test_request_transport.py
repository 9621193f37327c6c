"""The requests' way from an HTTP process to the inference workers (service/worker/request_sender.py and
request_inbox.py) over their real Unix sockets: each worker side a pickled copy of the inbox, as LitServe hands
it to a spawned worker, listening in this process."""

from __future__ import annotations

import asyncio
import multiprocessing
import pickle
import queue
import shutil
import socket
import tempfile
import time
from pathlib import Path

import pytest

from service.worker.request_inbox import RequestInbox, request_address
from service.worker.request_sender import RequestSender
from service.worker.unix_listener import SUN_PATH_MAX, socket_folder


def item(uid: str, payload=None) -> tuple:
    """LitServe's request tuple: (response queue id, uid, queued at, payload)."""
    return (0, uid, time.monotonic(), payload or {"texts": [uid]})


def worker(folder: str, worker_id: int) -> RequestInbox:
    inbox = pickle.loads(pickle.dumps(RequestInbox(folder)))
    inbox.listen(worker_id)
    return inbox


def uids(inbox: RequestInbox) -> list[str]:
    got = []
    while True:
        try:
            got.append(inbox.get(timeout=0.5)[1])
        except queue.Empty:
            return got


def test_requests_reach_the_worker_in_order_whole(tmp_path):
    inbox = worker(str(tmp_path), 0)
    sender = RequestSender(str(tmp_path), workers=1)
    big = {"texts": ["x" * 300_000]}                       # more than a socket buffer: read while written
    sent = [item("a"), item("b", big), item("c")]

    async def send():
        for one in sent:
            await sender.put(one, timeout_s=5)
    asyncio.run(send())
    assert [inbox.get(timeout=5) for _ in sent] == sent
    with pytest.raises(queue.Empty):
        inbox.get(timeout=0)
    inbox.close()


def test_each_request_goes_to_the_worker_holding_fewest_and_ties_alternate(tmp_path):
    first, second = worker(str(tmp_path), 0), worker(str(tmp_path), 1)
    sender = RequestSender(str(tmp_path), workers=2)

    async def send(*names):
        for name in names:
            await sender.put(item(name), timeout_s=5)
    asyncio.run(send("a", "b", "c", "d"))                  # ties: in turn
    assert (uids(first), uids(second)) == (["a", "c"], ["b", "d"])
    sender.done("a")
    sender.done("c")                                       # the first worker answered both of its requests
    asyncio.run(send("e", "f", "g"))                       # two to it before the second holds more than it
    assert (uids(first), uids(second)) == (["e", "f"], ["g"])
    sender.done("unknown")                                 # an uid it never sent: nothing changes
    assert sender._held == [2, 3]


def serve_inbox(folder: str, worker_id: int, out) -> None:
    """A spawned stand-in for a worker: listens and passes on each request's uid."""
    inbox = RequestInbox(folder)
    inbox.listen(worker_id)
    while True:
        out.put(inbox.get()[1])


def until_listening(address: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(address)
            return
        except OSError:
            assert time.monotonic() < deadline, "the worker never listened"
            time.sleep(0.05)
        finally:
            probe.close()


def test_a_worker_that_died_is_skipped_and_a_restarted_one_takes_its_address(tmp_path):
    spawn = multiprocessing.get_context("spawn")
    out = spawn.Queue()
    dying = spawn.Process(target=serve_inbox, args=(str(tmp_path), 0, out), daemon=True)
    dying.start()
    until_listening(request_address(str(tmp_path), 0))
    second = worker(str(tmp_path), 1)
    sender = RequestSender(str(tmp_path), workers=2)

    async def send(*names):
        for name in names:
            await sender.put(item(name), timeout_s=5)
    asyncio.run(send("a", "b"))
    assert out.get(timeout=30) == "a"
    dying.kill()
    dying.join(timeout=30)
    # "c": its turn was the dead worker's, whose connection now fails; "d": its socket file refuses
    asyncio.run(send("c", "d"))
    assert uids(second) == ["b", "c", "d"]
    restarted = worker(str(tmp_path), 0)                   # the same address, its predecessor's file removed
    for uid in "abcd":
        sender.done(uid)                                   # "a" failed by Workers.lost(), the others answered
    asyncio.run(send("e"))
    assert uids(restarted) == ["e"]


def test_a_request_for_a_lone_worker_that_died_waits_for_its_successor(tmp_path):
    """In one event loop, as an HTTP process's: a request and a control message sent after the lone worker's death
    (its old connection still held) wait for a worker to listen, none lost on the dead one's connection, and its
    successor at the same address takes both."""
    spawn = multiprocessing.get_context("spawn")
    out = spawn.Queue()
    dying = spawn.Process(target=serve_inbox, args=(str(tmp_path), 0, out), daemon=True)
    dying.start()
    until_listening(request_address(str(tmp_path), 0))
    sender = RequestSender(str(tmp_path), workers=1)

    async def run():
        await sender.put(item("a"), timeout_s=5)
        assert await asyncio.to_thread(out.get, timeout=30) == "a"
        dying.kill()
        await asyncio.to_thread(dying.join, 30)
        await asyncio.sleep(0.1)
        sender.done("a")
        put = asyncio.ensure_future(sender.put(item("b"), timeout_s=10))
        control = asyncio.ensure_future(sender.put(item("c"), timeout_s=10, worker=0))
        await asyncio.sleep(0.3)
        assert not put.done() and not control.done()      # no worker listens: they wait
        restarted = worker(str(tmp_path), 0)
        await asyncio.wait_for(asyncio.gather(put, control), 5)
        await asyncio.sleep(0)
        return restarted
    restarted = asyncio.run(run())
    assert sorted(uids(restarted)) == ["b", "c"]
    assert sender._held == [2]


def test_with_no_worker_listening_a_request_waits_for_one_without_blocking_the_loop(tmp_path):
    sender = RequestSender(str(tmp_path), workers=1)
    inboxes = []

    async def run():
        put = asyncio.ensure_future(sender.put(item("a"), timeout_s=10))
        ticks = 0
        for _ in range(10):                                # the loop runs on while the request waits
            await asyncio.sleep(0.01)
            ticks += 1
        assert not put.done()
        inboxes.append(worker(str(tmp_path), 0))           # the worker starts listening
        await asyncio.wait_for(put, 5)
        return ticks
    assert asyncio.run(run()) == 10
    assert uids(inboxes[0]) == ["a"]


def test_no_worker_within_the_timeout_is_a_timeout_error(tmp_path):
    sender = RequestSender(str(tmp_path), workers=2)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        asyncio.run(sender.put(item("a"), timeout_s=0.2))
    assert time.monotonic() - started < 5


def test_a_sender_that_dies_mid_request_or_sends_garbage_stops_only_its_own(tmp_path):
    inbox = worker(str(tmp_path), 0)
    dying = socket.socket(socket.AF_UNIX)
    dying.connect(request_address(str(tmp_path), 0))
    frame = pickle.dumps(item("lost"))
    dying.sendall(len(frame).to_bytes(4, "big") + frame[: len(frame) // 2])   # the header, half the body
    dying.close()
    sender = RequestSender(str(tmp_path), workers=1)

    async def send():
        await sender.put(item("a"), timeout_s=5)
        sender._out[0].send_bytes(b"not a pickle")         # skipped; the connection reads on
        await sender.put(item("b"), timeout_s=5)
    asyncio.run(send())
    assert uids(inbox) == ["a", "b"]


def test_a_temporary_directory_too_long_for_unix_sockets_gives_way_to_tmp(monkeypatch):
    """A TMPDIR whose sockets' paths would pass SUN_PATH_MAX (a test runner's, say): the sockets' folder is made in
    /tmp instead, and a worker listens there; a short one is used as it is."""
    long = Path(tempfile.mkdtemp(prefix="l-", dir="/tmp")) / ("d" * 70)     # whatever the runner's own TMPDIR
    long.mkdir()
    assert len(str(long)) + 44 > SUN_PATH_MAX
    monkeypatch.setenv("TMPDIR", str(long))
    monkeypatch.setattr("tempfile.tempdir", None)       # tempfile reads TMPDIR again
    folder = socket_folder("transerve-requests-")
    try:
        assert folder.startswith("/tmp/transerve-requests-") and not folder.startswith(str(long))
        inbox = worker(folder, 12)
        assert len(request_address(folder, 12)) <= SUN_PATH_MAX
        inbox.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(long.parent, ignore_errors=True)
    short = tempfile.mkdtemp(prefix="s-", dir="/tmp")
    monkeypatch.setenv("TMPDIR", short)
    monkeypatch.setattr("tempfile.tempdir", None)
    try:
        assert socket_folder("transerve-answers-").startswith(short + "/transerve-answers-")
    finally:
        shutil.rmtree(short, ignore_errors=True)
