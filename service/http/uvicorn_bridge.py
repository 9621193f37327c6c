"""uvicorn's HTTP protocol, with the service's JSON errors and a bound on every connection.

uvicorn refuses a request it cannot parse (a negative or non-numeric Content-Length, a malformed
request line or header) before any ASGI app sees it, with a plain-text 400 written by the protocol's
`send_400_response` (uvicorn 0.54, the same method in its h11 and httptools protocols; no setting
changes it). Every other error of the service is JSON, `{"error": {"type", "message"}, "request_id"}`,
so this subclass of whichever protocol uvicorn's "auto" picks (httptools where installed, as in the
image; else h11) overrides that method. LitServe passes `http=` and the other uvicorn options through
to uvicorn.Config (service/__main__.py, uvicorn_options).

uvicorn bounds only the idle time between requests (`timeout_keep_alive`). A client that sends its
headers a byte at a time, or opens a connection and sends nothing, holds it for ever; enough of them
use every file descriptor and the probes get no answer (issue 27). GuardedHTTPProtocol adds:

- a deadline for a request's line and headers (`--header-timeout-s`), from the connection's opening or
  from the first byte after the previous response: then 408 (when part of a request came) and close;
- a bound on a request's line and headers (`--max-header-bytes`, as sent, and `--max-headers` fields), counted
  as the bytes arrive, before the parser sees them: httptools keeps a header it has not finished in memory,
  whatever its size (one 32 MB header was answered 200; 16 connections each trickling 64 MB of headers held
  462 MB). Beyond: 431, as nginx and h11 answer it, and the connection closes once the client has had time
  to read it (LINGER_S; closing with the rest of the request unread would reset the connection under the
  answer); so too after any answer that ends a connection while its request's body is still arriving (`linger`:
  the 413 of a body declared too large, refused unread), as nginx's lingering close;
- a cap on open connections per HTTP process (`--max-connections`, kept below the file-descriptor
  limit, which start-up raises to its hard limit): a connection opened over the cap closes those that
  have waited longest on their clients (for headers, a body or a next request), so a new one, a
  probe's, is taken. A connection is safe for its first GRACE_S (its request is read by then), so a
  burst may pass the cap for that long, up to what the descriptors allow; past that ceiling, with none
  to close, a new connection is refused (503).

The body's deadline (`--body-timeout-s`) is the ASGI middleware's (service/http/middleware.py), which can
answer it in the request's own error shape. uvicorn's `limit_concurrency` is not used: it counts open
connections, slow ones included, and answers every request over it 503, the probes' too.

A response's head and body leave in one write (`CoalescedWrites`): uvicorn writes the head as the app starts the
response and the body as it sends it, two segments for every JSON answer. On loopback and in a pod the
sender's kernel also runs the receiving side of each, in the HTTP process's time: in py-spy profiles of the HTTP
process under 32 clients of one-sentence translations, uvicorn's two writes held the GIL in 21% of the samples,
the one write 6% (2-core AMD EPYC, 2026-12-01).

A request whose answer is computed elsewhere learns that its client went away from the connection itself
(`ClientGone`, on the request's scope under CLIENT_GONE, told by connection_lost), not from a task per request
blocked in receive() and cancelled once it is answered: that task, its cancellation and the exception thrown
through its frames cost every one-sentence /translate about 5% of the HTTP process's CPU (a CPU-time profile of
the process under load, benchmarks/results/serving-cpu.md). uvicorn's httptools protocol only (its h11 one
builds the scope elsewhere): where the scope has no CLIENT_GONE, http/litserve_workers.py waits in receive().

Signals (`hold_signals`): uvicorn's Server shuts its process down on SIGINT or SIGTERM, with handlers it sets
with signal.signal when it starts (Server.capture_signals), before the app's lifespan. Ctrl+C and a SIGTERM to
the process group reach every HTTP process with the main process; the lifespan puts a guard over uvicorn's
handler so that the HTTP process goes on answering until the main process has drained (service/stopping.py).
"""

from __future__ import annotations

import heapq
import json
import logging
import re
import resource
import signal
import uuid
from contextlib import asynccontextmanager

from uvicorn.protocols.http.auto import AutoHTTPProtocol

from ..logs import uvicorn_log_config
from ..config import Settings
from ..errors import ApiError
from ..stopping import Stopping

log = logging.getLogger("transerve")

FD_HEADROOM = 128   # descriptors kept for everything but connections: model files, pipes, the metrics port
HEAD_END = re.compile(rb"\r?\n\r?\n")   # the empty line that ends a request's headers
# After a 431: how long, and how many more bytes of the refused request, are read and dropped before the close.
LINGER_S = 2.0
LINGER_BYTES = 4 * 2**20
# After an answer that ends the connection while its request's body is still arriving (the 413 of a body declared
# over DRAIN_BYTES, service/http/middleware.py, refused unread; a 408): as after a 431, but for LINGER_S after the
# last read, BODY_LINGER_S and BODY_LINGER_BYTES at most (nginx's lingering_timeout, lingering_time): a body a client
# is writing whole before it reads (httpx's AsyncClient, urllib) is taken in at the network's pace and dropped, so
# that it reads the answer, not a reset under it.
BODY_LINGER_S = 30.0
BODY_LINGER_BYTES = 256 * 2**20
# How long a new connection is safe from the cap: time for its client's request to arrive and be read. A
# probe opened in a burst of slow connections is then answered, not closed by the burst's own newcomers.
GRACE_S = 1.0


def write_error(protocol, status: bytes, type_: str, message: str, extra: list[bytes] = (),
                limit: int | None = None, close: bool = True) -> None:
    """A JSON error written straight to the connection, which is then closed unless `close` is False (no
    request was parsed, or its app never sees this answer: the parser's state no longer matters)."""
    rid = uuid.uuid4().hex   # no request was parsed, so none came with one
    # Our shape: no path was read, so no flavour's (errors.responder) can be chosen.
    body = json.dumps(ApiError(int(status.split()[0]), type_, message, limit).body(rid)).encode()
    head = [b"HTTP/1.1 " + status]
    head += [name + b": " + value for name, value in protocol.server_state.default_headers]
    head += [b"content-type: application/json", b"content-length: %d" % len(body), b"connection: close",
             b"x-request-id: " + rid.encode(), *extra]
    protocol.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
    if close:
        protocol.transport.close()


CLIENT_GONE = "transerve.client_gone"   # the scope's key of its connection's ClientGone
BODY_WHOLE = "transerve.body_whole"     # on the scope once the request's body has arrived whole (True)


class ClientGone:
    """Whether a request's connection was lost, and what to call when it is (callbacks added and removed by
    whoever waits on the request's answer: Workers._outcome)."""

    __slots__ = ("lost", "callbacks")

    def __init__(self):
        self.lost, self.callbacks = False, []

    def connection_lost(self) -> None:
        self.lost = True
        for callback in self.callbacks[:]:
            callback()


class CoalescedWrites:
    """A connection's transport whose writes within one turn of the event loop go out as one, at the end of the
    turn (loop.call_soon) or at close(): a streamed response's head or event is never held past the turn it was
    written in. Everything else is the transport's."""

    def __init__(self, transport, loop, linger=None):
        self._transport, self._loop, self._held = transport, loop, None
        self._linger = linger      # called at close(): True when it keeps the connection open a while itself

    def write(self, data: bytes) -> None:
        if self._held is None:
            self._held = [data]
            self._loop.call_soon(self._flush)
        else:
            self._held.append(data)

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self._flush()
        if self._linger is None or not self._linger():
            self._transport.close()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


class JsonErrorHTTPProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
    def send_400_response(self, msg: str) -> None:
        write_error(self, b"400 Bad Request", "invalid_http", f"{msg} (malformed request line or headers, e.g. "
                    "a Content-Length that is not a non-negative integer)")


class GuardedHTTPProtocol(JsonErrorHTTPProtocol):
    """JsonErrorHTTPProtocol with a header deadline, bounded headers and a connection cap (see the module's
    docstring); `uvicorn_options` makes one with the settings (these class values are placeholders)."""

    header_timeout_s = 10.0
    max_header_bytes = 32768
    max_headers = 100
    max_connections = 1024
    ceiling = 1024
    recheck = None      # the pending make_room of this process (see make_room)

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescedWrites(transport, self.loop, self.linger))
        self.head_timer = None
        self.head_started = False       # some bytes of the awaited request arrived
        self.seen_cycle = None          # the request whose headers were complete last
        self.head: list | None = [0, 0, b""]   # of the head arriving: bytes, line ends, its last 3 bytes
        self.refused_bytes: int | None = None  # after a 431 or while lingering: the bytes read and dropped since
        self.drop_limit = LINGER_BYTES
        self.lingering: list | None = None     # while lingering after an answer (`linger`): [close timer, end time]
        self.stopping = False
        self.waiting_since = self.loop.time()
        self.gone = ClientGone()
        self.await_head()
        if len(self.connections) > self.max_connections:
            self.make_room()

    def connection_lost(self, exc) -> None:
        self.stop_head_timer()
        if self.lingering is not None:
            self.lingering[0].cancel()
        super().connection_lost(exc)
        self.gone.connection_lost()

    def on_headers_complete(self) -> None:   # httptools' parser's callbacks (uvicorn's h11 protocol has none)
        super().on_headers_complete()
        self.scope[CLIENT_GONE] = self.gone   # the scope of the request whose cycle was just made

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.scope[BODY_WHOLE] = True         # the middleware's body deadline has nothing left to wait for

    def data_received(self, data: bytes) -> None:
        if self.refused_bytes is not None:
            self.drop(data)
            return
        starting = self.head_timer is None and self.between_requests()
        if starting:
            self.waiting_since = self.loop.time()   # the next request (or the rest of an unread body) begins
        self.head_started = True
        if self.head is None and (self.cycle is None or not self.cycle.more_body):
            self.head = [0, 0, b""]   # the last request is whole: what comes is the next one's head
        if self.head is not None and not self.count_head(data):
            return
        super().data_received(data)
        if self.cycle is not None and self.cycle is not self.seen_cycle:   # a request's headers are complete
            self.seen_cycle = self.cycle
            self.stop_head_timer()
            self.head_started = False
            self.waiting_since = self.loop.time()
        elif starting and not self.transport.is_closing():
            self.await_head()   # its head is not whole yet: the deadline runs (a whole one never needed a timer)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.waiting_since = self.loop.time()   # uvicorn's keep-alive timer now bounds the idle wait
        if self.lingering is not None and getattr(self, "timeout_keep_alive_task", None) is not None:
            self.timeout_keep_alive_task.cancel()   # `linger`'s own timers bound it
            self.timeout_keep_alive_task = None

    # --- the header deadline ---------------------------------------------------------------------
    def between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def await_head(self) -> None:
        self.head_timer = self.loop.call_later(self.header_timeout_s, self.head_timed_out)

    def stop_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def head_timed_out(self) -> None:
        self.head_timer = None
        if self.transport.is_closing():
            return
        if not self.head_started:   # nothing sent at all (a preconnect, or a silent client): just closed
            self.transport.close()
            return
        write_error(self, b"408 Request Timeout", "timeout", f"the request line and headers did not arrive "
                    f"within {self.header_timeout_s:g} s (--header-timeout-s)")

    # --- bounded headers -------------------------------------------------------------------------
    def count_head(self, data: bytes) -> bool:
        """Counts the part of `data` that belongs to the head arriving; False when that takes it over a bound
        (then 431). The rest of a read that ends a head (a body, a pipelined request) is not counted: the next
        head is counted from the next read after its request's body is whole."""
        size, lines, tail = self.head
        end = HEAD_END.search(tail + data)
        part = data if end is None else data[:max(0, end.end() - len(tail))]
        size, lines = size + len(part), lines + part.count(b"\n")
        fields = lines - (1 if end is None else 2)   # neither the request line nor the empty line after the headers
        if size > self.max_header_bytes:
            self.refuse_head(f"the request line and headers are over {self.max_header_bytes} bytes "
                             "(--max-header-bytes)", self.max_header_bytes)
            return False
        if fields > self.max_headers:
            self.refuse_head(f"the request has over {self.max_headers} header fields (--max-headers)",
                             self.max_headers)
            return False
        self.head = None if end is not None else [size, lines, (tail + part)[-3:]]
        return True

    def shutdown(self) -> None:
        self.stopping = True            # the server is stopping: a connection closes at once, never lingers
        super().shutdown()

    def linger(self) -> bool:
        """At the close that ends the answer of a request whose body is still arriving (an answer that said
        `connection: close`, the 413 of a body too large): half closed instead (the answer and then its end
        reach the client), the rest read and dropped until the client closes, LINGER_S pass without a read, or
        BODY_LINGER_S or BODY_LINGER_BYTES are reached; True then. Closing with the body unread resets the
        connection, and a client still writing its body loses the answer in the reset. Any other close (by the
        connection cap, a timeout, a pipelined request's, the server stopping) closes at once."""
        cycle = self.cycle
        if (self.stopping or cycle is None or not cycle.more_body or not cycle.response_started or cycle.keep_alive
                or self.refused_bytes is not None or self.transport.is_closing()
                or not self.transport.can_write_eof()):
            return False
        self.stop_head_timer()
        self.head, self.refused_bytes, self.drop_limit = None, 0, BODY_LINGER_BYTES
        self.flow.resume_reading()
        self.transport.write_eof()
        self.lingering = [self.loop.call_later(LINGER_S, self.transport.close), self.loop.time() + BODY_LINGER_S]
        return True

    def refuse_head(self, message: str, limit: int) -> None:
        self.stop_head_timer()
        self.head, self.refused_bytes = None, 0
        write_error(self, b"431 Request Header Fields Too Large", "headers_too_large", message, limit=limit,
                    close=False)
        self.loop.call_later(LINGER_S, self.transport.close)

    def drop(self, data: bytes) -> None:
        """After a 431 (or while lingering), the rest of the request read and dropped (LINGER_BYTES at most, or
        BODY_LINGER_BYTES), so the client that writes it whole before reading reads the answer rather than a reset.
        Lingering, each read gives the client LINGER_S more, up to BODY_LINGER_S in all."""
        self.refused_bytes += len(data)
        if self.refused_bytes > self.drop_limit:
            self.transport.close()
        elif self.lingering is not None:
            timer, ends = self.lingering
            timer.cancel()
            self.lingering[0] = self.loop.call_later(min(LINGER_S, max(0.0, ends - self.loop.time())),
                                                     self.transport.close)

    # --- the connection cap ----------------------------------------------------------------------
    def waiting_on_client(self, now: float) -> bool:
        """Whether this connection has waited GRACE_S or more on its client: for a request's headers or
        body, or idle between requests (nothing of its answer is being computed or sent)."""
        if self.transport.is_closing() or now - getattr(self, "waiting_since", now) < GRACE_S:
            return False
        cycle = self.cycle
        return cycle is None or cycle.response_complete or (cycle.more_body and not cycle.response_started)

    def make_room(self, new: bool = True) -> None:
        """Over the cap: the connections that have waited longest on their clients (GRACE_S at least) closed
        until it holds; while there are too few of those (a burst of new connections), one look again a
        quarter of GRACE_S later (the connections opened meanwhile cost nothing), and past the ceiling this
        `new` connection refused (503)."""
        cls, now = type(self), self.loop.time()
        beyond = len(self.connections) > self.ceiling
        if cls.recheck is not None and new and not beyond:
            return
        # Those closed already count for the descriptors (until connection_lost), not for the cap: counted, a
        # connection made before their connection_lost runs closed as many more (a CI run lost all 120 it kept).
        still_open = [p for p in self.connections if not p.transport.is_closing()]
        over = len(still_open) - self.max_connections
        waiting = heapq.nsmallest(over, (p for p in still_open if isinstance(p, GuardedHTTPProtocol)
                                         and p.waiting_on_client(now)), key=lambda p: p.waiting_since)
        for p in waiting:
            p.stop_head_timer()
            p.transport.close()
        if over > len(waiting) and cls.recheck is None:
            cls.recheck = self.loop.call_later(GRACE_S / 4, self.check_again)
        if new and beyond and len(self.connections) - len(waiting) > self.ceiling:
            log.warning("%d connections open, none waiting on its client for %g s: a new one refused",
                        len(self.connections), GRACE_S)
            write_error(self, b"503 Service Unavailable", "overloaded", f"{len(self.connections) - 1} connections "
                        "are open (--max-connections, the file-descriptor limit); retry", [b"retry-after: 1"])

    def check_again(self) -> None:
        type(self).recheck = None
        if len(self.connections) > self.max_connections:
            self.make_room(new=False)


def connection_limits(wanted: int) -> tuple[int, int]:
    """(cap, ceiling): `wanted` connections, or fewer where the file-descriptor limit is lower even once
    its soft limit is raised to the hard one, and the most a burst may open for a moment (GRACE_S) above
    the cap: what the descriptors allow. Where the soft limit is 1,024 (a common default), a flood of
    connections would otherwise end in failing accept()s, which pause the listener, probes included."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    fds = 1 << 20 if soft == resource.RLIM_INFINITY else soft
    ceiling = max(1, fds - FD_HEADROOM)
    if ceiling < wanted:
        log.warning("--max-connections %d lowered to %d: the file-descriptor limit is %d", wanted, ceiling, soft)
    return min(wanted, ceiling), ceiling


def uvicorn_options(settings: Settings) -> dict:
    """The keyword arguments for LitServer.run (passed on to uvicorn.Config)."""
    cap, ceiling = connection_limits(settings.max_connections)
    protocol = type("GuardedHTTPProtocol", (GuardedHTTPProtocol,),
                    {"header_timeout_s": settings.header_timeout_s, "max_header_bytes": settings.max_header_bytes,
                     "max_headers": settings.max_headers, "max_connections": cap, "ceiling": ceiling})
    # h11 (where httptools is not installed) bounds a head itself, at 16 KiB by default: at ours instead,
    # which count_head enforces first, with its 431.
    options = {"http": protocol, "timeout_keep_alive": settings.keep_alive_timeout_s,
               "h11_max_incomplete_event_size": settings.max_header_bytes}
    # uvicorn's access line is never written: it holds the path and query a client sent (a download's token, a
    # file's name). The middleware writes ours (logs.access), with the route's template, or none (--no-access-log).
    options["access_log"] = False
    options["log_config"] = uvicorn_log_config()     # uvicorn's and LitServe's lines through our handler
    return options


def hold_signals(app, stopping: Stopping) -> None:
    """`app`'s lifespan wrapped: in each HTTP process, uvicorn's handler of SIGINT and SIGTERM runs only once
    the main process has ordered the stop (see the module's docstring)."""
    lifespan = app.router.lifespan_context

    @asynccontextmanager
    async def held(app_):
        uvicorn_exit = signal.getsignal(signal.SIGTERM)   # Server.handle_exit, set by capture_signals
        if callable(uvicorn_exit):
            stopping.guard(uvicorn_exit)
        async with lifespan(app_) as state:
            yield state

    app.router.lifespan_context = held
