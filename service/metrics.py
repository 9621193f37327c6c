"""Every Prometheus metric the service exports, in one place, prefix `transerve_`, units in names.

LitServe runs HTTP servers and inference workers in separate processes, so the metrics use
prometheus-client's multiprocess mode: each process writes to files under
PROMETHEUS_MULTIPROC_DIR and `/metrics` merges them. `configure()` must run before this module
is imported anywhere (the CLI does it first thing), which is why the metric objects are created
lazily by `metrics()` rather than at import time.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

PREFIX = "transerve_"

# Latency buckets, seconds: from a 1 ms cache hit to a 60 s long document.
SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Per-token pace, seconds: 1 ms (a GPU) to 1 s (an overloaded CPU).
TOKEN_SECONDS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_COUNTS = (1, 4, 16, 64, 128, 256, 512, 1024, 4096)
# Rows in one decoder call: 1 (a greedy sentence alone) to a GPU's batches (--max-batch-tokens).
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
# A document job's wait for its turn, seconds: none (the server had a place free) to minutes behind other documents.
QUEUED_SECONDS = (0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


def configure(directory: str | None = None) -> str:
    """Points prometheus-client at a fresh multiprocess directory (inherited by spawned workers)."""
    directory = directory or os.environ.get("PROMETHEUS_MULTIPROC_DIR") or tempfile.mkdtemp(prefix="transerve-metrics-")
    path = Path(directory)
    if path.exists():
        # Files of a previous run would be summed into this one's counters.
        shutil.rmtree(path)
    path.mkdir(parents=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)
    return str(path)


@lru_cache(maxsize=None)
def labelled(metric, *values: str):
    """metric.labels(*values), made once per label set: prometheus_client's labels() takes a lock and checks its
    arguments at every call, nine times a /translate request on the HTTP process's path. The label sets are few
    (endpoints, statuses, key names), so they are all kept."""
    return metric.labels(*values)


def metric_classes() -> tuple:
    """prometheus_client's Counter, Gauge and Histogram, their values written as prometheus_bridge.FastValue writes
    them (installed before the first metric is made)."""
    from prometheus_client import Counter, Gauge, Histogram

    from .prometheus_bridge import install
    install()
    return Counter, Gauge, Histogram


@lru_cache(maxsize=None)
def metrics() -> SimpleNamespace:
    """The metric objects of this process."""
    Counter, Gauge, Histogram = metric_classes()

    p = PREFIX
    return SimpleNamespace(
        requests=Counter(p + "requests_total", "HTTP requests answered, by endpoint and status code",
                         ["endpoint", "status"]),
        request_duration=Histogram(p + "request_duration_seconds", "End-to-end request latency",
                                   ["endpoint"], buckets=SECONDS),
        queue_wait=Histogram(p + "queue_wait_seconds", "Time from request arrival to the start of its batch",
                             ["endpoint"], buckets=SECONDS),
        inference=Histogram(p + "inference_duration_seconds", "Time an inference worker spends on one batch",
                            ["endpoint", "model"], buckets=SECONDS),
        batch_requests=Histogram(p + "batch_size_requests", "Requests per batch an inference worker takes",
                                 ["endpoint"], buckets=BATCH_SIZES),
        batch_sentences=Histogram(p + "batch_size_sentences", "Sentences decoded together in one engine call",
                                  ["endpoint", "model"], buckets=BATCH_SIZES),
        input_tokens=Counter(p + "input_tokens_total", "Source tokens read", ["endpoint", "model"]),
        output_tokens=Counter(p + "output_tokens_total", "Target tokens written", ["endpoint", "model"]),
        glossary_entries=Counter(p + "glossary_entries_total", "Glossary entries matched in a text, by whether the "
                                 "translation held the target term (held, missed)", ["model", "result"]),
        in_flight=Gauge(p + "requests_in_flight", "Requests received and not yet answered",
                        ["endpoint"], multiprocess_mode="livesum"),
        queue_depth=Gauge(p + "queue_depth_requests", "Requests waiting for an inference worker",
                          ["endpoint"], multiprocess_mode="livesum"),
        errors=Counter(p + "errors_total",
                       "Failed requests by kind (validation, auth, limit, client_closed, overload, timeout, internal)",
                       ["endpoint", "kind"]),
        model_info=Gauge(p + "model_info", "Loaded model packages (value 1)",
                         ["model", "directions", "precision", "provider"], multiprocess_mode="liveall"),
        worker_starts=Counter(p + "inference_worker_starts_total", "Inference worker starts (each restart inside "
                              "the pod adds 1)", ["endpoint", "worker"]),
        rejected=Counter(p + "requests_rejected_total", "Requests refused because the queue was full", ["endpoint"]),
        cancelled=Counter(p + "requests_cancelled_total", "Requests whose client went away before the answer "
                          "(work not yet started for them is skipped)", ["endpoint"]),
        # Generation: what a streaming user feels (first piece) and the pace after it.
        time_to_first_token=Histogram(p + "time_to_first_token_seconds",
                                      "From request arrival to its first generated piece", ["endpoint", "model"],
                                      buckets=SECONDS),
        time_per_output_token=Histogram(p + "time_per_output_token_seconds",
                                        "Mean time between generated pieces of one request, after the first",
                                        ["endpoint", "model"], buckets=TOKEN_SECONDS),
        generated_tokens=Counter(p + "generated_tokens_total", "Generated pieces by why their sequence ended",
                                 ["model", "finish_reason"]),
        # Per API key, by its name (service/keyfile.py; "anonymous" on a server without keys), never the key.
        key_requests=Counter(p + "key_requests_total", "HTTP requests answered, by key name, endpoint and status",
                             ["key", "endpoint", "status"]),
        key_characters=Counter(p + "key_characters_total", "Translation characters sent, by key name", ["key"]),
        key_tokens=Counter(p + "key_tokens_total", "Generation tokens (prompt and generated), by key name", ["key"]),
        key_rate_limited=Counter(p + "key_rate_limited_total", "Requests refused with 429, by key name and limit",
                                 ["key", "limit"]),
        # Requests decided without the limits' store (Redis unreachable or slow), by what --redis-down made of them.
        ratelimit_store_errors=Counter(p + "ratelimit_store_errors_total", "Requests whose limits Redis could not "
                                       "check in time, by outcome (admitted, refused)", ["outcome"]),
        **_document_metrics(p),
        **_translation_cache_metrics(p),
        **_model_control_metrics(p),
        **_scheduler_metrics(p),
    )


def _translation_cache_metrics(p: str) -> dict:
    """The translation cache (service/http/translation_cache.py), counted in units: a sentence, or a text that is
    cached whole; each distinct unit of a request once."""
    from prometheus_client import Counter, Gauge

    return {
        "translation_cache_hits": Counter(
            p + "translation_cache_hits_total", "Sentences answered from the translation cache, by where they were "
            "found (memory, redis)", ["tier"]),
        "translation_cache_misses": Counter(
            p + "translation_cache_misses_total", "Sentences the translation cache did not hold, sent to a worker"),
        "translation_cache_evictions": Counter(
            p + "translation_cache_evictions_total", "Sentences dropped from an HTTP process's translation cache to "
            "stay within --cache-size and --cache-bytes"),
        "translation_cache_store_errors": Counter(
            p + "translation_cache_store_errors_total", "Translation cache reads and writes Redis failed or did not "
            "answer in time (a read: misses)"),
        "translation_cache_redis_skipped": Counter(
            p + "translation_cache_redis_skipped_total", "Translation cache reads and writes not sent to Redis: "
            "backed off after a failure (backoff; a read: misses), or the writes' queue full (queue_full)",
            ["reason"]),
        "translation_cache_resent": Counter(
            p + "translation_cache_resent_total", "Requests partly kept sent again whole: another version answered "
            "their misses than the one their kept sentences came from (a swap in between)"),
        # livesum: the caches of the HTTP processes alive now
        "translation_cache_bytes": Gauge(
            p + "translation_cache_bytes", "Memory the HTTP processes' translation caches hold (answers, keys and "
            "their bookkeeping)", multiprocess_mode="livesum"),
        "translation_cache_entries": Gauge(
            p + "translation_cache_entries", "Sentences the HTTP processes' translation caches hold",
            multiprocess_mode="livesum"),
    }


def _model_control_metrics(p: str) -> dict:
    """Model control (service/http/model_control.py): the version label is the operator's version id, never client
    data."""
    from prometheus_client import Counter, Histogram

    return {
        "model_loads": Counter(p + "model_loads_total", "Model versions asked to load through model control, by "
                               "result: loaded, refused (before any worker loaded it: unreadable, not fitting, busy), "
                               "failed (a worker's load or check)", ["result"]),
        "version_requests": Counter(p + "model_version_requests_total", "Translation requests by model, the version "
                                    "that answered (or was routed to) and outcome (ok or the error kind)",
                                    ["model", "version", "outcome"]),
        "version_duration": Histogram(p + "model_version_request_duration_seconds", "A translation request's time "
                                      "from its queueing to its answer, by model and version", ["model", "version"],
                                      buckets=SECONDS),
    }


def _document_metrics(p: str) -> dict:
    """DeepL's document jobs (service/api/deepl_documents.py), counted by the HTTP process that runs each."""
    from prometheus_client import Counter, Gauge, Histogram

    return {
        "document_jobs": Counter(p + "document_jobs_total", "DeepL document jobs by the state each reached: queued "
                                 "(uploaded), done, error", ["state"]),
        "document_queue_wait": Histogram(p + "document_queue_wait_seconds", "From a document's upload to the start "
                                         "of its translation", buckets=QUEUED_SECONDS),
        # livesum: the jobs of the HTTP processes alive now (a process that died holds none: its leases run out)
        "document_jobs_active": Gauge(p + "document_jobs_active", "DeepL document jobs this server's HTTP processes "
                                      "hold now, by state: queued (waiting for a place to translate), translating",
                                      ["state"], multiprocess_mode="livesum"),
    }


def _scheduler_metrics(p: str) -> dict:
    """Each inference worker's scheduler (service/worker/watch.py): how full its decoder calls are."""
    from prometheus_client import Gauge, Histogram

    return {
        "running_rows": Gauge(p + "scheduler_running_rows", "Rows decoding now (sentences x beams, or sequences) "
                              "in the batches an inference worker has started", ["endpoint", "model"],
                              multiprocess_mode="livesum"),
        "waiting_requests": Gauge(p + "scheduler_waiting_requests", "Requests an inference worker has taken off "
                                  "the queue that have no row decoding yet (those still queued: "
                                  "transerve_queue_depth_requests)", ["endpoint"], multiprocess_mode="livesum"),
        "cache_bytes": Gauge(p + "cache_bytes", "Key/value cache held by the searches running now (self-attention "
                             "and the encoder's cross-attention keys and values, as reserved for each search's "
                             "longest output)", ["endpoint", "model"], multiprocess_mode="livesum"),
        "step_batch_rows": Histogram(p + "step_batch_rows", "Rows in one decoder call", ["endpoint", "model"],
                                     buckets=ROWS),
    }


# Series left out of every exposition, by what hides them: set in the main process before the HTTP processes fork,
# so that each one's /metrics and serve_metrics's thread leave out the same.
_HIDDEN: dict[str, Callable[[], Callable[[dict], bool]]] = {}


def hide_series(what: str, rule: Callable[[], Callable[[dict], bool]]) -> None:
    """At each exposition, `rule()` says by its labels which series have gone (model control's versions no longer
    served). This is what a labelled metric's remove() would do, which multiprocess mode cannot: remove() only forgets
    the calling process's child (prometheus_client warns so); its value stays in that process's file, which every
    exposition merges (a counter's even once the process has died). So a series that has gone is dropped where the
    files are merged, and its label is bounded by what serves now."""
    _HIDDEN[what] = rule


class _Without:
    """A collector's families less the samples `gone` names."""

    def __init__(self, collector, gone: list[Callable[[dict], bool]]):
        self.collector, self.gone = collector, gone

    def collect(self):
        for family in self.collector.collect():
            family.samples = [s for s in family.samples if not any(g(s.labels) for g in self.gone)]
            yield family


def render() -> tuple[bytes, str]:
    """The merged exposition of every process, for GET /metrics, less the series that have gone (hide_series)."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess

    registry = CollectorRegistry()
    merged = multiprocess.MultiProcessCollector(None)
    gone = [rule() for rule in _HIDDEN.values()]
    registry.register(_Without(merged, gone) if gone else merged)
    return generate_latest(registry), CONTENT_TYPE_LATEST


def serve_metrics(host: str, port: int) -> None:
    """GET /metrics on a port of its own, from a thread of the calling process (the server's main one,
    which lives as long as the server): for a scraper that holds no API key, on a port kept inside the
    cluster (deploy/k8s: the Service's `metrics` port, the NetworkPolicy)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics here")
                return
            body, ctype = render()
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):   # scrapes every few seconds: not worth a log line each
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()


def mark_process_dead(pid: int) -> None:
    """Drops a dead worker's live gauges (its counters stay, as Prometheus expects)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid)
