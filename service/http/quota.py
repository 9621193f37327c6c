"""Each key's limits (keyfile.Limits) counted and enforced: requests per minute as a request arrives (the
middleware, before its body is read), characters and tokens before its work is queued (the Gateway). Over a
limit: 429 with Retry-After and the IETF RateLimit and RateLimit-Policy fields (draft-ietf-httpapi-ratelimit-
headers), which each flavour answers in its own shape.

The algorithm: a fixed window per counter that starts at the key's first request in it (a counter created with
its window's expiry). Why: each limit reads "at most N per minute (day)", and within a window it is exact: a
key limited to 1,000 characters a minute gets at most 1,000 in its minute, however many replicas it is spread
over. One atomic step in Redis, O(1) memory per key and limit, and the Retry-After is exact (the window's end).
A sliding log is exact over any 60 s too, but keeps one entry per request (a day's limit: hundreds of
thousands); a sliding-window estimate and GCRA both let more than N through in a key's first minute (GCRA's
burst plus its rate), which is what a limit's reader would call a broken limit. The price of the fixed window:
at a window's end a key may send up to N more at once, so up to 2N within a short span across two windows.

Where the counts live: with --redis-url in Redis, shared by every process of every replica (redis_bridge.py);
without it in this process's memory, so each replica, and each of its --api-servers, counts on its own.
When Redis cannot answer within --redis-timeout-ms, --redis-down decides: admit (limits off) or refuse (429
`limits_unavailable` with Retry-After: 1, which clients retry as any 429; not a 5xx, which would read as the
service failing and page as its error ratio), counted in transerve_ratelimit_store_errors_total; never a 500.
Redis is then left alone for a second (a request must not wait on a Redis that is down), and limits resume
with its first answer.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from .redis_bridge import RedisCounters, StoreDown, where
from ..config import Settings
from ..errors import ApiError
from ..keyfile import Tenant
from ..metrics import metrics

log = logging.getLogger("transerve")

# Each limit's window (seconds) and its name in the RateLimit fields.
WINDOWS = {"requests_per_minute": 60, "characters_per_minute": 60, "characters_per_day": 86_400,
           "tokens_per_day": 86_400}
POLICY = {"requests_per_minute": "requests-minute", "characters_per_minute": "characters-minute",
          "characters_per_day": "characters-day", "tokens_per_day": "tokens-day"}
PAUSE_S = 1.0           # after Redis failed: how long requests are decided without asking it


@dataclass(frozen=True)
class Charge:
    """One counter a request moves: which limit, its value, and this request's cost (0: only checked that
    the key is not at its limit already; -1 as the limit: counted, never refused)."""
    limit_name: str
    limit: int
    cost: int

    def counter(self, tenant: Tenant) -> str:
        return f"transerve:{{{tenant.name}}}:{self.limit_name}"   # {name}: one Redis Cluster slot per key


@dataclass(frozen=True)
class Count:
    """A counter as a check left it: used in its window, and seconds until the window ends."""
    used: int
    reset_s: float


class MemoryCounters:
    """The script of redis_bridge.TAKE over a dict, for one process without Redis (nothing awaits between
    the check and the charge, so a process's requests are counted one at a time)."""

    def __init__(self):
        self.counters: dict[str, list[float]] = {}   # counter -> [used, when its window ends (monotonic)]

    async def take(self, keys: list[str], args: list[int]) -> list[int]:
        now = time.monotonic()
        rows = []
        for i, key in enumerate(keys):
            cost, limit, window_ms = args[3 * i: 3 * i + 3]
            used, ends = self.counters.get(key, [0, 0.0])
            if ends <= now:
                used, ends = 0, now + window_ms / 1000
            rows.append((key, cost, limit, used, ends))
        refused = next((i + 1 for i, (_, cost, limit, used, _) in enumerate(rows) if limit >= 0 and (
            used + cost > limit or (cost == 0 and used >= limit))), 0)
        out = [refused]
        for key, cost, _, used, ends in rows:
            if not refused and cost > 0:
                used += cost
                self.counters[key] = [used, ends]
            out += [int(used), int((ends - now) * 1000)]
        return out


class Quota:
    """Every key's counters, in Redis or in memory, and the 429s and RateLimit fields they give."""

    def __init__(self, settings: Settings):
        self.redis_at = where(settings.redis_url) if settings.redis_url else ""
        self.store = RedisCounters(settings.redis_url, settings.redis_timeout_ms / 1000) if settings.redis_url \
            else MemoryCounters()
        self.refuse_when_down = settings.redis_down == "refuse"
        self.paused_until = 0.0      # Redis failed: decided without it until then (monotonic)
        self.down_since: float | None = None

    async def take(self, tenant: Tenant, charges: list[Charge]) -> dict[str, str]:
        """Checks and charges `charges` at once: the RateLimit fields to send, or a 429 when one is over its
        limit (nothing charged then), or what --redis-down says while Redis cannot answer."""
        if not charges:
            return {}
        for c in charges:
            if c.limit >= 0 and c.cost > c.limit:   # would never fit: no Retry-After could be true
                raise ApiError(413, "over_key_limit", f"this request costs {c.cost} against the key's "
                               f"{c.limit_name} of {c.limit}: send less at once", c.limit)
        answer = await self.counted(tenant, charges)
        if answer is None:
            return {}
        refused, counts = answer[0], [Count(answer[i], answer[i + 1] / 1000) for i in range(1, len(answer), 2)]
        headers = fields(charges, counts)
        if refused:
            c, count = charges[refused - 1], counts[refused - 1]
            retry = max(1, math.ceil(count.reset_s))
            metrics().key_rate_limited.labels(tenant.name, c.limit_name).inc()
            raise ApiError(429, "rate_limited", f"the key {tenant.name!r} is at its {c.limit_name} of {c.limit} "
                           f"(used {count.used}); retry in {retry} s", c.limit,
                           headers | {"Retry-After": str(retry), "retry-after-ms": str(retry * 1000)})
        return headers

    async def counted(self, tenant: Tenant, charges: list[Charge]) -> list[int] | None:
        """The store's answer; None when Redis cannot give one and --redis-down admits."""
        keys = [c.counter(tenant) for c in charges]
        args = [x for c in charges for x in (c.cost, c.limit, WINDOWS[c.limit_name] * 1000)]
        if time.monotonic() >= self.paused_until:
            try:
                answer = await self.store.take(keys, args)
                if self.down_since is not None:
                    log.info("Redis at %s answers again after %.0f s: limits are counted again", self.redis_at,
                             time.monotonic() - self.down_since)
                    self.down_since = None
                return answer
            except StoreDown as e:
                self.paused_until = time.monotonic() + PAUSE_S
                if self.down_since is None:
                    self.down_since = time.monotonic()
                    log.warning("Redis at %s does not answer (%s): %s", self.redis_at, e,
                                "requests are refused with 429 (--redis-down refuse)" if self.refuse_when_down else
                                "requests are admitted without limits until it is back (--redis-down admit)")
        outcome = "refused" if self.refuse_when_down else "admitted"
        metrics().ratelimit_store_errors.labels(outcome).inc()
        if self.refuse_when_down:
            raise ApiError(429, "limits_unavailable", "the key's limits cannot be checked now (their store does "
                           "not answer); retry shortly", headers={"Retry-After": "1", "retry-after-ms": "1000"})
        return None

    async def usage(self, tenant: Tenant) -> dict:
        """The key's own usage, for GET /usage: each limit with what is used and left, and when its window ends."""
        limits = tenant.limits.given()
        charges = [Charge(name, -1, 0) for name in limits]
        answer = await self.counted(tenant, charges) if charges else []
        out = {}
        for i, (name, limit) in enumerate(limits.items()):
            used, reset_ms = (answer[1 + 2 * i], answer[2 + 2 * i]) if answer else (None, None)
            out[name] = {"limit": limit, "used": used, "remaining": None if used is None else max(0, limit - used),
                         "reset_s": None if reset_ms is None else math.ceil(reset_ms / 1000)}
        return out


def fields(charges: list[Charge], counts: list[Count]) -> dict[str, str]:
    """RateLimit-Policy (each limit: its quota q and window w) and RateLimit (what remains, r, and when the
    window ends, t), as draft-ietf-httpapi-ratelimit-headers writes them (structured-field lists)."""
    shown = [(c, n) for c, n in zip(charges, counts) if c.limit >= 0]
    if not shown:
        return {}
    policy = ", ".join(f'"{POLICY[c.limit_name]}";q={c.limit};w={WINDOWS[c.limit_name]}' for c, _ in shown)
    now = ", ".join(f'"{POLICY[c.limit_name]}";r={max(0, c.limit - n.used)};t={max(0, math.ceil(n.reset_s))}'
                    for c, n in shown)
    return {"RateLimit-Policy": policy, "RateLimit": now}


def charges(tenant: Tenant, *, requests: int = 0, characters: int = 0, tokens: int | None = None) -> list[Charge]:
    """The counters a request moves under its key's limits: one request, `characters` of translation text,
    or (tokens=0) a check that its generation tokens are not used up; `tokens` > 0 counts them after the fact."""
    given = tenant.limits.given()
    wanted = {"requests_per_minute": requests, "characters_per_minute": characters,
              "characters_per_day": characters}
    out = [Charge(name, given[name], cost) for name, cost in wanted.items() if cost and name in given]
    if tokens is not None and "tokens_per_day" in given:
        out.append(Charge("tokens_per_day", given["tokens_per_day"] if tokens == 0 else -1, tokens))
    return out
