"""DeepL's document jobs (POST /deepl/v2/document, service/api/deepl_documents.py runs them): each upload's state,
its file until it is translated and its result until it is downloaded, kept where every replica reaches them, so
that a client polling through a load balancer gets its answer from whichever replica it lands on: server A
translates, server B answers the status and hands over the result.

A job goes queued -> translating -> done -> downloaded, or to error from queued or translating. Its id (32 hex
digits, as DeepL's) and its key (64, given once, with the id: only its SHA-256 is stored) are random; a job is
found only with both, and only by the API key that uploaded it (its name: "anonymous" on a server without keys).
Anything else is the same 404, so an id says nothing of another key's documents. No file name is stored: the
result is handed over under a generic one, and nothing here logs a job's languages, name or text.

Leases: the server running a job holds it (`holder`: its host, process and a random token) until `lease_until`,
and renews it every third of --document-lease-s while the job is queued or translating. A job changes only while
it is queued or translating and, for its holder's steps, only while that server still holds it (each step a
compare-and-set), so a server that lost its lease cannot overwrite what another wrote. Whoever reads a job queued
or translating whose lease has run out fails it, with STOPPED (a compare-and-set too: two readers fail it once).
So a job whose server died is never left translating, whichever replica is asked next. A lease's end is written
by its holder's clock and read by the reader's: replicas' clocks must agree (NTP) well within the lease.

Time to live: a job, its files and its state expire --file-ttl-s after their last change (each renewal is one: a
long translation does not expire under its server), so a result not downloaded by then is deleted with its job.
A downloaded result is deleted at once; the job's state stays until its expiry (status "downloaded"), so that a
second download gets DeepL's "Document already downloaded" rather than a 404.

Where: with --redis-url in Redis, which every replica reads (a hash per job and its files as values, under the
owner's hash tag, expiring by Redis's own TTL; the conditional steps are scripts: redis_bridge.RedisDocuments).
Else in SQLite, one file under --data-dir (documents.sqlite3), which outlives a restart. Why SQLite rather than
files, as file_store.py keeps LibreTranslate's results: every change here is conditional (only its holder, only
while translating, a result taken once), and SQLite makes each one a single atomic step for every HTTP process of
the server (--api-servers), where files would need locks of their own; a document is a BLOB in it (SQLite takes up
to 1 GB; --max-file-bytes is 20 MB by default). It is in the standard library, as for the stored glossaries
(glossary_store.py). Its rows past their expiry are never read, and are deleted by a sweep (each upload, and every
quarter of the TTL, at most a minute, in a process that has run a job). Replicas on other hosts do not share it
(SQLite over a network file system is not safe): they need --redis-url.

The cap: a key (an owner) may have --max-document-jobs-per-key jobs queued or translating at once, their leases
live, over all replicas; create() refuses the next with DeepL's 429. The store counts and inserts in one atomic
step (Redis: redis_bridge.CREATE_DOCUMENT over the owner's set of active jobs, scored by their leases' ends;
SQLite: one transaction that takes the write lock first), so two replicas cannot both admit past the cap. A job
leaves the count when it is done or failed, or once its lease has run out, read or not.

A store that fails (Redis down, a disk that cannot be written) is a 503 `documents_unavailable`, logged with its
cause, never a 500. An upload answered so because its Redis call timed out or lost its connection is forgotten
(`forget`) once Redis answers again: a Redis that was only slow may have run its creation after all, or may run it
later (a tombstone refuses it then); one that answered an error stored nothing, nor does a failed SQLite
transaction. A Redis call that moves a document's bytes may take the store's timeout plus its bytes at
redis_bridge.TRANSFER_BYTES_PER_S, so a large file is not lost to a bound made for small calls.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import hmac
import logging
import os
import re
import secrets
import socket
import sqlite3
import time
from contextlib import closing
from typing import Callable
from pathlib import Path

from . import sqlite_file
from .redis_bridge import RedisDocuments, StoreDown, where
from ..config import Settings
from ..errors import ApiError
from ..metrics import metrics

log = logging.getLogger("transerve")

DOCUMENT_ID = re.compile(r"[0-9A-F]{32}")   # secrets.token_hex(16).upper(): any other id names no job
ACTIVE = ("queued", "translating")          # the states a lease covers
NUMBERS = {"created": float, "started": float, "lease_until": float, "chars": int, "translated": int, "billed": int}
STOPPED = "the server translating the document stopped before it finished (its lease ran out); upload it again"
RETRY_S = 5     # a refused upload's Retry-After: DeepL's clients poll a job every 5 s, so one ends at that pace
# The uploads answered 503 whose creation may have run in Redis all the same (DocumentJobs.forget): at most this
# many wait to be forgotten in a process (past it the oldest is let go: it expires with its time to live), tried
# by one task, FORGET_WAIT_S apart at first and twice as long after each failure, up to FORGET_WAIT_MOST_S.
FORGET_MOST = 10_000
FORGET_WAIT_S, FORGET_WAIT_MOST_S = 1.0, 30.0


def not_found() -> ApiError:
    """DeepL's 404 (its message), for an id unknown, expired, of another key, or a wrong document_key alike."""
    return ApiError(404, "document_not_found", "Document not found")


def digest(document_key: str) -> str:
    return hashlib.sha256(document_key.encode("utf-8", "replace")).hexdigest()


def typed(row: dict) -> dict:
    """A job's fields as numbers where they are (Redis answers text), None for one not set."""
    return {k: (NUMBERS[k](v) if k in NUMBERS and v not in (None, "") else (v if v != "" else None))
            for k, v in row.items()}


class DocumentJobs:
    """The jobs, in Redis or SQLite, with this process's leases; every call a 503 when the store cannot answer."""

    def __init__(self, settings: Settings):
        self.ttl_s, self.lease_s = settings.file_ttl_s, settings.document_lease_s
        self.cap = settings.max_document_jobs_per_key
        if settings.redis_url:
            # A job's step may wait longer than a limits check (--redis-timeout-ms): it is no request's admission; one
            # that carries a file gets its bytes' time on top (redis_bridge.transfer_timeout_s)
            self.backend: RedisJobs | SqliteJobs = RedisJobs(RedisDocuments(
                settings.redis_url, max(settings.redis_timeout_ms / 1000, 5.0)))
            self.where = f"Redis at {where(settings.redis_url)}"
        else:
            self.backend = SqliteJobs(settings.data_path / "documents.sqlite3")
            self.where = str(self.backend.path)
        self.holders: dict[int, str] = {}
        self.sweeper: asyncio.Task | None = None
        self.to_forget: dict[tuple[str, str], None] = {}   # (owner, document id), oldest first (forget)
        self.forgetter: asyncio.Task | None = None

    def holder(self) -> str:
        """This process as a lease's holder: host and pid, and a token (a pid comes back after a restart)."""
        pid = os.getpid()
        if pid not in self.holders:
            self.holders[pid] = f"{socket.gethostname()}:{pid}:{secrets.token_hex(4)}"
        return self.holders[pid]

    async def create(self, owner: str, fields: dict, source: bytes) -> tuple[str, str]:
        """A new job, queued and held by this process, with its file; (its id, its key). DeepL's 429 when the owner
        has --max-document-jobs-per-key jobs queued or translating already (their leases live), on any replica:
        the store counts and admits in one atomic step."""
        document_id, key = secrets.token_hex(16).upper(), secrets.token_hex(32).upper()
        now = time.time()
        job = fields | {"key_hash": digest(key), "status": "queued", "created": now, "holder": self.holder(),
                        "lease_until": now + self.lease_s}
        # Redis may have run a creation that failed all the same, or may run it once it goes on (SQLite's
        # transaction stored it whole or not at all)
        admitted = await self.call(self.backend.create(owner, document_id, job, source, self.ttl_s, self.cap),
                                   unsure=lambda: self.forget(owner, document_id))
        self.start_sweeping()
        if not admitted:
            metrics().key_rate_limited.labels(owner, "document_jobs").inc()
            raise ApiError(429, "too_many_documents", f"Too many documents: this key has {self.cap} queued or being "
                           f"translated, its limit (--max-document-jobs-per-key); upload this one when one is done",
                           self.cap, {"Retry-After": str(RETRY_S)})
        return document_id, key

    def forget(self, owner: str, document_id: str) -> None:
        """A job whose upload was answered 503 though Redis may have run its creation (or may run it when it goes
        on): deleted, and a tombstone left that refuses its creation should Redis run it later
        (redis_bridge.FORGET_DOCUMENT), by this process's one forgetter task, as soon as Redis answers again."""
        self.to_forget[owner, document_id] = None
        while len(self.to_forget) > FORGET_MOST:
            del self.to_forget[next(iter(self.to_forget))]
        if self.forgetter is None or self.forgetter.done():
            # a context of its own: not the request's (its span), which it outlives
            self.forgetter = asyncio.get_running_loop().create_task(self.forget_all(), context=contextvars.Context())

    async def forget_all(self) -> None:
        """Forgets the jobs waiting (`to_forget`), one call at a time; while Redis does not answer, waits FORGET_WAIT_S
        and twice as long after each failure (FORGET_WAIT_MOST_S at most)."""
        wait = FORGET_WAIT_S
        while self.to_forget:
            owner, document_id = next(iter(self.to_forget))
            try:
                await self.backend.forget(owner, document_id, self.ttl_s)
            except StoreDown:
                await asyncio.sleep(wait)
                wait = min(2 * wait, FORGET_WAIT_MOST_S)
                continue
            self.to_forget.pop((owner, document_id), None)
            wait = FORGET_WAIT_S

    async def find(self, owner: str, document_id: str, document_key: str) -> dict:
        """The job, or the 404; one whose lease has run out failed first (STOPPED)."""
        job = await self.read(owner, document_id, document_key)
        if job["status"] in ACTIVE and job["lease_until"] < time.time():
            if await self.call(self.backend.change(owner, document_id, self.ttl_s, "", time.time(), True, None,
                                                   {"status": "error", "error": STOPPED})):
                # Not its id, half of the download's credential; its upload's request id is not stored
                log.warning("a document job's server's lease ran out; failed")
                metrics().document_jobs.labels("error").inc()
            job = await self.read(owner, document_id, document_key)
        return job

    async def read(self, owner: str, document_id: str, document_key: str) -> dict:
        row = await self.call(self.backend.fields(owner, document_id)) \
            if DOCUMENT_ID.fullmatch(document_id) else None
        if row is None or not hmac.compare_digest(row["key_hash"], digest(document_key)):
            raise not_found()
        return typed(row)

    async def source(self, owner: str, document_id: str) -> bytes | None:
        return await self.call(self.backend.source(owner, document_id))

    async def change(self, owner: str, document_id: str, fields: dict, result: bytes | None = None,
                     drop_source: bool = False) -> bool:
        """`fields` set on a job this process holds that is still queued or translating, its lease and expiry
        renewed (with `result` stored, the source dropped, as asked); False when it is not (any more)."""
        fields = fields | {"lease_until": time.time() + self.lease_s}
        return await self.call(self.backend.change(owner, document_id, self.ttl_s, self.holder(), None,
                                                   drop_source, result, fields))

    async def take(self, owner: str, document_id: str, document_key: str) -> tuple[dict, bytes]:
        """The job and its result, handed over once (the job is then "downloaded"); the 404 of find(), or a 503
        naming why there is no result (not done yet, failed, downloaded already)."""
        job = await self.find(owner, document_id, document_key)
        status, data = job["status"], None
        if status == "done":
            status, data = await self.call(self.backend.take(owner, document_id))
        if data is None:
            raise no_result(status, job)
        return job, data

    async def call(self, work, unsure: Callable[[], None] | None = None):
        """The store's answer, or the 503 of a store that failed (its cause logged, with no client text); `unsure`
        is called first when the store may have done the work all the same (StoreDown.unsure)."""
        try:
            return await work
        except (StoreDown, sqlite3.Error, OSError) as e:
            if unsure is not None and getattr(e, "unsure", False):
                unsure()
            log.warning("the document store (%s) failed: %s: %s", self.where, type(e).__name__, e)
            raise ApiError(503, "documents_unavailable", "the document store cannot answer now; retry shortly",
                           headers={"Retry-After": "1"}) from None

    def start_sweeping(self) -> None:
        """The expired rows' sweep (SQLite's; Redis expires its own), at once and then periodically, on this process's
        event loop: started as the process starts (Gateway.started), and again by a job should it have ended."""
        if isinstance(self.backend, SqliteJobs) and (self.sweeper is None or self.sweeper.done()):
            self.sweeper = asyncio.get_running_loop().create_task(self.sweep_forever())

    async def sweep_forever(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.backend.sweep)
            except (sqlite3.Error, OSError) as e:
                log.warning("the document store (%s) failed its sweep: %s: %s", self.where, type(e).__name__, e)
            await asyncio.sleep(min(60.0, self.ttl_s / 4))


def no_result(status: str, job: dict) -> ApiError:
    """The download of a job without a result: DeepL's 503 (its clients' DocumentNotReadyException), whose message
    says why; "" (gone between the two reads: expired) is the 404."""
    if status == "downloaded":
        return ApiError(503, "document_downloaded", "Document already downloaded")   # DeepL's message
    if status == "error":
        return ApiError(503, "document_failed", f"the document's translation failed, so it has no result: "
                        f"{job['error']}")
    if status in ACTIVE:
        return ApiError(503, "document_not_ready", f"the document is {status}: download it once its status is "
                        "\"done\"", headers={"Retry-After": "5"})
    return not_found()


class RedisJobs:
    """Jobs in Redis: `transerve:{owner}:document:<id>`, each job's hash, and `...:<id>:source`, `...:<id>:result`,
    its files ({owner}: one Redis Cluster slot, as glossary_store.py's keys)."""

    def __init__(self, redis: RedisDocuments):
        self.redis = redis

    @staticmethod
    def keys(owner: str, document_id: str) -> list[str]:
        """The job's hash, its source, its result, its owner's active set and its tombstone
        (redis_bridge.CREATE_DOCUMENT, FORGET_DOCUMENT)."""
        job = f"transerve:{{{owner}}}:document:{document_id}"
        return [job, f"{job}:source", f"{job}:result", f"transerve:{{{owner}}}:documents:active", f"{job}:forgotten"]

    async def create(self, owner: str, document_id: str, job: dict, source: bytes, ttl_s: float, cap: int) -> bool:
        keys = self.keys(owner, document_id)
        return await self.redis.create([keys[0], keys[1], keys[3], keys[4]], {k: str(v) for k, v in job.items()},
                                       source, int(ttl_s * 1000), cap, time.time())

    async def forget(self, owner: str, document_id: str, ttl_s: float) -> None:
        await self.redis.forget(self.keys(owner, document_id), int(ttl_s * 1000))

    async def fields(self, owner: str, document_id: str) -> dict | None:
        return await self.redis.fields(self.keys(owner, document_id)[0])

    async def source(self, owner: str, document_id: str) -> bytes | None:
        return await self.redis.blob(self.keys(owner, document_id)[1])

    async def change(self, owner: str, document_id: str, ttl_s: float, holder: str, before: float | None,
                     drop_source: bool, result: bytes | None, fields: dict) -> bool:
        return await self.redis.change(self.keys(owner, document_id), int(ttl_s * 1000), holder,
                                       "" if before is None else repr(before), drop_source, result,
                                       {k: str(v) for k, v in fields.items()})

    async def take(self, owner: str, document_id: str) -> tuple[str, bytes | None]:
        return await self.redis.take(self.keys(owner, document_id))

    def sweep(self) -> None:
        """Nothing: Redis deletes each key at its expiry."""


SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
    document_id TEXT PRIMARY KEY, owner TEXT NOT NULL, key_hash TEXT NOT NULL, status TEXT NOT NULL,
    format TEXT NOT NULL, source_lang TEXT NOT NULL, target_lang TEXT NOT NULL, glossary_id TEXT,
    created REAL NOT NULL, started REAL, holder TEXT NOT NULL, lease_until REAL NOT NULL, chars INTEGER,
    translated INTEGER, billed INTEGER, error TEXT, expires REAL NOT NULL, source BLOB, result BLOB);
CREATE INDEX IF NOT EXISTS documents_by_expiry ON documents (expires);
CREATE INDEX IF NOT EXISTS documents_by_owner ON documents (owner, status);
"""
FIELDS = ("key_hash", "status", "format", "source_lang", "target_lang", "glossary_id", "created", "started",
          "holder", "lease_until", "chars", "translated", "billed", "error")   # a job's state: all but its files


class SqliteJobs:
    """Jobs in one SQLite file (sqlite_file.py), made with the first job; each call runs in a thread."""

    def __init__(self, path: Path):
        self.path = path

    def connect(self) -> sqlite3.Connection:
        return sqlite_file.connect(self.path, SCHEMA)

    async def create(self, owner: str, document_id: str, job: dict, source: bytes, ttl_s: float, cap: int) -> bool:
        """The job inserted, unless its owner has `cap` jobs queued or translating with their leases live (0: no
        cap): counted and inserted in one transaction, which holds the write lock from its start, so two HTTP
        processes cannot both admit past the cap (redis_bridge.CREATE_DOCUMENT's count, in SQL)."""
        def create_now() -> bool:
            assert set(job) <= set(FIELDS)   # column names, never a client's text
            with closing(self.connect()) as db:
                with sqlite_file.immediate(db):
                    now = time.time()
                    expired = db.execute("DELETE FROM documents WHERE expires < ?", (now,)).rowcount
                    held = db.execute("SELECT count(*) FROM documents WHERE owner = ? AND status IN ('queued', "
                                      "'translating') AND lease_until >= ?", (owner, now)).fetchone()[0] if cap else 0
                    admitted = not cap or held < cap
                    if admitted:
                        db.execute(f"INSERT INTO documents (document_id, owner, expires, source, {', '.join(job)}) "
                                   f"VALUES (?, ?, ?, ?{', ?' * len(job)})", (document_id, owner, now + ttl_s,
                                                                              source, *job.values()))
                if expired:
                    sqlite_file.forget(db)
            return admitted

        return await asyncio.to_thread(create_now)

    async def fields(self, owner: str, document_id: str) -> dict | None:
        def read() -> dict | None:
            if not self.path.exists():      # no job yet: nothing to make a file for
                return None
            with closing(self.connect()) as db:
                row = db.execute(f"SELECT {', '.join(FIELDS)} FROM documents WHERE owner = ? AND document_id = ? "
                                 "AND expires >= ?", (owner, document_id, time.time())).fetchone()
            return None if row is None else dict(zip(FIELDS, row))

        return await asyncio.to_thread(read)

    async def source(self, owner: str, document_id: str) -> bytes | None:
        def read() -> bytes | None:
            if not self.path.exists():
                return None
            with closing(self.connect()) as db:
                row = db.execute("SELECT source FROM documents WHERE owner = ? AND document_id = ? AND expires >= ?",
                                 (owner, document_id, time.time())).fetchone()
            return None if row is None else row[0]

        return await asyncio.to_thread(read)

    async def change(self, owner: str, document_id: str, ttl_s: float, holder: str, before: float | None,
                     drop_source: bool, result: bytes | None, fields: dict) -> bool:
        return await asyncio.to_thread(self.change_now, owner, document_id, ttl_s, holder, before, drop_source,
                                       result, fields)

    def change_now(self, owner: str, document_id: str, ttl_s: float, holder: str, before: float | None,
                   drop_source: bool, result: bytes | None, fields: dict) -> bool:
        """One UPDATE, so one atomic step: its conditions and its changes together (redis_bridge.CHANGE_DOCUMENT's)."""
        assert set(fields) <= set(FIELDS)   # column names, never a client's text
        now = time.time()
        sets, args = [f"{k} = ?" for k in fields] + ["expires = ?"], [*fields.values(), now + ttl_s]
        if drop_source:
            sets.append("source = NULL")
        if result is not None:
            sets.append("result = ?")
            args.append(result)
        conditions = "owner = ? AND document_id = ? AND status IN ('queued', 'translating') AND expires >= ?"
        args += [owner, document_id, now]
        if holder:
            conditions += " AND holder = ?"
            args.append(holder)
        if before is not None:
            conditions += " AND lease_until < ?"
            args.append(before)
        with closing(self.connect()) as db:
            changed = db.execute(f"UPDATE documents SET {', '.join(sets)} WHERE {conditions}", args).rowcount == 1
            if changed and drop_source:
                sqlite_file.forget(db)
            return changed

    async def take(self, owner: str, document_id: str) -> tuple[str, bytes | None]:
        def take_now() -> tuple[str, bytes | None]:
            with closing(self.connect()) as db:
                with sqlite_file.immediate(db):            # the read and the change as one step
                    row = db.execute("SELECT status, result FROM documents WHERE owner = ? AND document_id = ? AND "
                                     "expires >= ?", (owner, document_id, time.time())).fetchone()
                    taken = row is not None and row[0] == "done"
                    if taken:
                        db.execute("UPDATE documents SET status = 'downloaded', result = NULL WHERE owner = ? AND "
                                   "document_id = ?", (owner, document_id))
                if taken:
                    sqlite_file.forget(db)
            return ("", None) if row is None else (row[0], row[1] if row[0] == "done" else None)

        return await asyncio.to_thread(take_now)

    def sweep(self) -> None:
        """Deletes the expired jobs (their files with them)."""
        if self.path.exists():
            with closing(self.connect()) as db:
                if db.execute("DELETE FROM documents WHERE expires < ?", (time.time(),)).rowcount:
                    sqlite_file.forget(db)
