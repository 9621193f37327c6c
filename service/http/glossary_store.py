"""Stored glossaries (POST /glossaries, service/api/glossaries.py; used by id on POST /translate, Gateway.translate),
as DeepL's glossary API keeps them: each owned by the key that made it (its name: "anonymous" on a server without
keys), which alone lists, reads, uses and deletes it; any other key gets the 404 of an id that does not exist, so
it learns nothing of another key's glossaries. A glossary is its metadata and its entries as TSV (source TAB
target a line, as GET /glossaries/{id}/entries sends them); it is never changed, only deleted. Ids are random
(128 bits): knowing one says nothing of the others.

Where they live: with --redis-url in Redis, which every replica reads (a hash per glossary, a set of ids per owner,
under keys named as the limits' counters are, with the owner's hash tag: redis_bridge.RedisGlossaries); else in
SQLite, one file under --data-dir, which survives a restart. Why SQLite rather than a file per glossary, as
file_store.py keeps translated files: a glossary and the owner's count must change together, and SQLite's
transactions make each write all or nothing (a crash leaves the old state, never half a glossary) and let the HTTP
processes of one server (--api-servers) share the file safely: `BEGIN IMMEDIATE` lets one writer at a time count a
key's glossaries and add one, so two processes cannot both pass the key's limit. It is in the standard library
(nothing to run beside the server). Replicas on other hosts do not share it (SQLite over a network file system is
not safe): they need --redis-url.

Nothing here logs a glossary's name or terms: they are the client's text. A store that fails (Redis down, a disk
that cannot be written) is a 503 `glossaries_unavailable`, logged with its cause, never a 500.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from . import sqlite_file
from .redis_bridge import RedisGlossaries, StoreDown, where
from ..config import Settings
from ..errors import ApiError
from ..shared.glossary import Entry

log = logging.getLogger("transerve")

GLOSSARY_ID = re.compile(r"[0-9a-f]{32}")   # secrets.token_hex(16): any other id names no glossary
META = ("name", "source_lang", "target_lang", "entry_count", "creation_time")   # what a listing reads


@dataclass(frozen=True)
class GlossaryLimits:
    """What one key may store; each refused with its limit in the error body."""
    # Entries a glossary: every request that uses one sends all of them to the worker, which checks each, tokenizes
    # its target and matches it in every sentence; 10,000 cost a one-sentence request 0.2-0.3 CPU s more of its
    # worker (benchmarks/glossary_cost.py): more would cost every request using it more than its translation.
    entries: int = 10_000
    # Bytes of its entries as TSV (UTF-8): what a request using it reads from the store and sends to a worker.
    # 10,000 entries of two 50-byte terms. A body is still bounded by --max-payload-bytes first (1 MB by default).
    entry_bytes: int = 2**20
    # Glossaries a key: with the two above, 100 MiB a key at most in the store. Over it: 409, not 413: the body is
    # not too large, the key's store is full, and deleting one of its glossaries resolves it (RFC 9110's 409).
    per_key: int = 100


LIMITS = GlossaryLimits()


def not_found(glossary_id: str) -> ApiError:
    return ApiError(404, "glossary_not_found", f"no glossary {glossary_id!r} for this key: a glossary is used, "
                    "read and deleted only with the key that created it")


class GlossaryStore:
    """The calling key's glossaries, in Redis or SQLite, checked against `limits`."""

    def __init__(self, settings: Settings, limits: GlossaryLimits = LIMITS):
        self.limits = limits
        if settings.redis_url:
            # A glossary carries up to entry_bytes: longer than a limits check may wait (--redis-timeout-ms)
            self.backend: RedisStore | SqliteStore = RedisStore(RedisGlossaries(
                settings.redis_url, max(settings.redis_timeout_ms / 1000, 2.0)))
            self.where = f"Redis at {where(settings.redis_url)}"
        else:
            self.backend = SqliteStore(settings.data_path / "glossaries.sqlite3")
            self.where = str(self.backend.path)

    async def create(self, owner: str, name: str, source_lang: str, target_lang: str,
                     entries: Sequence[Entry]) -> dict:
        """The new glossary's metadata (GlossaryInfo's fields); 413 over a limit of its own, 409 when the key
        has its limit of glossaries already."""
        tsv = self.checked(entries)
        info = {"glossary_id": secrets.token_hex(16), "name": name, "source_lang": source_lang,
                "target_lang": target_lang, "entry_count": len(entries), "creation_time": now()}
        if not await self.call(self.backend.add(owner, info, tsv, self.limits.per_key)):
            raise ApiError(409, "too_many_glossaries", f"this key has {self.limits.per_key} glossaries, the most a "
                           "key may keep: delete one (DELETE /glossaries/{id}) to store another", self.limits.per_key)
        return info

    def checked(self, entries: Sequence[Entry]) -> str:
        """The entries (checked already: glossary.check_entries) as TSV, or the 413 of a limit, or the 400 of a term
        that TSV cannot hold."""
        n, most = len(entries), self.limits
        if n > most.entries:
            raise ApiError(413, "too_many_glossary_entries", f"the glossary has {n} entries; the limit is "
                           f"{most.entries}", most.entries)
        for i, e in enumerate(entries, 1):
            for side, term in (("source", e.source), ("target", e.target)):
                if "\t" in term or term.splitlines() != [term]:
                    raise ApiError(400, "invalid_glossary", f"glossary entry {i}: its {side} term holds a tab or a "
                                   "line break, which a glossary's TSV cannot hold")
        tsv = "".join(f"{e.source}\t{e.target}\n" for e in entries)
        try:
            size = len(tsv.encode("utf-8"))
        except UnicodeEncodeError as e:
            raise ApiError(422, "invalid_request", f"a glossary term has a lone UTF-16 surrogate (at character "
                           f"{e.start} of its TSV), which is not Unicode text; send its pair or drop it") from None
        if size > most.entry_bytes:
            raise ApiError(413, "glossary_too_large", f"the glossary's entries take {size} bytes as TSV (UTF-8); "
                           f"the limit is {most.entry_bytes}", most.entry_bytes)
        return tsv

    async def listed(self, owner: str) -> list[dict]:
        """The key's glossaries, oldest first."""
        infos = await self.call(self.backend.infos(owner))
        return sorted(infos, key=lambda i: (i["creation_time"], i["glossary_id"]))

    async def info(self, owner: str, glossary_id: str) -> dict:
        row = await self.read(owner, glossary_id, META)
        return {"glossary_id": glossary_id, **row, "entry_count": int(row["entry_count"])}

    async def entries(self, owner: str, glossary_id: str) -> str:
        return (await self.read(owner, glossary_id, ("entries",)))["entries"]

    async def pairs(self, owner: str, glossary_id: str, source_lang: str, target_lang: str) -> list[tuple[str, str]]:
        """The entries as the translate worker reads a glossary, for a request of source_lang-target_lang: 404 for
        an id this key has not, 400 when the glossary is for another pair."""
        row = await self.read(owner, glossary_id, ("source_lang", "target_lang", "entries"))
        if (row["source_lang"], row["target_lang"]) != (source_lang, target_lang):
            raise ApiError(400, "glossary_language_mismatch", f"glossary {glossary_id!r} is for "
                           f"{row['source_lang']}-{row['target_lang']}; this request translates "
                           f"{source_lang}-{target_lang}")
        return [tuple(line.split("\t", 1)) for line in row["entries"].split("\n") if line]

    async def delete(self, owner: str, glossary_id: str) -> None:
        if not GLOSSARY_ID.fullmatch(glossary_id) or not await self.call(self.backend.remove(owner, glossary_id)):
            raise not_found(glossary_id)

    async def read(self, owner: str, glossary_id: str, names: Sequence[str]) -> dict[str, str]:
        row = await self.call(self.backend.fields(owner, glossary_id, names)) \
            if GLOSSARY_ID.fullmatch(glossary_id) else None
        if row is None:
            raise not_found(glossary_id)
        return row

    async def call(self, work):
        """The store's answer, or the 503 of a store that failed (its cause logged, with no client text)."""
        try:
            return await work
        except (StoreDown, sqlite3.Error, OSError) as e:
            log.warning("the glossary store (%s) failed: %s: %s", self.where, type(e).__name__, e)
            raise ApiError(503, "glossaries_unavailable", "the glossary store cannot answer now; retry shortly",
                           headers={"Retry-After": "1"}) from None


def now() -> str:
    """UTC, to the millisecond, as DeepL writes a glossary's creation_time."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class RedisStore:
    """Glossaries in Redis: `transerve:{owner}:glossaries`, the owner's set of ids, and
    `transerve:{owner}:glossary:<id>`, each glossary's hash ({owner}: one Redis Cluster slot, as quota.py's)."""

    def __init__(self, redis: RedisGlossaries):
        self.redis = redis

    @staticmethod
    def keys(owner: str, glossary_id: str = "") -> tuple[str, str]:
        return f"transerve:{{{owner}}}:glossaries", f"transerve:{{{owner}}}:glossary:{glossary_id}"

    async def add(self, owner: str, info: dict, tsv: str, most: int) -> bool:
        owned, key = self.keys(owner, info["glossary_id"])
        fields = {k: str(info[k]) for k in META} | {"entries": tsv}
        return await self.redis.add(owned, key, info["glossary_id"], fields, most)

    async def infos(self, owner: str) -> list[dict]:
        ids = await self.redis.members(self.keys(owner)[0])
        rows = await self.redis.hashes([self.keys(owner, i)[1] for i in ids], list(META))
        return [{"glossary_id": i, **row, "entry_count": int(row["entry_count"])}
                for i, row in zip(ids, rows) if row is not None]

    async def fields(self, owner: str, glossary_id: str, names: Sequence[str]) -> dict[str, str] | None:
        (row,) = await self.redis.hashes([self.keys(owner, glossary_id)[1]], list(names))
        return row

    async def remove(self, owner: str, glossary_id: str) -> bool:
        return await self.redis.remove(*self.keys(owner, glossary_id), glossary_id)


SCHEMA = """
CREATE TABLE IF NOT EXISTS glossaries (
    glossary_id TEXT PRIMARY KEY, owner TEXT NOT NULL, name TEXT NOT NULL, source_lang TEXT NOT NULL,
    target_lang TEXT NOT NULL, entry_count INTEGER NOT NULL, creation_time TEXT NOT NULL, entries TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS glossaries_by_owner ON glossaries (owner);
"""


class SqliteStore:
    """Glossaries in one SQLite file (sqlite_file.py), made with the first glossary; each call runs in a thread."""

    def __init__(self, path: Path):
        self.path = path

    def connect(self, write: bool) -> sqlite3.Connection | None:
        """A connection, or None for a read before any glossary was stored."""
        return sqlite_file.connect(self.path, SCHEMA) if write else sqlite_file.reader(self.path)

    async def add(self, owner: str, info: dict, tsv: str, most: int) -> bool:
        return await asyncio.to_thread(self.add_now, owner, info, tsv, most)

    def add_now(self, owner: str, info: dict, tsv: str, most: int) -> bool:
        with closing(self.connect(write=True)) as db:
            with sqlite_file.immediate(db):     # the write lock first: the count and the insert as one step
                (n,) = db.execute("SELECT count(*) FROM glossaries WHERE owner = ?", (owner,)).fetchone()
                if n < most:
                    db.execute("INSERT INTO glossaries VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (
                        info["glossary_id"], owner, *(info[k] for k in META), tsv))
            return n < most

    async def infos(self, owner: str) -> list[dict]:
        return await asyncio.to_thread(self.select, "SELECT glossary_id, " + ", ".join(META) +
                                       " FROM glossaries WHERE owner = ?", (owner,))

    async def fields(self, owner: str, glossary_id: str, names: Sequence[str]) -> dict | None:
        assert set(names) <= {*META, "entries"}     # column names, never a client's text
        rows = await asyncio.to_thread(self.select, f"SELECT {', '.join(names)} FROM glossaries "
                                       "WHERE owner = ? AND glossary_id = ?", (owner, glossary_id))
        return rows[0] if rows else None

    def select(self, query: str, args: tuple) -> list[dict]:
        db = self.connect(write=False)
        if db is None:
            return []
        with closing(db):
            try:
                cursor = db.execute(query, args)
            except sqlite3.OperationalError:
                if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'glossaries'").fetchone():
                    raise
                return []       # a file made by a write that stopped before its table: nothing stored
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row)) for row in cursor.fetchall()]

    async def remove(self, owner: str, glossary_id: str) -> bool:
        def remove_now() -> bool:
            if not self.path.exists():
                return False
            with closing(self.connect(write=True)) as db:
                removed = db.execute("DELETE FROM glossaries WHERE owner = ? AND glossary_id = ?",
                                     (owner, glossary_id)).rowcount > 0
                if removed:
                    sqlite_file.forget(db)
                return removed

        return await asyncio.to_thread(remove_now)
