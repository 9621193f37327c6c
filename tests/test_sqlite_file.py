"""service/http/sqlite_file.py: the SQLite file the glossaries and document jobs share between HTTP processes."""
from __future__ import annotations

import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing

from service.http.sqlite_file import connect, immediate

SCHEMA = "CREATE TABLE IF NOT EXISTS t (x INTEGER);"


def test_a_new_files_first_write_waits_for_another_processs_lock_instead_of_a_503(tmp_path):
    """Switching a new file to WAL takes a lock SQLite's busy timeout does not wait for: CI once saw one of twelve
    concurrent first creates answered 503 'database is locked'. Here another connection holds the write lock of the
    new file, not yet in WAL, for 0.3 s while the first write's connection opens."""
    path = tmp_path / "store.sqlite3"
    sqlite3.connect(path).close()
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")    # while it holds this, SQLite refuses the switch at once (no busy timeout)
    release = threading.Timer(0.3, lambda: other.execute("COMMIT"))
    release.start()
    try:
        with closing(connect(path, SCHEMA)) as db:
            assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        release.join()
        other.close()


def test_sixteen_threads_first_writes_to_a_new_file_all_land(tmp_path):
    path = tmp_path / "a" / "store.sqlite3"

    def insert(x: int) -> None:
        with closing(connect(path, SCHEMA)) as db, immediate(db):
            db.execute("INSERT INTO t VALUES (?)", (x,))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(insert, range(16)))
    with closing(connect(path, SCHEMA)) as db:
        assert sorted(x for (x,) in db.execute("SELECT x FROM t")) == list(range(16))
    assert (path.stat().st_mode & 0o777, path.parent.stat().st_mode & 0o777) == (0o600, 0o700)
