"""service/http/sqlite_file.py: the SQLite file the glossaries and document jobs share between HTTP processes, and
what a client sent and we dropped left in neither it nor its write-ahead log."""
from __future__ import annotations

import asyncio
import secrets
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing

from service.http.document_jobs import SCHEMA as DOCUMENTS, SqliteJobs
from service.http.glossary_store import SCHEMA as GLOSSARIES, SqliteStore
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


# --- what a client sent and we dropped is in neither file -------------------------------------------------------
def holds(path, secret: bytes) -> list[str]:
    """Which of an SQLite file, its write-ahead log and its shared index hold `secret`."""
    return [f.name for f in path.parent.iterdir() if f.name.startswith(path.name) and secret in f.read_bytes()]


def test_a_documents_dropped_source_and_downloaded_result_are_in_neither_file_while_the_file_stays_open(tmp_path):
    """Another connection holds the file open throughout, as another HTTP process's or another request's would: SQLite
    then keeps the write-ahead log, and in it the old pages of the rows we changed, until forget() moves it into the
    file and truncates it (without it: each secret's pages found in the log)."""
    path = tmp_path / "documents.sqlite3"
    jobs, now = SqliteJobs(path), time.time()
    source, result = (("zq" + secrets.token_hex(8)).encode() * 300 for _ in range(2))   # over a page: overflow pages
    job = {"key_hash": "k", "status": "queued", "format": "txt", "source_lang": "de", "target_lang": "en",
           "created": now, "holder": "h", "lease_until": now + 60}
    assert asyncio.run(jobs.create("owner", "DOC", job, source, 600, 0))
    with closing(connect(path, DOCUMENTS)) as other:
        assert other.execute("PRAGMA secure_delete").fetchone() == (1,)      # freed pages zeroed, on any build
        assert holds(path, source[:18])
        assert asyncio.run(jobs.change("owner", "DOC", 600, "h", None, True, result, {"status": "done"}))
        assert not holds(path, source[:18]) and holds(path, result[:18])
        assert asyncio.run(jobs.take("owner", "DOC")) == ("done", result)
        assert not holds(path, result[:18])
        assert other.execute("SELECT status, source, result FROM documents").fetchall() == [("downloaded", None, None)]


def test_a_deleted_glossarys_entries_are_in_neither_file_while_the_file_stays_open(tmp_path):
    path = tmp_path / "glossaries.sqlite3"
    store, term = SqliteStore(path), "zq" + secrets.token_hex(8)
    info = {"glossary_id": "G1", "name": "n", "source_lang": "de", "target_lang": "en", "entry_count": 1,
            "creation_time": "2026-12-04T00:00:00Z"}
    assert store.add_now("owner", info, f"{term}\tterm\n", 10)
    with closing(connect(path, GLOSSARIES)) as other:
        assert holds(path, term.encode())
        assert asyncio.run(store.remove("owner", "G1"))
        assert not holds(path, term.encode())
        assert other.execute("SELECT count(*) FROM glossaries").fetchone() == (0,)
