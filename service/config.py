"""Service settings: command-line flags, each with an environment-variable twin for Kubernetes.

Precedence: flag > TRANSERVE_<NAME> environment variable > default. `--model` may be given several
times; TRANSERVE_MODELS takes a comma-separated list. API keys may also come from a file
(`--api-keys-file`: one key per line, or keys with names and limits, service/keyfile.py), checked here at
start-up and re-read by the HTTP processes on SIGHUP and when it changes: a Kubernetes Secret mounted as a
file stays out of the environment, which child processes, crash reports and `/proc/PID/environ` expose.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from urllib.parse import urlsplit

from .keyfile import KeysFileError, plain_keys, read_keys_file, structured


@dataclass
class Settings:
    # Model package directories: by default both embedded packages, as scripts/serve.sh serves them, so
    # `python -m service` answers /translate (models/de-en) and /generate (models/lm-small) alike.
    models: list[str] = field(default_factory=lambda: ["models/de-en", "models/lm-small"])
    host: str = "127.0.0.1"
    port: int = 8000
    device: str = "auto"                # auto | cpu | cuda
    workers: int = 1                    # inference worker processes per device
    api_servers: int = 0                # HTTP server processes; 0: as the machine allows (server.api_servers)
    threads: int = 0                    # onnxruntime intra-op threads per worker (0 = all cores)
    # Off: the HTTP process shares the cores, and threads that busy-wait between operators take
    # them from it (2 cores, beam 4, 32 clients: 1,105-1,160 tok/s with 2 threads not spinning, 860-980
    # spinning; benchmarks/results/vs-ctranslate2-cpu.md).
    spin_wait: bool = False
    # Inference workers run this much nicer than the HTTP process: on saturated cores the HTTP process
    # (probes, hand-back of results) gets the CPU first. 2 cores, 2 workers, 32 clients: the hand-back
    # took 29 ms a request at 10, 47 ms at 0, for the same throughput (same results file).
    worker_nice: int = 10
    max_batch_size: int = 32            # requests one worker takes at once
    # After a worker takes a request, how long it waits for more. 0: a lone request starts at once, and
    # requests that arrive while a worker is busy still form its next batch (service/worker/litserve_bridge.py).
    batch_timeout_ms: float = 0.0
    max_batch_tokens: int = 8192        # what a translation worker's running batch holds at most (sentence_cost)
    max_texts: int = 64                 # texts per request
    max_text_chars: int = 10_000        # characters per text
    max_sentence_tokens: int = 256      # source tokens per sentence after splitting
    max_request_tokens: int = 8192      # source tokens per request
    # Source tokens x beam_size per request (/generate: (prompt + max_new_tokens) x rows); beyond: 413.
    # 8192 tokens at the default beam 4; the 64 x 341 characters at beam 16 cost 130,432.
    max_request_cost: int = 32768
    max_queue: int = 256                # requests waiting or running, over all HTTP processes; beyond: 503
    request_timeout_s: float = 60.0     # longest a request may wait in the queue; then 504
    drain_timeout_s: float = 30.0       # on SIGINT or SIGTERM: how long admitted requests may take to finish
    max_payload_bytes: int = 1_000_000  # request body size; beyond: 413
    # Documents (LibreTranslate's POST /translate_file, and `transerve translate`'s docx/pptx/odt/odp; the checks
    # are service/documents/container.py's). A file's own body limit is max_file_bytes, not max_payload_bytes.
    max_file_bytes: int = 20_000_000          # a document as uploaded; beyond: 413
    max_file_unpacked_bytes: int = 100_000_000  # a zip's entries decompressed, together (a zip bomb's); beyond: 413
    max_file_entries: int = 10_000            # a zip's entries; beyond: 413
    max_file_elements: int = 300_000          # XML start tags in a document (a million runs); beyond: 413
    max_file_texts: int = 5_000               # texts to translate in a document (paragraphs, cells); beyond: 413
    # How long a translated file waits to be downloaded, then it is deleted (LibreTranslate's: 30 minutes); and
    # where: a directory of this host only (empty: transerve-files-<uid> in the system's temporary directory).
    file_ttl_s: float = 1800.0
    file_dir: str = ""
    # A DeepL document job's lease (service/http/document_jobs.py): the server translating it renews it every third
    # of this; a job whose lease has run out is failed by whichever replica is asked about it next ("the server
    # translating it stopped"). Long enough for a busy server's renewal to arrive, short enough that a client
    # polling every 5 s learns of a dead server within a few polls.
    document_lease_s: float = 30.0
    # DeepL document jobs one key may have queued or translating at once, over all replicas (0: no cap). Each is a
    # file of up to --max-file-bytes kept in the store and a place in a server's few translating slots: without a
    # cap one key's burst of uploads fills both, and every other key's documents wait behind it.
    max_document_jobs_per_key: int = 8
    # Where this host keeps what must outlive a restart without --redis-url: the stored glossaries' SQLite file
    # (service/http/glossary_store.py), DeepL's document jobs' (service/http/document_jobs.py). Empty:
    # $XDG_DATA_HOME/transerve, or ~/.local/share/transerve (data_path).
    data_dir: str = ""
    # Every connection bounded at the server (docs/serving.md, "Slow clients"; service/http/uvicorn_bridge.py).
    header_timeout_s: float = 10.0      # request line and headers, from the first byte; then 408 and close
    # A request's line and headers as sent, and its header fields; beyond either: 431 and close. nginx's
    # default buffers hold 32 KiB of headers; 100 fields is Apache's LimitRequestFields.
    max_header_bytes: int = 32768
    max_headers: int = 100
    body_timeout_s: float = 30.0        # the whole body, from the end of the headers; then 408 and close
    keep_alive_timeout_s: float = 5.0   # an idle connection between requests is closed after this
    max_connections: int = 1024         # open connections per HTTP process; beyond: the longest waiting closed
    max_output_tokens: int = 512        # hard cap on tokens written per sentence (and per generation)
    max_prompt_tokens: int = 512        # generation prompt tokens
    api_keys: list[str] = field(default_factory=list)  # empty = no authentication
    # More keys: one per line (# comments, blank lines ignored), or the structured form with names and limits
    # (service/keyfile.py); re-read on SIGHUP and when it changes (service/http/keys.py).
    api_keys_file: str = ""
    # Keys for the admin routes (/admin/models: model control, service/http/model_control.py), in a file of their
    # own (either form of service/keyfile.py), never users' keys; re-read like api_keys_file. Empty: they answer 403.
    admin_keys_file: str = ""
    # What the inference workers' model versions may hold together, in bytes, checked before a version is loaded
    # beside those serving (0: the memory the machine, or the container's cgroup, has available).
    model_memory_bytes: int = 0
    # The translation versions wanted (service/http/models_file.py): applied through model control when the file
    # changes and on SIGHUP. Empty: only the admin routes change them.
    models_file: str = ""
    # Where the keys' usage is counted, shared by every replica (service/http/quota.py); empty: in this
    # process's memory, so each replica (and each of its --api-servers) counts alone.
    redis_url: str = ""
    # The longest a request waits on Redis for its limits, and what it gets while Redis cannot answer:
    # "admit" (limits off until Redis is back) or "refuse" (429 with Retry-After: 1). Never a 5xx.
    redis_timeout_ms: float = 100.0
    redis_down: str = "admit"
    # The translation cache (service/http/translation_cache.py; docs/serving.md, "Translation cache"): answers kept
    # per sentence in each HTTP process's memory, and in Redis with --redis-url. Off by default (0), as LibreTranslate's
    # --translation-cache and Triton's response cache are: it keeps translations after their request (each key's
    # under its own entries), and load tests and benchmarks that repeat their texts would measure it instead of the
    # engine. An operator turns it on.
    cache_size: int = 0                 # sentences each HTTP process keeps; 0 = no cache at all (nor Redis's)
    # Each HTTP process's cache in bytes (answers, keys and their bookkeeping): a de-en sentence's answer costs about
    # 400, so 64 MiB holds some 150,000, beside the HTTP process's own 200-300 MB.
    cache_bytes: int = 64 * 2**20
    cache_ttl_s: float = 86_400.0       # how long an answer stays in Redis (memory is bounded by the two above)
    # What a key protects (README, "API keys"): everything but the probes. /metrics goes to its own port
    # for the cluster's scraper when metrics_port is set (0: on the main port, behind the key).
    metrics_port: int = 0
    public_docs: bool = False           # True: /docs, /openapi.json and /info open to all even with keys
    log_level: str = "info"
    # text: lines for a person at a terminal; json: one object per line for a log pipeline, with an access line
    # per request (service/logs.py). Never a key, never a request's text, in either.
    log_format: str = "text"
    access_log: bool = True             # an access line per request, in either format (logs.access)

    @property
    def model_paths(self) -> list[Path]:
        return [Path(p) for p in self.models]

    def public(self) -> dict:
        """Settings safe to show on /info (no keys)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("api_keys", "redis_url")}
        out["auth"] = self.keyed
        out["redis"] = bool(self.redis_url)   # its URL may hold a password
        return out

    def document_limits(self) -> dict:
        """The documents' limits, as service/documents/limits.py's Limits takes them (config imports no layer)."""
        return {"max_bytes": self.max_file_bytes, "max_unpacked_bytes": self.max_file_unpacked_bytes,
                "max_entries": self.max_file_entries, "max_elements": self.max_file_elements,
                "max_texts": self.max_file_texts}

    @property
    def data_path(self) -> Path:
        """--data-dir, or where the XDG Base Directory spec puts an application's data: $XDG_DATA_HOME (when it
        is an absolute path, as the spec asks) or ~/.local/share, then transerve."""
        if self.data_dir:
            return Path(self.data_dir)
        base = os.environ.get("XDG_DATA_HOME", "")
        return (Path(base) if os.path.isabs(base) else Path.home() / ".local" / "share") / "transerve"

    @property
    def keyed(self) -> bool:
        """Whether requests need a key: keys given, or a keys file (whose structured form leaves api_keys empty)."""
        return bool(self.api_keys or self.api_keys_file)


_HELP = {
    "models": "model package directory (repeatable; requests are routed by language pair)",
    "host": "address to listen on (0.0.0.0: every interface, reachable from other machines)",
    "port": "port to listen on",
    "device": "auto (CUDA when available), cpu or cuda",
    "workers": "inference worker processes per device",
    "api_servers": "HTTP server processes (0: one on a CPU, where the workers take the cores; on a GPU one per 4 "
                   "cores the workers leave, up to 4; one while key limits are counted in memory, without "
                   "--redis-url)",
    "threads": "onnxruntime intra-op threads per worker (0 = all cores)",
    "spin_wait": "let onnxruntime's threads busy-wait between operators (lower latency on cores the HTTP "
                 "process does not need; off: they sleep)",
    "worker_nice": "how much lower the inference workers' CPU priority is than the HTTP process's (0-19; 0 = the same)",
    "max_batch_size": "requests an inference worker takes into one batch at most",
    "max_batch_tokens": "the cache a translation worker's running batch may hold, in token positions: each "
                        "sentence holds beam_size x (its padded source tokens + its output budget); a sentence "
                        "joins when it fits, else waits (one that never fits runs alone)",
    "max_texts": "texts (or prompts) per request; beyond: 413",
    "max_text_chars": "characters per text or prompt; beyond: 413",
    "max_sentence_tokens": "source tokens per sentence, once a text is split into sentences; beyond: 413",
    "max_request_tokens": "source tokens per translation request; beyond: 413",
    "max_queue": "requests waiting or running at once, over all HTTP processes; beyond: 503 with Retry-After",
    "request_timeout_s": "seconds a request may wait in the queue for a worker (then 504); twice this bounds its "
                         "whole wait for an answer (a generation's for each of its events)",
    "drain_timeout_s": "on SIGINT or SIGTERM (Ctrl+C, the process group or the main process): seconds admitted "
                       "requests may take to finish, while new ones get 503; those still running a second later are "
                       "cut (their connections closed) and every process stops",
    "max_payload_bytes": "bytes a request's body may take; beyond: 413 (a body declared larger is refused unread)",
    "max_file_bytes": "bytes a document may have (POST /libretranslate/translate_file, transerve translate); "
                      "beyond: 413",
    "max_file_unpacked_bytes": "bytes a document's zip entries may unpack to, together; beyond: 413 (a zip bomb)",
    "max_file_entries": "entries a document's zip may have; beyond: 413",
    "max_file_elements": "XML elements a document may have over all its parts; beyond: 413 (a million runs)",
    "max_file_texts": "texts (paragraphs, cells, headers, runs in other formatting) a document may have to "
                      "translate; beyond: 413",
    "file_ttl_s": "seconds a translated file is kept for its download, then deleted (LibreTranslate's "
                  "/translate_file, DeepL's /v2/document)",
    "document_lease_s": "seconds a DeepL document job's lease lasts (renewed every third of it by the server "
                        "translating it); a job whose server stops renewing is failed after it",
    "max_document_jobs_per_key": "DeepL document jobs one key may have queued or translating at once, over all "
                                 "replicas; beyond: 429 with Retry-After (0: no cap)",
    "file_dir": "directory for the translated files waiting to be downloaded (empty: transerve-files-<uid> in the "
                "system's temporary directory); only this host reads it",
    "data_dir": "directory for what outlives a restart without --redis-url: the stored glossaries' and DeepL "
                "document jobs' SQLite files, shared by this host's HTTP processes (empty: $XDG_DATA_HOME/transerve "
                "or ~/.local/share/transerve)",
    "max_output_tokens": "tokens written per sentence or generation at most, whatever a request asks",
    "max_prompt_tokens": "tokens a generation prompt may have; beyond: 413",
    "redis_url": "Redis to count the keys' usage in, shared by every replica (redis://[:password@]host:6379/0; "
                 "give it from a Secret); none: each process counts in its own memory",
    "redis_timeout_ms": ("the longest a request waits on Redis for its limits (then --redis-down applies) or a "
                         "translation cache lookup (then a miss, and the cache backs off)"),
    "redis_down": "while Redis cannot answer: admit (limits off until it is back) or refuse (429 with Retry-After)",
    "cache_size": "sentences the translation cache keeps in each HTTP process (least recently used out first); with "
                  "--redis-url also in Redis, shared by the replicas; 0 = no translation cache",
    "cache_bytes": "bytes each HTTP process's translation cache may hold (answers, keys and their bookkeeping)",
    "cache_ttl_s": "seconds a translation cache answer stays in Redis (with --redis-url)",
    "log_level": "critical, error, warning, info or debug",
    "log_format": "text (lines for a terminal) or json (one object per line)",
    "access_log": "an access line per request: its id, key name, method, route (the route's template, never the "
                  "path or query sent), status, characters, tokens and timings; never a key or a text",
    "batch_timeout_ms": "after an inference worker takes a request, how long it waits for more to join the batch "
                        "(0: it takes only those already queued; under load they queue while it is busy)",
    "max_request_cost": "a request's cost at most: source tokens x beam_size for /translate, (prompt tokens + "
                        "max_new_tokens) x beams or sequences for /generate; beyond: 413 naming the limit",
    "api_keys": "comma-separated API keys; when set, requests need one, as Authorization: Bearer KEY or "
                "X-API-Key: KEY (LibreTranslate's routes: or their api_key field)",
    "api_keys_file": "file of API keys, one per line (blank lines and # comments ignored), read at start-up and "
                     "added to --api-keys; a missing, unreadable or keyless file is an error",
    "admin_keys_file": "file of admin keys (either form of --api-keys-file) for the admin routes, /admin/models "
                       "(model control: load, replace, canary, promote, rollback, unload); users' keys are refused "
                       "there; none: those routes answer 403",
    "models_file": "YAML file of the translation model versions to serve, each with an optional canary; applied "
                   "without a restart when it changes and on SIGHUP (models it does not name are left as they are)",
    "model_memory_bytes": "bytes the inference workers' model versions may hold together; a version whose load "
                          "would pass it is refused (0: what the machine or the container has available)",
    "metrics_port": "serve /metrics on this port instead, with no key (for the cluster's scraper; keep the "
                    "port inside the cluster); 0 = /metrics on the main port, behind the API key when there is one",
    "public_docs": "with API keys set, leave /docs, /openapi.json and /info open (the probes always are)",
    "header_timeout_s": "seconds a request's line and headers may take, from the connection's opening or the "
                        "first byte after the previous answer; then 408 and the connection closes",
    "body_timeout_s": "seconds a request's whole body may take after its headers; then 408 and the connection closes",
    "max_header_bytes": "bytes a request's line and headers may take, as sent; beyond: 431 and the connection closes",
    "max_headers": "header fields a request may have; beyond: 431 and the connection closes",
    "keep_alive_timeout_s": "seconds an idle connection is kept open between requests (behind a proxy that "
                            "reuses connections, set it above the proxy's idle timeout)",
    "max_connections": "open connections per HTTP process (lowered to fit the file-descriptor limit); a new one "
                       "beyond it closes the one waiting longest on its client, so probes are still answered",
}


_worker_niced = False


def lower_worker_priority(settings: Settings) -> None:
    """Once per process (a worker's setup() may run again): the calling inference worker runs
    `settings.worker_nice` below the priority it started with (see Settings.worker_nice)."""
    global _worker_niced
    if not _worker_niced:
        os.nice(settings.worker_nice)
        _worker_niced = True


def _env_value(name: str, default):
    raw = os.environ.get(f"TRANSERVE_{name.upper()}")
    if raw is None:
        return default
    if isinstance(default, list):
        return [x.strip() for x in raw.split(",") if x.strip()]
    if isinstance(default, bool):
        word = raw.strip().lower()
        if word not in ("1", "true", "yes", "on", "0", "false", "no", "off", ""):
            raise SystemExit(f"TRANSERVE_{name.upper()} must be true or false, got {raw!r}")
        return word in ("1", "true", "yes", "on")
    return type(default)(raw)


def read_api_keys_file(path: str) -> list[str]:
    """The keys of a plain API keys file: one per line, surrounding whitespace stripped, blank lines and
    lines starting with # skipped; [] for the structured form (its keys have names and limits: keyfile.py).
    A file that cannot be read, is malformed or holds no key is refused (keyfile.read_keys_file)."""
    read_keys_file(path)
    text = Path(path).read_text(encoding="utf-8")
    return [] if structured(text) else plain_keys(text)


def check_admin_keys_file(p: argparse.ArgumentParser, path: str) -> None:
    """The admin keys file (--admin-keys-file, either form of the API keys file) read, or the parser's error saying
    why it cannot be used. A file not there (yet) is no error: model control stays off until it appears (a
    Kubernetes Secret mounted as optional), so a missing admin key never opens anything."""
    try:
        if path and os.path.exists(path):
            read_keys_file(path)
    except KeysFileError as e:
        p.error(str(e).replace("API keys file", "admin keys file"))


def redis_url_problem(url: str) -> str | None:
    """Why a --redis-url is not one Redis can be reached at, in words that never quote it (it may hold a password);
    None when it is one. Checked at start: such a URL made every request that reads Redis a 500, and one whose
    password held a / stopped the start with part of the password in the traceback."""
    u = urlsplit(url)
    encode = " (a password's /, # or ? must be percent-encoded: %2F, %23, %3F)"
    if url.split(":", 1)[0] not in ("redis", "rediss", "unix"):      # as written: redis-py refuses REDIS://
        return "must start with redis://, rediss:// or unix://"
    if u.scheme == "unix":
        return None if u.path else "names no socket path"
    try:
        u.port
    except ValueError:
        return "has a port that is not a number from 0 to 65535" + encode
    if not u.hostname:
        return "names no host" + encode
    if u.path.strip("/") and not u.path.strip("/").isdigit():
        return "has a database that is not a number" + encode
    return None


def parse_settings(argv: list[str] | None = None) -> Settings:
    defaults = Settings()
    p = argparse.ArgumentParser(prog="python -m service", description="Serve model packages over HTTP.")
    for f in fields(Settings):
        default = _env_value(f.name, getattr(defaults, f.name))
        flag = "--model" if f.name == "models" else "--" + f.name.replace("_", "-")
        secret = f.name in ("api_keys", "redis_url")   # never a key or a password itself
        shown = ("given" if default else "none") if secret else default
        help_text = f"{_HELP[f.name]} (env TRANSERVE_{f.name.upper()}; default {shown})"
        if isinstance(default, list):
            p.add_argument(flag, dest=f.name, action="append", default=None, help=help_text)
        elif isinstance(default, bool):
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        else:
            p.add_argument(flag, dest=f.name, type=type(default), default=default, help=help_text)
    args = p.parse_args(argv)
    values = {}
    for f in fields(Settings):
        v = getattr(args, f.name)
        if isinstance(getattr(defaults, f.name), list):
            v = (v if v is not None else _env_value(f.name, getattr(defaults, f.name)))
            if f.name == "api_keys":
                v = [k for item in v for k in item.split(",") if k]
        values[f.name] = v
    if values["api_keys_file"]:
        try:
            file_keys = read_api_keys_file(values["api_keys_file"])
        except KeysFileError as e:
            p.error(str(e))
        values["api_keys"] = values["api_keys"] + [k for k in file_keys if k not in values["api_keys"]]
    check_admin_keys_file(p, values["admin_keys_file"])
    s = Settings(**values)
    check_settings(p, s)
    return s


def check_settings(p: argparse.ArgumentParser, s: Settings) -> None:
    """Each setting's range (and the Redis URL's form): p.error, naming the flag, for the first out of it."""
    if s.device not in ("auto", "cpu", "cuda"):
        p.error(f"--device must be auto, cpu or cuda, got {s.device!r}")
    if s.metrics_port and s.metrics_port == s.port:
        p.error(f"--metrics-port must differ from --port ({s.port}), or be 0 for /metrics on the main port")
    if s.log_format not in ("text", "json"):
        p.error(f"--log-format must be text or json, got {s.log_format!r}")
    if s.redis_down not in ("admit", "refuse"):
        p.error(f"--redis-down must be admit or refuse, got {s.redis_down!r}")
    if not s.redis_timeout_ms > 0:
        p.error(f"--redis-timeout-ms must be more than 0, got {s.redis_timeout_ms}")
    if s.redis_url and (problem := redis_url_problem(s.redis_url)):
        p.error(f"--redis-url {problem}")      # never the URL itself: it may hold a password
    if s.cache_size < 0 or s.cache_bytes < 1 or not s.cache_ttl_s > 0:
        p.error(f"--cache-size must be 0 (off) or more, --cache-bytes at least 1 and --cache-ttl-s more than 0, got "
                f"{s.cache_size}, {s.cache_bytes} and {s.cache_ttl_s}")
    if not 0 <= s.worker_nice <= 19:
        p.error(f"--worker-nice must be between 0 and 19, got {s.worker_nice}")
    for name in ("header_timeout_s", "body_timeout_s", "keep_alive_timeout_s", "file_ttl_s", "document_lease_s"):
        if not getattr(s, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be more than 0, got {getattr(s, name)}")
    for name, zero in (("max_document_jobs_per_key", "no cap"), ("model_memory_bytes", "what is available"),
                       ("api_servers", "as the machine allows")):
        if getattr(s, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be 0 ({zero}) or more, got {getattr(s, name)}")
    for name in ("workers", "max_batch_size", "max_texts", "max_queue", "max_connections",
                 "max_request_cost", "max_header_bytes", "max_headers", "max_file_bytes", "max_file_unpacked_bytes",
                 "max_file_entries", "max_file_elements", "max_file_texts"):
        if getattr(s, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(s, name)}")
