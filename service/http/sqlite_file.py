"""A store's SQLite file, shared by every HTTP process of a server (--api-servers) without Redis:
glossary_store.py's glossaries and document_jobs.py's jobs, each in a file of its own. Each call opens its own
connection (a connection is not to cross threads or a fork, and opening one costs ~0.1 ms) in autocommit mode; a
transaction of two statements is begun by hand. What a client sent and we drop (a document, its result, a
glossary) is left in neither file: see `forget`."""
from __future__ import annotations

import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

BUSY_S = 5.0    # how long a write waits for another process's to finish before the 503
SQLITE_BUSY = 5     # SQLite's result code (sqlite3.SQLITE_BUSY from Python 3.11; pyproject allows 3.10)


def connect(path: Path, schema: str) -> sqlite3.Connection:
    """A connection to write `path`, in WAL with `schema` made; the file made first (0600, in a 0700 directory)
    where there is none."""
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    db = sqlite3.connect(path, timeout=BUSY_S, isolation_level=None)
    db.execute("PRAGMA secure_delete=ON")     # freed pages zeroed: Debian's build does so, SQLite's own does not
    use_wal(db)
    db.executescript(schema)
    return db


def reader(path: Path) -> sqlite3.Connection | None:
    """A connection to read `path` as it is (no WAL switch, no schema), or None where no file was made yet."""
    return sqlite3.connect(path, timeout=BUSY_S, isolation_level=None) if path.exists() else None


def use_wal(db: sqlite3.Connection) -> None:
    """Write-ahead logging, so that readers go on while one process writes. Switching a new file to it while another
    connection holds the write lock fails at once (SQLite does not consult its busy timeout there: CI once saw one of
    twelve concurrent first writes answered 'database is locked'), so it is retried for up to BUSY_S; once switched,
    the file stays in WAL and the pragma takes no lock."""
    deadline = time.monotonic() + BUSY_S
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if not busy(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def forget(db: sqlite3.Connection) -> None:
    """After a write that dropped a client's data: the write-ahead log moved into the file and truncated. Until then
    the log holds the dropped rows' old pages whenever another connection has the file open (another HTTP process,
    another request's thread: SQLite deletes the log only when the last one closes), measured in
    tests/test_sqlite_file.py; secure_delete has zeroed them in the file itself. Waits up to BUSY_S for readers to
    finish, and other writers wait meanwhile (our reads are short); if they hold on (or the checkpoint
    fails), the log stays until the next forget()."""
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except sqlite3.OperationalError:    # the write it follows went through: it is not to fail for this
        pass


def busy(e: sqlite3.OperationalError) -> bool:
    """Whether SQLite answered SQLITE_BUSY (its primary code, 5, under any extended one); Python 3.10's errors carry
    no code, only the message."""
    code = getattr(e, "sqlite_errorcode", None)
    return code & 0xFF == SQLITE_BUSY if code is not None else "locked" in str(e)


@contextmanager
def immediate(db: sqlite3.Connection) -> Iterator[None]:
    """A transaction that takes the write lock first (BEGIN IMMEDIATE: another process's write waits for it, up to
    BUSY_S), committed when the block ends, rolled back when it raises."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
