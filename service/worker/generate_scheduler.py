"""The generation scheduler (`GenerationScheduler`), driven as scheduler.py says."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Hashable

import numpy as np

from .cancel import CancelBoard
from .scheduler import CPU_BATCH_ROWS, Failure, internal_failure, log
from .watch import SchedulerWatch
from ..inference.engine import Engine
from ..shared.options import SearchOptions
from ..metrics import metrics


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
    member: Any = None                    # its search in its model's running batch (LmBatch.join)
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
        Otherwise it waits in the worker's queue until there is room."""
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
            job.member = batch.join(prompts, job.options, seeds=job.seeds[:len(prompts)], cancel=job.cancel)
        except Exception:   # bad options, say: this request fails alone
            log.exception("a generation request could not start (request_id=%s)", job.request_id)
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
            log.error("a generation failed: %r (request_id=%s)", m.error, job.request_id)
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
            log.exception("decoding a generation's tokens failed (request_id=%s)", job.request_id)
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
