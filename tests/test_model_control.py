"""Model control (service/http/model_control.py, service/worker/model_swap.py, the routes in service/api/admin.py) on
real servers: a package replaced by other versions while 16 clients translate, with a broken version tried between,
fails no request and every answer names a version that was loaded; a broken package is refused with its reason
and never serves; a version that would not fit in memory is refused; admin keys are not users' keys, and with none
configured the admin routes answer 403; a restarted worker serves the versions the table lists."""

import asyncio
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from conftest import ROOT, free_port, server_log, start_server, stop_server

PACKAGE = ROOT / "models" / "de-en"
ADMIN_KEY, USER_KEY = "admin-key-0001", "user-key-0001"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
USER = {"Authorization": f"Bearer {USER_KEY}"}
CLIENTS = 16
LOAD_S = 18          # the CI test's window (benchmarks/model_swap.py runs the 60 s)
TEXTS = ["Wählen Sie Extras - Optionen.", "Klicken Sie auf OK, um die Datei zu speichern.", "Das geht zu weit.",
         "Wo ist der Bahnhof?", "Ich habe heute keine Zeit."]


def new_version(root: Path, version: str, source: Path = PACKAGE) -> Path:
    """A copy of the package whose model.json names another version (so another checksum)."""
    out = root / version
    shutil.copytree(source, out)
    meta = json.loads((out / "model.json").read_text())
    meta["version"] = version
    (out / "model.json").write_text(json.dumps(meta, indent=2))
    return out


def broken_version(root: Path, version: str, checksums_match: bool) -> Path:
    """A copy whose encoder.onnx is corrupted: its sha256 left as it was (the HTTP process's check refuses it) or
    rewritten to match (onnxruntime in the workers refuses it)."""
    out = new_version(root, version)
    encoder = out / "encoder.onnx"
    data = bytearray(encoder.read_bytes())
    data[64:8192] = bytes(8128)
    encoder.write_bytes(bytes(data))
    if checksums_match:
        meta = json.loads((out / "model.json").read_text())
        meta["files"]["encoder.onnx"]["sha256"] = hashlib.sha256(data).hexdigest()
        (out / "model.json").write_text(json.dumps(meta, indent=2))
    return out


def keys_files(root: Path) -> tuple[Path, Path]:
    users = root / "users.yaml"
    users.write_text(f"keys:\n  - name: team-a\n    key: {USER_KEY}\n")
    admins = root / "admins.keys"
    admins.write_text(ADMIN_KEY + "\n")
    return users, admins


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("model-control")
    users, admins = keys_files(root)
    proc, url = start_server(PACKAGE, "--workers", "2", "--api-keys-file", str(users), "--admin-keys-file", str(admins))
    try:
        yield proc, url, root
    finally:
        stop_server(proc)


def translate(url: str, text: str = "Das geht zu weit.", headers: dict = USER) -> httpx.Response:
    return httpx.post(url + "/translate", json={"text": text, "source_lang": "de", "target_lang": "en"},
                      headers=headers, timeout=60)


def admin(url: str, path: str = "", body: dict | None = None) -> httpx.Response:
    if body is None:
        return httpx.get(url + "/admin/models" + path, headers=ADMIN, timeout=30)
    return httpx.post(url + "/admin/models" + path, json=body, headers=ADMIN, timeout=300)


async def clients(url: str, seconds: float, n: int = CLIENTS) -> list[tuple[int, str | None, str | None]]:
    """`n` clients translating as fast as they are answered for `seconds`: (status, version in the body, header)."""
    deadline = time.monotonic() + seconds
    out = []

    async def one(k: int) -> None:
        async with httpx.AsyncClient(base_url=url, headers=USER, timeout=120) as http:
            i = k
            while time.monotonic() < deadline:
                r = await http.post("/translate", json={"text": TEXTS[i % len(TEXTS)], "source_lang": "de",
                                                        "target_lang": "en", "beam_size": 2})
                body = r.json() if r.status_code == 200 else {}
                out.append((r.status_code, body.get("model_version"), r.headers.get("x-model-version")))
                i += 1

    await asyncio.gather(*(one(k) for k in range(n)))
    return out


def test_replaced_three_times_and_a_broken_version_tried_under_16_clients_fails_no_request(server):
    proc, url, root = server
    first = admin(url).json()["models"][0]["active"]
    loaded, broken = [first], None

    async def run() -> tuple[list, list]:
        load = asyncio.create_task(clients(url, LOAD_S))
        calls = []
        for i, version in enumerate(["v2", "v3", "broken", "v4"]):
            await asyncio.sleep(LOAD_S / 6)
            path = broken_version(root, version, checksums_match=True) if version == "broken" else \
                new_version(root, version)
            r = await asyncio.to_thread(admin, url, "", {"path": str(path)})
            calls.append((version, r))
            if r.status_code == 200:
                loaded.append(version)
        return await load, calls

    answers, calls = asyncio.run(run())
    statuses = {}
    for status, _, _ in answers:
        statuses[status] = statuses.get(status, 0) + 1
    assert statuses == {200: len(answers)} and len(answers) > 100, statuses
    versions = {v for _, v, _ in answers}
    assert versions <= set(loaded) and "broken" not in versions and len(versions) >= 2, versions
    assert all(v == h for _, v, h in answers)            # the header names the version the body does
    for version, r in calls:
        if version == "broken":
            broken = r
        else:
            assert r.status_code == 200 and r.json()["active"] == version, r.text
    assert broken.status_code == 409 and broken.json()["error"]["type"] == "model_load_failed"
    assert "onnxruntime cannot load" in broken.json()["error"]["message"]
    assert str(root) not in broken.text                   # the answer names the file, never the path
    listing = admin(url).json()["models"][0]
    assert listing["active"] == "v4" and [v["version"] for v in listing["versions"]] == ["v4"]
    # On a loaded machine the last swap can end as the clients do, so v4 is asked once more, after the load
    after = translate(url)
    assert after.status_code == 200 and after.json()["model_version"] == "v4", after.text
    metrics = httpx.get(url + "/metrics", headers=USER).text
    assert 'transerve_model_loads_total{result="loaded"} 3.0' in metrics
    assert 'transerve_model_loads_total{result="failed"} 1.0' in metrics
    counted = re.search(r'transerve_model_version_requests_total\{model="de-en",outcome="ok",version="v4"\} (\S+)',
                        metrics)
    assert counted and float(counted.group(1)) == sum(v == "v4" for _, v, _ in answers) + 1, metrics[-3000:]
    assert str(root) not in server_log(proc)              # no package path in the log


def test_a_package_with_a_bad_checksum_is_refused_before_any_worker_and_the_old_one_serves(server):
    _, url, root = server
    before = admin(url).json()["models"][0]["active"]
    r = admin(url, "", {"path": str(broken_version(root, "bad-sum", checksums_match=False))})
    assert r.status_code == 409 and "encoder.onnx: sha256 does not match" in r.json()["error"]["message"]
    r = admin(url, "", {"path": str(root / "no-such-package")})
    assert r.status_code == 409 and "model.json: missing" in r.json()["error"]["message"]
    assert str(root) not in r.text
    r = translate(url)
    assert r.status_code == 200 and r.json()["model_version"] == before == admin(url).json()["models"][0]["active"]


def test_bad_admin_bodies_are_4xx_in_our_shape(server):
    _, url, _ = server
    assert admin(url, "", {"path": str(PACKAGE), "version": "no spaces"}).status_code == 422
    assert admin(url, "", {"nothing": 1}).status_code == 422
    assert admin(url, "/promote", {"name": "de-en"}).json()["error"]["type"] == "no_candidate"
    assert admin(url, "/rollback", {"name": "xx-yy"}).status_code == 404
    r = httpx.post(url + "/admin/models", content=b"{", headers=ADMIN | {"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_json"
    active = admin(url).json()["models"][0]["active"]
    r = admin(url, "", {"path": str(PACKAGE), "version": active})
    assert r.status_code == 409 and "served already" in r.json()["error"]["message"]


def test_a_canary_share_of_true_or_a_string_is_a_422_not_a_share_of_1(server):
    _, url, _ = server
    for share in (True, False, "0.5"):
        r = admin(url, "", {"path": str(PACKAGE), "canary": {"share": share}})
        assert r.status_code == 422 and r.json()["error"]["type"] == "invalid_request", r.text
        assert r.json()["error"]["message"] == "canary.share: Input should be a valid number"
        r = admin(url, "/canary", {"name": "de-en", "share": share})
        assert r.status_code == 422 and r.json()["error"]["message"] == "share: Input should be a valid number"
    assert admin(url).json()["models"][0]["candidate"] is None      # nothing was loaded


def test_a_path_with_a_nul_or_a_model_json_of_another_shape_is_a_409_naming_no_path(server):
    _, url, root = server
    odd = root / "odd-packages"
    for name, meta in (("a-list", "[]"), ("no-name", json.dumps({"format": "transerve-model/1"})),
                       ("number-name", json.dumps({"format": "transerve-model/1", "name": 7}))):
        (odd / name).mkdir(parents=True)
        (odd / name / "model.json").write_text(meta)
    for path in (f"{odd}/\u0000x", str(odd / "a-list"), str(odd / "no-name"), str(odd / "number-name")):
        r = admin(url, "", {"path": path})
        assert r.status_code == 409 and r.json()["error"]["type"] == "model_load_failed", (path, r.text)
        assert str(odd) not in r.text
    assert translate(url).status_code == 200


def test_a_model_json_naming_a_file_outside_its_package_is_a_409_quoting_no_path(server):
    proc, url, root = server
    real = json.loads((PACKAGE / "model.json").read_text())["files"]["spm.model"]
    for i, name in enumerate(["/etc/hostname", str(PACKAGE / "spm.model"), "../de-en/spm.model", "a/../../x",
                              "spm.model\nforged log line"]):
        package = root / "outside" / f"p{i}"
        package.mkdir(parents=True)
        (package / "model.json").write_text(json.dumps({"format": "transerve-model/1", "name": "de-en",
                                                        "files": {name: real}}))
        r = admin(url, "", {"path": str(package)})
        assert r.status_code == 409 and r.json()["error"]["message"] == (
            "not loaded: model.json: a file entry is not a relative path inside the package; the versions serving "
            "go on"), r.text
        assert not [part for part in ("/etc", "hostname", "de-en/", "../", "forged", str(root)) if part in r.text]
    log = server_log(proc)
    assert "/etc/hostname" not in log and "forged" not in log and str(root) not in log
    assert translate(url).status_code == 200


def test_admin_keys_are_not_users_keys(server):
    _, url, root = server
    assert httpx.get(url + "/admin/models", headers=USER).status_code == 401     # a user's key is not an admin's
    assert httpx.get(url + "/admin/models").status_code == 401
    assert translate(url, headers=ADMIN).status_code == 401                     # nor an admin's a user's
    # The admin keys file re-read when it changes, as the users' is
    (root / "admins.new").write_text("admin-key-0002\n")
    os.replace(root / "admins.new", root / "admins.keys")
    deadline = time.monotonic() + 10
    while httpx.get(url + "/admin/models", headers={"Authorization": "Bearer admin-key-0002"}).status_code != 200:
        assert time.monotonic() < deadline, "the admin keys file was not re-read"
        time.sleep(0.3)
    assert httpx.get(url + "/admin/models", headers=ADMIN).status_code == 401
    (root / "admins.new").write_text(ADMIN_KEY + "\n")
    os.replace(root / "admins.new", root / "admins.keys")
    while httpx.get(url + "/admin/models", headers=ADMIN).status_code != 200:
        assert time.monotonic() < deadline + 10
        time.sleep(0.3)


def worker_pids(url: str, slot: str) -> set[int]:
    """PIDs of the live workers serving `slot` (a version's engine), from transerve_model_info (a series a process)."""
    text = httpx.get(url + "/metrics", headers=USER).text
    return {int(s.labels["pid"]) for family in text_string_to_metric_families(text)
            if family.name == "transerve_model_info" for s in family.samples
            if s.labels.get("model") == slot and s.value == 1}


def test_a_restarted_worker_serves_the_versions_the_table_lists(server):
    proc, url, root = server
    assert admin(url, "", {"path": str(new_version(root, "v5"))}).status_code == 200
    pids = worker_pids(url, "de-en@v5")
    assert len(pids) == 2
    os.kill(min(pids), signal.SIGKILL)
    deadline = time.monotonic() + 90
    while worker_pids(url, "de-en@v5") - pids == set():   # its replacement loaded v5 from the table
        assert time.monotonic() < deadline, server_log(proc)[-3000:]
        time.sleep(0.5)
    while httpx.get(url + "/ready").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.3)
    answers = [translate(url) for _ in range(12)]
    assert all(r.status_code == 200 and r.json()["model_version"] == "v5" for r in answers), (
        [(r.status_code, r.text) for r in answers], server_log(proc)[-3000:])


SLOW_BYTES = 1 << 30     # a sparse file: no disk taken, yet its sha256 is computed in full (about 1 s of one core)


def slow_version(root: Path, version: str) -> Path:
    """A copy of the package with a 1 GiB file of zeros (sparse) that model.json lists: the worker checks its sha256
    as it loads the version, which takes a second or more whatever else the machine runs."""
    out = new_version(root, version)
    with open(out / "padding.bin", "wb") as f:
        f.truncate(SLOW_BYTES)
    digest, zeros = hashlib.sha256(), bytes(1 << 24)
    for _ in range(SLOW_BYTES // len(zeros)):
        digest.update(zeros)
    meta = json.loads((out / "model.json").read_text())
    meta["files"]["padding.bin"] = {"sha256": digest.hexdigest(), "bytes": SLOW_BYTES}
    (out / "model.json").write_text(json.dumps(meta, indent=2))
    return out


def test_a_request_sent_while_the_worker_loads_a_version_is_answered_before_the_load_ends(tmp_path):
    """A worker loads a version in a thread and serves between its steps (worker/model_swap.py): with one worker,
    requests sent after it began loading are answered while it still loads. The load is slow for real (a large
    file's checksum, the step a package's size makes long), not a mocked pause, so the worker's own code runs as in
    production; how long it took is what the worker logs (JSON: a spawned worker logs as the main process only then)."""
    _, admins = keys_files(tmp_path)
    path = slow_version(tmp_path, "slow")
    proc, url = start_server(PACKAGE, "--workers", "1", "--admin-keys-file", str(admins), "--log-format", "json")
    try:
        async def run() -> tuple[httpx.Response, float, list[tuple[float, float, int]]]:
            done, answers = asyncio.Event(), []

            async def client(k: int) -> None:
                async with httpx.AsyncClient(base_url=url, timeout=120) as http:
                    while not done.is_set():
                        sent = time.monotonic()
                        r = await http.post("/translate", json={"text": TEXTS[k % len(TEXTS)], "source_lang": "de",
                                                                "target_lang": "en"})
                        answers.append((sent, time.monotonic(), r.status_code))
                        k += 1

            clients = [asyncio.create_task(client(k)) for k in range(4)]
            r = await asyncio.to_thread(admin, url, "", {"path": str(path)})
            ended = time.monotonic()
            done.set()
            await asyncio.gather(*clients)
            return r, ended, answers

        r, ended, answers = asyncio.run(run())
        assert r.status_code == 200 and r.json()["active"] == "slow", r.text
        assert {status for _, _, status in answers} == {200}
        took = float(re.search(r"model version slow of de-en loaded beside .* in ([0-9.]+) s", server_log(proc))[1])
        assert took > 0.5                      # the checksum alone takes that: the load was slow
        # The worker loaded within [ended - took, ended]: requests sent and answered inside it, with a margin for the
        # HTTP process's switch of the table after the worker's answer.
        inside = [1 for sent, answered, _ in answers if sent >= ended - took and answered <= ended - 0.25]
        assert inside, (took, [(round(s - ended, 2), round(a - ended, 2)) for s, a, _ in answers[-12:]])
    finally:
        stop_server(proc)


def test_admin_routes_refused_without_admin_keys_and_a_swap_that_would_not_fit_refused(tmp_path):
    proc, url = start_server(PACKAGE, "--model-memory-bytes", "40000000")
    try:
        assert httpx.get(url + "/admin/models").json()["error"]["type"] == "model_control_off"
        assert httpx.post(url + "/admin/models", json={"path": str(PACKAGE)}).status_code == 403
    finally:
        stop_server(proc)
    _, admins = keys_files(tmp_path)
    proc, url = start_server(PACKAGE, "--model-memory-bytes", "40000000", "--admin-keys-file", str(admins))
    try:
        r = admin(url, "", {"path": str(new_version(tmp_path, "too-big"))})
        assert r.status_code == 409 and "not enough memory" in r.json()["error"]["message"], r.text
        assert translate(url, headers={}).json()["model_version"] != "too-big"
        assert 'transerve_model_loads_total{result="refused"} 1.0' in httpx.get(url + "/metrics").text
    finally:
        stop_server(proc)


def test_an_admin_keys_file_that_appears_after_start_is_read_and_re_read_on_sighup(tmp_path):
    _, admins = keys_files(tmp_path)
    later = tmp_path / "later" / "admins.keys"
    proc, url = start_server(PACKAGE, "--admin-keys-file", str(later))
    try:
        r = admin(url)
        assert r.status_code == 403 and r.json()["error"]["type"] == "model_control_off"
        later.parent.mkdir()
        os.replace(admins, later)        # as a Secret's update swaps its file in
        os.kill(proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + 10
        while admin(url).status_code != 200:
            assert time.monotonic() < deadline, "the admin keys file was not read when it appeared"
            time.sleep(0.3)
        assert httpx.get(url + "/admin/models", headers={"Authorization": "Bearer admin-key-0009"}).status_code == 401
        # A change only SIGHUP tells (rewritten in place, same size and mtime): the SIGHUP reaches this file too
        before = os.stat(later)
        later.write_text("admin-key-0009\n")
        os.utime(later, ns=(before.st_atime_ns, before.st_mtime_ns))
        time.sleep(1)
        assert admin(url).status_code == 200                      # the poller saw no change
        os.kill(proc.pid, signal.SIGHUP)
        while httpx.get(url + "/admin/models", headers={"Authorization": "Bearer admin-key-0009"}).status_code != 200:
            assert time.monotonic() < deadline + 10, "SIGHUP did not re-read the admin keys file"
            time.sleep(0.3)
        assert admin(url).status_code == 401
    finally:
        stop_server(proc)


def test_a_server_with_no_translation_worker_refuses_a_load_with_a_409(tmp_path):
    _, admins = keys_files(tmp_path)
    proc, url = start_server(ROOT / "models" / "lm-small", "--admin-keys-file", str(admins))
    try:
        r = admin(url, "", {"path": str(PACKAGE)})
        assert r.status_code == 409 and r.json()["error"]["type"] == "model_load_failed", r.text
        assert admin(url).json() == {"models": []}
    finally:
        stop_server(proc)


def wait_for(url: str, check, seconds: float = 60) -> dict:
    """The model's listing once `check(listing)` holds (AssertionError after `seconds`)."""
    deadline = time.monotonic() + seconds
    while True:
        models = admin(url).json()["models"]
        if models and check(models[0]):
            return models[0]
        assert time.monotonic() < deadline, models
        time.sleep(0.3)


def test_the_models_file_is_applied_when_it_changes_and_again_on_sighup(tmp_path):
    _, admins = keys_files(tmp_path)
    v2, v3 = new_version(tmp_path, "v2"), new_version(tmp_path, "v3")
    models = tmp_path / "models.yaml"
    models.write_text(f"models:\n  - path: {v2}\n")

    def replace(text: str) -> None:
        (tmp_path / "models.new").write_text(text)
        os.replace(tmp_path / "models.new", models)

    proc, url = start_server(PACKAGE, "--admin-keys-file", str(admins), "--models-file", str(models))
    try:
        wait_for(url, lambda m: m["active"] == "v2" and len(m["versions"]) == 1)
        assert translate(url, headers={}).json()["model_version"] == "v2"
        # /info and OpenAI's /v1/models list what serves now, not what served at start-up
        assert [(m["name"], m["version"]) for m in httpx.get(url + "/info").json()["models"]] == [("de-en", "v2")]
        assert [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]] == ["de-en"]
        replace(f"models:\n  - path: {v2}\n    canary: {{path: {v3}, share: 0.5}}\n")
        wait_for(url, lambda m: m["candidate"] == "v3" and m["canary_share"] == 0.5)
        replace(f"models:\n  - path: {v2}\n    canary: {{path: {v3}, share: 0.25}}\n")
        wait_for(url, lambda m: m["canary_share"] == 0.25)
        replace(f"models:\n  - path: {v3}\n")          # the candidate's path: promoted, not loaded again
        model = wait_for(url, lambda m: m["active"] == "v3" and m["candidate"] is None)
        assert [v["version"] for v in model["versions"]] == ["v3"]
        # Unloaded through the admin route, the file unchanged: SIGHUP applies it again
        assert admin(url, "/unload", {"name": "de-en"}).json() == {"models": []}
        assert httpx.get(url + "/info").json()["models"] == [] and httpx.get(url + "/v1/models").json()["data"] == []
        os.kill(proc.pid, signal.SIGHUP)
        wait_for(url, lambda m: m["active"] == "v3")
        assert translate(url, headers={}).json()["model_version"] == "v3"
        replace("models: [{path: 3}\n")                # malformed: nothing changes, the log says why
        time.sleep(3)
        assert admin(url).json()["models"][0]["active"] == "v3"
        replace(f"models:\n  - path: {v3}\n    canary: {{path: {v2}, share: true}}\n")   # true is no share
        time.sleep(3)
        assert admin(url).json()["models"][0]["candidate"] is None
        log = server_log(proc)
        assert "models file not applied: the models file is not valid YAML" in log and str(tmp_path) not in log
        assert "models file not applied: the models file is malformed: models.0.canary.share: Input should be a " \
               "valid number" in log
        assert 'transerve_model_loads_total{result="loaded"} 3.0' in httpx.get(url + "/metrics").text
    finally:
        stop_server(proc)


def test_a_server_never_probed_for_readiness_still_applies_its_models_file(tmp_path):
    """The models file's poller starts with each HTTP process, not with a first /ready (a plain `python -m
    service`, or a container without a health check, is never probed): only /health and the admin route are asked."""
    _, admins = keys_files(tmp_path)
    models = tmp_path / "models.yaml"
    models.write_text(f"models:\n  - path: {new_version(tmp_path, 'v2')}\n")
    port = free_port()
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "service", "--model", str(PACKAGE), "--host", "127.0.0.1",
                                 "--port", str(port), "--threads", "1", "--admin-keys-file", str(admins),
                                 "--models-file", str(models)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "TRANSERVE_DATA_DIR": str(tmp_path / "data")},
                                start_new_session=True)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 180
    try:
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        assert wait_for(url, lambda m: m["active"] == "v2")["active"] == "v2"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def test_the_cluster_gets_the_admin_keys_the_models_file_and_the_versions_volume(tmp_path):
    """deploy/: the Deployment mounts the Secret transerve-admin-keys and the ConfigMap transerve-models where
    settings.env names them, both optional (model control off, never open, without them); the model-versions
    component adds the shared volume read-only beside them."""
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl missing: the manifests are rendered with `kubectl kustomize`")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    k8s = ROOT / "deploy" / "k8s"
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{os.path.relpath(k8s / 'overlays' / 'cpu', overlay)}]\n"
        f"components: [{os.path.relpath(k8s / 'model-versions', overlay)}]\n")
    r = subprocess.run([kubectl, "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(overlay)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    objs = [d for d in yaml.safe_load_all(r.stdout) if d]
    settings = next(o for o in objs if o["kind"] == "ConfigMap")["data"]
    pod = next(o for o in objs if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for setting, volume, source, name in (("TRANSERVE_ADMIN_KEYS_FILE", "admin-keys", "secret", "transerve-admin-keys"),
                                          ("TRANSERVE_MODELS_FILE", "models-file", "configMap", "transerve-models")):
        given = volumes[volume][source]
        assert mounts[volume]["readOnly"] and given["optional"] is True
        assert given.get("secretName", given.get("name")) == name
        file = Path(settings[setting])
        assert [i["path"] for i in given["items"]] == [str(file.relative_to(mounts[volume]["mountPath"]))]
    assert volumes["admin-keys"]["secret"]["defaultMode"] & 0o007 == 0
    assert mounts["model-versions"] == {"name": "model-versions", "mountPath": "/models/versions", "readOnly": True}
    claim = volumes["model-versions"]["persistentVolumeClaim"]["claimName"]
    assert any(o["kind"] == "PersistentVolumeClaim" and o["metadata"]["name"] == claim for o in objs)
    job = yaml.safe_load((k8s / "model-versions" / "copy-version-job.yaml").read_text())
    assert job["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim


def test_a_late_unload_of_a_version_the_table_lists_again_leaves_it_serving():
    """An unload is sent after the table dropped the slot; a load of that version again (same slot) may switch the
    table back first. The worker then keeps it: what the table lists is served."""
    from types import SimpleNamespace

    from service.worker import model_swap

    table = model_swap.ModelTable()
    table.write({"models": {"de-en": {"active": "v1", "candidate": None, "share": 0.0, "keys": [], "versions": {
        "v1": {"slot": "de-en@v1", "checksum": "c", "path": "/nowhere", "directions": ["de-en"]}}}}, "busy": None})
    engine = SimpleNamespace(directions=["de-en"], package=SimpleNamespace(meta={"precision": "int8"}),
                             device_type="cpu")
    api = SimpleNamespace(models=table, engines={"de-en@v1": engine}, versions={"de-en@v1": ("de-en", "v1")},
                          retiring=set(), routes={("de", "en"): "de-en@v1"},
                          scheduler=SimpleNamespace(jobs={}, batches={}, endpoint="translate", watch=None))
    assert model_swap.control(api, {"control": "unload", "slot": "de-en@v1"})["ok"]
    assert api.engines == {"de-en@v1": engine} and not api.retiring
    table.write({"models": {}, "busy": None})                   # no longer listed: the unload takes it
    assert model_swap.control(api, {"control": "unload", "slot": "de-en@v1"})["removed"] == ["de-en@v1"]
    assert api.engines == {}


def test_the_models_file_outlives_a_model_unloaded_while_it_applies_an_entry(tmp_path):
    """An admin's unload between the file's promotion of a candidate and its next look at the table (a race the
    SIGHUP test above met under load) neither ends the file's poller nor raises: the entry is applied again at
    the next change or SIGHUP."""
    from types import SimpleNamespace

    from service.http.models_file import ModelsFile
    from service.worker.model_swap import ModelTable

    package = tmp_path / "v3"
    package.mkdir()
    (package / "model.json").write_text(json.dumps({"name": "m"}))
    v3 = hashlib.sha256((package / "model.json").read_bytes()).hexdigest()
    (tmp_path / "models.yaml").write_text(f"models:\n  - path: {package}\n")
    table = ModelTable()
    table.write({"models": {"m": {"active": "v2", "candidate": "v3", "share": 0.5, "keys": [], "versions": {
        "v2": {"slot": "m", "checksum": "other"}, "v3": {"slot": "m@v3", "checksum": v3}}}}, "busy": None})

    async def promote(name, who):   # promoted, then unloaded by an admin before the file looks again
        table.write({"models": {}, "busy": None})

    control = SimpleNamespace(table=table, promote=promote)
    assert asyncio.run(ModelsFile(str(tmp_path / "models.yaml"), control).apply()) is True


def test_messages_for_the_version_loading_wait_for_its_load_and_the_others_are_answered_at_once(tmp_path):
    """A worker loads one version at a time, in a thread (model_swap.begin): an unload of that version and the same
    load sent again wait for it and are answered in order once it is installed; an unload of another version is
    answered at once. The load is slow for real (the 1 GiB file's checksum), so the messages arrive while it runs."""
    from types import SimpleNamespace

    from service.worker import model_swap

    path = slow_version(tmp_path, "slow")
    table = model_swap.ModelTable()
    table.write({"models": {"de-en": {"active": "slow", "candidate": None, "share": 0.0, "keys": [], "versions": {
        "slow": {"slot": "de-en@slow", "checksum": "c", "path": str(path), "directions": ["de-en"]}}}}, "busy": None})
    old = SimpleNamespace(directions=["de-en"], package=SimpleNamespace(meta={"precision": "int8"}), device_type="cpu")
    api = SimpleNamespace(models=table, engines={"de-en@old": old}, versions={"de-en@old": ("de-en", "old")},
                          retiring=set(), routes={("de", "en"): "de-en@old"}, provider="cpu",
                          settings=SimpleNamespace(threads=1, spin_wait=False), loads=model_swap.Loads(),
                          scheduler=SimpleNamespace(jobs={}, batches={}, endpoint="translate", watch=None))
    answers = []
    load = {"control": "load", "slot": "de-en@slow", "name": "de-en", "version": "slow", "path": str(path),
            "checksum": "c"}
    for n, payload in enumerate([load, {"control": "unload", "slot": "de-en@slow"}, load,
                                 {"control": "unload", "slot": "de-en@old"}]):
        model_swap.begin(api, payload, lambda a, n=n: answers.append((n, a)))
    assert answers == [(3, {"ok": True, "removed": ["de-en@old"]})] and api.loads.running is not None
    deadline = time.monotonic() + 120
    while model_swap.finish_loads(api):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert [n for n, _ in answers] == [3, 0, 1, 2]
    examples = model_swap.card_examples(path, json.loads((path / "model.json").read_text())["directions"])
    assert answers[1][1]["ok"] and answers[1][1]["checked"] == len(examples) > 0, answers
    assert answers[2][1] == {"ok": True, "removed": []}           # the table lists it: it serves on
    assert answers[3][1] == {"ok": True, "resident_bytes": 0, "checked": 0}
    assert list(api.engines) == ["de-en@slow"] and api.routes[("de", "en")] == "de-en@slow"
