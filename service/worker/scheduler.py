"""The worker's scheduler: which requests' rows the engine decodes at each step, for translation
(`TranslationScheduler`) and for generation (`GenerationScheduler`). No LitServe here: the worker loop
(litserve_bridge.SchedulerLoop) feeds a scheduler the requests it takes off the queue and runs it one
step at a time; the LitAPIs (translate_api, generate_api) turn a request into a job (validation,
tokenizing) and a job into its answer. Both schedulers are driven alike:

    admit({key: job})     requests join, also while others are under way (key: the caller's name for each)
    busy                  whether there is work left: call step()
    wants_new_requests()  whether a request arriving now would start before the work under way ends (the
                          loop looks at its queue between steps only then: each look costs a round trip, and
                          a request this worker has no room for is better left to another)
    step()                one decoder step
    take_finished()       translation: the requests that can be answered now, which the scheduler forgets
    take_progress()       generation: every request held, each with whether it is over (the over ones leave)
    abandon()             forget everything (after an unexpected exception, whose requests the loop fails)

Failures: a request that cannot be served is a `Failure` value, never an exception, so its batch-mates are
still served; a translation search or decoder step that raises has its sentences retried one at a time, a
generation step that raises fails the requests whose rows were in it only.

Translation: each model's running batch decodes the rows of every sentence that has joined in one decoder
call a step (service/inference/decoders.py's RunningBatch): a request's sentences join at the next step when
their cache fits the budget (--max-batch-tokens, `sentence_cost`), else they wait their turn, which is their
request's arrival, each cost tier above 0 counted TIER_WAIT_S later (a one-word request goes ahead of a large
one's waiting sentences; the large one's running rows go on meanwhile); a sentence leaves at the step its
search ends, a request whose client went away at once. A sentence's answer does not depend on its batch-mates
or on when it joined (tests/test_batch_invariance.py).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Hashable

import numpy as np

from .cancel import CancelBoard
from .watch import SchedulerWatch
from ..inference.decoders import columns_for
from ..inference.running_batch import Member, RunningBatch, Ticket, pooled
from ..inference.engine import Engine
from ..shared.options import SearchOptions
from ..metrics import metrics
from ..shared.search import Hypothesis, max_lengths

log = logging.getLogger("transerve")

# Cost tiers: a request costing up to this (source tokens x beam: any one sentence at the default beam 4)
# is in tier 0, up to twice that in tier 1, and so on.
TIER_COST = 1024
# Sentences wait for room in the running batch in order of their request's arrival, each cost tier above 0
# counted as this much later: a one-word request that arrives while a large one's sentences wait goes ahead
# of them, and a large one still joins before requests that arrive this much later per tier than it. Seconds,
# not steps: what a client waits; 2 s, as a busy 2-core machine's first step of two large requests can take
# over 0.5 s, after which a one-word request that came meanwhile would wait behind them.
TIER_WAIT_S = 2.0
# On CPU a running batch holds at most this many rows (sentences x beams): a decoder step, what a request
# that joins waits for at most, then stays short. 2 cores, beam 16, 64 short sentences: 256 rows a call
# took 13.0 s in all, 180 ms a step; 1024 rows 13.6 s, 700 ms a step (benchmarks/results/fairness.md).
CPU_BATCH_ROWS = 256
GAUGE_S = 0.05      # the running rows, waiting requests and cache gauges are set this often at most


# --- failures: one request's, never its batch-mates' ----------------------------------------------------
@dataclass
class Failure:
    status: int
    type: str
    message: str
    limit: int | None = None

    def to_dict(self) -> dict:
        err = {"type": self.type, "message": self.message}
        if self.limit is not None:
            err["limit"] = self.limit
        return {"error": err, "status": self.status}


def internal_failure() -> Failure:
    """What a request gets when the worker raises on it (its batch-mates are still served)."""
    return Failure(500, "internal_error", "the inference worker failed on this request; the server logged why")


def for_one_request(hook: str, request_id: str, fn, *args):
    """fn(*args) for one request of a batch, or internal_failure() if it raises: raised in the worker loop,
    the exception would fail every request of the batch."""
    try:
        return fn(*args)
    except Exception:
        log.exception("%s failed for request %s", hook, request_id)
        return internal_failure()


# --- translation ------------------------------------------------------------------------------------------
def request_cost(source_tokens: int, beam_size: int) -> int:
    """What --max-request-cost bounds and the scheduler weighs: source tokens x beam size (the rows a
    search decodes, each for about as many steps as its source has tokens)."""
    return source_tokens * max(1, beam_size)


def cost_tier(cost: int) -> int:
    return max(0, math.ceil(math.log2(max(1, cost) / TIER_COST)))


@dataclass
class Job:
    """One translation request, tokenized."""
    request_id: str
    model: str
    source_lang: str
    target_lang: str
    options: SearchOptions
    sentences: list[list[int]]            # source ids of every sentence of every text
    text_spans: list[tuple[int, int]]     # sentences[start:end] belong to text i
    separators: list[list[str]]           # per text: what stood between its sentences
    received: float                       # time.monotonic() when the HTTP process got it
    number: int = 0                       # CancelBoard number (0: never cancelled)
    cost: int = 0                         # request_cost(): its engine batches' tier
    hyps: list[list[Hypothesis] | None] = field(default_factory=list)
    left: int = 0                         # sentences not answered yet
    failure: Failure | None = None
    started: float = 0.0                  # when it was admitted, when its last sentence was done (monotonic)
    finished: float = 0.0


def answerable(job: Job | Failure) -> bool:
    return isinstance(job, Failure) or job.failure is not None or job.left == 0


@dataclass
class Running:
    """Sentences of one request that joined the running batch at one step: one search in its model's batch."""
    key: Hashable
    batch: tuple[str, int]                # its running batch: (model, rows per source)
    sentences: list[int] = field(default_factory=list)   # their indices in the request
    tokens: list[int] = field(default_factory=list)      # what each holds of --max-batch-tokens (sentence_cost)
    rows: list[int] = field(default_factory=list)        # the most rows each holds at once
    member: Member | Ticket | None = None   # their search in the batch (Engine.join)
    t0: float = 0.0                       # when they joined (perf_counter)
    _seen: int = -1                       # the member's live_count that _held was counted from
    _held: tuple[int, int] = (0, 0)

    def held(self) -> tuple[int, int]:
        """(tokens, rows) of its sentences still searched: one that ended has left the batch (its search
        dropped its rows), and its budget with it."""
        if self.member is None or self.member.want is None:
            return 0, 0
        if self._seen != self.member.live_count:          # a sentence ended since
            live = self.member.sentences_left()
            self._seen, self._held = self.member.live_count, (int(np.take(self.tokens, live).sum()),
                                                              int(np.take(self.rows, live).sum()))
        return self._held


class TranslationScheduler:
    """The translation requests a worker holds: each model's sentences decoded in a running batch per beam
    size, one decoder call a step for all its rows whatever their other options (iteration-level batching,
    service/inference/decoders.py's RunningBatch). A request's sentences join at the next step when their
    cache fits the budget (--max-batch-tokens tokens, `sentence_cost`; on CPU at most CPU_BATCH_ROWS rows of a
    model), else they wait their turn (TIER_WAIT_S); a sentence leaves at the step its search ends, a request
    whose client went away at once."""
    endpoint = "translate"                # its metrics' label

    def __init__(self, engines: dict[str, Engine], board: CancelBoard, max_batch_tokens: int):
        self.engines, self.board, self.max_batch_tokens = engines, board, max_batch_tokens
        self.jobs: dict[Hashable, Job | Failure] = {}    # admitted, not taken yet; in the order admitted
        # Sentences waiting for room: (turn, order admitted, job key, sentence index), in the order they join.
        self.waiting: list[tuple[float, int, Hashable, int]] = []
        self.running: list[Running] = []
        # (model, rows per source) -> its running batch: one per beam size, which fixes how many rows read one
        # copy of a source (RunningBatch says why a sentence's answer needs that).
        self.batches: dict[tuple[str, int], RunningBatch] = {}
        self.fresh: set[Hashable] = set()                # keys that may have become answerable
        self._order = 0
        self._seen = -1                  # the board's cancellations at the last look; -1: look at the next step
        self._gauged = 0.0               # when the gauges were last set (monotonic)
        self._gauged_held = (0, 0)       # (searches running, sentences waiting) then
        self.watch = SchedulerWatch(self.endpoint, engines)
        # The searches of the requests that join at one step together (_searches), given their requests' keys
        # (one per sentence), wrapped: the worker loop traces them there (service/worker/traces.py: a span for
        # the group, its encoder run inside, each decoder step an event); by default as they are.
        self.traced: Callable[[Generator, list[Hashable]], Generator] = lambda steps, keys: steps
        self.searches: list[Generator] = []       # those under way, advanced after each step

    @property
    def used(self) -> int:
        """Tokens the running sentences hold (sentence_cost)."""
        return sum(r.held()[0] for r in self.running)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def wants_new_requests(self) -> bool:
        """Whether a request arriving now would join before the work held ends: while nothing waits and the
        running batch has room, or what waits is above tier 0 (a one-word request goes ahead of it). Otherwise
        it is better left on the queue, for a worker with room."""
        if self.waiting:
            return cost_tier(self.jobs[self.waiting[0][2]].cost) > 0
        return self.used < self.max_batch_tokens

    def admit(self, jobs: dict[Hashable, Job | Failure]) -> None:
        """Adds requests, also between two decoder steps: their sentences wait for room (the next step
        admits what fits). A Failure is answerable at once."""
        metrics().batch_requests.labels(self.endpoint).observe(len(jobs))
        self.jobs.update(jobs)
        self.fresh.update(jobs)
        for key, job in jobs.items():
            if isinstance(job, Job):
                job.hyps, job.left = [None] * len(job.sentences), len(job.sentences)
                turn = job.received + cost_tier(job.cost) * TIER_WAIT_S
                for k in range(len(job.sentences)):
                    self._order += 1
                    self.waiting.append((turn, self._order, key, k))
        self.waiting.sort(key=lambda w: w[:2])
        self._seen = -1                  # a request cancelled before it came is seen at the next step
        self._gauges()

    def sentence_cost(self, job: Job, k: int) -> tuple[int, int]:
        """(tokens, rows) sentence k of `job` holds in the running batch at most: its rows (beams) x (its
        source's padded positions + its output budget), the positions of its encoder outputs and its cache."""
        o = job.options
        rows = o.rows_per_input
        n = len(job.sentences[k])
        cap = min(o.max_length, getattr(self.engines.get(job.model), "max_positions", o.max_length))
        out = int(max_lengths([n], a=o.max_length_a, b=o.max_length_b, cap=cap)[0])
        return rows * (columns_for(n) + out), rows

    def step(self) -> None:
        """Requests whose client went away leave; waiting sentences that fit join; then one decoder call per
        model for every running row. take_finished() then says which requests can be answered."""
        self._drop_cancelled()
        self._join_waiting()
        for key, batch in list(self.batches.items()):
            if batch.members:
                self._step_batch(key, batch)
            if not batch.members:          # its blocks go back to the pool, for the next batch
                batch.close()
                del self.batches[key]
        for search in list(self.searches):
            if next(search, self) is self:    # all its requests' searches ended
                self.searches.remove(search)
        self._gauges(force=not self.busy)

    def _join_waiting(self) -> None:
        """The waiting sentences that fit, in turn (the first that does not fit stops the rest: it is not
        overtaken for ever by smaller ones); one that could never fit joins an empty batch alone."""
        if not self.waiting:
            return
        joining: dict[Hashable, Running] = {}
        used, rows = 0, {}
        for r in self.running:
            tokens, n = r.held()
            used, rows[r.batch[0]] = used + tokens, rows.get(r.batch[0], 0) + n
        while self.waiting:
            _, _, key, k = self.waiting[0]
            job = self.jobs[key]
            tokens, r = self.sentence_cost(job, k)
            on_cpu = getattr(self.engines.get(job.model), "device_type", "cpu") == "cpu"
            most = CPU_BATCH_ROWS if on_cpu else math.inf
            if (self.running or joining) and (used + tokens > self.max_batch_tokens
                                              or rows.get(job.model, 0) + r > most):
                break
            self.waiting.pop(0)
            used, rows[job.model] = used + tokens, rows.get(job.model, 0) + r
            run = joining.setdefault(key, Running(key, (job.model, r)))
            run.sentences.append(k)
            run.tokens.append(tokens)
            run.rows.append(r)
        for runs in self._together(list(joining.values())):
            search = self.traced(self._search(runs), [run.key for run in runs for _ in run.sentences])
            if next(search, self) is not self:
                self.searches.append(search)

    def _search(self, runs: list[Running]) -> Generator[None, None, None]:
        """The searches of requests that join at one step together, as one generator for the traces: its first
        step joins them (their encoder run), each next one follows a decoder step; it returns once they all
        ended (or failed to start: their sentences were tried one by one then)."""
        if len(runs) > 1:
            self._join_together(runs)
        else:
            self._join(runs[0])
        while any(run.member is not None and run.member.want is not None for run in runs):
            yield None

    def _together(self, runs: list[Running]) -> list[list[Running]]:
        """The joining runs, those that join one pool (beam searches of one batch and options) together: their
        sentences are encoded in one call; any other alone."""
        groups: dict[Hashable, list[Running]] = {}
        for run in runs:
            options = self.jobs[run.key].options
            groups.setdefault((run.batch, options.batch_key()) if pooled(options) else id(run), []).append(run)
        return list(groups.values())

    def _batch(self, run: Running) -> RunningBatch:
        batch = self.batches.get(run.batch)
        if batch is None:
            batch = self.batches[run.batch] = self.engines[run.batch[0]].running_batch(run.batch[1])
        return batch

    def _join_together(self, runs: list[Running]) -> None:
        jobs = [self.jobs[run.key] for run in runs]
        try:
            tickets = self.engines[jobs[0].model].join_together(
                self._batch(runs[0]), [[job.sentences[k] for k in run.sentences] for job, run in zip(jobs, runs)],
                jobs[0].options)
        except Exception:  # each tries alone (and its sentences one by one if that fails too)
            log.exception("starting the search of %d requests together failed; each starts alone", len(runs))
            for run in runs:
                self._join(run)
            return
        now, t0 = time.monotonic(), time.perf_counter()
        for job, run, ticket in zip(jobs, runs, tickets):
            job.started, run.t0, run.member = job.started or now, t0, ticket
            self.running.append(run)

    def _join(self, run: Running) -> None:
        job = self.jobs[run.key]
        engine = self.engines[job.model]
        if not job.started:
            job.started = time.monotonic()
        batch = self._batch(run)
        run.t0 = time.perf_counter()
        try:
            run.member = engine.join(batch, [job.sentences[k] for k in run.sentences], job.options)
        except Exception:  # its request's sentences are tried one by one; the batch goes on
            log.exception("starting the search of %d sentences failed; retrying one by one", len(run.sentences))
            self._finished(run, self._one_by_one(job, run.sentences))
            return
        self.running.append(run)
        if run.member.want is None:       # it ended before its first step
            self._ended(run)

    def _step_batch(self, key: tuple[str, int], batch: RunningBatch) -> None:
        try:
            batch.step()      # (transerve_step_batch_rows: the engine's graph tells the watch)
        except Exception:  # which row's fault is unknown: the batch's sentences are tried one by one
            log.exception("a decoder step of %d rows failed; their sentences run again one by one", batch.rows)
            batch.close()
            for run in [r for r in self.running if r.batch == key]:
                self.running.remove(run)
                self._finished(run, self._one_by_one(self.jobs[run.key], run.sentences))
            return
        for run in [r for r in self.running if r.member.want is None]:
            self._ended(run)

    def _ended(self, run: Running) -> None:
        """A search that ended: its hypotheses to their request (or, if it raised, its sentences one by one)."""
        self.running.remove(run)
        job, m = self.jobs[run.key], run.member
        if m.error is not None:
            log.error("the search of %d sentences failed; retrying one by one", len(run.sentences), exc_info=m.error)
        results = self._one_by_one(job, run.sentences) if m.error is not None else m.result
        metrics().inference.labels(self.endpoint, job.model).observe(time.perf_counter() - run.t0)
        metrics().batch_sentences.labels(self.endpoint, job.model).observe(len(run.sentences))
        self._finished(run, results)

    def _drop_cancelled(self) -> None:
        """Requests whose client has gone get a 499 no one reads; their sentences leave the waiting list and
        the running batch."""
        seen = self.board.cancellations()
        if seen == self._seen:           # no cancellation since the last look, none unchecked (admit)
            return
        self._seen = seen
        held = [j for j in dict.fromkeys([w[2] for w in self.waiting] + [r.key for r in self.running])
                if self.jobs[j].number and self.jobs[j].failure is None]
        if not held:
            return
        gone = {j for j, g in zip(held, self.board.cancelled(np.array([self.jobs[j].number for j in held]))) if g}
        if not gone:
            return
        for j in gone:
            self.jobs[j].failure = Failure(499, "client_closed_request", "the client went away")
            self.fresh.add(j)
        self.waiting = [w for w in self.waiting if w[2] not in gone]
        for run in [r for r in self.running if r.key in gone]:
            self.batches[run.batch].leave(run.member)
            self.running.remove(run)

    def _one_by_one(self, job: Job, sentences: list[int]) -> list[list[Hypothesis] | None]:
        engine, results = self.engines[job.model], []
        for k in sentences:
            try:
                results.append(engine.search([job.sentences[k]], job.options)[0])
            except Exception:
                log.exception("sentence failed")
                results.append(None)
        return results

    def _finished(self, run: Running, results: list[list[Hypothesis] | None]) -> None:
        """Sentences' hypotheses to their request (None: that sentence failed)."""
        job = self.jobs.get(run.key)
        if not isinstance(job, Job):
            return
        for k, hyps in zip(run.sentences, results):
            if hyps is None and job.failure is None:
                job.failure = Failure(500, "internal_error", "the engine failed on this text")
            job.hyps[k] = hyps
            job.left -= 1
        self.fresh.add(run.key)

    def _gauges(self, force: bool = True) -> None:
        """The scheduler's gauges (service/worker/watch.py): rows running per model, requests with a sentence
        waiting for room: whenever a search joins or leaves or a sentence starts waiting, else at most every
        GAUGE_S (each set writes a shared file, and a beam that ends changes the rows at almost every step)."""
        now, held = time.monotonic(), (len(self.running), len(self.waiting))
        if not force and held == self._gauged_held and now - self._gauged < GAUGE_S:
            return
        self._gauged, self._gauged_held, running = now, held, {}
        for (model, _), batch in self.batches.items():
            running[model] = running.get(model, 0) + batch.rows
        self.watch.update(running, len({w[2] for w in self.waiting}))

    def take_finished(self) -> list[tuple[Hashable, Job | Failure]]:
        """The requests that can be answered now (every sentence done, or failed), in the order they were
        admitted, each once: the scheduler forgets them."""
        if not self.fresh:
            return []
        done = [j for j, job in self.jobs.items() if j in self.fresh and answerable(job)]
        self.fresh.clear()     # the others come back when their next sentence is done
        now = time.monotonic()
        for j in done:
            job = self.jobs[j]
            if isinstance(job, Job):
                job.finished = now
                job.started = job.started or now
        return [(j, self.jobs.pop(j)) for j in done]

    def run(self, jobs: dict[Hashable, Job | Failure]) -> dict[Hashable, Job | Failure]:
        """admit() and step() to the end, for a caller that answers every request at once: each job, done."""
        self.admit(jobs)
        done = dict(self.take_finished())
        while self.busy:
            self.step()
            done.update(self.take_finished())
        return {key: done[key] for key in jobs}

    def abandon(self) -> None:
        """Forgets every request and running batch; the searches under way hand their memory back."""
        for batch in self.batches.values():
            with contextlib.suppress(Exception):   # called while handling an error: do not add one
                batch.close()
        for search in self.searches:
            with contextlib.suppress(Exception):
                search.close()
        self.searches = []
        self.jobs, self.waiting, self.running, self.batches, self.fresh, self._seen = {}, [], [], {}, set(), -1
        self._gauges()


# --- generation -------------------------------------------------------------------------------------------
def generation_cost(prompt_tokens: int, max_new_tokens: int, rows: int) -> int:
    """What --max-request-cost bounds for /generate and what a request holds of the generation worker's budget
    while it runs: the cache positions its rows may fill, (prompt tokens + max_new_tokens) x rows (beams or
    sequences)."""
    return (prompt_tokens + max_new_tokens) * rows


@dataclass
class GenJob:
    """One generation request: its prompt and, as the worker goes, each returned sequence's text."""
    request_id: str
    number: int                           # CancelBoard number
    model: str
    options: SearchOptions
    prompt: list[int]
    n: int                                # sequences returned
    seeds: list[int | None]
    stop: list[str]
    max_new_tokens: int
    received: float
    texts: list[str] = field(default_factory=list)
    emitted: list[int] = field(default_factory=list)     # characters of texts[k] sent (by generate_api)
    tokens: list[int] = field(default_factory=list)
    finish: list[str | None] = field(default_factory=list)
    failure: Failure | None = None
    started: float = 0.0                  # when it joined the running batch (monotonic)
    reported: bool = False                # its last event was made (by generate_api)
    member: Any = None                    # its search in its model's running batch (Engine.join_generation)
    cancel: set[int] = field(default_factory=set)   # its sequences stopped by a stop sequence: they leave
    t0: float = 0.0                       # when it joined (perf_counter)

    @property
    def over(self) -> bool:
        return self.failure is not None or all(f is not None for f in self.finish)

    @property
    def beam(self) -> bool:
        """Beam search: one row a beam, its n best hypotheses at its end (it streams nothing)."""
        return self.options.strategy == "beam"

    @property
    def rows(self) -> int:
        return self.options.beam_size if self.beam else self.n

    @property
    def cost(self) -> int:
        return generation_cost(len(self.prompt) - 1, self.max_new_tokens, self.rows)


def _stop_at(text: str, stops: list[str]) -> int:
    """Where the first stop sequence in `text` begins; -1 if none is there."""
    return min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)


class GenerationScheduler:
    """The generation requests a worker holds: each model's sequences decoded in one running batch, one decoder
    call a step for all its rows (iteration-level batching, service/inference/lm_batch.py). A request joins at
    the next step when its cache fits the budget (`generation_cost` tokens, `budget` in all, and on CPU at most
    CPU_BATCH_ROWS rows), else it waits its turn, first come first served (alone, a request always joins: the
    cost limit is within the budget); its tokens go out as each step ends. A sequence leaves at its eos, its
    length budget or a stop sequence, a request at once when its client goes away."""
    endpoint = "generate"                 # its metrics' label

    def __init__(self, engines: dict[str, Engine], board: CancelBoard, budget: int | None = None):
        self.engines, self.board, self.budget = engines, board, budget
        self.jobs: dict[Hashable, GenJob | Failure] = {}   # admitted, not over yet; in the order admitted
        self.waiting: list[Hashable] = []                  # admitted, not joined: in the order they join
        self.running: dict[Hashable, GenJob] = {}          # joined a running batch
        self.batches: dict[str, Any] = {}                  # model -> its running batch (Engine.generation_batch)
        self.used = 0                                      # tokens the running requests hold (generation_cost)
        self.watch = SchedulerWatch(self.endpoint, engines)
        self._seen = -1              # the board's cancellations at the last look; -1: look at the next step

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def wants_new_requests(self) -> bool:
        """Whether a request arriving now would join at the next step: nothing waits and the budget has room.
        Otherwise it is better left on the queue, for a worker with room."""
        return not self.waiting and (self.budget is None or self.used < self.budget)

    def admit(self, jobs: dict[Hashable, GenJob | Failure]) -> None:
        """Adds requests, also between two steps of others: they join at the next step that has room for them."""
        metrics().batch_requests.labels(self.endpoint).observe(len(jobs))
        self.jobs.update(jobs)
        self.waiting += [key for key, job in jobs.items() if isinstance(job, GenJob)]
        self._seen = -1              # a request cancelled before it came is seen at the next step
        self._gauges()

    def step(self) -> None:
        """One step: the requests whose client went away leave, waiting ones join while they fit, then one
        step of each model's running batch; every sequence's new token is in its job's text after it."""
        self._drop_gone()
        self._join_waiting()
        for model, batch in list(self.batches.items()):
            self._step_batch(model, batch)
        self._gauges()

    def _join_waiting(self) -> None:
        rows = sum(job.rows for job in self.running.values())
        while self.waiting:
            job = self.jobs.get(self.waiting[0])
            if not isinstance(job, GenJob) or job.over:          # gone, or failed, while it waited
                self.waiting.pop(0)
                continue
            on_cpu = getattr(self.engines[job.model], "device_type", "cpu") == "cpu"
            full = ((self.budget is not None and self.used + job.cost > self.budget)
                    or (on_cpu and rows + job.rows > CPU_BATCH_ROWS))
            if full and self.running:
                return
            self._join(self.waiting.pop(0), job)
            rows += job.rows

    def _join(self, key: Hashable, job: GenJob) -> None:
        engine = self.engines[job.model]
        batch = self.batches.get(job.model)
        prompts = [job.prompt] * (1 if job.beam else job.n)
        try:
            if batch is None:
                batch = self.batches[job.model] = engine.generation_batch()
            job.member = engine.join_generation(batch, prompts, job.options, seeds=job.seeds[:len(prompts)],
                                                cancel=job.cancel)
        except Exception:   # bad options, say: this request fails alone
            log.exception("generation request %s could not start", job.request_id)
            job.failure = internal_failure()
            return
        job.started, job.t0 = time.monotonic(), time.perf_counter()
        self.running[key] = job
        self.used += job.cost

    def _step_batch(self, model: str, batch) -> None:
        """One step of a model's running batch; each of its requests gets its sequences' new tokens. A step
        that raises fails the batch's requests (their rows were in one call), not the other models'."""
        engine = self.engines[model]
        try:
            ended = batch.step()
        except Exception:
            log.exception("a generation step of %s failed; the %d requests in its batch fail", model,
                          sum(job.model == model for job in self.running.values()))
            for job in self.running.values():
                if job.model == model:
                    job.failure = internal_failure()
            self._close(model)
            return
        for rows in batch.call_rows:    # (transerve_step_batch_rows: the engine's graph tells the watch)
            metrics().batch_sentences.labels(self.endpoint, model).observe(rows)
        for key, job in list(self.running.items()):
            m = job.member
            if job.model != model:
                continue
            if m.step is not None:
                for k, tok in zip(m.step.sentence, m.step.tokens):
                    ended_here = tok == engine.eos_id
                    self._extend(key, int(k), [] if ended_here else [int(tok)], ended_here)
            if m in ended:
                self._ended(key, job)

    def _ended(self, key: Hashable, job: GenJob) -> None:
        """Its search returned (or raised): beam search's hypotheses arrive whole; a sequence still open ends."""
        m = job.member
        if m.error is not None:
            log.error("generation failed for request %s: %r", job.request_id, m.error)
            job.failure = internal_failure()
            return
        if job.beam:
            hyps = m.result[0]
            for k in range(job.n):
                self._extend(key, k, list(hyps[k].tokens) if k < len(hyps) else [], True)
        for k in range(job.n):
            self._extend(key, k, [], True)     # no-op for the sequences already finished

    def _extend(self, key: Hashable, k: int, tokens: list[int], ended: bool) -> None:
        """Sequence k of a request gets these tokens; a stop sequence in its text ends it there."""
        job = self.jobs.get(key)
        if not isinstance(job, GenJob) or job.failure is not None or job.finish[k] is not None:
            return
        try:
            job.tokens[k] += len(tokens)
            job.texts[k] += self.engines[job.model].piece_text(tokens)
        except Exception:   # this request fails alone: take_progress() reports it, its rows leave
            log.exception("decoding the tokens of request %s failed", job.request_id)
            job.failure = internal_failure()
            return
        stop_at = _stop_at(job.texts[k], job.stop)
        if stop_at >= 0:
            job.texts[k] = job.texts[k][:stop_at]
            job.finish[k] = "stop"
            job.cancel.add(k)               # its row leaves at the next step
        elif ended:
            job.finish[k] = "length" if job.tokens[k] >= job.max_new_tokens else "stop"

    def _drop_gone(self) -> None:
        """Requests whose client went away end now, their unfinished sequences "cancelled", and leave their
        batch before its next call (or the queue of those waiting). The board is read only when its count of
        cancellations moved (or a request came): a step of 8 streams is a few ms, reading it 0.05-0.1."""
        seen = self.board.cancellations()
        if seen == self._seen:
            return
        self._seen = seen
        held = [(key, job) for key, job in self.jobs.items() if isinstance(job, GenJob)]
        if not held:
            return
        gone = self.board.cancelled(np.array([job.number for _, job in held], dtype=np.int64))
        for (key, job), went in zip(held, gone):
            if went:
                job.finish = ["cancelled" if f is None else f for f in job.finish]
                self._release(key)

    def _release(self, key: Hashable) -> None:
        """A request leaves the running batch (or the waiting line): its rows are in no later call."""
        if key in self.waiting:
            self.waiting.remove(key)
        job = self.running.pop(key, None)
        if job is None:
            return
        self.used -= job.cost
        metrics().inference.labels(self.endpoint, job.model).observe(time.perf_counter() - job.t0)
        batch = self.batches.get(job.model)
        if batch is not None:
            batch.leave(job.member)
            if not batch.members:
                self._close(job.model)

    def _close(self, model: str) -> None:
        """A model's batch is empty (or failed): its blocks go back to the pool; the next request makes a new one."""
        with contextlib.suppress(Exception):   # may be called while handling an error: do not add one
            self.batches.pop(model).close()

    def _gauges(self) -> None:
        """The scheduler's gauges (service/worker/watch.py): rows running per model, requests waiting for room."""
        self.watch.update({model: batch.rows for model, batch in self.batches.items()}, len(self.waiting))

    def take_progress(self) -> list[tuple[Hashable, GenJob | Failure, bool]]:
        """Every request held, with whether it is over (each sequence finished, or it failed): the over ones
        leave, at once. Each request's new text is in its job (texts, finish); what of it is sent is the
        encoder's business."""
        out = [(key, job, isinstance(job, Failure) or job.over) for key, job in self.jobs.items()]
        left = [key for key, _, over in out if over]
        for key in left:
            self.jobs.pop(key, None)
            self._release(key)
        if left:
            self._gauges()
        return out

    def abandon(self) -> None:
        """Forgets every request and batch; the batches hand their cache back."""
        for model in list(self.batches):
            self._close(model)
        self.jobs, self.waiting, self.running, self.used, self._seen = {}, [], {}, 0, -1
        self._gauges()
