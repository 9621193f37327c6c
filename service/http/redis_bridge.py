"""The one module that knows the `redis` client library: a connection per HTTP process, the counting script,
the stored glossaries' hashes and sets (RedisGlossaries), DeepL's document jobs and their files (RedisDocuments),
the translation cache's answers (RedisCache), and every way Redis can fail turned into one exception, StoreDown.
quota.py, glossary_store.py, document_jobs.py and translation_cache.py decide what a failure means and name the keys.

The script checks and charges all of a request's counters at once, inside Redis, so that two replicas (or two
HTTP processes) charging the same key cannot both pass a limit that only one fits under: Redis runs a script
alone, start to end. Its counters name the key in a hash tag (`{team-a}`), so a Redis Cluster keeps all of one
key's counters in one slot, where one script may touch them together.
"""

from __future__ import annotations

import asyncio
import os
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError, RedisError, TimeoutError as RedisTimeoutError

# KEYS: the counters; ARGV: cost, limit, window (ms) of each, in order. A counter over which this request's cost
# would go (or, for a cost of 0, a counter already at its limit) refuses the request, and then nothing is
# charged; a limit of -1 is no limit (a charge after the fact: tokens generated). A counter is created with its
# window's expiry: its window starts at the key's first request in it. Returns {refused counter's number or 0,
# then used and milliseconds to the window's end of each counter}. A counter that is not a number (written by
# something else) starts again at 0: raising, the script read as Redis down, every key's limits with it.
TAKE = """
local function used_of(key)
  local value = redis.pcall('GET', key)
  local used = type(value) ~= 'table' and tonumber(value or '0') or nil
  if used == nil then redis.call('DEL', key); return 0 end
  return used
end
local out, refused = {}, 0
for i = 1, #KEYS do
  local cost, limit = tonumber(ARGV[3*i-2]), tonumber(ARGV[3*i-1])
  local used = used_of(KEYS[i])
  local ttl = redis.call('PTTL', KEYS[i])
  if ttl < 0 then ttl = tonumber(ARGV[3*i]) end
  if refused == 0 and limit >= 0 and (used + cost > limit or (cost == 0 and used >= limit)) then refused = i end
  out[2*i-1], out[2*i] = used, ttl
end
if refused == 0 then
  for i = 1, #KEYS do
    local cost = tonumber(ARGV[3*i-2])
    if cost > 0 then
      out[2*i-1] = redis.call('INCRBY', KEYS[i], cost)
      if redis.call('PTTL', KEYS[i]) < 0 then redis.call('PEXPIRE', KEYS[i], ARGV[3*i]) end
    end
  end
end
table.insert(out, 1, refused)
return out
"""


# A glossary stored and added to its owner's set at once, unless the set holds ARGV[1] already (the key's limit):
# two replicas storing for one key at once cannot both pass it. KEYS: the owner's set, the glossary's hash;
# ARGV: the limit, the glossary's id, then the hash's fields and values. Returns 1, or 0 when refused.
ADD_GLOSSARY = """
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[2], unpack(ARGV, 3))
redis.call('SADD', KEYS[1], ARGV[2])
return 1
"""
# The glossary out of its owner's set and its hash deleted, together; KEYS as above, ARGV: its id. Returns 1, or
# 0 when the set did not hold it.
REMOVE_GLOSSARY = """
if redis.call('SREM', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('DEL', KEYS[2])
return 1
"""


class StoreDown(Exception):
    """Redis did not answer in time, or could not be reached: the exception's class name says which. `unsure`: the
    call may have reached Redis and run there all the same (it timed out, or its connection was lost), where an
    error Redis answered (a write refused at its maxmemory) says that it did not."""

    def __init__(self, cause: BaseException):
        super().__init__(type(cause).__name__)
        self.unsure = isinstance(cause, (OSError, RedisTimeoutError, RedisConnectionError))   # TimeoutError too


def where(url: str) -> str:
    """host:port of a Redis URL, for the log: the URL itself may hold a password (never in an error either)."""
    u = urlsplit(url)
    try:
        port = u.port or 6379
    except ValueError:                     # config.redis_url_problem refuses such a URL at start
        port = "?"
    return f"{u.hostname or '?'}:{port}"


class RedisCounters:
    """The counting script on one Redis; each process opens its own connections on its first use (a
    connection pool does not survive a fork, nor an event loop)."""

    def __init__(self, url: str, timeout_s: float):
        self.url, self.timeout_s = url, timeout_s
        self.client: aioredis.Redis | None = None
        self.script = None
        self.pid = None

    def connect(self):
        if self.client is None or self.pid != os.getpid():
            self.client = aioredis.Redis.from_url(self.url, socket_timeout=self.timeout_s,
                                                  socket_connect_timeout=self.timeout_s)
            self.script, self.pid = self.client.register_script(TAKE), os.getpid()
        return self.script

    async def take(self, keys: list[str], args: list[int]) -> list[int]:
        """The script's answer, or StoreDown within the timeout, whatever Redis does."""
        script = self.connect()
        try:
            async with asyncio.timeout(self.timeout_s):
                return [int(x) for x in await script(keys=keys, args=args)]
        except (RedisError, OSError, TimeoutError) as e:
            raise StoreDown(e) from None

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()


class RedisGlossaries:
    """Stored glossaries in one Redis: a hash per glossary and a set of ids per owner, under the keys
    glossary_store.py names (both in one Redis Cluster slot: the owner's hash tag). A connection per process,
    opened on its first use, as RedisCounters'; its answers are text."""

    def __init__(self, url: str, timeout_s: float):
        self.url, self.timeout_s = url, timeout_s
        self.client: aioredis.Redis | None = None
        self.scripts: tuple = ()
        self.pid = None

    def connect(self) -> aioredis.Redis:
        if self.client is None or self.pid != os.getpid():
            self.client = aioredis.Redis.from_url(self.url, socket_timeout=self.timeout_s, decode_responses=True,
                                                  socket_connect_timeout=self.timeout_s)
            self.scripts = (self.client.register_script(ADD_GLOSSARY), self.client.register_script(REMOVE_GLOSSARY))
            self.pid = os.getpid()
        return self.client

    async def answer(self, call):
        """`call(client)`'s answer, or StoreDown within the timeout, whatever Redis does."""
        client = self.connect()
        try:
            async with asyncio.timeout(self.timeout_s):
                return await call(client)
        except (RedisError, OSError, TimeoutError) as e:
            raise StoreDown(e) from None

    async def add(self, owned: str, key: str, member: str, fields: dict[str, str], most: int) -> bool:
        """The hash `key` written and `member` added to the set `owned`, unless the set holds `most` already."""
        flat = [x for item in fields.items() for x in item]
        return bool(await self.answer(lambda c: self.scripts[0](keys=[owned, key], args=[most, member, *flat])))

    async def members(self, owned: str) -> list[str]:
        return list(await self.answer(lambda c: c.smembers(owned)))

    async def hashes(self, keys: list[str], names: list[str]) -> list[dict[str, str] | None]:
        """Each hash's fields `names` (None for a hash that is gone), in one round trip."""
        async def read(client):
            async with client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.hmget(key, names)
                return await pipe.execute()

        rows = await self.answer(read) if keys else []
        return [None if row[0] is None else dict(zip(names, row)) for row in rows]

    async def remove(self, owned: str, key: str, member: str) -> bool:
        return bool(await self.answer(lambda c: self.scripts[1](keys=[owned, key], args=[member])))


# Each owner's active set (a sorted set: its jobs queued or translating, by their hash's key, scored by the end of
# their lease) is what the cap on a key's jobs counts: a job leaves it when it is done or failed, and a job whose
# server stopped renewing its lease no longer counts once the lease has run out, whether or not a reader failed it.
#
# A document job (document_jobs.py) created with its source file and entered in its owner's active set, unless the
# set holds ARGV[2] live jobs already (0: no cap), or the job was forgotten (FORGET_DOCUMENT): two replicas admitting
# uploads of one key at once cannot both pass it. KEYS: the job's hash, its source file, its owner's active set, its
# tombstone; ARGV: time to live (ms), the cap, now, the job's lease end (its score), the source, then the hash's
# fields and values. Returns 1, or 0 when refused.
# Its first write is the HSET, which a Redis at its maxmemory refuses (an error: the upload's 503) before anything is
# written: a script's later writes go through once one has (ZREMRANGEBYSCORE first stored 20 MB uploads past it).
CREATE_DOCUMENT = """
if redis.call('EXISTS', KEYS[4]) == 1 then return 0 end
if tonumber(ARGV[2]) > 0 and redis.call('ZCOUNT', KEYS[3], ARGV[3], '+inf') >= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 6))
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[5], 'PX', ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[4], KEYS[1])
redis.call('PEXPIRE', KEYS[3], ARGV[1])
return 1
"""
# A job whose upload was answered 503 (its creation's call failed, perhaps only late) forgotten: whatever of it a Redis
# that was only slow stored deleted, and a tombstone left for the job's time to live, so that its creation, should
# Redis run it only now, stores nothing. KEYS: the job's hash, its source, its result, its owner's active set, its
# tombstone; ARGV: time to live (ms).
FORGET_DOCUMENT = """
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('ZREM', KEYS[4], KEYS[1])
redis.call('SET', KEYS[5], '1', 'PX', ARGV[1])
return 1
"""
# A document job changed only while it is still queued or translating and, where ARGV[2] names one, still held by
# that server; where ARGV[3] gives a time, only if its lease ended before it (a reader failing the job of a server
# that stopped). KEYS: the job's hash, its source file, its result, its owner's active set; ARGV: time to live
# (ms), holder or '', time or '', '1' to delete the source, '1' to store ARGV[6] as the result, then the hash's
# fields and values. Every key's expiry is then renewed, and the job's place in the active set with its lease (or
# taken out: done, failed). Returns 1, or 0 when refused.
CHANGE_DOCUMENT = """
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'queued' and status ~= 'translating' then return 0 end
if ARGV[2] ~= '' and redis.call('HGET', KEYS[1], 'holder') ~= ARGV[2] then return 0 end
if ARGV[3] ~= '' and tonumber(redis.call('HGET', KEYS[1], 'lease_until')) >= tonumber(ARGV[3]) then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 7))
if ARGV[4] == '1' then redis.call('DEL', KEYS[2]) end
if ARGV[5] == '1' then redis.call('SET', KEYS[3], ARGV[6]) end
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ARGV[1]) end
status = redis.call('HGET', KEYS[1], 'status')
if status == 'queued' or status == 'translating' then
  redis.call('ZADD', KEYS[4], redis.call('HGET', KEYS[1], 'lease_until'), KEYS[1])
  redis.call('PEXPIRE', KEYS[4], ARGV[1])
else
  redis.call('ZREM', KEYS[4], KEYS[1])
end
return 1
"""
# A done job's result handed over once: the job marked downloaded and the result deleted in the same step, so two
# replicas asked at once cannot both send it. KEYS as above (the active set unused: a done job is out of it).
# Returns {status} or, for a done job, {'done', result}.
TAKE_DOCUMENT = """
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'done' then return {status or ''} end
local result = redis.call('GET', KEYS[3])
redis.call('HSET', KEYS[1], 'status', 'downloaded')
redis.call('DEL', KEYS[3])
return {'done', result}
"""
# The bandwidth a document's bytes are given to reach Redis or come back from it, on top of the store's timeout:
# a 20 MB file (--max-file-bytes) gets 2 s more. Low on purpose: a Redis in another zone, or one link shared with
# a burst of uploads, moves far less than a LAN's 100 MB/s, and a transfer cut short loses an upload or a finished
# result, while a timeout too long only makes a dead Redis's 503 come later for a large file.
TRANSFER_BYTES_PER_S = 10_000_000


def transfer_timeout_s(base_s: float, size: int) -> float:
    """How long a call moving `size` bytes of a document may take: the store's timeout, plus the bytes at
    TRANSFER_BYTES_PER_S."""
    return base_s + size / TRANSFER_BYTES_PER_S


class RedisDocuments:
    """Document jobs in one Redis: a hash per job and its files as plain values, under the keys document_jobs.py
    names (one Redis Cluster slot: the owner's hash tag). Bytes in and out, unlike RedisGlossaries' text: a file is
    not text; the hashes' values are decoded here. A connection per process, opened on its first use, with no
    socket timeout of its own: each call is bounded by `timeout_s`, or by transfer_timeout_s for one that moves a
    document (a socket timeout would cut a large file's transfer at the small calls' bound)."""

    def __init__(self, url: str, timeout_s: float):
        self.url, self.timeout_s = url, timeout_s
        self.client: aioredis.Redis | None = None
        self.scripts: tuple = ()
        self.pid = None

    def connect(self) -> aioredis.Redis:
        if self.client is None or self.pid != os.getpid():
            self.client = aioredis.Redis.from_url(self.url, socket_timeout=None,
                                                  socket_connect_timeout=self.timeout_s)
            self.scripts = tuple(self.client.register_script(s) for s in (CHANGE_DOCUMENT, TAKE_DOCUMENT,
                                                                           CREATE_DOCUMENT, FORGET_DOCUMENT))
            self.pid = os.getpid()
        return self.client

    async def answer(self, call, size: int = 0):
        """`call(client)`'s answer, or StoreDown within the timeout for `size` bytes moved, whatever Redis does."""
        client = self.connect()
        try:
            async with asyncio.timeout(transfer_timeout_s(self.timeout_s, size)):
                return await call(client)
        except (RedisError, OSError, TimeoutError) as e:
            raise StoreDown(e) from None

    async def create(self, keys: list[str], fields: dict[str, str], blob: bytes, ttl_ms: int, cap: int,
                     now: float) -> bool:
        """CREATE_DOCUMENT's step on the keys (hash, source, the owner's active set, the tombstone); whether it was
        taken."""
        args = [ttl_ms, cap, repr(now), fields["lease_until"], blob, *(x for item in fields.items() for x in item)]
        return bool(await self.answer(lambda c: self.scripts[2](keys=keys, args=args), len(blob)))

    async def forget(self, keys: list[str], ttl_ms: int) -> None:
        """FORGET_DOCUMENT's step on the keys (hash, source, result, the owner's active set, the tombstone)."""
        await self.answer(lambda c: self.scripts[3](keys=keys, args=[ttl_ms]))

    async def fields(self, key: str) -> dict[str, str] | None:
        row = await self.answer(lambda c: c.hgetall(key))
        return {k.decode(): v.decode() for k, v in row.items()} if row else None

    async def blob(self, key: str) -> bytes | None:
        size = await self.answer(lambda c: c.strlen(key))     # first: how long the file's transfer may take
        return await self.answer(lambda c: c.get(key), size)

    async def change(self, keys: list[str], ttl_ms: int, holder: str, before: str, drop_blob: bool,
                     result: bytes | None, fields: dict[str, str]) -> bool:
        """CHANGE_DOCUMENT's step on the keys (hash, source, result, the owner's active set); whether it was
        taken."""
        args = [ttl_ms, holder, before, int(drop_blob), int(result is not None), result or b"",
                *(x for item in fields.items() for x in item)]
        return bool(await self.answer(lambda c: self.scripts[0](keys=keys, args=args), len(result or b"")))

    async def take(self, keys: list[str]) -> tuple[str, bytes | None]:
        """TAKE_DOCUMENT's step: (the job's status, its result once when done; "" for a job that is gone)."""
        size = await self.answer(lambda c: c.strlen(keys[2]))
        out = await self.answer(lambda c: self.scripts[1](keys=keys), size)
        return out[0].decode(), (out[1] if len(out) > 1 else None)


class RedisCache:
    """The translation cache's answers in one Redis (translation_cache.py names the keys and makes a failure a miss):
    plain values with an expiry, each key on its own (a Redis Cluster may hold them in any slot), read and written in
    one round trip each. A connection per process, opened on its first use."""

    def __init__(self, url: str, timeout_s: float):
        self.url, self.timeout_s = url, timeout_s
        self.client: aioredis.Redis | None = None
        self.pid = None

    async def answer(self, call):
        """`call(client)`'s answer, or StoreDown within the timeout, whatever Redis does."""
        if self.client is None or self.pid != os.getpid():
            self.client = aioredis.Redis.from_url(self.url, socket_timeout=self.timeout_s,
                                                  socket_connect_timeout=self.timeout_s)
            self.pid = os.getpid()
        try:
            async with asyncio.timeout(self.timeout_s):
                return await call(self.client)
        except (RedisError, OSError, TimeoutError) as e:
            raise StoreDown(e) from None

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        async def read(client):
            async with client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.get(key)
                return await pipe.execute()

        return await self.answer(read) if keys else []

    async def set_many(self, values: dict[str, bytes], ttl_ms: int) -> None:
        async def write(client):
            async with client.pipeline(transaction=False) as pipe:
                for key, value in values.items():
                    pipe.set(key, value, px=ttl_ms)
                return await pipe.execute()

        if values:
            await self.answer(write)

    async def ping(self) -> None:
        """Whether Redis answers (StoreDown if not): the cache's probe at the end of a back-off."""
        await self.answer(lambda c: c.ping())
