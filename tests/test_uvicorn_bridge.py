"""The connection cap of service/http/uvicorn_bridge.py, in this process: the real protocol class on a real
asyncio server on 127.0.0.1, real client sockets. tests/test_slow_clients.py floods a served process with
hundreds; here one step of the cap is looked at exactly, which a flood shows only by chance."""

import asyncio

from uvicorn.config import Config
from uvicorn.server import ServerState

from service.http.uvicorn_bridge import CLIENT_GONE, GRACE_S, ClientGone, CoalescedWrites, GuardedHTTPProtocol


async def app(scope, receive, send):   # never reached: the clients send nothing
    raise AssertionError(scope)


async def open_silent(n: int, cap: int):
    """A server whose protocol is GuardedHTTPProtocol at `cap` (the cap checked only when a test asks) and `n`
    silent connections to it, all waiting on their clients for GRACE_S: (server, its protocols, the clients'
    (reader, writer) pairs)."""
    loop = asyncio.get_running_loop()
    config = Config(app=app, log_level="warning")
    config.load()
    state = ServerState()
    protocol = type("Capped", (GuardedHTTPProtocol,), {"max_connections": 10 * n, "ceiling": 100 * n})
    server = await loop.create_server(lambda: protocol(config=config, server_state=state, app_state={}, _loop=loop),
                                     "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    clients = [await asyncio.open_connection("127.0.0.1", port) for _ in range(n)]   # kept: a writer let go closes
    async with asyncio.timeout(5):
        while len(state.connections) < n:
            await asyncio.sleep(0.01)
    await asyncio.sleep(GRACE_S + 0.1)
    protocol.max_connections = cap
    return server, state.connections, clients


async def closed_count(clients, wait_s: float = 0.3) -> int:
    async def closed(client):
        reader, _ = client
        try:
            return await asyncio.wait_for(reader.read(1), wait_s) == b""
        except (TimeoutError, ConnectionError):
            return False
    return sum(await asyncio.gather(*map(closed, clients)))


def shut(server, clients) -> None:
    server.close()
    for _, writer in clients:
        writer.close()


def test_a_second_look_before_the_closed_are_gone_closes_no_more():
    """The cap closes the connections over it, and a look made before their connection_lost has run (a new
    connection in the same turn of the event loop) finds none over: the closing ones are not counted."""
    async def run():
        server, connections, clients = await open_silent(6, cap=4)
        one = next(iter(connections))
        one.make_room(new=False)    # the look after GRACE_S/4 (check_again) ...
        one.make_room(new=True)     # ... and a connection made before the loop turns
        assert await closed_count(clients) == 2
        assert len(connections) == 4
        shut(server, clients)
    asyncio.run(run())


def test_the_oldest_waiting_are_the_ones_closed():
    async def run():
        server, connections, clients = await open_silent(5, cap=3)
        next(iter(connections)).make_room(new=False)
        assert [await closed_count([c]) for c in clients] == [1, 1, 0, 0, 0]
        shut(server, clients)
    asyncio.run(run())


class Recording:
    """A transport that records each write it is given."""

    def __init__(self):
        self.writes, self.closed = [], False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str):
        return f"extra {name}"


def test_writes_of_one_turn_leave_as_one_and_none_waits_past_its_turn():
    """A response's head and body, written in one turn of the loop, reach the transport as one write; a stream's
    event written in a later turn is not held for the next; close() sends what is held first."""
    async def run() -> tuple:
        transport = Recording()
        writes = CoalescedWrites(transport, asyncio.get_running_loop())
        writes.write(b"HTTP/1.1 200 OK\r\n\r\n")
        writes.write(b"body")
        assert transport.writes == []                 # held until the turn ends
        await asyncio.sleep(0)
        first = list(transport.writes)
        writes.write(b"event")                         # a stream's next event, a turn later
        await asyncio.sleep(0)
        second = list(transport.writes)
        writes.write(b"last")
        writes.close()
        return first, second, transport, writes.get_extra_info("peername")
    first, second, transport, extra = asyncio.run(run())
    assert first == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    assert second == first + [b"event"]
    assert transport.writes == second + [b"last"] and transport.closed
    assert extra == "extra peername"                   # everything else is the transport's



def test_a_request_learns_from_its_connection_that_its_client_went_away():
    """The scope of a request the protocol parsed carries its connection's ClientGone (CLIENT_GONE): what waits on
    its answer is told when the client closes, with no task of its own blocked in receive()."""
    async def run() -> tuple:
        loop = asyncio.get_running_loop()
        told, gone = loop.create_future(), loop.create_future()

        async def waiting(scope, receive, send):   # a route whose answer is computed elsewhere and never comes
            watch = scope[CLIENT_GONE]
            watch.callbacks.append(lambda: told.done() or told.set_result(True))
            gone.set_result(watch)
            await asyncio.sleep(30)

        config = Config(app=waiting, log_level="warning")
        config.load()
        server = await loop.create_server(lambda: GuardedHTTPProtocol(config=config, server_state=ServerState(),
                                                                       app_state={}, _loop=loop), "127.0.0.1", 0)
        _, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        writer.write(b"POST /translate HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
                     b"content-length: 2\r\n\r\n{}")
        watch = await asyncio.wait_for(gone, 5)
        before = (watch.lost, told.done())
        writer.close()
        await asyncio.wait_for(told, 5)
        server.close()
        return before, watch
    before, watch = asyncio.run(run())
    assert before == (False, False)          # not while the client waits
    assert watch.lost and isinstance(watch, ClientGone)


def test_a_close_lingers_only_after_the_answer_of_the_request_whose_body_is_coming():
    """`linger` half-closes a connection whose answer said close while that request's body still comes (the 413
    of a body too large: tests/test_slow_clients.py). A request pipelined behind such an answer, its body still
    coming, is not started (its answer would be written after the half-close) and the connection just closes;
    a request answered before its body was whole, with `connection: close`, gets the rest of its body dropped
    until the client is done, then the close."""
    async def run() -> tuple:
        loop = asyncio.get_running_loop()
        started = []

        async def routes(scope, receive, send):
            started.append(scope["path"])
            close = [(b"connection", b"close")] if scope["path"] == "/close" else []
            await send({"type": "http.response.start", "status": 413,
                        "headers": [(b"content-length", b"2"), *close]})
            await send({"type": "http.response.body", "body": b"no"})

        config = Config(app=routes, log_level="warning")
        config.load()
        server = await loop.create_server(lambda: GuardedHTTPProtocol(config=config, server_state=ServerState(),
                                                                       app_state={}, _loop=loop), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)   # a body answered, then written on
        writer.write(b"POST /close HTTP/1.1\r\nhost: t\r\ncontent-length: 3000000\r\n\r\n" + b"x" * 1000)
        answer = await asyncio.wait_for(reader.read(), 5)        # the answer, then the half-close's end
        for _ in range(30):                                       # the rest still taken in: no reset
            writer.write(b"x" * 100_000)
            await writer.drain()
        writer.close()
        reader2, writer2 = await asyncio.open_connection("127.0.0.1", port)   # pipelined behind a close
        writer2.write(b"GET /close HTTP/1.1\r\nhost: t\r\n\r\nPOST /behind HTTP/1.1\r\nhost: t\r\n"
                      b"content-length: 100000\r\n\r\n" + b"x" * 1000)
        pipelined = await asyncio.wait_for(reader2.read(), 5)
        await asyncio.sleep(0.2)
        server.close()
        writer2.close()
        return answer, pipelined, started
    answer, pipelined, started = asyncio.run(run())
    assert answer.startswith(b"HTTP/1.1 413") and answer.endswith(b"\r\n\r\nno")
    assert pipelined.startswith(b"HTTP/1.1 413") and pipelined.count(b"HTTP/1.1") == 1
    assert started == ["/close", "/close"]          # /behind never started
