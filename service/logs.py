"""How every process logs: text (the default, for a terminal) or, with --log-format json, one JSON object per
line for a log pipeline: the server's own events ({"ts", "level", "logger", "pid", "message"}) and one access line per
request (middleware.request_context: its id, trace id, key name, route, status, characters and tokens in and
out, queue, inference and total ms, model, error type). Never a key, never a request's text: the access line takes only
the fields named in ACCESS_FIELDS, the server's own messages quote neither, and an exception is logged with its type
and frames but not its message, which a library may have filled with what a client sent (a document's words, a file's
path, whose name is a download's token): `QuietFormatter`.

Process-wide (the standard library only): the main process configures logging before LitServe starts the
others; the forked HTTP processes inherit it, uvicorn and LitServe take it through uvicorn's log_config
(uvicorn_log_config), and the spawned inference workers call configure() in their setup.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import traceback

ACCESS = "transerve.access"
# What an access line may carry, besides the time and level: counts, timings and names only.
ACCESS_FIELDS = ("request_id", "trace_id", "key", "method", "route", "status", "chars_in", "chars_out", "tokens_in",
                 "tokens_out", "queue_ms", "inference_ms", "total_ms", "model", "error_type")
# trace_id: the request's OpenTelemetry trace (32 hex digits), when traces are on (service/tracing.py)
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class QuietFormatter(logging.Formatter):
    """Python's text format, with exceptions as `quiet_exception` writes them, and the time's text made once a
    second (strftime took a tenth of an access line's CPU; every request writes one)."""

    def formatException(self, exc_info) -> str:
        return quiet_exception(exc_info[1])

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        return self.default_msec_format % (self.second_text(int(record.created)), record.msecs)

    def second_text(self, second: int) -> str:
        """The text of the whole second `second` (time.time()), as `format_second` writes it; the last one kept."""
        kept = getattr(self, "_second", None)
        if kept is None or kept[0] != second:
            kept = self._second = (second, self.format_second(second))
        return kept[1]

    def format_second(self, second: int) -> str:
        """In local time, as logging's default writes it."""
        return time.strftime(self.default_time_format, self.converter(second))


def quiet_exception(exc: BaseException | None) -> str:
    """A traceback's frames and each chained exception's type, without their messages."""
    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    parts = []
    for e in reversed(chain):
        kind = type(e)
        parts += ["Traceback (most recent call last):\n", *traceback.format_tb(e.__traceback__),
                  f"{kind.__module__}.{kind.__qualname__} (its message is not logged)\n"]
        members = getattr(e, "exceptions", None)          # an exception group's (no BaseExceptionGroup on 3.10)
        for i, member in enumerate(members if isinstance(members, tuple) else ()):
            parts.append(f"  +-- {i + 1} of the group:\n" + quiet_exception(member) + "\n")
    return "".join(parts).rstrip("\n")


class JsonFormatter(QuietFormatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, the process's id (an HTTP process's or an
    inference worker's: they write to the same stream), message, and an access line's fields."""

    def format_second(self, second: int) -> str:
        """ISO 8601, in UTC."""
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": f"{self.second_text(int(record.created))}.{int(record.msecs):03d}Z",
               "level": record.levelname.lower(), "logger": record.name, "pid": record.process}
        access = getattr(record, "access", None)
        if access is not None:
            out |= {k: access[k] for k in ACCESS_FIELDS if access.get(k) is not None}
        else:
            out["message"] = record.getMessage()
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure(level: str, log_format: str) -> None:
    """This process's root logger: text or JSON lines on stderr."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else QuietFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def uvicorn_log_config() -> dict:
    """uvicorn's log_config, in either format: uvicorn's and LitServe's loggers go to the root handler (configure), so
    their lines are written as ours are, their exceptions without messages (uvicorn's own text handler printed an
    "Exception in ASGI application" with its message: a download's path, its token); uvicorn's access log is left off,
    as the middleware writes ours."""
    return {"version": 1, "disable_existing_loggers": False,
            "loggers": {name: {"handlers": [], "propagate": True}
                        for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "litserve")}}


_access_log = logging.getLogger(ACCESS)
ACCESS_TEXT = "%s %s %s %.1f ms %s"   # method, route, status, duration, then the other fields (Named)


def access(state: dict, method: str, route: str, status: int, total_ms: float) -> None:
    """The access line of one request (--access-log): what the Gateway noted in `state["access"]`, with the
    request's id, key name, route (its template: middleware.route_of), status and duration. JSON: those fields;
    text: the method, route, status and duration, then the rest as name=value. Handed to the logger's handlers
    as Logger.info would hand it (its level, filters and handlers as they are), made by access_record."""
    if not _access_log.isEnabledFor(logging.INFO):
        return
    tenant = state.get("tenant")
    fields = state.get("access", {}) | {
        "request_id": state.get("request_id"), "trace_id": state.get("trace_id"),
        "key": tenant.name if tenant is not None else None, "method": method, "route": route, "status": status,
        "total_ms": round(total_ms, 2), "error_type": state.get("error_type")}
    _access_log.handle(access_record((method, route, status, total_ms, Named(fields)), fields))


_template: list[logging.LogRecord] = []   # an access record made by the record factory in this process
os.register_at_fork(after_in_child=_template.clear)


def access_record(args: tuple, fields: dict) -> logging.LogRecord:
    """An access line's record: a copy of one LogRecord made once in this process, with its own time, thread and
    arguments. LogRecord's own __init__ (the caller's file and module names, the thread's and the process's names
    looked up each time) and Logger.info's search of the stack for the caller's line were half of an access line's
    CPU, on every request; neither format shows them. Under a record factory of someone else's
    (logging.setLogRecordFactory: one may add each record's own context, a trace's ids) every record is its."""
    factory = logging.getLogRecordFactory()
    if factory is not logging.LogRecord:
        record = factory(ACCESS, logging.INFO, __file__, 0, ACCESS_TEXT, args, None, "access")
        record.access = fields
        return record
    if not _template:
        _template.append(factory(ACCESS, logging.INFO, __file__, 0, ACCESS_TEXT, (), None, "access"))
    made = _template[0]
    record = object.__new__(type(made))
    record.__dict__.update(made.__dict__)
    now_ns = time.time_ns()
    record.created, record.msecs = now_ns / 1e9, (now_ns % 1_000_000_000) // 1_000_000 + 0.0   # as LogRecord's
    record.relativeCreated = made.relativeCreated + (record.created - made.created) * 1000
    record.thread, record.threadName = threading.get_ident(), threading.current_thread().name
    record.args, record.access = args, fields
    return record


# What the text line names after its method, route, status and duration
NAMED_FIELDS = tuple(k for k in ACCESS_FIELDS if k not in ("method", "route", "status", "total_ms"))


class Named:
    """An access line's other fields as name=value, for the text format (formatted only if the line is written)."""

    def __init__(self, fields: dict):
        self.fields = fields

    def __str__(self) -> str:
        fields = self.fields
        return " ".join([f"{k}={v}" for k in NAMED_FIELDS if (v := fields.get(k)) is not None])
