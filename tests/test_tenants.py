"""Many users on one service (issue 38): keys with names and limits (service/keyfile.py), counted in a real
redis-server shared by two server processes (service/http/quota.py, redis_bridge.py), 429s in each flavour's
shape with Retry-After and the RateLimit fields, Redis stopped under load and back, and the keys file reloaded
on SIGHUP and when it changes (service/http/keys.py).

The servers serve the committed packages (models/de-en, models/lm-small; TRANSERVE_TEST_PACKAGE and
TRANSERVE_TEST_LM_PACKAGE name others): nothing to train. redis-server comes from Debian's package
(scripts/test.sh installs it as root); without it the tests that need it skip and say so."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import hashlib
import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from conftest import ROOT, free_port, server_log, start_server, stop_server
from service.config import Settings
from service.errors import ApiError
from service.http.keys import KeyRing
from service.http.quota import Quota, charges
from service.keyfile import KeysFileError, Limits, read_keys_file

PACKAGE = os.environ.get("TRANSERVE_TEST_PACKAGE") or str(ROOT / "models" / "de-en")
LM_PACKAGE = os.environ.get("TRANSERVE_TEST_LM_PACKAGE") or str(ROOT / "models" / "lm-small")
TEXT = ("Das Wetter ist heute schön, und wir gehen in den Park. Morgen regnet es wohl den ganzen Tag lang da.")
assert len(TEXT) == 100
HAMMER_S = float(os.environ.get("TRANSERVE_TENANT_HAMMER_S", "10"))   # the 20 s, shortened for CI
KEYS = {"capped": "capped-key-0001", "free": "free-key-0002", "chatty": "chatty-key-0003",
        "steady": "steady-key-0004", "newbie": "newbie-key-0005", "narrow": "narrow-key-0006",
        "tokened": "tokened-key-0007", "daily": "daily-key-0008"}


def keys_yaml(*names: str) -> str:
    limits = {"capped": "{characters_per_minute: 1000}", "chatty": "{requests_per_minute: 2}",
              "tokened": "{tokens_per_day: 10}", "daily": "{characters_per_day: 100000}"}
    lines = ["keys:"]
    for name in names:
        if name == "steady":   # only its SHA-256 in the file
            lines += [f"  - name: {name}", f"    sha256: {hashlib.sha256(KEYS[name].encode()).hexdigest()}"]
        else:
            lines += [f"  - name: {name}", f"    key: {KEYS[name]}"]
        if name in limits:
            lines.append(f"    limits: {limits[name]}")
        if name == "narrow":
            lines.append("    routes: [/usage, /translate]")
        if name == "tokened":
            lines.append("    models: [lm-small]")
    return "\n".join(lines) + "\n"


def metric_samples(url: str, family: str) -> list:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", headers=bearer("free"), timeout=30).text
    return [s for f in text_string_to_metric_families(text) if f.name == family for s in f.samples
            if s.name.endswith("_total")]


def bearer(name: str) -> dict:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def replace(path: Path, text: str) -> None:
    """As a Kubernetes Secret's update does: a new file put in place at once."""
    tmp = path.with_suffix(".new")
    tmp.write_text(text)
    os.replace(tmp, path)


# --- the keys file ----------------------------------------------------------------------------------------
def test_structured_keys_file_yaml_and_json_with_names_limits_and_hashes(tmp_path):
    f = tmp_path / "keys.yaml"
    f.write_text(keys_yaml("capped", "steady", "narrow"))
    capped, steady, narrow = read_keys_file(str(f))
    assert capped.name == "capped" and capped.limits == Limits(characters_per_minute=1000)
    assert steady.digest == hashlib.sha256(KEYS["steady"].encode()).digest() and steady.limits == Limits()
    assert narrow.routes == {"/usage", "/translate"} and narrow.models is None
    j = tmp_path / "keys.json"
    j.write_text(json.dumps({"keys": [{"name": "a", "key": "k1", "limits": {"tokens_per_day": 5},
                                       "models": ["lm-small"]}]}))
    (a,) = read_keys_file(str(j))
    assert a.limits.tokens_per_day == 5 and a.models == {"lm-small"}
    plain = tmp_path / "plain"
    plain.write_text("# a comment\nk1\nk2\n")
    assert [t.name for t in read_keys_file(str(plain))] == [
        "key-" + hashlib.sha256(k.encode()).hexdigest()[:8] for k in ("k1", "k2")]


@pytest.mark.parametrize("text,why", [
    ("keys:\n  - name: a\n", "exactly one of key and sha256"),
    ("keys:\n  - name: a\n    key: s3cret-in-file\n    limits: {characters_per_minute: lots}\n", "valid integer"),
    ("keys:\n  - name: a\n    key: s3cret-in-file\n  - name: a\n    key: other\n", "twice"),
    ("keys:\n  - name: a\n    key: s3cret-in-file\n    colour: red\n", "Extra inputs"),
    ("keys: [name: a, key: s3cret-in-file\n", "not valid YAML"),
    ('{"keys": [{"name": "a", "key": "s3cret-in-file"}', "not valid JSON"),
])
def test_a_malformed_keys_file_says_why_without_quoting_a_key(tmp_path, text, why):
    f = tmp_path / "keys"
    f.write_text(text)
    with pytest.raises(KeysFileError) as e:
        read_keys_file(str(f))
    assert why in str(e.value) and "s3cret" not in str(e.value), str(e.value)


def test_keyring_reload_is_all_or_nothing(tmp_path):
    f = tmp_path / "keys"
    f.write_text(keys_yaml("capped", "free"))
    ring = KeyRing(["given-key"], str(f))
    assert ring.find(KEYS["free"]).name == "free" and ring.find("given-key") is not None
    replace(f, keys_yaml("capped", "newbie"))
    assert ring.reload("test") and ring.find(KEYS["free"]) is None and ring.find(KEYS["newbie"]).name == "newbie"
    replace(f, "keys:\n  - name: broken\n")
    assert not ring.reload("test") and ring.find(KEYS["newbie"]).name == "newbie"
    assert ring.find("given-key") is not None   # --api-keys stay whatever the file says


# --- counting, in memory and in Redis ------------------------------------------------------------------------
def capped_tenant():
    return next(t for t in read_keys_file_text(keys_yaml("capped")))


def read_keys_file_text(text: str):
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    try:
        return read_keys_file(f.name)
    finally:
        os.unlink(f.name)


async def spend(quota: Quota, tenant, n: int, cost: int = 100) -> list:
    """n charges of `cost` characters at once: the RateLimit fields of each admitted, the 429 of each refused."""
    async def one():
        try:
            return await quota.take(tenant, charges(tenant, characters=cost))
        except ApiError as e:
            return e
    return await asyncio.gather(*(one() for _ in range(n)))


def test_memory_counts_a_window_exactly_with_retry_after_and_ratelimit_fields():
    tenant = capped_tenant()
    out = asyncio.run(spend(Quota(Settings()), tenant, 13))
    passed, refused = [o for o in out if isinstance(o, dict)], [o for o in out if isinstance(o, ApiError)]
    assert len(passed) == 10 and len(refused) == 3
    assert passed[0]["RateLimit-Policy"] == '"characters-minute";q=1000;w=60'
    assert passed[-1]["RateLimit"].startswith('"characters-minute";r=0;t=')
    e = refused[0]
    assert e.status == 429 and 1 <= int(e.headers["Retry-After"]) <= 60 and e.headers["RateLimit"].startswith(
        '"characters-minute";r=0;')
    with pytest.raises(ApiError) as big:   # more than the limit at once: never fits, so no Retry-After
        asyncio.run(Quota(Settings()).take(tenant, charges(tenant, characters=1001)))
    assert big.value.status == 413


def test_redis_counts_atomically_across_clients(redis):
    """Two Quotas (two processes' worth of connections) charging one key at once: exactly the limit passes."""
    redis.flush()
    tenant = capped_tenant()
    # A generous timeout, and refusal past it: on a loaded machine 50 new connections may take longer than the
    # default 100 ms, and an admitted request would hide whether the counting itself is atomic.
    settings = Settings(redis_url=redis.url, redis_timeout_ms=5000, redis_down="refuse")

    async def both():
        return [*await spend(Quota(settings), tenant, 25), *await spend(Quota(settings), tenant, 25)]

    out = asyncio.run(both())
    assert sum(isinstance(o, dict) for o in out) == 10, out


def test_a_counter_that_is_not_a_number_starts_again_at_0_instead_of_failing_the_store(redis):
    """A counter written by something else (a string, another type): its key counts from 0 again; it was a script
    error, read as Redis down, which turned every key's limits off (admit) or refused them all (refuse) for a
    second at each of its requests."""
    import redis as redis_client

    redis.flush()
    tenant = capped_tenant()
    store = redis_client.Redis.from_url(redis.url)
    settings = Settings(redis_url=redis.url, redis_timeout_ms=5000, redis_down="refuse")
    counter = charges(tenant, characters=1)[0].counter(tenant)
    for garbage in (lambda: store.set(counter, "garbage"), lambda: store.hset(counter, "a", "b")):
        store.delete(counter)
        garbage()
        out = asyncio.run(spend(Quota(settings), tenant, 12))
        assert sum(isinstance(o, dict) for o in out) == 10, out          # its limit, counted from 0
        assert {o.type for o in out if not isinstance(o, dict)} == {"rate_limited"}


@pytest.mark.parametrize("choice,status", [("admit", None), ("refuse", 429)])
def test_redis_unreachable_applies_the_configured_choice_within_the_timeout(choice, status):
    tenant = capped_tenant()
    quota = Quota(Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0", redis_down=choice, redis_timeout_ms=200))
    t0 = time.monotonic()
    out = asyncio.run(spend(quota, tenant, 3))
    assert time.monotonic() - t0 < 1.0
    if status is None:
        assert out == [{}, {}, {}]
    else:
        assert all(isinstance(o, ApiError) and o.status == status and o.type == "limits_unavailable"
                   and o.headers["Retry-After"] == "1" for o in out), out


# --- two server processes sharing one redis-server ---------------------------------------------------------------
@pytest.fixture(scope="module")
def servers(redis, tmp_path_factory):
    """Two servers on one Redis: the first admits while Redis is out, the second refuses. A timeout of 2 s:
    a loaded test machine must not turn a slow answer into an admission (a stopped Redis fails at once)."""
    keys = tmp_path_factory.mktemp("keys") / "keys.yaml"
    keys.write_text(keys_yaml("capped", "free", "chatty", "steady", "narrow", "tokened"))
    redis.flush()
    procs = []
    try:
        for choice in ("admit", "refuse"):
            procs.append(start_server(PACKAGE, "--model", LM_PACKAGE, "--api-keys-file", str(keys), "--redis-url",
                                      redis.url, "--redis-down", choice, "--redis-timeout-ms", "2000"))
        yield [url for _, url in procs], [proc for proc, _ in procs], keys
    finally:
        for proc, _ in procs:
            stop_server(proc)


def hammer(urls: list[str], key: str, seconds: float, per_server: int = 2, path: str = "/translate") -> list:
    """`per_server` clients on each server sending 100-character texts as fast as they are answered."""
    deadline = time.monotonic() + seconds
    body = {"text": TEXT, "source_lang": "de", "target_lang": "en", "beam_size": 1}

    def client(url: str) -> list:
        out = []
        with httpx.Client(base_url=url, timeout=60, headers=bearer(key)) as http:
            while time.monotonic() < deadline:
                out.append(http.post(path, json=body))
        return out

    with cf.ThreadPoolExecutor(len(urls) * per_server) as pool:
        runs = [pool.submit(client, url) for url in urls for _ in range(per_server)]
        return [r for run in runs for r in run.result()]


def test_two_servers_share_a_keys_character_limit(servers):
    urls, _, _ = servers
    answers = hammer(urls, "capped", HAMMER_S)
    ok = [r for r in answers if r.status_code == 200]
    limited = [r for r in answers if r.status_code == 429]
    assert 1 <= len(ok) <= 10 and len(ok) + len(limited) == len(answers), [r.status_code for r in answers]
    assert len(limited) > len(ok), "the hammer should have run well past the limit"
    for r in limited:
        assert 1 <= int(r.headers["retry-after"]) <= 60 and r.json()["error"]["type"] == "rate_limited"
        assert r.headers["ratelimit-policy"] == '"characters-minute";q=1000;w=60'
        assert r.headers["ratelimit"].startswith('"characters-minute";r=')
    assert ok[0].headers["ratelimit-policy"] == '"characters-minute";q=1000;w=60'
    # Another key is not affected, on either server; LibreTranslate's clients get its shape.
    for url in urls:
        assert httpx.post(url + "/translate", json={"text": TEXT, "source_lang": "de", "target_lang": "en"},
                          headers=bearer("free"), timeout=60).status_code == 200
        r = httpx.post(url + "/libretranslate/translate", json={"q": TEXT, "source": "de", "target": "en",
                                                                "api_key": KEYS["capped"]}, timeout=60)
        assert r.status_code == 429 and list(r.json()) == ["error"] and "retry-after" in r.headers, r.text
    usage = httpx.get(urls[1] + "/usage", headers=bearer("capped")).json()
    assert usage["key"] == "capped" and usage["limits"]["characters_per_minute"]["used"] <= 1000
    assert usage["limits"]["characters_per_minute"]["remaining"] < 100
    # A key at its own limit is a client's error, not the service overloaded (which more replicas would help).
    errors = {(s.labels["endpoint"], s.labels["kind"]): s.value for s in metric_samples(urls[0], "transerve_errors")}
    assert errors[("translate", "limit")] >= 1 and errors[("translate", "overload")] == 0, errors


def test_openai_client_sees_its_rate_limit_error(servers):
    openai = pytest.importorskip("openai")
    urls, _, _ = servers
    clients = [openai.OpenAI(base_url=url + "/v1", api_key=KEYS["chatty"], max_retries=0) for url in urls]
    # Two requests a minute, over both servers: a completion on one, the model list on the other.
    clients[0].completions.create(model="lm-small", prompt="Das ist", max_tokens=2, seed=1)
    clients[1].models.list()
    with pytest.raises(openai.RateLimitError) as e:
        clients[1].completions.create(model="lm-small", prompt="Das ist", max_tokens=2, seed=1)
    assert e.value.body["type"] == "rate_limit_error" and e.value.body["code"] == "rate_limited"
    assert 1 <= int(e.value.response.headers["retry-after"]) <= 60   # what the client's retry waits for


def test_a_key_limited_to_routes_gets_403_elsewhere(servers):
    urls, _, _ = servers
    r = httpx.post(urls[0] + "/generate", json={"prompt": "Das"}, headers=bearer("narrow"))
    assert r.status_code == 403 and r.json()["error"]["type"] == "route_not_allowed", r.text
    assert httpx.get(urls[0] + "/usage", headers=bearer("narrow")).json()["key"] == "narrow"


def test_tokens_per_day_are_counted_when_a_generation_ends_and_models_are_kept_to_the_list(servers):
    urls, _, _ = servers
    # OpenAI's model list shows a key the models it may use; another is not found, as OpenAI answers
    listed = httpx.get(urls[0] + "/v1/models", headers=bearer("tokened")).json()["data"]
    assert [m["id"] for m in listed] == ["lm-small"]
    assert {m["id"] for m in httpx.get(urls[0] + "/v1/models", headers=bearer("free")).json()["data"]} == {
        "de-en", "lm-small"}
    r = httpx.get(urls[1] + "/v1/models/de-en", headers=bearer("tokened"))
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    assert httpx.get(urls[1] + "/v1/models/lm-small", headers=bearer("tokened")).json()["id"] == "lm-small"
    r = httpx.post(urls[0] + "/v1/completions", json={"model": "de-en", "prompt": "Das"}, headers=bearer("tokened"))
    assert r.status_code == 404 and "lm-small" in r.text and "de-en'" in r.text and "de-en," not in r.text, r.text
    prompt = {"prompt": "Das ist", "max_new_tokens": 8, "seed": 1}
    first = httpx.post(urls[0] + "/generate", json=prompt, headers=bearer("tokened"), timeout=60)
    assert first.status_code == 200, first.text
    usage = first.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] >= 10, usage   # the day's 10 tokens used up
    r = httpx.post(urls[1] + "/generate", json=prompt, headers=bearer("tokened"), timeout=60)
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limited", r.text
    assert r.headers["ratelimit-policy"] == '"tokens-day";q=10;w=86400'
    r = httpx.post(urls[0] + "/translate", json={"text": TEXT, "source_lang": "de", "target_lang": "en"},
                   headers=bearer("tokened"))
    assert r.status_code == 403 and r.json()["error"]["type"] == "model_not_allowed", r.text


def statuses_while(urls: list[str], key: str, action, seconds: float) -> list[int]:
    """The statuses of steady translation traffic while `action` runs."""
    with cf.ThreadPoolExecutor(1) as pool:
        load = pool.submit(hammer, urls, key, seconds, 1)
        action()
        return [r.status_code for r in load.result()]


def test_keys_reload_on_sighup_and_on_file_change_without_failing_a_request(servers):
    urls, procs, keys = servers

    def swap():
        time.sleep(0.5)
        replace(keys, keys_yaml("capped", "chatty", "steady", "newbie"))   # "free" goes, "newbie" comes
        procs[0].send_signal(signal.SIGHUP)   # the second server sees the file change on its own
        t0 = time.monotonic()
        for url in urls:
            while not (httpx.get(url + "/usage", headers=bearer("newbie")).status_code == 200
                       and httpx.get(url + "/usage", headers=bearer("free")).status_code == 401):
                assert time.monotonic() - t0 < 1.0, "the new keys took more than 1 s"
                time.sleep(0.05)

    statuses = statuses_while(urls, "steady", swap, 4)
    assert statuses and set(statuses) == {200}, statuses
    # A malformed file keeps the keys in use, and the log says why, quoting no key.
    replace(keys, "keys:\n  - name: broken\n    limits: {tokens_per_day: 5}\n")
    procs[0].send_signal(signal.SIGHUP)
    time.sleep(1.0)
    for url in urls:
        assert httpx.get(url + "/usage", headers=bearer("newbie")).status_code == 200
    for proc in procs:
        log = server_log(proc)
        assert "API keys not reloaded" in log and "exactly one of key and sha256" in log, log[-2000:]
        assert not any(k in log for k in KEYS.values()) and TEXT[:30] not in log


def test_redis_stopped_under_load_and_back(servers, redis):
    """While Redis is out: no 5xx; the first server admits the capped key, the second refuses with 429; DeepL's
    usage of a key's day is a 429 to retry on either (it said 0 used). Back: the capped key is limited again (its
    counters went with the Redis that held them)."""
    urls, _, keys = servers
    replace(keys, keys_yaml("capped", "free", "chatty", "steady", "daily"))
    time.sleep(1.0)
    answers = {}

    def outage():
        time.sleep(0.5)
        redis.stop()
        for i, url in enumerate(urls):
            answers[i] = [httpx.post(url + "/translate", json={"text": TEXT, "source_lang": "de", "target_lang": "en",
                                                               "beam_size": 1}, headers=bearer("capped"), timeout=60)
                          for _ in range(3)]
        answers["usage"] = [httpx.get(url + "/deepl/v2/usage", headers={"Authorization": "DeepL-Auth-Key "
                                                                       + KEYS["daily"]}, timeout=60) for url in urls]
        time.sleep(1.0)

    statuses = statuses_while(urls, "steady", outage, 4)
    assert all(s < 500 for s in statuses), statuses
    assert [r.status_code for r in answers[0]] == [200] * 3                       # admitted
    assert all(r.status_code == 429 and r.json()["error"]["type"] == "limits_unavailable"
               and r.headers["retry-after"] == "1" for r in answers[1])          # refused, retry shortly
    assert [(r.status_code, r.headers.get("retry-after")) for r in answers["usage"]] == [(429, "1")] * 2, \
        [r.text for r in answers["usage"]]
    metrics = httpx.get(urls[0] + "/metrics", headers=bearer("steady")).text
    assert 'transerve_ratelimit_store_errors_total{outcome="admitted"}' in metrics
    assert not any(k in metrics for k in KEYS.values())
    redis.start()
    time.sleep(1.5)   # the pause after a failure (quota.PAUSE_S), then the next request asks Redis again
    seen = []
    while 429 not in seen:   # counted from 0 again: its counters went with the Redis that held them
        assert len(seen) <= 10, seen
        r = httpx.post(urls[len(seen) % 2] + "/translate", json={"text": TEXT, "source_lang": "de",
                                                                 "target_lang": "en", "beam_size": 1},
                       headers=bearer("capped"), timeout=60)
        seen.append(r.status_code)
    assert seen.count(200) == 10 and r.json()["error"]["type"] == "rate_limited", seen


# --- JSON logs (--log-format json) ----------------------------------------------------------------------------
def test_json_logs_one_line_per_request_with_its_id_and_no_key_or_text(tmp_path):
    keys = tmp_path / "keys.yaml"
    keys.write_text(keys_yaml("steady", "capped"))
    proc, url = start_server(PACKAGE, "--model", LM_PACKAGE, "--api-keys-file", str(keys), "--log-format", "json")
    sent = {}
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            def send(rid, method, path, key="steady", route=None, **kwargs):
                headers = {"X-Request-ID": rid} | (bearer(key) if key else {})
                sent[rid] = (route or path, http.request(method, path, headers=headers, **kwargs).status_code)
            send("log-1", "POST", "/translate", json={"text": TEXT, "source_lang": "de", "target_lang": "en"})
            send("log-2", "POST", "/translate", json={"text": "", "source_lang": "de", "target_lang": "en"})
            send("log-3", "POST", "/translate", key=None, json={"text": TEXT, "source_lang": "de", "target_lang": "en"})
            send("log-4", "POST", "/generate", json={"prompt": "Das ist", "max_new_tokens": 4, "seed": 1})
            send("log-5", "GET", "/usage", key="capped")
            send("log-6", "POST", "/libretranslate/translate", key=None,
                 json={"q": TEXT, "source": "de", "target": "en", "api_key": KEYS["capped"]})
            # Paths and queries a client chose are logged as the route's template, or as "(unmatched)"
            send("log-7", "GET", "/v1/models/GeheimModell?token=Geheimnis", route="/v1/models/{model}")
            send("log-8", "GET", "/NoKeyPfad-uuuu?token=Geheimnis", key=None, route="(unmatched)")
            send("log-9", "GET", "/Pfad-Geheim", route="(unmatched)")
    finally:
        stop_server(proc)
    log = server_log(proc)
    lines = [json.loads(line) for line in log.splitlines() if line.strip()]   # every line parses
    access = {rec["request_id"]: rec for rec in lines if rec["logger"] == "transerve.access"}
    assert {rid: (a["route"], a["status"]) for rid, a in access.items() if rid in sent} == sent
    assert sent["log-1"][1] == 200 and sent["log-3"][1] == 401 and sent["log-6"][1] == 200
    assert sum(rec.get("request_id") == "log-1" for rec in lines) == 1
    one = access["log-1"]
    assert one["key"] == "steady" and one["chars_in"] == 100 and one["tokens_out"] > 0 and one["model"] == "de-en"
    assert one["queue_ms"] >= 0 and one["inference_ms"] > 0 and one["total_ms"] > 0 and "error_type" not in one
    assert access["log-2"]["error_type"] == "invalid_request" and access["log-3"]["error_type"] == "unauthorized"
    assert access["log-4"]["tokens_out"] > 0 and access["log-4"]["model"] == "lm-small"
    assert access["log-6"]["key"] == "capped" and access["log-6"]["chars_in"] == 100
    assert any(rec["logger"].startswith("uvicorn") for rec in lines)   # the server's own events, as JSON
    # The inference workers' lines are JSON too (they are spawned, and configure their logging in setup), each
    # from a process of its own: neither an HTTP process (the access lines') nor the other worker.
    workers = [rec for rec in lines if rec.get("message", "").startswith(("worker ready", "generation worker ready"))]
    http_pids = {rec["pid"] for rec in access.values()}
    assert len(workers) == 2 and len({rec["pid"] for rec in workers} - http_pids) == 2, workers
    assert all(rec["level"] == "info" and rec["logger"] == "transerve" for rec in workers)
    assert not any(k in log for k in KEYS.values()) and TEXT[:20] not in log and "Das ist" not in log
    assert not any(secret in log for secret in ("Geheim", "NoKeyPfad", "token="))
