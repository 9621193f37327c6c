"""Shared fixtures: a corpus of 64 real Ding sentence pairs (tests/fixtures/pairs64.tsv, from Debian's
trans-de-en, GPL-2+), a tiny model trained on it until it reproduces them, and its exported package.
Shared helpers, defined here once so that no test module imports another: start_server / stop_server /
server_log run the real service on 127.0.0.1, free_port finds it a port."""

import fcntl
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).parent.parent
FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(Path(__file__).parent))
PORTS = (20000, 32768)   # free_port's range: below the ephemeral ports (ip_local_port_range's default starts at 32768)

# Settings that make the tiny preset overfit 64 pairs in a few hundred steps on a CPU.
# The peak is what the paper's schedule gave these fixtures at factor 1 (d_model 64, warm-up 50); every pair
# every epoch; fp32 on every CPU, so the fixtures train alike whether or not the CPU has bf16 instructions.
TINY = ["--preset", "tiny", "--vocab-size", "300", "--warmup", "50", "--lr", str(64 ** -0.5 * 50 ** -0.5),
        "--max-tokens", "2000", "--label-smoothing", "0", "--short-weight", "1", "--precision", "fp32"]


def train_fixture(args: list[str]) -> None:
    """model.train for a shared fixture, reproducibly: seed 1 on one torch thread, whatever the core
    count. The weights depend on torch's thread count (one and two threads train different models from
    the same seed, which get different memorised sentences slightly wrong in beam search), not on the
    load: the same weights on an idle machine and beside a CPU-bound process, where one thread took 31 s
    for the tiny de-en model's 500 steps and two OpenMP threads 22 minutes. The caller's thread count
    is restored (model.train sets it for the whole process)."""
    import torch

    from model import train

    threads = torch.get_num_threads()
    try:
        train.main([*args, "--seed", "1", "--threads", "1"])
    finally:
        torch.set_num_threads(threads)


def made_once(tmp_path_factory, key: str, name: str, make) -> Path:
    """A directory `name` (a run's or a package's name), filled by make(it) once for the whole session: under
    pytest-xdist (scripts/test.sh runs two processes) the first process to ask makes it, under a lock, and the
    others wait for it and reuse it (`key` names it there). For the fixtures every process would make alike (the
    tiny models train reproducibly: seed 1, one thread), each of which took each process a minute or more of a
    2-core machine's CPU. Tests only read what it holds."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent                      # the session's, above each process's own
    shared, done = root / f"made-once-{key}", root / f"made-once-{key}.done"
    with open(root / f"made-once-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)        # released when the file closes, or its process dies
        if not done.exists():
            shutil.rmtree(shared, ignore_errors=True)          # a half-made one (its maker failed)
            shared.mkdir()
            make(shared / name)
            done.touch()
    return shared / name


def descendants(root: int) -> list[int]:
    """Every process below root, from /proc (the servers under test spawn their workers)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def read_answer(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 answer read off a raw socket (for the tests that must send what httpx will not): its status,
    its headers (lower-case names) and its body, Content-Length bytes of it."""
    data = b""
    while b"\r\n\r\n" not in data:
        part = s.recv(65536)
        assert part, f"connection closed after {data!r}"
        data += part
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        part = s.recv(65536)
        assert part, f"connection closed inside the body after {body!r}"
        body += part
    return int(lines[0].split()[1]), headers, body[:int(headers.get("content-length", 0))]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (a server started next can bind it). Under pytest-xdist (scripts/test.sh runs
    two processes) each process draws only ports of its own residue: the OS, asked for any free port, may hand the
    same one to both while the first one's server is still starting, before it binds. Drawn below the ephemeral
    range (32768 and up here), where no client connection takes one; the OS's own choice cannot be split this
    way, since Linux gives bind() even ports only."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")         # gw0, gw1, ...; empty without xdist
    index = int(worker[2:]) if worker.startswith("gw") else 0
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(PORTS[0] + index, PORTS[1], count)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:       # taken, or a connection of it waiting out TIME_WAIT
                continue
        return port
    raise RuntimeError(f"no free port in {PORTS} for pytest process {worker or 'main'}")


def start_server(package, *extra, env=None, port=None, preexec_fn=None):
    """`python -m service` on a free port of 127.0.0.1 (or `port`), in a session of its own so that stop_server
    ends its workers with it; (proc, url) once /ready answers 200. `preexec_fn` runs in the child before the
    service starts (e.g. to ignore SIGINT, as a shell does for a background job)."""
    port = port or free_port()
    cmd = [sys.executable, "-m", "service", "--model", str(package), "--host", "127.0.0.1", "--port", str(port),
           "--threads", "1", *extra]
    # The log goes to a file: a pipe no one reads fills up (64 KiB of access log) and blocks the server.
    log = tempfile.NamedTemporaryFile("w+", prefix="transerve-test-", suffix=".log", delete=False)
    # Stored glossaries beside the log (made with the first one), never in the user's own data directory;
    # --data-dir, or env, names another.
    env = {**os.environ, "TRANSERVE_DATA_DIR": f"{log.name}.data", **(env or {})}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True, preexec_fn=preexec_fn)
    proc.log_path = log.name
    url = f"http://127.0.0.1:{port}"
    if wait_ready(url, proc, 180):
        return proc, url
    stop_server(proc)
    raise RuntimeError("server did not become ready in 180 s")


def wait_ready(url: str, proc, seconds: float) -> bool:
    """Polls url/ready until it answers 200 (True), `proc` exits (RuntimeError with its log) or `seconds`
    pass (False)."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            log = server_log(proc) if hasattr(proc, "log_path") else (proc.stdout.read() if proc.stdout else "")
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log[-3000:]}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    return False


def torch_reference(run):
    """(model, tokenizer) of a run's checkpoint in PyTorch, for a module-scoped fixture to yield from: on one
    thread, since two threads on a loaded 2-core machine are slower."""
    import torch

    from model.checkpoint import load_checkpoint

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model, tok, _ = load_checkpoint(run)
    yield model, tok
    torch.set_num_threads(threads)


def server_log(proc) -> str:
    with open(proc.log_path, encoding="utf-8", errors="replace") as f:
        return f.read()


def stop_server(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def redis():
    """A redis-server of the module's own on a free port, without persistence (tests/test_tenants.py,
    test_glossary_store.py); the test skips, saying why, where the machine has none."""
    binary = shutil.which("redis-server")
    if not binary:
        pytest.skip("no redis-server: apt-get install redis-server (scripts/test.sh does, as root)")
    server = RedisServer(binary, free_port())
    server.start()
    yield server
    server.stop()


class RedisServer:
    def __init__(self, binary: str, port: int):
        self.binary, self.port, self.proc = binary, port, None
        self.url = f"redis://127.0.0.1:{port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen([self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.time() + 10
        while subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True, text=True
                             ).stdout.strip() != "PONG":
            assert time.time() < deadline and self.proc.poll() is None, "redis-server did not start"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def flush(self) -> None:
        subprocess.run(["redis-cli", "-p", str(self.port), "flushall"], check=True, capture_output=True)


def pairs64() -> list[tuple[str, str]]:
    rows = [line.split("\t") for line in (FIXTURES / "pairs64.tsv").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 64
    return [(de, en) for de, en in rows]


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    text = "".join(f"{de}\t{en}\tding\n" for de, en in pairs64())
    for split in ("train", "dev", "test"):
        (d / f"{split}.tsv").write_text(text, encoding="utf-8")
    (d / "meta.json").write_text(json.dumps({"langs": ["de", "en"]}))
    return d


@pytest.fixture(scope="session")
def tiny_run(data_dir, tmp_path_factory):
    """A de→en tiny model that has memorised the 64 pairs (trained by our own command): greedy search
    gives all 64, beam search a few slightly wrong (see tests/test_service.py)."""
    return made_once(tmp_path_factory, "run", "tiny", lambda out: train_fixture([
        "--data", str(data_dir), "--out", str(out), "--direction", "de-en", "--max-steps", "500",
        "--eval-every", "0", "--eval-sentences", "64", *TINY]))


@pytest.fixture(scope="session", autouse=True)
def tiny_models_side_by_side(request):
    """Under pytest-xdist, the first two processes each make one of the tiny models first, side by side, when the
    run needs both: else both processes' first tests asked for the same one, and one process sat idle for a
    minute or more while the other trained it, then trained the second alone (made_once; the models are the
    same either way: seed 1, one thread)."""
    first = {"gw0": "tiny_run", "gw1": "tiny_lm_run"}.get(os.environ.get("PYTEST_XDIST_WORKER", ""))
    needed = {name for item in request.session.items for name in item.fixturenames}
    if first and {"tiny_run", "tiny_lm_run"} <= needed:
        try:
            request.getfixturevalue(first)
        except (Exception, pytest.skip.Exception, pytest.fail.Exception):
            pass    # the tests that need it ask again and report it; the others run on


@pytest.fixture(scope="session")
def tiny_package(tiny_run, tmp_path_factory):
    """tiny_run exported to an fp32 model package."""
    from model.export import export_package

    return made_once(tmp_path_factory, "package", "tiny-de-en", lambda out: export_package(tiny_run, out))


@pytest.fixture(scope="session")
def tiny_int8(tiny_run, tmp_path_factory):
    """(quantize, weight_bits=8) -> tiny_run exported in that int8 form (int8: calibrated on the dev split its
    config.json names), in a directory named after the form ("int8", "int8-rows", "int8-w7"), made once for the
    session: test_engine, test_calibrate and test_upgrade read the same exports (each took 10-35 s)."""
    from model.export import export_package

    def get(quantize: str, weight_bits: int = 8) -> Path:
        name = quantize if weight_bits == 8 else f"{quantize}-w{weight_bits}"
        return made_once(tmp_path_factory, f"tiny-{name}", name, lambda out: export_package(
            tiny_run, out, quantize=quantize, weight_bits=weight_bits))
    return get


@pytest.fixture(scope="session")
def mono_dir(tmp_path_factory):
    """The 128 sentences of pairs64.tsv as monolingual text (what model.data --monolingual writes)."""
    d = tmp_path_factory.mktemp("mono")
    text = "".join(f"de\t{de}\tding\nen\t{en}\tding\n" for de, en in pairs64())
    for split in ("train", "dev", "test"):
        (d / f"{split}.tsv").write_text(text, encoding="utf-8")
    (d / "meta.json").write_text(json.dumps({"kind": "monolingual", "langs": ["de", "en"]}))
    return d


@pytest.fixture(scope="session")
def tiny_lm_run(mono_dir, tmp_path_factory):
    """A tiny decoder-only model that has memorised the 128 sentences (trained by our own command).
    800 steps: at 400, 2 of 4 seeds had not learnt every continuation (the prompt "Bless" went on
    "sssss..."); at 800, 10 of 10 seeds continue each half-sentence prompt of tests/test_generation.py
    into a sentence that begins with it, the one such sentence by at least 1 nat over the runner-up."""
    return made_once(tmp_path_factory, "lm-run", "tiny-lm", lambda out: train_fixture([
        "--arch", "decoder", "--data", str(mono_dir), "--out", str(out), "--max-steps", "800", "--eval-every", "0",
        *TINY]))


@pytest.fixture(scope="session")
def tiny_lm_package(tiny_lm_run, tmp_path_factory):
    """tiny_lm_run exported to an fp32 generation package."""
    from model.export import export_package

    return made_once(tmp_path_factory, "lm-package", "tiny-lm", lambda out: export_package(tiny_lm_run, out))


def worker_pids(url: str, model: str) -> set[int]:
    """PIDs of the live workers serving `model`, from transerve_model_info (one series per process)."""
    from prometheus_client.parser import text_string_to_metric_families

    pids = set()
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        if family.name == "transerve_model_info":
            pids |= {int(s.labels["pid"]) for s in family.samples if s.labels.get("model") == model and s.value == 1}
    return pids
