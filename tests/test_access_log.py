"""The access line (service/logs.py, written by http/middleware.py): its route is a template or "(unmatched)", never a
path a client sent; in the text format the line carries the same fields as the JSON one. The whole path, through a
server with JSON logs: test_tenants.py's test_json_logs_one_line_per_request_with_its_id_and_no_key_or_text."""

from __future__ import annotations

import io
import json
import logging

import pytest
from starlette.routing import Route

from service.http.middleware import UNMATCHED, named_method, route_of
from service.logs import ACCESS, JsonFormatter, TEXT_FORMAT, access


@pytest.fixture
def written():
    """What the access logger writes, in either format: (set_format(name), the stream)."""
    stream, log = io.StringIO(), logging.getLogger(ACCESS)
    handler = logging.StreamHandler(stream)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    yield lambda fmt: handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT)), stream
    log.removeHandler(handler)
    log.setLevel(logging.NOTSET)


STATE = {"request_id": "r-1", "access": {"chars_in": 12, "tokens_out": 5, "model": "de-en", "queue_ms": 0.4}}


def test_the_text_line_has_the_json_lines_fields(written):
    set_format, stream = written
    set_format("text")
    access(STATE, "POST", "/translate", 200, 12.345)
    set_format("json")
    access(STATE, "POST", "/translate", 200, 12.345)
    text, line = stream.getvalue().splitlines()
    assert text.endswith("transerve.access: POST /translate 200 12.3 ms request_id=r-1 chars_in=12 tokens_out=5 "
                         "queue_ms=0.4 model=de-en"), text
    assert json.loads(line) | {"ts": None} == {"ts": None, "level": "info", "logger": ACCESS, "pid": json.loads(line)[
        "pid"], "request_id": "r-1", "method": "POST", "route": "/translate", "status": 200, "total_ms": 12.35,
        "chars_in": 12, "tokens_out": 5, "queue_ms": 0.4, "model": "de-en"}


def test_no_line_is_made_when_the_logger_is_off(written):
    set_format, stream = written
    logging.getLogger(ACCESS).setLevel(logging.WARNING)
    access(STATE, "POST", "/translate", 200, 1.0)
    assert stream.getvalue() == ""


def test_the_route_is_a_template_or_unmatched_never_the_path_sent():
    download = Route("/libretranslate/download_file/{filename}", lambda request: None)
    fixed = frozenset({"/translate"})
    sent = {"path": "/libretranslate/download_file/tok3n.Kuendigung_Max_Mustermann.srt", "route": download}
    assert route_of(sent, fixed) == "/libretranslate/download_file/{filename}"
    assert route_of({"path": "/translate"}, fixed) == "/translate"        # refused before routing: a fixed path
    assert route_of({"path": "/NoKeyPfad-uuuu"}, fixed) == UNMATCHED


def test_a_method_no_rfc_names_is_logged_as_other():
    """h11 (uvicorn's parser where httptools is not installed) passes any token as the method: it is a client's
    word, so it is named "_OTHER" in the access line and the span."""
    assert named_method({"method": "POST"}) == "POST" and named_method({"method": "PATCH"}) == "PATCH"
    assert named_method({"method": "ZQSECRET"}) == "_OTHER" and named_method({"method": "post"}) == "_OTHER"


def test_an_access_record_has_what_a_log_record_made_now_would_have():
    """access() copies one LogRecord made in the process instead of making its own: a handler or format still
    finds every attribute a LogRecord has, with this line's time, thread and process (a forked HTTP process's own)."""
    import os
    import threading
    import time

    from service.logs import access_record

    def made() -> tuple[logging.LogRecord, logging.LogRecord]:
        reference = logging.LogRecord(ACCESS, logging.INFO, __file__, 1, "x", (), None)
        return reference, access_record(("POST", "/translate", 200, 1.0, "r"), {"status": 200})

    reference, record = made()
    assert vars(reference).keys() - {"taskName"} <= vars(record).keys()
    assert record.process == os.getpid() and record.thread == threading.get_ident()
    assert abs(record.created - time.time()) < 1 and 0 <= record.created % 1 * 1000 - record.msecs < 1.001
    assert record.threadName == threading.current_thread().name and record.msecs == int(record.msecs)
    assert abs(record.relativeCreated - reference.relativeCreated) < 1000
    assert record.getMessage() == "POST /translate 200 1.0 ms r" and record.access == {"status": 200}
    read, write = os.pipe()
    child = os.fork()
    if child == 0:   # a forked HTTP process: its own pid, not the template's
        os.write(write, str(made()[1].process).encode())
        os._exit(0)
    os.waitpid(child, 0)
    assert int(os.read(read, 64)) == child


def test_a_record_factory_of_someone_elses_makes_each_access_record():
    """A factory installed with logging.setLogRecordFactory (OpenTelemetry's logging instrumentation adds each record's
    trace ids so) makes every access record: a copy of the first one would carry the first request's context."""
    from service.logs import access_record

    made = iter(range(1, 100))
    old = logging.getLogRecordFactory()

    def factory(*args, **kwargs):
        record = old(*args, **kwargs)
        record.context = next(made)
        return record

    logging.setLogRecordFactory(factory)
    try:
        first, second = (access_record(("POST", "/translate", 200, 1.0, "r"), {"status": 200}) for _ in range(2))
    finally:
        logging.setLogRecordFactory(old)
    assert (first.context, second.context) == (1, 2)
    assert second.getMessage() == "POST /translate 200 1.0 ms r" and second.access == {"status": 200}
