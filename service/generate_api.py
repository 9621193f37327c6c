"""The LitAPI behind POST /generate: decoder-only generation, batched and streamed, in each inference
worker process.

    decode_request  validate against the loaded generation packages, tokenize the prompt
    batch           every sequence of every request, grouped by model and decoding options
    predict         arrays only: one engine step per group per iteration, yielding what each chose
    encode_response per request and step: the new text, stop sequences, the final event

LitServe's batched streaming loop chains these as generators, so `encode_response` sees each step
before `predict` takes the next one: when it finds a stop sequence it adds the sequence to the
group's `cancel` set, and the engine drops that row on the very next step. A request whose client
went away is found on the `CancelBoard`, shared with the HTTP processes, and dropped the same way.

Every request is streamed from the worker; the HTTP layer either forwards the events as
server-sent events or collects them into one JSON response, so a streamed text is by construction
the concatenation of the same pieces a non-streamed request returns.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import litserve as ls
import numpy as np

from .litserve_bridge import PromptBatchedStreamingLoop
from .config import Settings, lower_worker_priority
from .engine import Engine, SearchOptions
from .cancel import CancelBoard
from .metrics import metrics
from .stopping import Stopping, die
from .translate_api import Failure, for_one_request, internal_failure

log = logging.getLogger("transerve")
ENDPOINT = "generate"


@dataclass
class GenJob:
    """One request: its prompt and, as the worker goes, each returned sequence's text."""
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
    emitted: list[int] = field(default_factory=list)     # characters of texts[k] already sent
    tokens: list[int] = field(default_factory=list)
    finish: list[str | None] = field(default_factory=list)
    started: float = 0.0
    reported: bool = False                # the final event was sent


@dataclass
class Group:
    """Sequences decoded together: same model and options."""
    model: str
    options: SearchOptions
    rows: list[tuple[int, int]]           # (job index, sequence index) of each engine row
    prompts: list[list[int]]
    seeds: list[int | None]
    beam: bool                            # beam search: one row per job, its n best hypotheses


@dataclass
class StepEvents:
    """What one iteration produced for each job: (sequence index, new token ids, ended)."""
    jobs: list[GenJob | Failure]
    events: list[list[tuple[int, list[int], bool]]]
    cancels: list[set[int]]               # per group, rows to drop (written by encode_response)
    groups: list[Group]
    gone: np.ndarray | None = None        # per job: its client went away (read once per step in predict)


def _held_back(text: str, stops: list[str]) -> int:
    """Characters at the end of `text` that could still become a stop sequence: not sent yet."""
    keep = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), keep, -1):
            if text.endswith(s[:n]):
                keep = n
                break
    return keep


class GenerateAPI(ls.LitAPI):
    def __init__(self, settings: Settings, board: CancelBoard, stopping: Stopping | None = None):
        super().__init__(max_batch_size=settings.max_batch_size, batch_timeout=settings.batch_timeout_ms / 1000,
                         api_path="/generate", stream=True, loop=PromptBatchedStreamingLoop())
        self.settings = settings
        self.board = board
        self.stopping = stopping   # None outside a server (tests): the signals are left alone

    def setup(self, device: str) -> None:
        self.board.worker_started(ENDPOINT)   # first: the gateway fails what a dead predecessor held
        if self.stopping is not None:   # SIGINT, SIGTERM: stop once the main process has drained
            self.stopping.guard(die)
        lower_worker_priority(self.settings)
        provider = "cpu" if self.settings.device == "cpu" or not str(device).startswith("cuda") else "cuda"
        self.engines: dict[str, Engine] = {}
        for path in self.settings.model_paths:
            engine = Engine(path, device=provider, intra_op_threads=self.settings.threads,
                            spin_wait=self.settings.spin_wait)
            if engine.task != "generation":
                continue
            name = engine.package.name
            self.engines[name] = engine
            metrics().model_info.labels(model=name, directions="generation", precision=engine.package.meta["precision"],
                                  provider=engine.device_type).set(1)
            engine.generate(["Hallo"], max_new_tokens=4)  # warm-up before /ready
        self.default_model = next(iter(self.engines))
        log.info("generation worker ready: %s", list(self.engines))

    # --- per request -------------------------------------------------------------------------------
    def decode_request(self, request: dict) -> GenJob | Failure:
        return for_one_request("decode_request", request.get("request_id", ""), self._decode, request)

    def _decode(self, request: dict) -> GenJob | Failure:
        s = self.settings
        name = request.get("model") or self.default_model
        engine = self.engines.get(name)
        if engine is None:
            return Failure(400, "unknown_model", f"no generation model {name!r}; loaded: {', '.join(self.engines)}")
        prompt = engine.prompt_ids([request["prompt"]])[0]
        if len(prompt) - 1 > s.max_prompt_tokens:
            return Failure(413, "too_many_tokens", f"the prompt has {len(prompt) - 1} tokens; the limit is "
                           f"{s.max_prompt_tokens}", s.max_prompt_tokens)
        max_new = min(request.get("max_new_tokens", 64), s.max_output_tokens)
        room = engine.max_positions - len(prompt)
        if room < 1:
            return Failure(413, "too_many_tokens", f"the prompt fills the model's {engine.max_positions} positions",
                           engine.max_positions)
        max_new = min(max_new, room)
        beam = request.get("beam_size", 1)
        temperature = request.get("temperature", 1.0)
        n = request.get("num_return_sequences", 1)
        sampling = beam == 1 and temperature > 0   # beam search with sampling options: GenerateRequest refused it
        if n > 1 and not sampling and n > beam:
            return Failure(422, "invalid_request", f"num_return_sequences={n} needs sampling (temperature > 0) or "
                           f"beam_size >= {n}; greedy search returns one text")
        rows = beam if beam > 1 else n
        cost = (len(prompt) - 1 + max_new) * rows
        if cost > s.max_request_cost:
            return Failure(413, "request_too_costly", f"the request costs {cost} ((prompt tokens {len(prompt) - 1} + "
                           f"max_new_tokens {max_new}) x {rows} {'beams' if beam > 1 else 'sequences'}); the limit is "
                           f"{s.max_request_cost} (send a shorter prompt, fewer max_new_tokens, beams or sequences)",
                           s.max_request_cost)
        options = SearchOptions(beam_size=beam, num_hypotheses=n if beam > 1 else 1, max_length=max_new + 1,
                                min_length=min(request.get("min_new_tokens", 0), max_new),
                                repetition_penalty=request.get("repetition_penalty", 1.0), sampling=sampling,
                                temperature=temperature if sampling else 1.0, top_k=request.get("top_k", 0),
                                top_p=request.get("top_p", 1.0))
        seed = request.get("seed")
        seeds = [None if seed is None else seed + k for k in range(n)]
        return GenJob(request.get("request_id", ""), request.get("number", -1), name, options, prompt, n, seeds,
                      list(request.get("stop") or []), max_new, request.get("received", time.monotonic()),
                      texts=[""] * n, emitted=[0] * n, tokens=[0] * n, finish=[None] * n)

    def batch(self, jobs: list[GenJob | Failure]) -> StepEvents:
        metrics().batch_requests.labels(ENDPOINT).observe(len(jobs))
        groups: dict[tuple, Group] = {}
        started = time.monotonic()
        for j, job in enumerate(jobs):
            if not isinstance(job, GenJob):
                continue
            job.started = started
            beam = job.options.beam_size > 1
            g = groups.setdefault((job.model, job.options.batch_key()),
                                  Group(job.model, job.options, [], [], [], beam))
            for k in range(1 if beam else job.n):
                g.rows.append((j, k))
                g.prompts.append(job.prompt)
                g.seeds.append(job.seeds[k])
        gs = list(groups.values())
        return StepEvents(list(jobs), [], [set() for _ in gs], gs)

    def predict(self, plan: StepEvents):
        """Arrays only: advances every group one engine step per iteration and yields, per job, the
        tokens each sequence chose."""
        steps = {}
        for gi, g in enumerate(plan.groups):
            try:  # beam search runs whole here
                steps[gi] = self.engines[g.model].generate_steps(g.prompts, g.options, seeds=g.seeds,
                                                                 cancel=plan.cancels[gi])
            except Exception:
                self._fail_group(plan, g)
        live = list(steps)
        numbers = np.array([job.number if isinstance(job, GenJob) else -1 for job in plan.jobs], dtype=np.int64)
        t0 = time.perf_counter()
        # One event first: a Failure job learns its error without waiting for the others' decoding.
        yield StepEvents(plan.jobs, [[] for _ in plan.jobs], plan.cancels, plan.groups)
        while live:
            events: list[list[tuple[int, list[int], bool]]] = [[] for _ in plan.jobs]
            for gi in list(live):
                g = plan.groups[gi]
                eos = self.engines[g.model].eos_id
                try:
                    step = next(steps[gi])
                except StopIteration as done:
                    live.remove(gi)
                    metrics().inference.labels(ENDPOINT, g.model).observe(time.perf_counter() - t0)
                    metrics().batch_sentences.labels(ENDPOINT, g.model).observe(len(g.rows))
                    if g.beam:  # beam search streams nothing: its hypotheses arrive whole
                        for (j, _), hyps in zip(g.rows, done.value):
                            for k in range(getattr(plan.jobs[j], "n", 0)):   # 0: it failed meanwhile
                                events[j].append((k, list(hyps[k].tokens) if k < len(hyps) else [], True))
                    continue
                except Exception:
                    live.remove(gi)
                    self._fail_group(plan, g)
                    continue
                for s, tok in zip(step.sentence, step.tokens):
                    j, k = g.rows[s]
                    events[j].append((k, [] if tok == eos else [int(tok)], tok == eos))
            gone = self.board.cancelled(numbers)
            if gone.any():
                for gi, g in enumerate(plan.groups):
                    plan.cancels[gi].update(r for r, (j, _) in enumerate(g.rows) if gone[j])
            yield StepEvents(plan.jobs, events, plan.cancels, plan.groups, gone)

    @staticmethod
    def _fail_group(plan: StepEvents, g: Group) -> None:
        """Called from an except block: the group's requests get a 500 at the next event; the other
        groups go on."""
        log.exception("generation failed for %d sequences of %s; their requests fail alone", len(g.rows), g.model)
        for j in {j for j, _ in g.rows}:
            if isinstance(plan.jobs[j], GenJob) and not plan.jobs[j].reported:
                plan.jobs[j] = internal_failure()

    def unbatch(self, output):
        yield from output  # each item already carries every job's events

    def encode_response(self, stream):
        """Per step, one dict per job: {"pieces": [{"index", "text"}], "done": {...}} or an error."""
        for step in stream:
            out = []
            for j, job in enumerate(step.jobs):
                if isinstance(job, Failure):
                    out.append(job.to_dict() if not getattr(job, "reported", False) else "")
                    job.reported = True
                    continue
                try:
                    out.append(self._job_event(step, j, job))
                except Exception:  # raised here, it would end every request of the batch
                    log.exception("encode_response failed for request %s", job.request_id)
                    step.jobs[j] = failure = internal_failure()
                    failure.reported = True
                    out.append(failure.to_dict())
                    for k in range(job.n):
                        self._cancel(step, j, k)
            yield out

    def _job_event(self, step: StepEvents, j: int, job: GenJob):
        if job.reported:
            return ""
        engine = self.engines[job.model]
        pieces = []
        for k, tokens, ended in step.events[j]:
            if job.finish[k] is not None:
                continue
            job.tokens[k] += len(tokens)
            job.texts[k] += engine.piece_text(tokens)
            stop_at = min((i for i in (job.texts[k].find(s) for s in job.stop) if i >= 0), default=-1)
            if stop_at >= 0:
                job.texts[k] = job.texts[k][:stop_at]
                job.finish[k] = "stop"
                self._cancel(step, j, k)
            elif ended:
                job.finish[k] = "length" if job.tokens[k] >= job.max_new_tokens else "stop"
        gone = step.gone is not None and bool(step.gone[j])
        for k in range(job.n):
            if gone and job.finish[k] is None:
                job.finish[k] = "cancelled"
            # Everything is sent once a sequence is over; until then, a possible stop sequence's start waits.
            upto = len(job.texts[k]) - (0 if job.finish[k] else _held_back(job.texts[k], job.stop))
            if upto > job.emitted[k]:
                pieces.append({"index": k, "text": job.texts[k][job.emitted[k]:upto]})
                job.emitted[k] = upto
        event: dict = {"pieces": pieces}
        if all(f is not None for f in job.finish):
            job.reported = True
            for k in range(job.n):
                metrics().generated_tokens.labels(job.model, job.finish[k]).inc(job.tokens[k])
            metrics().input_tokens.labels(ENDPOINT, job.model).inc(len(job.prompt) - 1)
            metrics().output_tokens.labels(ENDPOINT, job.model).inc(sum(job.tokens))
            event["done"] = {
                "model": job.model,
                "choices": [{"index": k, "finish_reason": job.finish[k], "tokens": job.tokens[k]}
                            for k in range(job.n)],
                "usage": {"prompt_tokens": len(job.prompt) - 1, "completion_tokens": sum(job.tokens)},
                "queue_ms": round((job.started - job.received) * 1000, 2),
            }
        return event if pieces or "done" in event else ""

    @staticmethod
    def _cancel(step: StepEvents, j: int, k: int) -> None:
        for gi, g in enumerate(step.groups):
            for r, row in enumerate(g.rows):
                if row == (j, k):
                    step.cancels[gi].add(r)
