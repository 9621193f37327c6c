"""Faults: an inference worker killed under load. The server stays up, LitServe starts a new worker,
every request in flight gets an answer at once instead of hanging (200 if it finished first, otherwise
503 worker_failed with Retry-After: the gateway sees the worker stop being ready, within LitServe's
2 s monitor period), and the service translates again once the new worker is ready."""

import concurrent.futures as cf
import os
import signal
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from conftest import pairs64
from test_service import start_server, stop_server


def worker_pids(url: str, model: str) -> set[int]:
    """PIDs of the live workers serving `model`, from transerve_model_info (one series per process)."""
    pids = set()
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        if family.name == "transerve_model_info":
            pids |= {int(s.labels["pid"]) for s in family.samples if s.labels.get("model") == model and s.value == 1}
    return pids


def test_a_killed_worker_is_replaced_and_in_flight_requests_get_an_answer(tiny_package):
    proc, url = start_server(tiny_package, "--request-timeout-s", "10")
    try:
        (pid,) = worker_pids(url, tiny_package.name)
        texts = [de for de, _ in pairs64()][:32]
        body = {"text": texts, "source_lang": "de", "target_lang": "en", "beam_size": 4}

        def client(_):
            t0 = time.monotonic()
            r = httpx.post(url + "/translate", json=body, timeout=90)
            return r.status_code, r.headers.get("retry-after"), r.json(), time.monotonic() - t0

        with cf.ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(client, i) for i in range(6)]
            time.sleep(0.5)                      # the worker is busy with them
            os.kill(pid, signal.SIGKILL)
            results = [f.result() for f in futures]
        statuses = [r[0] for r in results]
        assert set(statuses) <= {200, 503}, results
        assert 503 in statuses                   # some were running when it died
        for status, retry_after, payload, seconds in results:
            if status != 200:
                assert retry_after and payload["error"]["type"] == "worker_failed"
            assert seconds < 10                  # long before the 20 s deadline (504): not a hang
        assert proc.poll() is None               # the server survived its worker

        deadline = time.time() + 120
        while time.time() < deadline:
            if httpx.get(url + "/ready").status_code == 200 and worker_pids(url, tiny_package.name) - {pid}:
                break
            time.sleep(1)
        de, en = pairs64()[0]
        r = httpx.post(url + "/translate", json={"text": de, "source_lang": "de", "target_lang": "en"}, timeout=60)
        assert r.status_code == 200 and r.json()["translations"][0]["text"] == en
        assert worker_pids(url, tiny_package.name) - {pid}   # a new process serves
    finally:
        stop_server(proc)
