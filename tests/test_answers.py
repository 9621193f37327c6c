"""The workers' answers' transport (service/worker/answers.py) over its real Unix sockets: a worker's copy of
SocketAnswers (pickled, as LitServe hands it to a spawned worker) writes, the HTTP side reads; no peer, dead,
silent or garbled, stops the others' answers."""

from __future__ import annotations

import asyncio
import multiprocessing
import pickle
import socket
import threading
import time
from multiprocessing.connection import Connection

import pytest
from litserve.utils import LitAPIStatus, LoopResponseType

from service.worker.answers import SocketAnswers, bundle, take_frame


async def listening(answers) -> None:
    """The HTTP side's first read starts its listener; nothing has come yet."""
    with pytest.raises(asyncio.TimeoutError):
        await answers.areceive(0, timeout=0.01)


def worker_side(answers):
    """A worker's copy, pickled as LitServe hands the transport to a spawned worker."""
    return pickle.loads(pickle.dumps(answers))


def test_the_http_side_reads_a_bundle_as_the_messages_it_holds_in_order(tmp_path):
    """Over SocketAnswers' real Unix socket: a worker's copy (pickled, as LitServe hands it to a spawned worker)
    connects and sends; the HTTP side unbundles, in order."""
    answers = SocketAnswers(str(tmp_path))
    worker = worker_side(answers)
    first = ("u1", ("a", LitAPIStatus.OK, LoopResponseType.STREAMING, 0))
    second = ("u2", ("b", LitAPIStatus.OK, LoopResponseType.STREAMING, 0))
    third = ("u1", ("", LitAPIStatus.FINISH_STREAMING, LoopResponseType.STREAMING, 0))

    async def read() -> list:
        await listening(answers)
        sender = threading.Thread(target=lambda: [worker.send(bundle(m), 0)
                                                  for m in ([first, second], [third])])
        sender.start()
        got = [await answers.areceive(0) for _ in range(3)]
        sender.join()
        return got
    try:
        assert asyncio.run(read()) == [first, second, third]
    finally:
        answers.close(send_sentinel=False)
    assert not tmp_path.exists()


def test_no_peer_stops_the_others_answers(tmp_path):
    """A connection that never writes, a worker killed half-way through a message and a message that cannot be
    unpickled: each ends or skips only its own; the answers of a worker connected all along, and a new one's,
    still arrive (each connection read on its own, a frame read whole before it is unpickled)."""
    answers = SocketAnswers(str(tmp_path))
    message = ("u1", ("a", LitAPIStatus.OK, LoopResponseType.REGULAR, 0))
    later = ("u2", ("b", LitAPIStatus.OK, LoopResponseType.REGULAR, 0))

    async def read() -> list:
        await listening(answers)
        silent = socket.socket(socket.AF_UNIX)
        silent.connect(answers.address(0))
        steady = worker_side(answers)
        steady.send(message, 0)
        got = [await answers.areceive(0, timeout=5)]
        dying = worker_side(answers)._connect(0)
        frame = pickle.dumps(message)
        dying._send(len(frame).to_bytes(4, "big") + frame[:len(frame) // 2])   # the header, half the body
        dying.close()
        steady._out[0].send_bytes(b"not a pickle")             # skipped; the connection reads on
        steady.send(later, 0)
        got.append(await answers.areceive(0, timeout=5))
        worker_side(answers).send(message, 0)
        got.append(await answers.areceive(0, timeout=5))
        silent.close()
        return got
    try:
        assert asyncio.run(read()) == [message, later, message]
    finally:
        answers.close(send_sentinel=False)


def http_process(answers, received) -> None:
    """A spawned stand-in for an HTTP process: listens, reads one answer, says so, and exits."""
    async def read() -> None:
        answer = None                       # not listening(): the answer may come within its 10 ms
        while answer is None:               # None: a second without one, as LitServe's loop sees it
            answer = await answers.areceive(0, timeout=60)
        received.put(answer)
    asyncio.run(read())


def test_a_worker_drops_the_answers_of_an_http_process_that_has_gone(tmp_path):
    """Once connected, a worker whose HTTP process has exited fails that send and the next ones at once, not after
    CONNECT_S: a dead HTTP process must not hold the answers bound for the others."""
    answers = SocketAnswers(str(tmp_path))
    worker = worker_side(answers)
    message = ("u1", ("a", LitAPIStatus.OK, LoopResponseType.REGULAR, 0))
    # spawned, not forked: a fork of the suite's process would inherit whatever lock another thread held then.
    spawn = multiprocessing.get_context("spawn")
    received = spawn.Queue()
    http = spawn.Process(target=http_process, args=(answers, received))
    http.start()
    worker.send(message, 0)                 # waits for the listener, as a worker does at start-up
    assert received.get(timeout=60) == message
    http.join(timeout=60)
    assert http.exitcode == 0
    started = time.monotonic()
    for _ in range(3):
        with pytest.raises(OSError):
            for _ in range(100):            # a first write may still land in the closed socket's buffer
                worker.send(message, 0)
    # Three waits for a listener would take 3 x CONNECT_S (60 s each); a loaded CI machine takes well under 1 s.
    assert time.monotonic() - started < SocketAnswers.CONNECT_S / 10


def test_frames_are_taken_whole_however_the_bytes_arrive():
    """multiprocessing.connection's framing, read by the HTTP process on its event loop (answers.Frames): a frame
    split anywhere waits for its rest; several in one read come out in order; the long form (-1, an 8-byte length)
    is read too. Held to what Connection.send_bytes writes."""
    writer, reader = socket.socketpair()
    payloads = [pickle.dumps(("u1", "x" * 300)), b"", pickle.dumps(("u2", "y"))]
    with Connection(writer.detach()) as connection, reader:
        for p in payloads:
            connection.send_bytes(p)
        wire = b""
        while len(wire) < sum(4 + len(p) for p in payloads):   # the bytes as sent
            wire += reader.recv(65536)
    long_form = (-1).to_bytes(4, "big", signed=True) + len(payloads[2]).to_bytes(8, "big") + payloads[2]
    for stream in (wire, long_form + wire):
        for cut in range(len(stream) + 1):        # every split of the stream into two reads
            buffer, got = bytearray(), []
            for part in (stream[:cut], stream[cut:]):
                buffer += part
                while (frame := take_frame(buffer)) is not None:
                    got.append(frame)
            assert got == ([payloads[2]] if stream is not wire else []) + payloads and not buffer, cut
