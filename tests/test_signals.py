"""Stopping the server as operators do (service/stopping.py), on a real server: Ctrl+C in a terminal (SIGINT to
the whole process group), SIGTERM to the process group (systemd, `docker stop` of a shell wrapper) and SIGINT to
the main process alone, of a server a shell started in the background (with SIGINT ignored, as a shell starts
one). Each time the requests in flight are answered, every process of the group ends within the drain timeout,
the main process exits 0 with no traceback in the log, and the port is free: a new server starts on it."""

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from conftest import pairs64, server_log, start_server, stop_server

DRAIN_S = 20                 # --drain-timeout-s of these servers: every process must be gone within it
REQUESTS = 6                 # in flight at the signal: seconds of work together, on a busy machine too
TEXTS = [de for de, _ in pairs64()]


def alive(pgid: int) -> list[int]:
    """The processes of a process group that still run (a zombie holds nothing: no port, no memory)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def port_is_free(port: int) -> bool:
    """Whether a server could listen on the port now (SO_REUSEADDR, as uvicorn binds: closed connections
    waiting out TIME_WAIT do not count, a listening socket still held does)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def in_flight(url: str) -> float:
    found = re.search(r'^transerve_requests_in_flight\{endpoint="translate"\} (\S+)$', httpx.get(url + "/metrics").text,
                      re.M)
    return float(found.group(1)) if found else 0.0


def stop_while_busy(proc, url: str, deliver) -> dict:
    """Sends REQUESTS requests that take a while together, calls `deliver()` (the signal) once they are in
    flight, and waits for every process of the server's group to end: what happened, with the answers."""
    members = alive(proc.pid)
    assert len(members) >= 4, members          # main, manager, HTTP process, worker (and the resource tracker)
    got: dict = {"answers": [], "answered_at": []}
    body = {"text": TEXTS, "source_lang": "de", "target_lang": "en", "beam_size": 16}   # 0.5 s each, idle

    def ask():
        answer = httpx.post(url + "/translate", json=body, timeout=60)
        got["answers"].append(answer)
        got["answered_at"].append(time.monotonic())

    askers = [threading.Thread(target=ask) for _ in range(REQUESTS)]
    for asker in askers:
        asker.start()
    # Until every request is admitted (in flight, or already answered: on a starved machine the first ones can
    # be answered before the last is admitted) and one at least is still in flight.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        running = in_flight(url)
        if running >= 1 and running + len(got["answers"]) >= REQUESTS:
            break
        time.sleep(0.02)
    got["signalled"] = signalled = time.monotonic()
    deliver()
    for asker in askers:
        asker.join(60)
    try:
        got["exit"] = proc.wait(timeout=max(0.1, signalled + DRAIN_S - time.monotonic()))
    except subprocess.TimeoutExpired:
        got["exit"] = "still running"
    while alive(proc.pid) and time.monotonic() < signalled + DRAIN_S:
        time.sleep(0.05)
    got["left"] = alive(proc.pid)
    got["stopped_s"] = time.monotonic() - signalled
    return got


def check_stopped(proc, url: str, got: dict) -> None:
    """Every request admitted before the signal answered in full (one not yet admitted, on a busy machine,
    refused as the drain refuses new ones), one of them at least after the signal; the rest as the module says."""
    assert len(got["answers"]) == REQUESTS
    after = [a for a, t in zip(got["answers"], got["answered_at"]) if t > got["signalled"]]
    assert any(a.status_code == 200 for a in after), "no request was in flight at the signal"
    for answer in got["answers"]:
        if answer.status_code == 503:
            assert answer.json()["error"]["type"] == "shutting_down", answer.text
        else:
            assert answer.status_code == 200 and len(answer.json()["translations"]) == len(TEXTS), answer.text[:500]
    assert sum(a.status_code == 200 for a in got["answers"]) >= REQUESTS // 2, got["answers"]
    assert got["exit"] == 0 and got["left"] == [] and got["stopped_s"] < DRAIN_S, got
    assert port_is_free(urlsplit(url).port)
    log = server_log(proc)
    assert "Traceback" not in log and "ERROR" not in log, log[-4000:]


def test_ctrl_c_answers_the_request_in_flight_stops_every_process_and_frees_the_port(tiny_package):
    proc, url = start_server(tiny_package, "--drain-timeout-s", str(DRAIN_S))
    try:
        got = stop_while_busy(proc, url, lambda: os.killpg(proc.pid, signal.SIGINT))
    finally:
        stop_server(proc)
    check_stopped(proc, url, got)
    again, url_again = start_server(tiny_package, port=urlsplit(url).port)   # a restart on the same port
    try:
        assert url_again == url and httpx.get(url + "/health").text == "ok"
    finally:
        stop_server(again)


def test_sigterm_to_the_process_group_drains_and_exits_0_without_a_traceback(tiny_package):
    """... and leaves nothing in its temporary directory: the metrics' files and the workers' sockets go with it."""
    tmp = Path(tempfile.mkdtemp(prefix="ts-", dir="/tmp"))   # short: its sockets' paths fit (unix_listener)
    proc, url = start_server(tiny_package, "--drain-timeout-s", str(DRAIN_S), env={"TMPDIR": str(tmp)})
    try:
        assert {p.name.rsplit("-", 1)[0] for p in tmp.iterdir()} >= {"transerve-metrics", "transerve-requests"}
        got = stop_while_busy(proc, url, lambda: os.killpg(proc.pid, signal.SIGTERM))
    finally:
        stop_server(proc)
        left = list(tmp.iterdir())
        shutil.rmtree(tmp, ignore_errors=True)
    check_stopped(proc, url, got)
    assert left == []


def test_sigint_to_the_main_process_of_a_background_server_stops_it(tiny_package):
    """`python -m service &` in a script: the shell starts it with SIGINT ignored, and the service's own
    handler must still take it."""
    proc, url = start_server(tiny_package, "--drain-timeout-s", str(DRAIN_S),
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        got = stop_while_busy(proc, url, lambda: os.kill(proc.pid, signal.SIGINT))
    finally:
        stop_server(proc)
    check_stopped(proc, url, got)


def test_requests_still_running_at_the_drain_timeout_are_cut_and_every_process_ends(tiny_package):
    """The drain timeout bounds the stop: requests that outlive it are cut (their connections closed) and every
    process ends a moment later, not when the last of them is done (uvicorn waited for every connection, so 48
    requests of seconds' work each held the stop for as long as they ran)."""
    drain_s, requests = 1, 48
    proc, url = start_server(tiny_package, "--drain-timeout-s", str(drain_s), "--max-queue", "100")
    body = {"text": TEXTS, "source_lang": "de", "target_lang": "en", "beam_size": 16}   # 0.5 s each, idle
    statuses: list = []

    def ask():
        try:
            statuses.append(httpx.post(url + "/translate", json=body, timeout=120).status_code)
        except httpx.TransportError:                      # cut: its connection closed under it
            statuses.append("cut")

    askers = [threading.Thread(target=ask) for _ in range(requests)]
    try:
        for asker in askers:
            asker.start()
        deadline = time.monotonic() + 60
        while in_flight(url) + len(statuses) < requests and time.monotonic() < deadline:
            time.sleep(0.02)
        signalled = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        exit_status = proc.wait(timeout=60)
        stopped_s = time.monotonic() - signalled
        for asker in askers:
            asker.join(60)
    finally:
        stop_server(proc)
    assert "cut" in statuses, statuses                    # work was left at the timeout
    assert stopped_s < drain_s + 6 and exit_status == 0, (stopped_s, exit_status)
    assert_all_gone_within_10_s(proc, url)


def assert_all_gone_within_10_s(proc, url: str) -> None:
    """Issue 54's bar for a server that lost its main process or every HTTP process: no process of its group
    alive 10 s later, the port free."""
    deadline = time.monotonic() + 10
    while alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive(proc.pid) == [] and port_is_free(urlsplit(url).port)


def test_kill_9_of_the_main_process_ends_every_process_and_frees_the_port(tiny_package):
    """Nothing signals the children of a main process killed outright (the OOM killer, kill -9): each asked the
    kernel for SIGTERM when the main process dies (Stopping.die_with_main), so none is left holding the port or
    a device. Issue 54's bar: no process of the group alive 10 s later, the port free."""
    proc, url = start_server(tiny_package, "--workers", "2", "--api-servers", "2")
    try:
        assert httpx.post(url + "/translate", json={"text": TEXTS[0], "source_lang": "de", "target_lang": "en"},
                          timeout=60).status_code == 200
        children = [pid for pid in alive(proc.pid) if pid != proc.pid]
        assert len(children) >= 5, children           # manager, 2 HTTP processes, 2 workers (and the tracker)
        proc.kill()
        proc.wait(timeout=10)
        assert_all_gone_within_10_s(proc, url)
    finally:
        stop_server(proc)


def http_processes(main_pid: int) -> list[int]:
    """The server's HTTP processes: the main process's forked children (not spawned workers or the resource
    tracker) but the first, LitServe's manager, which it forks before any of them."""
    forked = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == main_pid and b"multiprocessing" not in cmdline:
            forked.append(int(stat.parent.name))
    return sorted(forked)[1:]


def test_an_http_process_that_dies_is_said_and_the_last_one_stops_the_server(tiny_package):
    """Issue 54: kill -9 of an HTTP process is noticed and said, as a worker's is; the others go on serving; with
    none left the server stops (exit status 1) rather than look alive holding a port no one answers on."""
    proc, url = start_server(tiny_package, "--api-servers", "2")
    try:
        first, second = http_processes(proc.pid)
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while "HTTP process" not in server_log(proc) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert re.search(r"HTTP process \d \(pid \d+\) ended \(exit code -9\) while serving; 1 of 2 left",
                         server_log(proc)), server_log(proc)[-2000:]
        assert httpx.get(url + "/health", timeout=10).text == "ok"          # the other one answers
        os.kill(second, signal.SIGKILL)
        assert proc.wait(timeout=15) == 1
        log = server_log(proc)
        assert "no HTTP process is left: the server stops" in log and "SIGKILL" not in log, log[-2000:]
        assert_all_gone_within_10_s(proc, url)
    finally:
        stop_server(proc)
