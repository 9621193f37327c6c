"""The LitAPI behind POST /generate: decoder-only generation, batched and streamed, in each inference
worker process; a thin adapter over the worker's scheduler.

    setup           load the generation packages, start a GenerationScheduler over them, warm up
    decode_request  validate against the loaded generation packages, tokenize the prompt: a GenJob
    encode_response per request and step: the new text, the final event

The worker's loop (litserve_bridge.SchedulerLoop) admits each decoded request into `self.scheduler`
(service/worker/generate_scheduler.py), runs it one engine step at a time and, after each step, encodes every request
it holds: the scheduler has added each sequence's new text (and ended a sequence at a stop sequence, its
eos, or its client's disconnect), this sends what of it may be sent.

Every request is streamed from the worker; the HTTP layer either forwards the events as
server-sent events or collects them into one JSON response, so a streamed text is by construction
the concatenation of the same pieces a non-streamed request returns.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import litserve as ls

from .cancel import CancelBoard
from ..config import Settings
from ..inference.engine import Engine
from ..shared.options import SearchOptions
from .litserve_bridge import SchedulerLoop
from ..metrics import metrics
from .scheduler import Failure, for_one_request
from .generate_scheduler import GenerationScheduler, GenJob, generation_cost
from ..stopping import Stopping
from .process import start_worker

log = logging.getLogger("transerve")
ENDPOINT = GenerationScheduler.endpoint


def _held_back(text: str, stops: list[str]) -> int:
    """Characters at the end of `text` that could still become a stop sequence: not sent yet."""
    keep = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), keep, -1):
            if text.endswith(s[:n]):
                keep = n
                break
    return keep


def generation_budget(settings: Settings) -> int:
    """The tokens of cache (generation_cost) a generation worker's running requests hold at most: the larger of
    --max-batch-tokens and --max-request-cost, so that any request the cost limit lets in fits alone (one that
    could never fit is that limit's 413)."""
    return max(settings.max_batch_tokens, settings.max_request_cost)


class GenerateAPI(ls.LitAPI):
    def __init__(self, settings: Settings, board: CancelBoard, stopping: Stopping | None = None):
        super().__init__(max_batch_size=settings.max_batch_size, batch_timeout=settings.batch_timeout_ms / 1000,
                         api_path="/generate", stream=True, loop=SchedulerLoop())
        self.settings = settings
        self.board = board
        self.stopping = stopping   # None outside a server (tests): the signals are left alone

    def setup(self, device: str) -> None:
        start_worker(ENDPOINT, self.settings, self.board, self.stopping)
        provider = "cpu" if self.settings.device == "cpu" or not str(device).startswith("cuda") else "cuda"
        engines: dict[str, Engine] = {}
        for path in self.settings.model_paths:
            engine = Engine(path, device=provider, intra_op_threads=self.settings.threads,
                            spin_wait=self.settings.spin_wait)
            if engine.task != "generation":
                continue
            engines[engine.package.name] = engine
            metrics().model_info.labels(model=engine.package.name, directions="generation",
                                        precision=engine.package.meta["precision"], provider=engine.device_type).set(1)
            engine.generate(["Hallo"], max_new_tokens=4)  # warm-up before /ready
        self.use_engines(engines)
        log.info("generation worker ready: %s", list(self.engines))

    def use_engines(self, engines: dict[str, Engine]) -> None:
        """Serves these engines (by package name; setup() loads them, a test may pass its own), the first the
        default, and the scheduler that runs them."""
        self.engines = engines
        self.default_model = next(iter(engines))
        self.scheduler = GenerationScheduler(engines, self.board, generation_budget(self.settings))

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
        options: SearchOptions = request["options"]   # mapped once, in the Gateway: to_search_options()
        room = engine.max_positions - len(prompt)
        if room < 1:
            return Failure(413, "too_many_tokens", f"the prompt fills the model's {engine.max_positions} positions",
                           engine.max_positions)
        if options.max_length - 1 > room:   # the budget the server allows, capped by the model's room for it
            options = replace(options, max_length=room + 1, min_length=min(options.min_length, room))
        max_new, n = options.max_length - 1, request["num_return_sequences"]
        beam = options.strategy == "beam"
        rows = options.beam_size if beam else n
        cost = generation_cost(len(prompt) - 1, max_new, rows)
        if cost > s.max_request_cost:
            return Failure(413, "request_too_costly", f"the request costs {cost} ((prompt tokens {len(prompt) - 1} + "
                           f"max_new_tokens {max_new}) x {rows} {'beams' if beam else 'sequences'}); the limit is "
                           f"{s.max_request_cost} (send a shorter prompt, fewer max_new_tokens, beams or sequences)",
                           s.max_request_cost)
        seed = request["seed"]
        seeds = [None if seed is None else seed + k for k in range(n)]
        return GenJob(request.get("request_id", ""), request.get("number", -1), name, options, prompt, n, seeds,
                      list(request["stop"]), max_new, request.get("received", time.monotonic()),
                      texts=[""] * n, emitted=[0] * n, tokens=[0] * n, finish=[None] * n)

    def encode_response(self, job: GenJob | Failure) -> dict | str:
        """The request's event for this step: {"pieces": [{"index", "text"}], "done": {...}} (done: its last),
        an error, or "" when there is nothing new to send."""
        if isinstance(job, Failure):
            return job.to_dict()       # a request that failed before it started: its one event
        if job.reported:
            return ""
        if job.failure is not None:
            job.reported = True
            return job.failure.to_dict()
        event = for_one_request("encode_response", job.request_id, self._event, job)
        if isinstance(event, Failure):
            job.failure = event        # the scheduler's next take_progress() ends it, its rows leave
            job.reported = True
            return event.to_dict()
        return event

    def _event(self, job: GenJob) -> dict | str:
        pieces = []
        for k in range(job.n):
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
