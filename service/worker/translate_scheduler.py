"""The translation scheduler (`TranslationScheduler`), driven as scheduler.py says.

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
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Generator, Hashable

import numpy as np

from .cancel import CancelBoard
from .scheduler import CPU_BATCH_ROWS, GAUGE_S, Failure, log
from .watch import SchedulerWatch
from ..inference.decoders import columns_for
from ..inference.running_batch import Member, RunningBatch, Ticket, pooled
from ..inference.engine import Engine
from ..inference.request_terms import SentenceTerms
from ..shared.constraints import Terms
from ..shared.options import SearchOptions
from ..metrics import metrics
from ..shared.search import Hypothesis, max_lengths


# Cost tiers: a request costing up to this (source tokens x beam: any one sentence at the default beam 4)
# is in tier 0, up to twice that in tier 1, and so on.
TIER_COST = 1024
# Sentences wait for room in the running batch in order of their request's arrival, each cost tier above 0
# counted as this much later: a one-word request that arrives while a large one's sentences wait goes ahead
# of them, and a large one still joins before requests that arrive this much later per tier than it. Seconds,
# not steps: what a client waits; 2 s, as a busy 2-core machine's first step of two large requests can take
# over 0.5 s, after which a one-word request that came meanwhile would wait behind them.
TIER_WAIT_S = 2.0


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
    terms: SentenceTerms | None = None    # its sentences' constraints, glossary matches, kept spans (glossary_terms.py)
    glossary: bool = False                # whether it came with a glossary (its answer reports it)
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
    member: Member | Ticket | None = None   # their search in the batch (RunningBatch.join)
    t0: float = 0.0                       # when they joined (perf_counter)
    _seen: int = -1                       # the member's live_count that _held was counted from
    _held: tuple[int, int] = (0, 0)

    def held(self) -> tuple[int, int]:
        """(tokens, rows) of its sentences still searched: one that ended has left the batch (its search
        dropped its rows), and its budget with it."""
        if self.member is None or self.member.want is None:
            return 0, 0
        live_count = self.member.live_count
        if self._seen != live_count:                      # it joined, or a sentence ended since
            if live_count == len(self.sentences):        # all still searched (a Ticket counts its sentences, a
                self._held = (sum(self.tokens), sum(self.rows))    # Member its rows: one each, never beams)
            else:
                live = self.member.sentences_left()
                self._held = (int(np.take(self.tokens, live).sum()), int(np.take(self.rows, live).sum()))
            self._seen = live_count
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
        it waits in the worker's queue until one would."""
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
            constrained = self._terms(self.jobs[run.key], run.sentences) is not None   # they pool apart
            key = (run.batch, options.batch_key(), constrained) if pooled(options) else id(run)
            groups.setdefault(key, []).append(run)
        return list(groups.values())

    def _batch(self, run: Running) -> RunningBatch:
        batch = self.batches.get(run.batch)
        if batch is None:
            batch = self.batches[run.batch] = self.engines[run.batch[0]].running_batch(run.batch[1])
        return batch

    def _join_together(self, runs: list[Running]) -> None:
        jobs = [self.jobs[run.key] for run in runs]
        sources = [[job.sentences[k] for k in run.sentences] for job, run in zip(jobs, runs)]
        terms = [self._terms(job, run.sentences) for job, run in zip(jobs, runs)]
        try:
            tickets = self._joined(runs[0], [s for r in sources for s in r], jobs[0].options, [len(r) for r in sources],
                                   None if terms[0] is None else [t for ts in terms for t in ts])
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
        if not job.started:
            job.started = time.monotonic()
        run.t0 = time.perf_counter()
        try:
            (run.member,) = self._joined(run, [job.sentences[k] for k in run.sentences], job.options,
                                         terms=self._terms(job, run.sentences))
        except Exception:  # its request's sentences are tried one by one; the batch goes on
            log.exception("starting the search of %d sentences failed; retrying one by one", len(run.sentences))
            self._finished(run, self._one_by_one(job, run.sentences))
            return
        self.running.append(run)
        if run.member.want is None:       # it ended before its first step
            self._ended(run)

    def _joined(self, run: Running, src_ids: list[list[int]], options: SearchOptions,
                sizes: list[int] | None = None, terms: list[Terms | None] | None = None) -> list[Member | Ticket]:
        """The engine encodes the sources, the running batch starts their searches: `sizes` requests' sentences
        in turn (one request: all of them), with their constraints; a handle per request."""
        batch = self._batch(run)      # first: a batch that cannot be made leaves no encoder outputs unowned
        return batch.join(self.engines[run.batch[0]].encode_sources(src_ids, options), options,
                          sizes or [len(src_ids)], terms=terms)

    @staticmethod
    def _terms(job: Job, sentences: list[int]) -> list[Terms | None] | None:
        """The constraints of a request's sentences, or None when none has any."""
        if job.terms is None or not job.terms.constrained:
            return None
        terms = [job.terms.terms[k] for k in sentences]
        return terms if any(t is not None for t in terms) else None

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
                results.append(engine.search([job.sentences[k]], job.options, terms=self._terms(job, [k]))[0])
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
