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
still served; a search or decoder step that raises has its sentences retried one at a time, a generation group
that raises fails its own requests only.

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
from typing import Hashable

import numpy as np

from .cancel import CancelBoard
from ..inference.decoders import Member, RunningBatch, columns_for
from ..inference.engine import Engine, Steps
from ..shared.options import SearchOptions
from ..metrics import metrics
from ..shared.search import Hypothesis, max_lengths, rows_per_input

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
    member: Member | None = None          # their search in the batch (Engine.join)
    t0: float = 0.0                       # when they joined (perf_counter)
    _seen: object = None                  # the member's row_source that _held was counted from
    _held: tuple[int, int] = (0, 0)

    def held(self) -> tuple[int, int]:
        """(tokens, rows) of its sentences still searched: one that ended has left the batch (its search
        dropped its rows), and its budget with it."""
        if self.member is None or self.member.want is None:
            return 0, 0
        if self._seen is not self.member.row_source:      # its rows changed (a new array at every select)
            live = np.unique(self.member.row_source)
            self._seen, self._held = self.member.row_source, (int(np.take(self.tokens, live).sum()),
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
        rows = rows_per_input(o)
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
        self._gauges(force=not self.busy)

    def _join_waiting(self) -> None:
        """The waiting sentences that fit, in turn (the first that does not fit stops the rest: it is not
        overtaken for ever by smaller ones); one that could never fit joins an empty batch alone."""
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
        for run in joining.values():
            self._join(run)

    def _join(self, run: Running) -> None:
        job = self.jobs[run.key]
        engine = self.engines[job.model]
        if not job.started:
            job.started = time.monotonic()
        batch = self.batches.get(run.batch) or self.batches.setdefault(run.batch, engine.running_batch(run.batch[1]))
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
        metrics().step_batch_rows.labels(self.endpoint, key[0]).observe(batch.rows)
        try:
            batch.step()
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
        """The scheduler's gauges, at most every GAUGE_S while busy (each set writes a shared file)."""
        now = time.monotonic()
        if not force and now - self._gauged < GAUGE_S:
            return
        self._gauged, m = now, metrics()
        m.waiting_requests.labels(self.endpoint).set(len({w[2] for w in self.waiting}))
        for model in self.engines:
            batches = [b for (name, _), b in self.batches.items() if name == model]
            m.running_rows.labels(self.endpoint, model).set(sum(b.rows for b in batches))
            m.cache_bytes.labels(self.endpoint, model).set(sum(b.bytes for b in batches))

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
        self.jobs, self.waiting, self.running, self.batches, self.fresh, self._seen = {}, [], [], {}, set(), -1
        self._gauges()


# --- generation -------------------------------------------------------------------------------------------
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
    started: float = 0.0
    reported: bool = False                # its last event was made (by generate_api)

    @property
    def over(self) -> bool:
        return self.failure is not None or all(f is not None for f in self.finish)


@dataclass
class Group:
    """Sequences decoded together: same model and options."""
    model: str
    options: SearchOptions
    rows: list[tuple[Hashable, int]]      # (job key, sequence index) of each engine row
    prompts: list[list[int]]
    seeds: list[int | None]
    beam: bool                            # beam search: one row per job, its n best hypotheses
    cancel: set[int] = field(default_factory=set)    # rows the engine drops at its next step
    steps: Steps | None = None            # its decoding, once started (Engine.generate_steps)
    t0: float = 0.0                       # when it started (perf_counter)


def _stop_at(text: str, stops: list[str]) -> int:
    """Where the first stop sequence in `text` begins; -1 if none is there."""
    return min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)


class GenerationScheduler:
    """The generation requests a worker holds, grouped by model and decoding options, every group one engine
    step per step(). A sequence leaves its group's batch at its eos, at a stop sequence, or when its
    request's client goes away; beam search runs whole at its group's first step (it does not stream)."""
    endpoint = "generate"                 # its metrics' label

    def __init__(self, engines: dict[str, Engine], board: CancelBoard):
        self.engines, self.board = engines, board
        self.jobs: dict[Hashable, GenJob | Failure] = {}   # admitted, not over yet; in the order admitted
        self.groups: list[Group] = []                      # decoding, or to start at the next step

    @property
    def busy(self) -> bool:
        return bool(self.groups)

    def wants_new_requests(self) -> bool:
        """Never yet: a generation batch runs to its end before the worker takes the next."""
        return False

    def admit(self, jobs: dict[Hashable, GenJob | Failure]) -> None:
        """Adds requests; their sequences start at the next step, in groups of their own."""
        metrics().batch_requests.labels(self.endpoint).observe(len(jobs))
        self.jobs.update(jobs)
        groups: dict[tuple, Group] = {}
        now = time.monotonic()
        for key, job in jobs.items():
            if not isinstance(job, GenJob):
                continue
            job.started = now
            beam = job.options.beam_size > 1
            g = groups.setdefault((job.model, job.options.batch_key()), Group(job.model, job.options, [], [], [], beam))
            for k in range(1 if beam else job.n):
                g.rows.append((key, k))
                g.prompts.append(job.prompt)
                g.seeds.append(job.seeds[k])
        self.groups += groups.values()

    def step(self) -> None:
        """One engine step of every group (a new group's first), then the sequences of requests whose client
        went away leave."""
        for g in list(self.groups):
            self._step_group(g)
        self._drop_gone()

    def _step_group(self, g: Group) -> None:
        engine = self.engines[g.model]
        try:
            if g.steps is None:
                g.t0 = time.perf_counter()
                g.steps = engine.generate_steps(g.prompts, g.options, seeds=g.seeds, cancel=g.cancel)
            step = next(g.steps)
        except StopIteration as done:
            self.groups.remove(g)
            metrics().inference.labels(self.endpoint, g.model).observe(time.perf_counter() - g.t0)
            metrics().batch_sentences.labels(self.endpoint, g.model).observe(len(g.rows))
            if g.beam:  # beam search streams nothing: its hypotheses arrive whole
                for (key, _), hyps in zip(g.rows, done.value):
                    for k in range(getattr(self.jobs.get(key), "n", 0)):   # 0: it is over already
                        self._extend(key, k, list(hyps[k].tokens) if k < len(hyps) else [], True)
            return
        except Exception:
            self.groups.remove(g)
            self._fail_group(g)
            return
        for s, tok in zip(step.sentence, step.tokens):
            key, k = g.rows[s]
            self._extend(key, k, [] if tok == engine.eos_id else [int(tok)], tok == engine.eos_id)

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
            self._cancel(key, k)
        elif ended:
            job.finish[k] = "length" if job.tokens[k] >= job.max_new_tokens else "stop"

    def _drop_gone(self) -> None:
        """Requests whose client went away end, their unfinished sequences "cancelled"."""
        held = [(key, job) for key, job in self.jobs.items() if isinstance(job, GenJob)]
        if not held:
            return
        gone = self.board.cancelled(np.array([job.number for _, job in held], dtype=np.int64))
        for (key, job), went in zip(held, gone):
            if not went:
                continue
            for k in range(job.n):
                if job.finish[k] is None:
                    job.finish[k] = "cancelled"
                    self._cancel(key, k)

    def _fail_group(self, g: Group) -> None:
        """Called from an except block: the group's requests fail; the other groups go on."""
        log.exception("generation failed for %d sequences of %s; their requests fail alone", len(g.rows), g.model)
        for key in dict.fromkeys(key for key, _ in g.rows):
            job = self.jobs.get(key)
            if isinstance(job, GenJob) and not job.over:
                job.failure = internal_failure()

    def _cancel(self, key: Hashable, k: int) -> None:
        """Sequence k of a request leaves its group's batch at the next step."""
        for g in self.groups:
            g.cancel.update(r for r, row in enumerate(g.rows) if row == (key, k))

    def _leave(self, key: Hashable, job: GenJob | Failure) -> None:
        self.jobs.pop(key, None)
        for k in range(getattr(job, "n", 0)):
            self._cancel(key, k)

    def take_progress(self) -> list[tuple[Hashable, GenJob | Failure, bool]]:
        """Every request held, with whether it is over (each sequence finished, or it failed): the over ones
        leave, and their sequences still decoding stop at the next step. Each request's new text is in its
        job (texts, finish); what of it is sent is the encoder's business."""
        out = [(key, job, isinstance(job, Failure) or job.over) for key, job in self.jobs.items()]
        for key, job, over in out:
            if over:
                self._leave(key, job)
        return out

    def abandon(self) -> None:
        """Forgets every request and group; the started ones hand their cache back."""
        for g in self.groups:
            if g.steps is not None:
                with contextlib.suppress(Exception):   # called while handling an error: do not add one
                    g.steps.close()
        self.jobs, self.groups = {}, []
