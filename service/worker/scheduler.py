"""The worker's scheduler: which requests' rows the engine decodes at each step, for translation
(`TranslationScheduler`) and for generation (`GenerationScheduler`). No LitServe here: the worker loop
(litserve_bridge.SchedulerLoop) feeds a scheduler the requests it takes off the queue and runs it one
step at a time; the LitAPIs (translate_api, generate_api) turn a request into a job (validation,
tokenizing) and a job into its answer. Both schedulers are driven alike:

    admit({key: job})     requests join, also while others are under way (key: the caller's name for each)
    busy                  whether there is work left: call step()
    wants_new_requests()  whether a request arriving now would start before the work under way ends (the
                          loop looks at its queue between steps only then: each look costs a round trip)
    step()                one decoder step
    take_finished()       translation: the requests that can be answered now, which the scheduler forgets
    take_progress()       generation: every request held, each with whether it is over (the over ones leave)
    abandon()             forget everything (after an unexpected exception, whose requests the loop fails)

Failures: a request that cannot be served is a `Failure` value, never an exception, so its batch-mates are
still served; an engine batch that raises is retried one sentence at a time, a generation step that raises
fails the requests whose rows were in it only.

Translation, fairness: engine batches run in order of their requests' cost tier (source tokens x beam, each
tier twice the one before), so the sentences of a one-word request start at the next decoder step, before
the rest of a large request's engine batch; a large request's paused search keeps its cache and goes on
after (and gets steps back under a steady stream of small requests, LEND_S). A sentence's answer does not
depend on its batch-mates or on what runs between its steps (tests/test_batch_invariance.py).
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
from ..inference.engine import Engine
from ..shared.options import SearchOptions
from ..metrics import metrics
from ..shared.search import Hypothesis

log = logging.getLogger("transerve")

# Cost tiers: a request costing up to this (source tokens x beam: any one sentence at the default beam 4)
# is in tier 0, up to twice that in tier 1, and so on; engine batches of a lower tier run first.
# Ordinary one-sentence traffic stays in tier 0, batched as it always was.
TIER_COST = 1024
# A started engine batch paused for lower-tier ones gets a step back whenever they have run this many
# seconds more than it since it was paused: bursts of small requests go first, a steady stream of them
# shares the worker half and half with the large request instead of holding it back until its timeout.
LEND_S = 0.5
# On CPU an engine batch holds at most this many rows (sentences x beams): a decoder step, what a request
# that overtakes may wait for, then stays short. 2 cores, beam 16, 64 short sentences: 256 rows a call
# took 13.0 s in all, 180 ms a step; 1024 rows 13.6 s, 700 ms a step (benchmarks/results/fairness.md).
CPU_BATCH_ROWS = 256


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
class EngineBatch:
    model: str
    options: SearchOptions
    rows: list[tuple[Hashable, int]]      # (job key, sentence index)
    src_ids: list[list[int]]
    tier: int = 0                         # cost_tier of its requests
    steps: Generator | None = None        # its search, once started (Engine.search_steps)
    t0: float = 0.0                       # when it started (perf_counter)
    live: int = 0                         # rows in its latest decoder call (metrics)


class TranslationScheduler:
    """The translation requests a worker holds, cut into engine batches (grouped by model, search options and
    cost tier, sorted by length, at most --max-batch-tokens and, on CPU, CPU_BATCH_ROWS rows each), run one
    decoder step at a time, lowest tier first."""
    endpoint = "translate"                # its metrics' label

    def __init__(self, engines: dict[str, Engine], board: CancelBoard, max_batch_tokens: int):
        self.engines, self.board, self.max_batch_tokens = engines, board, max_batch_tokens
        self.jobs: dict[Hashable, Job | Failure] = {}    # admitted, not taken yet; in the order admitted
        self.batches: list[EngineBatch] = []             # not finished, in the order they run (lowest tier first)
        self.fresh: set[Hashable] = set()                # keys that may have become answerable
        self.lent = 0.0                       # seconds the first batch ran while a started one waited (LEND_S)
        self.watch = SchedulerWatch(self.endpoint, engines)
        # Each engine batch's search, given its requests' keys, wrapped: the worker loop traces it there
        # (service/worker/traces.py); by default the search as it is.
        self.traced: Callable[[Generator, list[Hashable]], Generator] = lambda steps, keys: steps

    @property
    def busy(self) -> bool:
        return bool(self.batches)

    def wants_new_requests(self) -> bool:
        """Whether a one-word request arriving now would run before the batch under way (one above tier 0)."""
        return bool(self.batches) and self.batches[0].tier > 0

    def admit(self, jobs: dict[Hashable, Job | Failure]) -> None:
        """Adds requests, also between two decoder steps of others. Their sentences join the engine batches
        not started yet (cut again, so requests that arrive while a batch runs are batched together), which
        go before any of a higher cost tier, started or not. A Failure is answerable at once."""
        metrics().batch_requests.labels(self.endpoint).observe(len(jobs))
        self.jobs.update(jobs)
        self.fresh.update(jobs)
        now = time.monotonic()
        rows = [r for eb in self.batches if eb.steps is None for r in eb.rows if r[0] in self.jobs]
        for key, job in jobs.items():
            if isinstance(job, Job):
                job.hyps, job.left, job.started = [None] * len(job.sentences), len(job.sentences), now
                rows += [(key, k) for k in range(len(job.sentences))]
        self.batches = [eb for eb in self.batches if eb.steps is not None] + self._engine_batches(rows)
        self.batches.sort(key=lambda eb: eb.tier)    # stable: within a tier, first come first served
        self._observe()

    def _engine_batches(self, all_rows: list[tuple[Hashable, int]]) -> list[EngineBatch]:
        """Sentences (job key, index) grouped by (model, options, cost tier), sorted by length, cut by token
        budget."""
        jobs = self.jobs
        groups: dict[tuple, list[tuple[Hashable, int]]] = {}
        for j, k in all_rows:
            job = jobs[j]
            groups.setdefault((job.model, job.options.batch_key(), cost_tier(job.cost)), []).append((j, k))
        batches = []
        for (model, _, tier), rows in groups.items():
            options = jobs[rows[0][0]].options
            rows.sort(key=lambda r: len(jobs[r[0]].sentences[r[1]]))
            budget = max(1, self.max_batch_tokens // max(1, options.beam_size))
            on_cpu = getattr(self.engines.get(model), "device_type", "cpu") == "cpu"
            most = max(1, CPU_BATCH_ROWS // max(1, options.beam_size)) if on_cpu else len(rows)
            chunks: list[list[tuple[Hashable, int]]] = [[]]
            for r in rows:
                width = len(jobs[r[0]].sentences[r[1]])  # sorted: the newest row is the widest
                if chunks[-1] and (width * (len(chunks[-1]) + 1) > budget or len(chunks[-1]) == most):
                    chunks.append([])
                chunks[-1].append(r)
            batches += [EngineBatch(model, options, c, [jobs[a].sentences[b] for a, b in c], tier) for c in chunks]
        return batches

    def step(self) -> None:
        """One step of the first engine batch (or of a started one it preempts that is owed time, see
        LEND_S): its encoder and first decoder step when it has not started (its cancelled requests
        dropped first), else its next decoder step. Call while busy; take_finished() then says which
        requests can be answered."""
        self._step()
        self._observe()

    def _observe(self) -> None:
        """The scheduler's gauges: rows of the started batches, requests with no sentence in one."""
        running: dict[str, int] = {}
        started = set()
        for eb in self.batches:
            if eb.steps is not None:
                running[eb.model] = running.get(eb.model, 0) + eb.live
                started.update(j for j, _ in eb.rows)
        self.watch.update(running, sum(j not in started and not answerable(job) for j, job in self.jobs.items()))

    def _step(self) -> None:
        i, lending = self._next_batch()
        eb = self.batches[i]
        if eb.steps is None:
            eb = self.batches[i] = self._drop_cancelled(eb)
            if not eb.rows:
                self.batches.pop(i)
                return
            eb.t0 = time.perf_counter()
        t0 = time.perf_counter()
        try:
            if eb.steps is None:
                eb.steps = self.traced(self.engines[eb.model].search_steps(eb.src_ids, eb.options),
                                       [j for j, _ in eb.rows])
            self.watch.last_rows = 0
            next(eb.steps)
            eb.live = self.watch.last_rows
            return
        except StopIteration as done:
            results = done.value
        except Exception:  # one bad engine batch must not take its requests' batch-mates down
            log.exception("engine batch of %d sentences failed; retrying one by one", len(eb.rows))
            results = self._one_by_one(eb)
        finally:
            self.lent += (time.perf_counter() - t0) * (-1 if i else int(lending))
        self.batches.pop(i)
        self._finished(eb, results)

    def _next_batch(self) -> tuple[int, bool]:
        """(0, whether the first batch runs while a started one waits behind it), or (i, False) for a
        started batch behind it once the batches ahead have run LEND_S more than it since it was paused:
        then they share the worker, so a stream of small requests cannot hold a large one back for ever."""
        paused = next((i for i, eb in enumerate(self.batches[1:], 1) if eb.steps is not None), None)
        if paused is None:
            self.lent = 0.0
            return 0, False
        return (paused, False) if self.lent > LEND_S else (0, True)

    def _drop_cancelled(self, eb: EngineBatch) -> EngineBatch:
        """eb without the sentences of requests whose client has gone (they get a 499 no one reads), or
        that are already answered or failed."""
        live = [j for j in dict.fromkeys(j for j, _ in eb.rows) if j in self.jobs and self.jobs[j].failure is None]
        gone = {j for j, g in zip(live, self.board.cancelled(np.array([self.jobs[j].number for j in live])))
                if g and self.jobs[j].number}
        for j in gone:
            self.jobs[j].failure = Failure(499, "client_closed_request", "the client went away")
            self.fresh.add(j)
        keep = [i for i, (j, _) in enumerate(eb.rows) if j in self.jobs and j not in gone
                and self.jobs[j].failure is None]
        if len(keep) == len(eb.rows):
            return eb
        return EngineBatch(eb.model, eb.options, [eb.rows[i] for i in keep], [eb.src_ids[i] for i in keep], eb.tier)

    def _one_by_one(self, eb: EngineBatch) -> list[list[Hypothesis] | None]:
        engine, results = self.engines[eb.model], []
        for src in eb.src_ids:
            try:
                results.append(engine.search([src], eb.options)[0])
            except Exception:
                log.exception("sentence failed")
                results.append(None)
        return results

    def _finished(self, eb: EngineBatch, results: list[list[Hypothesis] | None]) -> None:
        """A finished engine batch's hypotheses to their requests (None: that sentence failed)."""
        metrics().inference.labels(self.endpoint, eb.model).observe(time.perf_counter() - eb.t0)
        metrics().batch_sentences.labels(self.endpoint, eb.model).observe(len(eb.rows))
        for (j, k), hyps in zip(eb.rows, results):
            job = self.jobs.get(j)
            if job is None:        # answered already (failed in another engine batch)
                continue
            if hyps is None and job.failure is None:
                job.failure = Failure(500, "internal_error", "the engine failed on this text")
            job.hyps[k] = hyps
            job.left -= 1
            self.fresh.add(j)

    def take_finished(self) -> list[tuple[Hashable, Job | Failure]]:
        """The requests that can be answered now (every sentence done, or failed), in the order they were
        admitted, each once: the scheduler forgets them."""
        if not self.fresh:
            return []
        done = [j for j, job in self.jobs.items() if j in self.fresh and answerable(job)]
        self.fresh.clear()     # the others come back when their next sentence is done
        now = time.monotonic()
        for j in done:
            if isinstance(self.jobs[j], Job):
                self.jobs[j].finished = now
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
        """Forgets every request and engine batch; the started searches hand their cache back."""
        for eb in self.batches:
            if eb.steps is not None:
                with contextlib.suppress(Exception):   # called while handling an error: do not add one
                    eb.steps.close()
        self.jobs, self.batches, self.fresh, self.lent = {}, [], set(), 0.0
        self._observe()


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
        return self.options.beam_size > 1

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
        batch before its next call (or the queue of those waiting)."""
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
        self.jobs, self.waiting, self.running, self.used = {}, [], {}, 0
        self._gauges()
