"""The LitAPI behind POST /translate (and the LibreTranslate-compatible route, which feeds the same
queue): runs in each inference worker process.

    decode_request  validate against the loaded models, split texts into sentences, tokenize
    batch           every sentence of every request in the batch: grouped by model, search options
                    and cost tier, sorted by length, cut into token-budget engine batches
    predict         arrays only: Engine.search per engine batch
    encode_response one JSON-ready dict per request

Fairness: the worker's loop (litserve_bridge.PromptBatchedLoop) does not call predict. It runs the
plan one decoder step at a time (`advance`), lets requests that arrive meanwhile join it (`admit`), and
answers each request as soon as its last sentence is done (`take_finished`). Engine batches run in
order of their requests' cost tier (source tokens x beam, each tier twice the one before), so the
sentences of a one-word request start at the next decoder step, before the rest of a large request's
engine batch; a large request's paused search keeps its cache and goes on after. A sentence's answer
does not depend on its batch-mates or on what runs between its steps (tests/test_batch_invariance.py).

No hook raises for a single request: LitServe would fail the whole batch. A request that cannot
be served becomes a `Failure` value and travels to `encode_response`, which returns it as an error
dict; the HTTP layer turns that into the right status code. Batch-mates are untouched. An unexpected
exception in `decode_request` or `encode_response` becomes such a Failure too (500, logged).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generator

import litserve as ls
import numpy as np

from .litserve_bridge import PromptBatchedLoop
from .cancel import CancelBoard
from .config import Settings, lower_worker_priority
from .engine import Engine, SearchOptions, load_package
from .shared.options import DEFAULTS
from .metrics import metrics
from .stopping import Stopping, die
from .shared.search import Hypothesis
from .text import join_sentences, split_sentences

log = logging.getLogger("transerve")
ENDPOINT = "translate"
# Cost tiers: a request costing up to this (source tokens x beam: any one sentence at the default beam 4)
# is in tier 0, up to twice that in tier 1, and so on; engine batches of a lower tier run first (see the
# docstring). Ordinary one-sentence traffic stays in tier 0, batched as it always was.
TIER_COST = 1024
# A started engine batch paused for lower-tier ones gets a step back whenever they have run this many
# seconds more than it since it was paused: bursts of small requests go first, a steady stream of them
# shares the worker half and half with the large request instead of holding it back until its timeout.
LEND_S = 0.5
# On CPU an engine batch holds at most this many rows (sentences x beams): a decoder step, what a request
# that overtakes may wait for, then stays short. 2 cores, beam 16, 64 short sentences: 256 rows a call
# took 13.0 s in all, 180 ms a step; 1024 rows 13.6 s, 700 ms a step (benchmarks/results/fairness.md).
CPU_BATCH_ROWS = 256


def request_cost(source_tokens: int, beam_size: int) -> int:
    """What --max-request-cost bounds and the scheduler weighs: source tokens x beam size (the rows a
    search decodes, each for about as many steps as its source has tokens)."""
    return source_tokens * max(1, beam_size)


def cost_tier(cost: int) -> int:
    return max(0, math.ceil(math.log2(max(1, cost) / TIER_COST)))


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
    """What a request gets when a worker hook raises on it (its batch-mates are still served)."""
    return Failure(500, "internal_error", "the inference worker failed on this request; the server logged why")


def for_one_request(hook: str, request_id: str, fn, *args):
    """fn(*args) for one request of a batch, or internal_failure() if it raises: raised in a LitAPI hook, the
    exception would fail every request of the batch."""
    try:
        return fn(*args)
    except Exception:
        log.exception("%s failed for request %s", hook, request_id)
        return internal_failure()


@dataclass
class Job:
    """One request, tokenized."""
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
    started: float = 0.0                  # when its plan took it, when its last sentence was done (monotonic)
    finished: float = 0.0


@dataclass
class EngineBatch:
    model: str
    options: SearchOptions
    rows: list[tuple[int, int]]           # (job key, sentence index)
    src_ids: list[list[int]]
    tier: int = 0                         # cost_tier of its requests
    steps: Generator | None = None        # its search, once started (Engine.search_steps)
    t0: float = 0.0                       # when it started (perf_counter)


@dataclass
class Plan:
    jobs: dict[int, Job | Failure]        # by key; the worker's loop forgets a job once it is answered
    batches: list[EngineBatch]            # not finished yet, in the order they run (lowest tier first)
    started: float
    fresh: set[int] = field(default_factory=set)     # keys that may have become answerable
    lent: float = 0.0                     # seconds the first batch ran while a started one waited (LEND_S)
    next_key: int = 0


class TranslateAPI(ls.LitAPI):
    def __init__(self, settings: Settings, board: CancelBoard, stopping: Stopping | None = None):
        super().__init__(max_batch_size=settings.max_batch_size, batch_timeout=settings.batch_timeout_ms / 1000,
                         api_path="/translate", loop=PromptBatchedLoop())
        self.settings = settings
        self.board = board      # requests whose client went away: skipped before each engine batch
        self.stopping = stopping   # None outside a server (tests): the signals are left alone

    # --- worker start-up -------------------------------------------------------------------------
    def setup(self, device: str) -> None:
        self.board.worker_started(ENDPOINT)   # first: the gateway fails what a dead predecessor held
        if self.stopping is not None:   # SIGINT, SIGTERM: stop once the main process has drained
            self.stopping.guard(die)
        lower_worker_priority(self.settings)
        provider = "cuda" if str(device).startswith("cuda") else "cpu"
        if self.settings.device == "cpu":
            provider = "cpu"
        self.engines: dict[str, Engine] = {}
        self.routes: dict[tuple[str, str], str] = {}
        for path in self.settings.model_paths:
            package = load_package(path)
            if package.meta.get("task", "translation") != "translation":
                continue  # served by GenerateAPI's workers
            engine = Engine(package, device=provider, intra_op_threads=self.settings.threads,
                            spin_wait=self.settings.spin_wait)
            name = engine.package.name
            self.engines[name] = engine
            for d in engine.directions:
                src, tgt = d.split("-")
                self.routes.setdefault((src, tgt), name)
            metrics().model_info.labels(model=name, directions=",".join(engine.directions),
                                  precision=engine.package.meta["precision"], provider=engine.device_type).set(1)
        # Warm-up: the first run of an onnxruntime session allocates and optimises; do it before /ready.
        for (src, tgt), name in self.routes.items():
            self.engines[name].translate(["Hallo Welt."] if src == "de" else ["Hello world."],
                                         source_lang=src, target_lang=tgt, beam_size=2, max_length=8)
        log.info("worker ready: %s", {f"{s}-{t}": n for (s, t), n in self.routes.items()})

    # --- per request -----------------------------------------------------------------------------
    def decode_request(self, request: dict) -> Job | Failure:
        return for_one_request("decode_request", request.get("request_id", ""), self._decode, request)

    def _decode(self, request: dict) -> Job | Failure:
        s = self.settings
        pair = (request["source_lang"], request["target_lang"])
        name = self.routes.get(pair)
        if name is None:
            valid = ", ".join(f"{a}-{b}" for a, b in sorted(self.routes))
            return Failure(400, "unsupported_language_pair",
                           f"no model translates {pair[0]}-{pair[1]}; available pairs: {valid}")
        engine = self.engines[name]
        d = DEFAULTS
        beam = request.get("beam_size", d.beam_size)
        n_alt = request.get("num_alternatives", 0)   # < beam_size: TranslateRequest checked it
        options = SearchOptions(
            beam_size=beam, num_hypotheses=n_alt + 1 if beam > 1 else 1,
            length_penalty=request.get("length_penalty", d.length_penalty),
            max_length=min(request.get("max_length") or s.max_output_tokens, s.max_output_tokens),
            no_repeat_ngram_size=request.get("no_repeat_ngram_size", d.no_repeat_ngram_size),
            repetition_penalty=request.get("repetition_penalty", d.repetition_penalty))
        texts = request["texts"]
        sentences, spans, seps = [], [], []
        for text in texts:
            sents, sep = split_sentences(text)
            spans.append((len(sentences), len(sentences) + len(sents)))
            seps.append(sep)
            sentences.extend(sents)
        ids = engine.source_ids(sentences, pair[1])
        longest = max(len(x) for x in ids)
        if longest > s.max_sentence_tokens:
            return Failure(413, "too_many_tokens", f"a sentence has {longest} tokens; the limit is "
                           f"{s.max_sentence_tokens} per sentence (split it)", s.max_sentence_tokens)
        total = sum(len(x) for x in ids)
        if total > s.max_request_tokens:
            return Failure(413, "too_many_tokens", f"the request has {total} source tokens; the limit is "
                           f"{s.max_request_tokens} (send fewer or shorter texts)", s.max_request_tokens)
        cost = request_cost(total, beam)
        if cost > s.max_request_cost:
            return Failure(413, "request_too_costly", f"the request costs {cost} (source tokens {total} x beam_size "
                           f"{beam}); the limit is {s.max_request_cost} (send fewer or shorter texts, or a smaller "
                           "beam_size)", s.max_request_cost)
        return Job(request.get("request_id", ""), name, pair[0], pair[1], options, ids, spans, seps,
                   request.get("received", time.monotonic()), request.get("number", 0), cost)

    def batch(self, jobs: list[Job | Failure]) -> Plan:
        """A plan for these requests: their engine batches, lowest cost tier first."""
        plan = Plan({}, [], time.monotonic())
        self.admit(plan, jobs)
        return plan

    def admit(self, plan: Plan, jobs: list[Job | Failure]) -> list[int]:
        """Adds requests to a plan, also one under way (between two decoder steps); their keys in
        plan.jobs. Their sentences join the engine batches not started yet (cut again, so requests that
        arrive while a batch runs are batched together), which go before any of a higher cost tier,
        started or not."""
        metrics().batch_requests.labels(ENDPOINT).observe(len(jobs))
        keys = list(range(plan.next_key, plan.next_key + len(jobs)))
        plan.next_key += len(jobs)
        plan.jobs.update(zip(keys, jobs))
        plan.fresh.update(keys)
        now = time.monotonic()
        rows = [r for eb in plan.batches if eb.steps is None for r in eb.rows if r[0] in plan.jobs]
        for j, job in zip(keys, jobs):
            if isinstance(job, Job):
                job.hyps, job.left, job.started = [None] * len(job.sentences), len(job.sentences), now
                rows += [(j, k) for k in range(len(job.sentences))]
        plan.batches = [eb for eb in plan.batches if eb.steps is not None] + self._engine_batches(plan, rows)
        plan.batches.sort(key=lambda eb: eb.tier)    # stable: within a tier, first come first served
        return keys

    def _engine_batches(self, plan: Plan, all_rows: list[tuple[int, int]]) -> list[EngineBatch]:
        """Sentences (job key, index) grouped by (model, options, cost tier), sorted by length, cut by token
        budget."""
        jobs = plan.jobs
        groups: dict[tuple, list[tuple[int, int]]] = {}
        for j, k in all_rows:
            job = jobs[j]
            groups.setdefault((job.model, job.options.batch_key(), cost_tier(job.cost)), []).append((j, k))
        batches = []
        for (model, _, tier), rows in groups.items():
            options = jobs[rows[0][0]].options
            rows.sort(key=lambda r: len(jobs[r[0]].sentences[r[1]]))
            budget = max(1, self.settings.max_batch_tokens // max(1, options.beam_size))
            on_cpu = getattr(self.engines.get(model), "device_type", "cpu") == "cpu"
            most = max(1, CPU_BATCH_ROWS // max(1, options.beam_size)) if on_cpu else len(rows)
            chunks: list[list[tuple[int, int]]] = [[]]
            for r in rows:
                width = len(jobs[r[0]].sentences[r[1]])  # sorted: the newest row is the widest
                if chunks[-1] and (width * (len(chunks[-1]) + 1) > budget or len(chunks[-1]) == most):
                    chunks.append([])
                chunks[-1].append(r)
            batches += [EngineBatch(model, options, c, [jobs[a].sentences[b] for a, b in c], tier) for c in chunks]
        return batches

    def _drop_cancelled(self, plan: Plan, eb: EngineBatch) -> EngineBatch:
        """eb without the sentences of requests whose client has gone (they get a 499 no one reads), or
        that are already answered (failed)."""
        jobs = sorted({j for j, _ in eb.rows if j in plan.jobs and plan.jobs[j].failure is None})
        gone = {j for j, g in zip(jobs, self.board.cancelled(np.array([plan.jobs[j].number for j in jobs])))
                if g and plan.jobs[j].number}
        for j in gone:
            plan.jobs[j].failure = Failure(499, "client_closed_request", "the client went away")
            plan.fresh.add(j)
        keep = [i for i, (j, _) in enumerate(eb.rows) if j in plan.jobs and j not in gone
                and plan.jobs[j].failure is None]
        if len(keep) == len(eb.rows):
            return eb
        return EngineBatch(eb.model, eb.options, [eb.rows[i] for i in keep], [eb.src_ids[i] for i in keep], eb.tier)

    def advance(self, plan: Plan) -> None:
        """One step of the plan's first engine batch (or of a batch it preempts that is owed time, see
        LEND_S): its encoder and first decoder step when it has not started (its cancelled requests
        dropped first), else its next decoder step. Call while plan.batches; take_finished() then says
        which requests can be answered."""
        i, lending = self._next_batch(plan)
        eb = plan.batches[i]
        if eb.steps is None:
            eb = plan.batches[i] = self._drop_cancelled(plan, eb)
            if not eb.rows:
                plan.batches.pop(i)
                return
            eb.t0 = time.perf_counter()
        t0 = time.perf_counter()
        try:
            if eb.steps is None:
                eb.steps = self.engines[eb.model].search_steps(eb.src_ids, eb.options)
            next(eb.steps)
            return
        except StopIteration as done:
            results = done.value
        except Exception:  # one bad engine batch must not take its requests' batch-mates down
            log.exception("engine batch of %d sentences failed; retrying one by one", len(eb.rows))
            results = self._one_by_one(eb)
        finally:
            plan.lent += (time.perf_counter() - t0) * (-1 if i else int(lending))
        plan.batches.pop(i)
        metrics().inference.labels(ENDPOINT, eb.model).observe(time.perf_counter() - eb.t0)
        metrics().batch_sentences.labels(ENDPOINT, eb.model).observe(len(eb.rows))
        for (j, k), hyps in zip(eb.rows, results):
            job = plan.jobs.get(j)
            if job is None:        # answered already (failed in another engine batch)
                continue
            if hyps is None and job.failure is None:
                job.failure = Failure(500, "internal_error", "the engine failed on this text")
            job.hyps[k] = hyps
            job.left -= 1
            plan.fresh.add(j)

    @staticmethod
    def overtakable(plan: Plan) -> bool:
        """Whether a one-word request arriving now would run before the batch under way (one above tier 0):
        only then does the worker's loop look for new requests between steps (others wait for the next take)."""
        return bool(plan.batches) and plan.batches[0].tier > 0

    @staticmethod
    def _next_batch(plan: Plan) -> tuple[int, bool]:
        """(0, whether the first batch runs while a started one waits behind it), or (i, False) for a
        started batch behind it once the batches ahead have run LEND_S more than it since it was paused:
        then they share the worker, so a stream of small requests cannot hold a large one back for ever."""
        paused = next((i for i, eb in enumerate(plan.batches[1:], 1) if eb.steps is not None), None)
        if paused is None:
            plan.lent = 0.0
            return 0, False
        return (paused, False) if plan.lent > LEND_S else (0, True)

    def _one_by_one(self, eb: EngineBatch) -> list[list[Hypothesis] | None]:
        engine, results = self.engines[eb.model], []
        for src in eb.src_ids:
            try:
                results.append(engine.search([src], eb.options)[0])
            except Exception:
                log.exception("sentence failed")
                results.append(None)
        return results

    def take_finished(self, plan: Plan) -> list[int]:
        """Keys of the requests that can be answered now (every sentence done, or failed), each once."""
        out = []
        for j in sorted(plan.fresh):
            job = plan.jobs[j]
            if isinstance(job, Failure) or job.failure is not None or job.left == 0:
                if isinstance(job, Job):
                    job.finished = time.monotonic()
                out.append(j)
        plan.fresh.clear()     # the others come back when their next sentence is done
        return out

    def predict(self, plan: Plan) -> list[Job | Failure]:
        """The whole plan at once (the worker's loop runs it step by step instead; see the docstring)."""
        while plan.batches:
            self.advance(plan)
        self.take_finished(plan)
        return list(plan.jobs.values())

    def unbatch(self, output: list[Job | Failure]) -> list[Job | Failure]:
        return output

    def encode_response(self, job: Job | Failure) -> dict:
        if isinstance(job, Failure):
            return job.to_dict()
        if job.failure is not None:
            return job.failure.to_dict()
        out = for_one_request("encode_response", job.request_id, self._encode, job)
        return out.to_dict() if isinstance(out, Failure) else out

    def _encode(self, job: Job) -> dict:
        engine = self.engines[job.model]
        items = []
        n_in = n_out = 0
        for (start, end), seps in zip(job.text_spans, job.separators):
            sent_hyps = job.hyps[start:end]
            best = [h[0] for h in sent_hyps]
            text = join_sentences([engine.detokenize(h.tokens) for h in best], seps)
            alternatives = []
            for a in range(1, job.options.num_hypotheses):
                # For a split text the k-th alternative joins each sentence's k-th hypothesis.
                pieces = [h[a] if a < len(h) else h[0] for h in sent_hyps]
                alternatives.append({"text": join_sentences([engine.detokenize(h.tokens) for h in pieces], seps),
                                     "score": float(np.mean([h.score for h in pieces]))})
            tokens_in = sum(len(x) for x in job.sentences[start:end])
            tokens_out = sum(len(h.tokens) for h in best)
            n_in, n_out = n_in + tokens_in, n_out + tokens_out
            items.append({"text": text, "score": float(np.mean([h.score for h in best])),
                          "alternatives": alternatives, "input_tokens": tokens_in, "output_tokens": tokens_out})
        metrics().input_tokens.labels(ENDPOINT, job.model).inc(n_in)
        metrics().output_tokens.labels(ENDPOINT, job.model).inc(n_out)
        return {"translations": items, "model": job.model, "source_lang": job.source_lang,
                "target_lang": job.target_lang,
                "timings": {"queue_ms": round((job.started - job.received) * 1000, 2),
                            "inference_ms": round((job.finished - job.started) * 1000, 2)}}


def check_packages(settings: Settings) -> list[dict]:
    """Reads every package's model.json (and checksums) in the HTTP process, so a broken package stops
    the server before any worker starts, with a message naming the file."""
    out = []
    for path in settings.model_paths:
        pkg = load_package(path)
        out.append({"name": pkg.name, "path": str(Path(path)), "task": pkg.meta.get("task", "translation"),
                    "directions": pkg.meta["directions"], "precision": pkg.meta["precision"],
                    "config": pkg.meta["config"], "training": pkg.meta.get("training", {})})
    return out
