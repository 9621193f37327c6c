"""service/logs.py's formatters: an exception is logged with its type and frames, never its message, which a library
may have filled with what a client sent (a FileNotFoundError naming a download's token, lxml quoting a document)."""

from __future__ import annotations

import json
import logging

import pytest

from service.logs import TEXT_FORMAT, JsonFormatter, QuietFormatter


def record_of_a_chained_failure(secret: str) -> logging.LogRecord:
    def open_download():
        raise FileNotFoundError(2, "No such file or directory", f"/tmp/transerve-files-0/{secret}")

    try:
        try:
            open_download()
        except OSError as e:
            raise RuntimeError(f"serving {secret} failed") from e
    except RuntimeError:
        import sys
        return logging.LogRecord("transerve", logging.ERROR, __file__, 1, "unhandled error on %s", ("/download",),
                                 sys.exc_info())


@pytest.mark.parametrize("formatter", [QuietFormatter(TEXT_FORMAT), JsonFormatter()], ids=["text", "json"])
def test_an_exception_is_logged_with_its_types_and_frames_without_its_messages(formatter):
    secret = "109dc9d3fd097b38a49caad474c83319"
    line = formatter.format(record_of_a_chained_failure(secret))
    text = json.loads(line)["exception"] if isinstance(formatter, JsonFormatter) else line
    assert secret not in line
    assert "unhandled error on /download" in line
    assert "builtins.FileNotFoundError (its message is not logged)" in text
    assert "builtins.RuntimeError (its message is not logged)" in text
    assert text.index("FileNotFoundError") < text.index("RuntimeError")     # the cause first, as Python prints it
    assert "in open_download" in text and "raise FileNotFoundError" in text   # where it was raised


def test_an_exception_groups_members_are_logged_quietly_too():
    import builtins
    import sys

    group = getattr(builtins, "ExceptionGroup", None)     # anyio's and asyncio's task groups raise them (3.11+)
    if group is None:
        pytest.skip("this Python has no exception groups")
    secret = "zq" + "5e1f" * 4
    try:
        raise group("two", [KeyError(secret), ValueError(secret)])
    except group:
        record = logging.LogRecord("transerve", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = QuietFormatter(TEXT_FORMAT).format(record)
    assert secret not in line
    assert "builtins.KeyError (its message is not logged)" in line and "builtins.ValueError" in line


def test_uvicorns_and_litserves_loggers_write_through_ours_in_either_format():
    """uvicorn's own text handler printed "Exception in ASGI application" with the exception's message."""
    from service.logs import uvicorn_log_config

    config = uvicorn_log_config()
    assert {"uvicorn", "uvicorn.error", "litserve"} <= set(config["loggers"])
    assert all(c == {"handlers": [], "propagate": True} for c in config["loggers"].values())
