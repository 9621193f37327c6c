"""The LitAPI behind POST /translate (and the LibreTranslate-compatible route, which feeds the same
queue): runs in each inference worker process, a thin adapter over the worker's scheduler.

    setup           load the translation packages, start a TranslationScheduler over them, warm up
    decode_request  validate against the loaded models, split texts into sentences, tokenize: a Job
    encode_response one JSON-ready dict per request

The worker's loop (litserve_bridge.SchedulerLoop) admits each decoded request into `self.scheduler`
(service/worker/translate_scheduler.py: the plan, cost tiers, steps, fairness), runs it step by step and encodes each
request as soon as the scheduler has finished it.

No hook raises for a single request: LitServe would fail the whole batch. A request that cannot
be served becomes a `Failure` value and travels to `encode_response`, which returns it as an error
dict; the HTTP layer turns that into the right status code. Batch-mates are untouched. An unexpected
exception in `decode_request` or `encode_response` becomes such a Failure too (500, logged).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

import litserve as ls
import numpy as np

from . import model_swap
from .cancel import CancelBoard
from ..config import Settings
from ..inference.engine import Engine
from ..shared.package import load_package
from .litserve_bridge import SchedulerLoop
from ..metrics import metrics
from .scheduler import Failure, for_one_request
from .glossary_terms import report, request_terms
from ..shared.kept_spans import Kept
from .translate_scheduler import Job, TranslationScheduler, request_cost
from ..shared.options import SearchOptions
from ..stopping import Stopping
from .process import start_worker
from ..shared.text import join_sentences, split_sentences

log = logging.getLogger("transerve")
ENDPOINT = TranslationScheduler.endpoint


class TranslateAPI(ls.LitAPI):
    def __init__(self, settings: Settings, board: CancelBoard, stopping: Stopping | None = None,
                 models: model_swap.ModelTable | None = None):
        super().__init__(max_batch_size=settings.max_batch_size, batch_timeout=settings.batch_timeout_ms / 1000,
                         api_path="/translate", loop=SchedulerLoop())
        self.settings = settings
        self.board = board      # shared with the HTTP processes: worker starts, requests whose client went away
        self.stopping = stopping   # None outside a server (tests): the signals are left alone
        self.models = models    # the served versions (worker/model_swap.py); None: the command line's packages
        self.provider = "cpu"
        self.loads = model_swap.Loads()   # a version loading in a thread, and the control messages waiting for it

    # --- worker start-up -------------------------------------------------------------------------
    def setup(self, device: str) -> None:
        start_worker(ENDPOINT, self.settings, self.board, self.stopping)
        provider = "cuda" if str(device).startswith("cuda") else "cpu"
        if self.settings.device == "cpu":
            provider = "cpu"
        self.provider = provider   # a version loaded later (model_swap.load) runs where these do
        engines: dict[str, Engine] = {}
        for slot, path in model_swap.served_paths(self):
            package = load_package(path)
            if package.meta.get("task", "translation") != "translation":
                continue  # served by GenerateAPI's workers
            engine = Engine(package, device=provider, intra_op_threads=self.settings.threads,
                            spin_wait=self.settings.spin_wait)
            engines[slot or engine.package.name] = engine
            metrics().model_info.labels(model=slot or engine.package.name, directions=",".join(engine.directions),
                                        precision=engine.package.meta["precision"],
                                        provider=engine.device_type).set(1)
        self.use_engines(engines)
        # Warm-up: the first run of an onnxruntime session allocates and optimises; do it before /ready.
        for (src, tgt), name in self.routes.items():
            self.engines[name].translate(["Hallo Welt."] if src == "de" else ["Hello world."],
                                         source_lang=src, target_lang=tgt, beam_size=2, max_length=8)
        log.info("worker ready: %s", {f"{s}-{t}": n for (s, t), n in self.routes.items()})

    def use_engines(self, engines: dict[str, Engine]) -> None:
        """Serves these engines (by package name; setup() loads them, a test may pass its own): the language
        pairs each translates, the first loaded winning a pair, and the scheduler that runs them."""
        self.engines = engines
        self.routes: dict[tuple[str, str], str] = {}
        for name, engine in engines.items():
            for d in engine.directions:
                src, tgt = d.split("-")
                self.routes.setdefault((src, tgt), name)
        self.scheduler = TranslationScheduler(engines, self.board, self.settings.max_batch_tokens)
        # Model control (worker/model_swap.py): each engine's (package name, version), the slots to unload once
        # no request uses them.
        self.versions: dict[str, tuple[str, str]] = self.models.versions() if self.models is not None else {}
        self.retiring: set[str] = set()

    def control(self, payload: dict, answer: Callable[[dict], None] | None = None) -> dict | None:
        """A model control message (a version loaded or unloaded). From the worker's loop (`answer` given): a load runs
        in a thread and is answered by `finish_loads` once done, the rest at once; without `answer`, here and now."""
        if answer is None:
            return model_swap.control(self, payload)
        model_swap.begin(self, payload, answer)
        return None

    def finish_loads(self) -> bool:
        """Between the loop's steps: a load done is installed and answered; whether one still runs."""
        return model_swap.finish_loads(self)

    # --- per request -----------------------------------------------------------------------------
    def decode_request(self, request: dict) -> Job | Failure:
        return for_one_request("decode_request", request.get("request_id", ""), self._decode, request)

    def _decode(self, request: dict) -> Job | Failure:
        s = self.settings
        pair = (request["source_lang"], request["target_lang"])
        if self.retiring:
            model_swap.collect_retired(self)
        name = model_swap.slot_for(self, request, pair)
        if name is None:
            valid = ", ".join(f"{a}-{b}" for a, b in sorted(self.routes))
            return Failure(400, "unsupported_language_pair",
                           f"no model translates {pair[0]}-{pair[1]}; available pairs: {valid}")
        engine = self.engines[name]
        options: SearchOptions = request["options"]   # mapped once, in the Gateway: to_search_options()
        beam = options.beam_size
        texts = request["texts"]
        sentences, spans, seps = [], [], []
        for text in texts:
            sents, sep = split_sentences(text)
            spans.append((len(sentences), len(sentences) + len(sents)))
            seps.append(sep)
            sentences.extend(sents)
        terms = request_terms(engine, sentences, request.get("glossary"), s.max_sentence_tokens,
                              beam=options.strategy == "beam")
        if isinstance(terms, Failure):
            return terms
        ids = engine.source_ids(terms.texts, pair[1])
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
                   request.get("received", time.monotonic()), request.get("number", 0), cost, terms=terms,
                   glossary=request.get("glossary") is not None)

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
            kept = job.terms.kept[start:end] if job.terms else [Kept("")] * (end - start)
            translated = [k.restore(engine.detokenize(h.tokens)) for k, h in zip(kept, best)]
            text = join_sentences(translated, seps)
            alternatives = []
            for a in range(1, job.options.num_hypotheses):
                # For a split text the k-th alternative joins each sentence's k-th hypothesis.
                pieces = [h[a] if a < len(h) else h[0] for h in sent_hyps]
                alternatives.append({"text": join_sentences([k.restore(engine.detokenize(h.tokens))
                                                             for k, h in zip(kept, pieces)], seps),
                                     "score": float(np.mean([h.score for h in pieces]))})
            tokens_in = sum(len(x) for x in job.sentences[start:end])
            tokens_out = sum(len(h.tokens) for h in best)
            n_in, n_out = n_in + tokens_in, n_out + tokens_out
            items.append({"text": text, "score": float(np.mean([h.score for h in best])),
                          "alternatives": alternatives, "input_tokens": tokens_in, "output_tokens": tokens_out})
            if job.glossary:
                items[-1]["glossary"] = report(job.terms, (start, end), translated, job.model)
        metrics().input_tokens.labels(ENDPOINT, job.model).inc(n_in)
        metrics().output_tokens.labels(ENDPOINT, job.model).inc(n_out)
        return {"translations": items, **model_swap.answer_fields(self, job.model), "source_lang": job.source_lang,
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
