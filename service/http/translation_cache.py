"""The translation cache (--cache-size): a worker's answers kept per sentence, so that a sentence asked again (a
document's repeated paragraphs, a catalog's recurring labels, a page many users open, a client's retry) is answered
without the queue or a worker.

What is kept: the worker's answer to one unit as a text (its item: text, score, alternatives, tokens, glossary
report). A text's units are its sentences, split here by shared/text.py's `split_sentences`, the function the worker
splits with; a sentence is sent to the worker as a text of its own, which the worker splits into itself again. Each
sentence is searched alone in the worker (its kept spans, glossary matches and terms are its own, and a search's
answer does not depend on its batch-mates: tests/test_batch_invariance.py), so a text's item joined here from its
sentences' items (`joined`, the worker's own arithmetic: translate_api._encode) is the one the worker would answer
for the text whole. A text one of whose sentences would split differently on its own (never seen; checked for every
sentence) is a unit whole.

The key: a hash of everything the worker reads of the request but the texts (translate_payload's fields: the pair,
the SearchOptions as mapped once in the Gateway (beam size, length penalty, n-best, max length, sampling and its
seed, ...), the glossary's entries, a stored glossary's too), the checksum of the model.json of the version that will
serve it (Gateway.route_for's Route, a canary's too: another version never reads this one's answers), this server's
version (the code that keeps spans and joins sentences), the name of the key that asks (never the key itself) and the
unit's text. Each key has entries of its own: shared, a hit (answered in a millisecond, with zero queue and inference
times) told any key whether another had sent a sentence lately, a word of it guessed at a time (helper-36 found
"vierzig" among four numbers in another key's sentence); a server without keys has one caller, so one cache.
Sampling without a seed is never cached (each run is meant to differ); with one it is (each sentence samples from its
own generator seeded by it: shared/search.py).

Where: each HTTP process's memory, least recently used first out, bounded by entries (--cache-size) and bytes
(--cache-bytes); with --redis-url also in Redis, with an expiry (--cache-ttl-s), so that replicas share it. Redis
is asked for what memory lacks, within --redis-timeout-ms; a Redis that fails or is slow makes misses, never an
error, and after a failure it is not asked at all for a back-off (RedisTier), so that a Redis down costs one
request its timeout, not every request; answers are written to Redis off the request's path. A value under our
key that is not an answer is a miss (and is overwritten by the answer computed). `--cache-size 0` (the default)
turns both off. Nothing here logs or labels a text, a key or a term: the keys are hashes; Redis holds the answers
(translations, and the glossary terms a report names) under them.

One version per answer: the kept sentences are the routed version's (its checksum is in their keys); should
another version answer what was sent (the routed one unloaded by a swap in between), the Gateway sends the whole
request again (`Lookup.mixed`, `Lookup.whole`), so that every sentence of an answer comes from the version it
names.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from .. import __version__
from .redis_bridge import RedisCache, StoreDown, where
from ..config import Settings
from ..metrics import labelled, metrics
from ..shared.options import SearchOptions
from ..shared.schemas import TranslationItem
from ..shared.text import join_sentences, split_sentences
from ..tracing import child_span

log = logging.getLogger("transerve")

# Bumped when what a kept answer holds changes shape, so a Redis shared with older servers is not read.
CACHE_FORMAT = 1
REDIS_PREFIX = "transerve:translation:"
# What an entry costs the process beyond its value's bytes: its 64-character key as a str (113 bytes), the value's
# bytes object (33) and the ordered dict's slot and link: 237 bytes measured with tracemalloc over 100,000 entries
# of 135-byte answers (372 bytes each in all).
ENTRY_OVERHEAD = 250
# After a Redis failure the cache asks Redis nothing for BACKOFF_S, then one probe (a PING, in the background)
# decides: a failed probe doubles the back-off, up to BACKOFF_MOST_S. Requests meanwhile neither wait the timeout
# nor pile connections on a Redis that does not answer; a Redis back is used again within the back-off.
BACKOFF_S, BACKOFF_MOST_S = 1.0, 30.0
# Answers waiting to be written to Redis, per HTTP process: one task writes them in order, so a slow Redis holds
# one connection, not one per request; beyond this many they are dropped (Redis only misses them later).
WRITES_QUEUED = 256


def _plain(value):
    """JSON for what a payload holds beside JSON's own types: SearchOptions (every field, so a new option is in the
    key without a change here); anything else by its repr (a key that never matches is only a miss)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return repr(value)


def request_key(fields: dict, package: str, caller: str) -> str | None:
    """The hash of what decides a request's answers but its texts, and of who asks (`caller`: the key's name), or None
    when they are not to be cached (sampling without a seed)."""
    options = fields.get("options")
    if isinstance(options, SearchOptions) and options.strategy == "sampling" and options.seed is None:
        return None
    what = {k: v for k, v in fields.items() if k != "texts"}
    blob = json.dumps([CACHE_FORMAT, __version__, package, caller, what], default=_plain, sort_keys=True,
                      ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def units(text: str) -> tuple[list[str], list[str] | None]:
    """A text's cache units and their separators: its sentences, or the text itself (separators None) when one of
    them would not come back from split_sentences as itself (the worker splits what it is sent)."""
    sentences, separators = split_sentences(text)
    if all(split_sentences(s) == ([s], []) for s in sentences):
        return sentences, separators
    return [text], None


def joined(items: list[dict], separators: list[str] | None) -> dict:
    """A text's item from its sentences' items, as translate_api._encode makes it from the sentences' hypotheses: the
    texts joined, the scores' mean, each alternative joined and averaged, tokens summed, glossary reports merged (an
    entry held where it held in every sentence that has it, in the order first found)."""
    if separators is None:
        return dict(items[0])
    alternatives = [[alternative(i, a) for i in items] for a in range(max(len(i["alternatives"]) for i in items))]
    out = {"text": join_sentences([i["text"] for i in items], separators),
           "score": float(np.mean([i["score"] for i in items])),
           "alternatives": [{"text": join_sentences([x["text"] for x in alt], separators),
                             "score": float(np.mean([x["score"] for x in alt]))} for alt in alternatives],
           "input_tokens": sum(i["input_tokens"] for i in items),
           "output_tokens": sum(i["output_tokens"] for i in items)}
    if "glossary" in items[0]:
        report: dict[str, dict] = {}
        for item in items:
            for entry in item.get("glossary") or ():
                before = report.get(entry["source"])
                report[entry["source"]] = entry | {"held": entry["held"] and (before is None or before["held"])}
        out["glossary"] = list(report.values())
    return out


def alternative(item: dict, a: int) -> dict:
    """A sentence's a-th alternative, or its best where it has fewer (as the worker joins a split text's)."""
    return item["alternatives"][a] if a < len(item["alternatives"]) else item


def parsed(value: bytes) -> dict | None:
    """A kept answer, or None for a value that is not one (a Redis key of ours written by something else, or an
    answer's keys with other types): a miss, never a 500, and never kept in this process's memory. Checked as the
    response checks an answer (TranslationItem, strictly: no "1.5" for a score); a glossary report, when there is
    one, is a list (the worker writes none otherwise)."""
    try:
        item = json.loads(value)
        TranslationItem.model_validate(item, strict=True)
    except ValueError:                       # not JSON, or not an answer (pydantic's ValidationError is a ValueError)
        return None
    return item if item.get("glossary", []) is not None else None


@dataclass
class Lookup:
    """One request as the cache sees it: each text's unit keys and separators, the answers found, and what the
    worker is sent (each missing unit once). Passed through (`keys` None): the texts go as they are and the
    worker's answer is the answer."""
    fields: dict
    served: object = None                                    # model_control.Route: name, version, checksum
    keys: list[tuple[list[str], list[str] | None]] | None = None
    found: dict[str, dict] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)     # key -> the unit's text, in order

    def sent(self) -> list[str]:
        return self.fields["texts"] if self.keys is None else list(self.missing.values())

    def mixed(self, out: dict) -> bool:
        """Whether the worker's answer `out` comes from another version than the kept sentences (the routed one,
        unloaded in between by a swap): joined, the answer would name one version and hold another's sentences."""
        return bool(self.keys is not None and self.found
                    and out.get("model_version") != getattr(self.served, "version", None))

    def whole(self) -> Lookup:
        """The request passed through: its texts sent whole, the answer the worker's alone, nothing kept."""
        return Lookup(self.fields)

    def answer(self, out: dict | None) -> dict:
        """The request's answer: the worker's (`out`, None when nothing was sent) with each text's item made from
        its units' items, found or computed. Timings are the worker's, or 0 when no worker ran."""
        if self.keys is None:
            return out
        items = self.found | dict(zip(self.missing, out["translations"] if out else []))
        base = out or {"model": self.served.name, "model_version": getattr(self.served, "version", None),
                       "source_lang": self.fields["source_lang"], "target_lang": self.fields["target_lang"],
                       "timings": {"queue_ms": 0.0, "inference_ms": 0.0}}
        return base | {"translations": [joined([items[k] for k in keys], seps) for keys, seps in self.keys]}


class MemoryCache:
    """Values by key, least recently used out first, within `entries` and `most_bytes` (ENTRY_OVERHEAD each
    beside the value)."""

    def __init__(self, entries: int, most_bytes: int):
        self.entries, self.most_bytes = entries, most_bytes
        self.kept: OrderedDict[str, bytes] = OrderedDict()
        self.bytes = 0

    def get(self, key: str) -> bytes | None:
        value = self.kept.get(key)
        if value is not None:
            self.kept.move_to_end(key)
        return value

    def put(self, key: str, value: bytes) -> int:
        """Keeps `value` (one larger than the whole bound is not kept); how many entries went to make room."""
        size = len(value) + ENTRY_OVERHEAD
        if size > self.most_bytes:
            return 0
        old = self.kept.pop(key, None)
        self.bytes += size - (0 if old is None else len(old) + ENTRY_OVERHEAD)
        self.kept[key] = value
        evicted = 0
        while len(self.kept) > self.entries or self.bytes > self.most_bytes:
            _, gone = self.kept.popitem(last=False)
            self.bytes -= len(gone) + ENTRY_OVERHEAD
            evicted += 1
        return evicted


class RedisTier:
    """The cache's Redis (redis_bridge.RedisCache) as requests see it: a read within --redis-timeout-ms while it
    answers; after a failure none at all for a back-off (BACKOFF_S, doubled by each failed probe up to
    BACKOFF_MOST_S) that one probe in the background ends; writes queued (WRITES_QUEUED at most) and made by a
    task of their own, never on a request's path. A failure is logged once, until Redis answers again."""

    def __init__(self, url: str, timeout_s: float, ttl_ms: int):
        self.redis, self.at, self.ttl_ms = RedisCache(url, timeout_s), where(url), ttl_ms
        self.backoff_s = 0.0          # 0: up; else the back-off now, since the last failure
        self.until = 0.0              # time.monotonic() the back-off ends
        self.probing = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.writes: asyncio.Queue | None = None
        self.tasks: set[asyncio.Task] = set()   # the writer and a probe, held: a task only weakly held may vanish

    @property
    def down(self) -> bool:
        return self.backoff_s > 0

    def usable(self) -> bool:
        """Whether to ask Redis now: not while backed off (a skip, counted); once the back-off ends, a probe starts
        and Redis is asked again when it answers."""
        if not self.down:
            return True
        if time.monotonic() >= self.until and not self.probing:
            self.probing = True
            self.start(self.probe())
        return False

    async def read(self, keys: list[str]) -> dict[str, bytes]:
        """The values Redis holds of `keys` (none when it fails or is backed off)."""
        if not self.usable():
            labelled(metrics().translation_cache_redis_skipped, "backoff").inc()
            return {}
        try:
            values = await self.redis.get_many([REDIS_PREFIX + k for k in keys])
        except StoreDown as e:
            self.failed(e)
            return {}
        self.answered()
        return {k: v for k, v in zip(keys, values) if v is not None}

    def write(self, values: dict[str, bytes]) -> None:
        """`values` queued for Redis, or dropped (counted) while it is backed off or the queue is full."""
        if not values:
            return
        if self.down:
            labelled(metrics().translation_cache_redis_skipped, "backoff").inc()
            return
        loop = asyncio.get_running_loop()
        if self.loop is not loop:                 # the queue and its writer live on the loop that fills them
            self.loop, self.writes = loop, asyncio.Queue(WRITES_QUEUED)
            self.start(self.writer(self.writes))
        try:
            self.writes.put_nowait(values)
        except asyncio.QueueFull:
            labelled(metrics().translation_cache_redis_skipped, "queue_full").inc()

    async def writer(self, queue: asyncio.Queue) -> None:
        while True:
            values = await queue.get()
            if self.down:                          # queued before the failure: Redis is not asked meanwhile
                labelled(metrics().translation_cache_redis_skipped, "backoff").inc()
                continue
            try:
                await self.redis.set_many({REDIS_PREFIX + k: v for k, v in values.items()}, self.ttl_ms)
            except StoreDown as e:
                self.failed(e)
            else:
                self.answered()

    async def probe(self) -> None:
        try:
            await self.redis.ping()
        except StoreDown as e:
            self.failed(e, probe=True)
        else:
            self.answered()
        finally:
            self.probing = False

    def start(self, work) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def failed(self, e: StoreDown, probe: bool = False) -> None:
        """A failure starts the back-off, a failed probe doubles it; another request's failure while backed off (it
        asked before the first failed) only restarts it."""
        metrics().translation_cache_store_errors.inc()
        if not self.down:
            log.warning("Redis at %s does not answer the translation cache (%s): its answers are misses, and it is "
                        "asked again in %.0f s and then less often until it answers", self.at, e, BACKOFF_S)
            self.backoff_s = BACKOFF_S
        elif probe:
            self.backoff_s = min(BACKOFF_MOST_S, self.backoff_s * 2)
        self.until = time.monotonic() + self.backoff_s

    def answered(self) -> None:
        if self.down:
            self.backoff_s = 0.0
            log.info("Redis at %s answers the translation cache again", self.at)


class TranslationCache:
    """The Gateway's translation cache: `lookup` before a request goes to the workers, `store` after."""

    def __init__(self, settings: Settings):
        self.on = settings.cache_size > 0
        self.memory = MemoryCache(settings.cache_size, settings.cache_bytes)
        self.redis = RedisTier(settings.redis_url, settings.redis_timeout_ms / 1000,
                               max(1, int(settings.cache_ttl_s * 1000))) if self.on and settings.redis_url else None
        m = metrics()
        for tier in ("memory", "redis"):   # series at 0 from the start: a dashboard's rate() has them
            labelled(m.translation_cache_hits, tier)
        for reason in ("backoff", "queue_full"):
            labelled(m.translation_cache_redis_skipped, reason)

    async def lookup(self, fields: dict, served, caller: str) -> Lookup:
        """What of a request (translate_payload's `fields`) is kept for the version that will serve it (`served`:
        Gateway.route_for's Route, its name, version and package checksum; None: not cached) and the key that asks
        (`caller`, its name)."""
        key = request_key(fields, served.checksum, caller) if self.on and served is not None else None
        if key is None:
            return Lookup(fields)
        out = Lookup(fields, served, [])
        wanted: dict[str, str] = {}
        for text in fields["texts"]:
            pieces, seps = units(text)
            keys = [hashlib.sha256(f"{key}\n{p}".encode("utf-8", "surrogatepass")).hexdigest() for p in pieces]
            out.keys.append((keys, seps))
            wanted.update(zip(keys, pieces))
        with child_span("transerve.cache") as span:   # a request's lookup in its trace: counts only
            # Memory holds only what parsed (answers computed here, or read from Redis and checked)
            out.found = {k: parsed(v) for k in wanted if (v := self.memory.get(k)) is not None}
            labelled(metrics().translation_cache_hits, "memory").inc(len(out.found))
            if self.redis is not None and len(out.found) < len(wanted):
                out.found |= await self.from_redis([k for k in wanted if k not in out.found])
            out.missing = {k: p for k, p in wanted.items() if k not in out.found}
            span.set(hits=len(out.found), misses=len(out.missing))
        metrics().translation_cache_misses.inc(len(out.missing))
        return out

    async def from_redis(self, keys: list[str]) -> dict[str, dict]:
        """The answers Redis holds of `keys`, kept in memory too. A value that is not an answer is a miss only
        (not a hit as well): the answer computed for it is written over it."""
        found = {}
        for k, v in (await self.redis.read(keys)).items():
            if (item := parsed(v)) is not None:
                found[k] = item
                self.keep(k, v)
        labelled(metrics().translation_cache_hits, "redis").inc(len(found))
        return found

    def store(self, lookup: Lookup, out: dict) -> None:
        """The worker's answers to what `lookup` sent it, kept in memory and queued for Redis; not when another
        version than the one it was routed to answered (a worker that had unloaded it): its key names the routed
        one."""
        if lookup.keys is None or out.get("model_version") not in (None, getattr(lookup.served, "version", None)):
            return
        values = {k: json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
                  for k, item in zip(lookup.missing, out["translations"])}
        for k, v in values.items():
            self.keep(k, v)
        if self.redis is not None:
            self.redis.write(values)

    def keep(self, key: str, value: bytes) -> None:
        m = metrics()
        m.translation_cache_evictions.inc(self.memory.put(key, value))
        m.translation_cache_bytes.set(self.memory.bytes)
        m.translation_cache_entries.set(len(self.memory.kept))
