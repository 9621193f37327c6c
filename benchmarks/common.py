"""What several benchmarks share: the CPU and GPU they ran on, sentences and references to measure with, the
Marian model CTranslate2 and our engine both run, timing passes, thread choices and a served model. Importing it
puts the repository on sys.path; every benchmark runs as `python benchmarks/NAME.py`, so `import common` finds
this file."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import math
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FIXTURES = ROOT / "tests" / "fixtures"
CALIBRATION_MIN = 32        # fewer unmeasured sentences than this in a source: the next source is tried
HELD_OUT = FIXTURES / "langid-heldout.tsv"   # lang<TAB>text, 200 German Ding sentences

# A server a benchmark starts gets a process group of its own (os.killpg stops all of it) but stays in the
# client's session. With the kernel's autogroup scheduling (sched_autogroup_enabled=1, Debian's default) a new
# session is a CPU group of its own, and the scheduler then shares the cores between the client's group and the
# server's instead of process by process: on the 2-core EPYC the client then waited on the run queue for 2.4 s of
# a 10 s run of 8 streams (schedstat), and a stream's TTFT p95 was 90-218 ms where a server in the client's session
# gave 25-30 ms; the server's own part of it (its timings' first_token_ms) had a p50 of 11-14 ms both ways. A
# client on another machine does not wait behind the server (benchmarks/results/serving-cpu.md).
SERVER_PROCESS_GROUP = {"process_group": 0}


def pairs64() -> list[tuple[str, str]]:
    """The tests' 64 real Ding sentence pairs (tests/fixtures/pairs64.tsv, GPL-2+): (German, English)."""
    rows = [line.split("\t") for line in (FIXTURES / "pairs64.tsv").read_text(encoding="utf-8").splitlines()]
    return [(de, en) for de, en in rows]


def build_marian(out: Path, spm_file: Path) -> Path:
    """A randomly initialised Marian model with the `small` preset's shape over an existing vocabulary."""
    from model.export_marian import write_marian_vocabulary
    from model.tokenizer import Tokenizer
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    from model.transformer import preset

    c = preset("small")
    out.mkdir(parents=True, exist_ok=True)
    pieces = write_marian_vocabulary(Tokenizer(spm_file), out)
    V = len(pieces)
    config = MarianConfig(vocab_size=V, d_model=c.d_model, encoder_layers=c.n_encoder_layers,
                          decoder_layers=c.n_decoder_layers, encoder_attention_heads=c.h, decoder_attention_heads=c.h,
                          encoder_ffn_dim=c.d_ff, decoder_ffn_dim=c.d_ff, max_position_embeddings=512,
                          activation_function="relu", scale_embedding=True, pad_token_id=V - 1,
                          decoder_start_token_id=V - 1, eos_token_id=0, forced_eos_token_id=0, bad_words_ids=[[V - 1]])
    torch.manual_seed(0)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        model.model.shared.weight[V - 1].zero_()   # the decoder starts from a zero vector, as CTranslate2 assumes
    model.save_pretrained(out)
    MarianTokenizer(str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json"),
                    source_lang="de", target_lang="en").save_pretrained(out)
    return out


def read_sentences(data: Path | None, n: int) -> list[str]:
    if data is None:
        base = [de for de, _ in pairs64()]
    else:
        base = [line.split("\t")[0] for line in data.read_text(encoding="utf-8").splitlines() if line.strip()]
    return (base * (n // len(base) + 1))[:n]


def first_column(path: Path) -> list[str]:
    return [line.split("\t")[0] for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")]


def calibration_sentences(data: Path | None, measured: list[str], explicit: Path | None = None,
                          limit: int | None = None) -> tuple[list[str], str]:
    """German sentences that set our int8-static package's activation scales (model.calibrate), at most
    `limit` (model.calibrate's CALIBRATION_SENTENCES), and how the report names them: `explicit`'s first
    column, else the first source with at least CALIBRATION_MIN sentences not among `measured` (--data's
    other rows, dev.tsv beside --data, the German side of the tests' held-out language-identification
    file), else the measured sentences themselves."""
    from model.calibrate import CALIBRATION_SENTENCES

    limit = limit or CALIBRATION_SENTENCES
    seen = set(measured)
    if explicit is not None:
        texts = first_column(explicit)[:limit]
        overlap = sum(t in seen for t in texts)
        return texts, (f"{len(texts)} sentences of {explicit} (--calibration), "
                       + (f"{overlap} of them among the measured ones" if overlap else "none of them measured"))
    sources: list[tuple[str, list[str]]] = []
    if data is not None:
        sources.append((f"rows of {data} other than the measured ones", first_column(data)))
        dev = data.parent / "dev.tsv"
        if dev.is_file() and dev.resolve() != data.resolve():
            sources.append((str(dev), first_column(dev)))
    else:
        sources.append(("the tests' Ding sentences beyond the measured ones", read_sentences(None, 64)))
    sources.append((f"the German side of {HELD_OUT.relative_to(ROOT)} (Ding sentences)",
                    [line.split("\t", 1)[1] for line in HELD_OUT.read_text(encoding="utf-8").splitlines()
                     if line.startswith("de\t")]))
    for name, texts in sources:
        unmeasured = [t for t in texts if t not in seen][:limit]
        if len(unmeasured) >= CALIBRATION_MIN:
            return unmeasured, f"{len(unmeasured)} sentences not measured here: {name}"
    texts = list(dict.fromkeys(measured))[:limit]
    print(f"note: int8 is calibrated on the measured sentences themselves ({len(texts)}): no other source has "
          f"{CALIBRATION_MIN}", flush=True)
    return texts, f"the measured sentences themselves ({len(texts)}; no other source had {CALIBRATION_MIN})"


def batches(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def measure(run, groups: list[list]) -> dict:
    run(groups[0])                                         # warm-up: first-call allocations
    latencies, tokens = [], 0
    t0 = time.perf_counter()
    for g in groups:
        s = time.perf_counter()
        tokens += run(g)
        latencies.append(time.perf_counter() - s)
    wall = time.perf_counter() - t0
    return {"tok_s": tokens / wall, "p50_ms": statistics.median(latencies) * 1000, "tokens": tokens}


def ct2_runner(path: Path, *, beam: int, max_length: int, threads: int, device: str = "cpu", outputs=None,
               inter: int = 1):
    """run(batch of piece lists) -> target tokens; with `outputs` (a list) each best hypothesis's pieces
    are appended to it. inter > 1: the batch is cut into `inter` sub-batches that CTranslate2's workers
    translate in parallel, each on `threads` threads."""
    import ctranslate2

    translator = ctranslate2.Translator(str(path), device=device, intra_threads=threads, inter_threads=inter)

    def run(batch: list[list[str]]) -> int:
        # min_decoding_length=1: CTranslate2's default and ours (SearchOptions.min_length), no empty translation.
        results = translator.translate_batch(batch, beam_size=beam, max_decoding_length=max_length,
                                             min_decoding_length=1, length_penalty=1.0, return_end_token=True,
                                             max_batch_size=math.ceil(len(batch) / inter) if inter > 1 else 0)
        if outputs is not None:
            outputs.extend([p for p in r.hypotheses[0] if p != "</s>"] for r in results)
        return sum(len(r.hypotheses[0]) for r in results)
    return run


def cpu_facts() -> dict:
    """The CPU as this process sees it. `cores`: the physical cores among the CPUs it may use (hyperthread
    siblings counted once), capped by a cgroup quota: os.cpu_count() counts the host's logical CPUs, which
    in a container or on an SMT machine is more threads than can run at once."""
    try:
        info = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        info = ""
    field = lambda name: next((line.split(":", 1)[1].strip() for line in info.splitlines()   # noqa: E731
                               if line.split(":", 1)[0].strip() == name), "")
    usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    siblings = set()
    for cpu in usable:
        f = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        siblings.add(f.read_text().strip() if f.exists() else str(cpu))
    quota = None
    try:
        limit, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        quota = None if limit == "max" else int(limit) / int(period)
    except (OSError, ValueError):
        pass
    cores = max(1, min(len(siblings), math.floor(quota) if quota else len(siblings)))
    flags = set(field("flags").split())
    return {"model": field("model name") or field("Hardware") or platform.processor() or platform.machine(),
            "logical": os.cpu_count() or 1, "usable": len(usable), "physical": len(siblings), "quota": quota,
            "cores": cores, "logical_usable": max(cores, min(len(usable), math.floor(quota) if quota else len(usable))),
            "isa": [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8") if f in flags]}


def describe_cpu(facts: dict) -> str:
    quota = f", cgroup quota {facts['quota']:g} CPUs" if facts["quota"] else ", no cgroup CPU quota"
    return (f"{facts['model']}; {facts['logical']} logical CPUs, {facts['usable']} usable by this process, "
            f"{facts['physical']} physical cores among them{quota}; flags {' '.join(facts['isa']) or 'none of note'}")


def thread_candidates(facts: dict, batch: int, engine: str) -> list[tuple[int, int]]:
    """(intra, inter) pairs worth trying: 1 thread (no barrier to stall), all physical cores, all logical
    CPUs where hyperthreads add some, and sub-batches in parallel, one thread each."""
    out = [(1, 1)]
    for n in (facts["cores"], facts["logical_usable"]):
        if (n, 1) not in out:
            out.append((n, 1))
    if batch > 1 and facts["cores"] > 1:
        out.append((1, facts["cores"]))
    return out


def describe_threads(engine: str, intra: int, inter: int, shared: bool = False) -> str:
    if engine == "ctranslate2" or inter > 1:
        return f"intra {intra} × inter {inter}" + (", one session" if shared else "")
    return f"intra {intra}"


def choose_threads(make, groups: list[list], candidates: list[tuple[int, int]]) -> tuple[tuple[int, int], dict]:
    """The candidate (intra, inter[, shared]) with the most tok/s over a sample of `groups`, best of 2 short
    passes each; make(*candidate) -> run. Returns it and every candidate's tok/s."""
    tried = {}
    for c in candidates:
        run = make(*c)
        tried[c] = max(measure(run, groups)["tok_s"] for _ in range(2))
    return max(tried, key=tried.get), tried


def target_tag(package: Path | None, tok, target: str = "en") -> list[int]:
    """[the Marian id of the package's <2en> tag] for a multi-directional package of ours, else []."""
    if package is None:
        return []
    meta = json.loads((package / "model.json").read_text(encoding="utf-8"))
    tags = meta.get("target_tags") or {}
    if not tags:
        return []
    if target not in tags:
        raise SystemExit(f"{package} has target tags for {sorted(tags)}, not {target!r}")
    import sentencepiece as spm
    piece = spm.SentencePieceProcessor(model_file=str(package / meta["tokenizer"]["source"])).id_to_piece(tags[target])
    tag = tok.convert_tokens_to_ids(piece)
    if tag == tok.unk_token_id:
        raise SystemExit(f"the Marian vocabulary has no {piece!r}")
    return [tag]


def gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    return out.splitlines()[0] if out else "unknown (nvidia-smi did not answer)"


def cpu_name() -> str:
    """The CPU's model name, as lscpu gives it: every speed figure names its CPU."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class KeepAlive:
    """One HTTP/1.1 keep-alive connection on a plain socket, for `served`'s clients: the cost of a load generator
    written in C (wrk), not httpx's. On the 2-core EPYC httpx's Client took 2.3 ms for a `GET /ready` whose round
    trip on a plain socket took 0.47 ms, and 1.1-1.2 CPU ms a request at 32 clients (benchmarks/results/serving-cpu.md):
    time a lone request's figure and CPU the server's throughput should not pay on a machine they share.
    It reads only what our JSON responses are (a Content-Length, no chunks)."""

    def __init__(self, host: str, port: int):
        self.host, self.port, self.sock = host, port, None

    def post_json(self, path: str, body: dict) -> tuple[int, dict]:
        """(status, the response's JSON)."""
        data = json.dumps(body).encode()
        if self.sock is None:
            self.sock = socket.create_connection((self.host, self.port))
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += self._recv()
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
        length = int(headers[b"content-length"])
        while len(rest) < length:
            rest += self._recv()
        if headers.get(b"connection", b"").lower() == b"close":
            self.close()
        return int(lines[0].split()[1]), json.loads(rest[:length])

    def _recv(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            self.close()
            raise ConnectionError("the server closed the connection")
        return chunk

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def wait_ready(url: str, timeout_s: float = 180) -> str:
    """Waits for a server's /ready; the device its /info names."""
    import httpx

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    else:
        raise RuntimeError("the service did not become ready")
    info = httpx.get(url + "/info", timeout=10)
    return info.json().get("device", "unknown") if info.status_code == 200 else "unknown"


@contextlib.contextmanager
def service(packages: list[str], extra: list[str] = (), log: str | None = None):
    """`python -m service` on the packages, on a free port of 127.0.0.1, in a process group of its own: yields
    (process, url) once it is ready, and stops all of it after."""
    port = free_port()
    cmd = [sys.executable, "-m", "service", *(a for p in packages for a in ("--model", p)), "--host", "127.0.0.1",
           "--port", str(port), "--threads", "1", *extra]
    out = open(log, "w") if log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, **SERVER_PROCESS_GROUP)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url)
        yield proc, url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        if log:
            out.close()


def served(package: Path, sentences: list[str], *, workers: int, threads: int, max_length: int,
           clients: int = 32, repeat: int = 1, device: str = "cpu", max_batch: int = 32) -> dict:
    """The HTTP service at `clients` concurrent clients, one sentence per request, beam 4: the best of
    `repeat` passes over the sentences, on one server (each pass's figures come from that pass), and
    the lowest p50 of `repeat` runs of 16 sentences sent one at a time, with that run's stages."""
    port = free_port()
    cmd = [sys.executable, "-m", "service", "--model", str(package), "--port", str(port),
           "--workers", str(workers), "--threads", str(threads), "--device", device,
           "--max-batch-size", str(max_batch), "--max-output-tokens", str(max_length)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **SERVER_PROCESS_GROUP)
    try:
        device_used = wait_ready(f"http://127.0.0.1:{port}")
        body = {"source_lang": "de", "target_lang": "en", "beam_size": 4, "max_length": max_length}
        own, connections = threading.local(), []        # a connection per client thread

        def one(text: str) -> tuple[int, float, dict]:
            if not hasattr(own, "connection"):
                own.connection = KeepAlive("127.0.0.1", port)
                connections.append(own.connection)
            s = time.perf_counter()
            status, out = own.connection.post_json("/translate", body | {"text": text})
            if status != 200:
                raise RuntimeError(f"/translate answered {status}: {out}")
            return out["translations"][0]["output_tokens"] + 1, time.perf_counter() - s, out["timings"]
        try:
            one(sentences[0])
            best: dict = {}
            alone_p50, alone_stages = float("inf"), {}
            pool = cf.ThreadPoolExecutor(clients)
            for _ in range(repeat):
                # Single-sentence latency with nothing else in flight, then throughput under load.
                alone = [one(t) for t in sentences[:16]]
                p50 = statistics.median(r[1] for r in alone) * 1000
                if p50 < alone_p50:
                    alone_p50, alone_stages = p50, stages(alone)
                t0 = time.perf_counter()
                results = list(pool.map(one, sentences))
                wall = time.perf_counter() - t0
                tok_s = sum(r[0] for r in results) / wall
                if tok_s > best.get("tok_s", 0):
                    best = {"tok_s": tok_s, "p50_ms": statistics.median(r[1] for r in results) * 1000,
                            "stages": stages(results)}
            pool.shutdown()
        finally:
            for connection in connections:
                connection.close()
        return best | {"alone_p50_ms": alone_p50, "alone_stages": alone_stages, "device": device_used}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def stages(results: list[tuple[int, float, dict]]) -> dict[str, float]:
    """Mean ms per request in each stage, from the client's clock and the response's `timings`:
    queue (received -> its batch starts: tokenisation, hand-over to the worker, waiting for the
    engine), inference (its batch's engine time), response (detokenisation, hand-back) and HTTP
    (everything outside the handler: parsing, validation, JSON, the network)."""
    n = len(results)
    e2e = sum(r[1] for r in results) * 1000 / n
    queue = sum(r[2]["queue_ms"] for r in results) / n
    inference = sum(r[2]["inference_ms"] for r in results) / n
    handler = sum(r[2]["total_ms"] for r in results) / n
    return {"end to end": e2e, "queue": queue, "inference": inference, "response": handler - queue - inference,
            "HTTP": e2e - handler}


def best_passes(runs: dict, repeat: int) -> dict:
    """measure() of each (run, groups) in `runs`, the best of `repeat` passes each."""
    # The engines take turns, and each keeps its best pass: a noisy neighbour on a shared
    # machine slows a pass down, never speeds one up.
    best: dict[tuple, dict] = {}
    for _ in range(repeat):
        for key, (run, groups) in runs.items():
            r = measure(run, groups)
            if key not in best or r["tok_s"] > best[key]["tok_s"]:
                best[key] = r
    return best
