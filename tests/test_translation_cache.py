"""The translation cache (service/http/translation_cache.py, --cache-size), against real servers over models/de-en: A
and B keep answers in their memory and in one real redis-server, C keeps none (the reference: what the worker
answers for each text whole). A cached answer is C's answer, per sentence joined back into texts (alternatives,
scores, glossary reports); a request whose sentences are all kept makes no decoder call and takes no worker
(/metrics say so), and only for the key that asked it before (another key's is a miss: a hit would tell it what was
sent); a glossary or another option is an entry of its own; a document translated again makes no decoder call and
comes back the same; what A computed is a hit on B for the same key; a value in Redis that is not an answer is one
miss and is written over; a key's limits and the input limits refuse a request the same with a warm cache as without
one. A reaches Redis through `Gate`, a proxy that can hold Redis's replies or answer nothing: a request partly kept
whose misses a swapped-in version answered is sent again whole, so it names the version that computed all of it;
while Redis does not answer, one request waits the timeout and the next ones none, and once Redis is back it is used
again after the back-off. Without servers: the memory's bounds, the key (every option, the glossary, the package's
version, the key's name), sampling without a seed never kept, Redis down as misses. Timings are
benchmarks/translation_cache.py's to print, not asserted here.
redis-server comes from Debian's package (scripts/test.sh installs it); without it the server tests skip."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import dataclasses
import json
import socket
import subprocess
import threading
import time
from types import SimpleNamespace

import httpx
import pytest
import redis as redis_client
from prometheus_client.parser import text_string_to_metric_families

from conftest import ROOT, free_port, pairs64, server_log, start_server, stop_server
from service.config import Settings
from service.http.redis_bridge import RedisCache
from service.http.translation_cache import (BACKOFF_MOST_S, BACKOFF_S, ENTRY_OVERHEAD, WRITES_QUEUED, MemoryCache,
                                            RedisTier, TranslationCache, joined, parsed, request_key, units)
from service.shared.options import SearchOptions
from service.shared.text import split_sentences

KEYS = {"alice": "alice-cache-key-0001", "bob": "bob-cache-key-0002", "carol": "carol-cache-key-0003"}
ADMIN = {"Authorization": "Bearer admin-cache-key-0001"}
CAROL_CHARS_PER_MINUTE = 100
A_TIMEOUT_S = 5.0   # A's --redis-timeout-ms: longer than a promote takes on a loaded CI machine (the swap test)
GERMAN = [de for de, _ in pairs64()]
# Texts of several sentences, one with a line break, one with a sentence twice.
TEXTS = [" ".join(GERMAN[0:3]), GERMAN[3] + "\n" + GERMAN[4] + " " + GERMAN[5], GERMAN[6],
         f"{GERMAN[7]} {GERMAN[8]} {GERMAN[7]}"]
GLOSSARY = [{"source": "Haus", "target": "building"}, {"source": "Trick", "target": "knack"}]
# The last: at max_length 4 its first sentence holds "building", its second does not (it writes "knack" only).
GLOSSED = ["Das Haus ist klein. Das ist der ganze Trick.", "Das Haus ist alt. Das Haus ist groß.",
           "Das Haus. Das Haus ist sehr sehr groß und schön, und das ist der ganze Trick."]


class Gate:
    """A TCP proxy in front of the test's redis-server, for A: "pass" forwards both ways; "hold" forwards what A
    sends and holds Redis's replies until the mode changes (a Redis slow to answer); "drop" takes connections and
    bytes and answers nothing (a Redis that hangs), and leaving it closes those connections (as a Redis restarted
    would), so that no reply dropped can be read as another's."""

    def __init__(self, port: int):
        self.target, self.mode, self.held = port, "pass", 0
        self.cond = threading.Condition()
        self.conns: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self) -> None:
        while True:
            client, _ = self.listener.accept()
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self.cond:
                self.conns += [client, upstream]
            threading.Thread(target=self.pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self.pump, args=(upstream, client, True), daemon=True).start()

    def pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while data := src.recv(65536):
                with self.cond:
                    if replies and self.mode == "hold":
                        self.held += 1
                        self.cond.notify_all()
                        self.cond.wait_for(lambda: self.mode != "hold")
                    if self.mode == "drop":
                        continue
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with self.cond:
                    if sock in self.conns:
                        self.conns.remove(sock)
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def set(self, mode: str) -> None:
        with self.cond:
            if self.mode == "drop" and mode != "drop":
                for sock in self.conns:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
            self.mode = mode
            self.cond.notify_all()

    def wait_held(self, n: int, seconds: float = 60) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.held >= n, seconds), "no Redis reply was held"


@pytest.fixture(scope="module")
def servers(redis, tmp_path_factory):
    """A and B (a cache each, one redis-server between them, A's through a Gate) and C (no cache), started
    together; keyed (carol with a characters-per-minute limit), A with an admin key (model control)."""
    redis.flush()
    root = tmp_path_factory.mktemp("keys")
    keys, admins = root / "keys.yaml", root / "admins.keys"
    keys.write_text("keys:\n" + "".join(f"  - name: {n}\n    key: {k}\n" for n, k in KEYS.items()) +
                    f"    limits:\n      characters_per_minute: {CAROL_CHARS_PER_MINUTE}\n")   # carol, the last
    admins.write_text(ADMIN["Authorization"].split()[1] + "\n")
    gate = Gate(redis.port)
    keyed = ("--api-keys-file", str(keys))
    cached = (*keyed, "--cache-size", "10000", "--redis-url", redis.url, "--redis-timeout-ms", "2000")
    a = (*keyed, "--cache-size", "10000", "--redis-url", gate.url, "--redis-timeout-ms", str(int(A_TIMEOUT_S * 1000)),
         "--admin-keys-file", str(admins))
    with cf.ThreadPoolExecutor(3) as pool:
        started = list(pool.map(lambda extra: start_server(ROOT / "models" / "de-en", *extra),
                                [a, cached, (*keyed, "--cache-size", "0")]))
    yield SimpleNamespace(a=started[0][1], b=started[1][1], c=started[2][1], procs=[p for p, _ in started],
                          redis=redis, gate=gate, root=root)
    gate.set("pass")
    for proc, _ in started:
        stop_server(proc)


def translate(url: str, body: dict, key: str = "alice") -> dict:
    r = httpx.post(url + "/translate", json={"source_lang": "de", "target_lang": "en"} | body,
                   headers={"Authorization": f"Bearer {KEYS[key]}"}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def metric(url: str, name: str, **labels) -> float:
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEYS['alice']}"}, timeout=30).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def worker_work(url: str) -> tuple[float, float, float]:
    """(decoder calls, requests the workers took, source tokens read) so far."""
    return (metric(url, "transerve_step_batch_rows_count", endpoint="translate"),
            metric(url, "transerve_batch_size_requests_sum", endpoint="translate"),
            metric(url, "transerve_input_tokens_total", endpoint="translate"))


@pytest.mark.parametrize("options", [{}, {"num_alternatives": 2, "beam_size": 4}, {"beam_size": 1},
                                     {"glossary": GLOSSARY}, {"glossary": GLOSSARY, "max_length": 4},
                                     {"max_length": 6, "length_penalty": 0.5}])
def test_a_cached_answer_is_the_one_the_worker_computes_for_the_text_whole(servers, options):
    texts = TEXTS + GLOSSED if "glossary" in options else TEXTS
    reference = translate(servers.c, {"text": texts} | options)
    first, again = (translate(servers.a, {"text": texts} | options) for _ in range(2))
    assert first["translations"] == reference["translations"] == again["translations"]
    assert first["model"] == again["model"] == reference["model"] == "de-en"
    if "glossary" in options:   # reports merged over a text's sentences: an entry held only where held in each
        assert [[e["source"] for e in i["glossary"]] for i in again["translations"][-3:]] == [
            ["Haus", "Trick"], ["Haus"], ["Haus", "Trick"]]
        assert again["translations"][-1]["glossary"][0]["held"] is ("max_length" not in options)
    # Some kept, some not: only the new sentences are computed, and the answer is still the whole text's.
    mixed = [TEXTS[0], f"{GERMAN[20]} {GERMAN[1]}", GERMAN[21]]
    misses = metric(servers.a, "transerve_translation_cache_misses_total")
    assert translate(servers.a, {"text": mixed} | options)["translations"] == \
        translate(servers.c, {"text": mixed} | options)["translations"]
    assert metric(servers.a, "transerve_translation_cache_misses_total") - misses == 2


def test_a_request_all_kept_reaches_no_worker_for_the_key_that_asked_it_and_is_still_charged(servers):
    body = {"text": [GERMAN[30], f"{GERMAN[31]} {GERMAN[32]}"], "beam_size": 3}
    computed = {key: translate(servers.a, body, key) for key in ("alice", "bob")}   # bob's: not alice's entries
    assert computed["bob"]["timings"]["inference_ms"] > 0
    work, hits = worker_work(servers.a), metric(servers.a, "transerve_translation_cache_hits_total", tier="memory")
    chars = {n: metric(servers.a, "transerve_key_characters_total", key=n) for n in ("alice", "bob")}
    answers = [translate(servers.a, body, key) for key in ("alice", "bob", "bob")]
    assert worker_work(servers.a) == work                      # no decoder call, no request taken, no token read
    assert metric(servers.a, "transerve_translation_cache_hits_total", tier="memory") - hits == 3 * 3
    n = sum(map(len, body["text"]))
    assert [metric(servers.a, "transerve_key_characters_total", key=k) - chars[k] for k in chars] == [n, 2 * n]
    for answer in answers:
        assert answer["translations"] == computed["alice"]["translations"] == computed["bob"]["translations"]
        assert answer["model"] == computed["alice"]["model"]
        assert answer["timings"]["queue_ms"] == answer["timings"]["inference_ms"] == 0.0   # no worker ran


def test_another_keys_kept_sentence_is_a_miss(servers):
    """A hit answers in a millisecond with zero queue and inference times: shared between keys, it told one key
    which of four guesses another had just sent."""
    sent = "Wir entlassen im Mai vierzig Leute."
    translate(servers.a, {"text": sent}, "alice")
    hits = metric(servers.a, "transerve_translation_cache_hits_total")
    work = worker_work(servers.a)
    for guess in ("zehn", "vierzig"):
        answer = translate(servers.a, {"text": sent.replace("vierzig", guess)}, "bob")
        assert answer["timings"]["inference_ms"] > 0, guess
    assert metric(servers.a, "transerve_translation_cache_hits_total") == hits and worker_work(servers.a) != work
    assert translate(servers.a, {"text": sent}, "alice")["timings"]["inference_ms"] == 0.0   # alice's own: kept


def test_a_glossary_or_an_option_is_an_entry_of_its_own_and_a_stored_glossary_its_entries(servers):
    body = {"text": ["Das Haus ist neu. Der Trick ist alt.", "Das Haus steht dort."]}   # asked nowhere else
    translate(servers.a, body)
    for other in ({"glossary": GLOSSARY}, {"beam_size": 2}, {"no_repeat_ngram_size": 2}, {"repetition_penalty": 1.2}):
        work = worker_work(servers.a)
        translate(servers.a, body | other)
        assert worker_work(servers.a)[0] > work[0], other          # computed: the options change the answer
    r = httpx.post(servers.a + "/glossaries", json={"name": "Bau", "source_lang": "de", "target_lang": "en",
                                                    "entries": GLOSSARY},
                   headers={"Authorization": f"Bearer {KEYS['alice']}"}, timeout=30)
    assert r.status_code in (200, 201), r.text
    work = worker_work(servers.a)
    stored = translate(servers.a, body | {"glossary_id": r.json()["glossary_id"]})
    assert worker_work(servers.a) == work                       # its entries are the inline glossary's
    assert stored["translations"] == translate(servers.c, body | {"glossary": GLOSSARY})["translations"]


def test_a_document_translated_again_makes_no_decoder_call_and_comes_back_the_same(servers):
    paragraphs = [f"{GERMAN[40 + i]} {GERMAN[50 + i]}" for i in range(6)]
    data = ("\n".join(paragraphs * 10) + "\n").encode()

    def document(url: str) -> bytes:
        form = {"source": "de", "target": "en", "api_key": KEYS["alice"]}
        r = httpx.post(url + "/libretranslate/translate_file", data=form, files={"file": ("doc.txt", data)},
                       timeout=300)
        assert r.status_code == 200, r.text
        got = httpx.get(r.json()["translatedFileUrl"], headers={"X-API-Key": KEYS["alice"]}, timeout=30)
        assert got.status_code == 200
        return got.content

    first = document(servers.a)
    work = worker_work(servers.a)
    assert document(servers.a) == first == document(servers.c)
    assert worker_work(servers.a) == work


def test_an_answer_computed_on_one_server_is_a_hit_on_another_sharing_redis(servers):
    body = {"text": [f"{GERMAN[60]} {GERMAN[61]}", GERMAN[62]]}
    computed = translate(servers.a, body)
    work, hits = worker_work(servers.b), metric(servers.b, "transerve_translation_cache_hits_total", tier="redis")
    assert translate(servers.b, body, "alice")["translations"] == computed["translations"]
    assert worker_work(servers.b) == work
    assert metric(servers.b, "transerve_translation_cache_hits_total", tier="redis") - hits == 3
    # Now in B's memory too.
    assert translate(servers.b, body)["translations"] == computed["translations"]
    assert metric(servers.b, "transerve_translation_cache_hits_total", tier="redis") - hits == 3


def until(check, seconds: float = 30, what: str = "the condition"):
    """check()'s first true answer, asked every 0.1 s for `seconds`."""
    deadline = time.monotonic() + seconds
    while not (out := check()):
        assert time.monotonic() < deadline, f"{what} did not come within {seconds} s"
        time.sleep(0.1)
    return out


def test_a_value_in_redis_that_is_not_an_answer_is_one_miss_and_is_written_over(servers):
    store = redis_client.Redis(port=servers.redis.port)
    kept = set(store.scan_iter("transerve:translation:*"))
    body = {"text": [GERMAN[63], GERMAN[9]]}
    computed = translate(servers.a, body)
    # A writes to Redis after answering, off the request's path: its two keys come a moment later.
    new = until(lambda: len(keys := set(store.scan_iter("transerve:translation:*")) - kept) == 2 and keys,
                what="A's two answers in Redis")
    # Written by something else: an answer's keys with other types (joined() raised on them: a 500), not JSON.
    wrong_types = b'{"text": null, "score": "x", "alternatives": 5, "input_tokens": "a", "output_tokens": null}'
    for key, garbage in zip(sorted(new), (wrong_types, b"\xff not JSON")):
        store.set(key, garbage)
    work, misses = worker_work(servers.b), metric(servers.b, "transerve_translation_cache_misses_total")
    hits = metric(servers.b, "transerve_translation_cache_hits_total")
    assert translate(servers.b, body)["translations"] == computed["translations"]   # never an error
    assert worker_work(servers.b)[0] > work[0]
    assert metric(servers.b, "transerve_translation_cache_misses_total") - misses == 2
    assert metric(servers.b, "transerve_translation_cache_hits_total") == hits     # neither a hit as well
    until(lambda: all(parsed(store.get(k)) is not None for k in new), what="B's answers over the bad values")
    hits = metric(servers.b, "transerve_translation_cache_hits_total", tier="memory")
    assert translate(servers.b, body)["translations"] == computed["translations"]
    assert metric(servers.b, "transerve_translation_cache_hits_total", tier="memory") - hits == 2   # kept now


def refusal(r: httpx.Response) -> tuple:
    """What a refusal says, its numbers of seconds aside: status, error type, limit, and the Retry-After and RateLimit
    fields it has."""
    error = r.json()["error"]
    return r.status_code, error["type"], error.get("limit"), sorted(
        h for h in r.headers if h.lower() in ("retry-after", "ratelimit", "ratelimit-policy"))


def test_a_key_over_its_limits_or_a_request_over_the_input_limits_is_refused_the_same_with_a_warm_cache(servers):
    """The HTTP process's checks (the key's limits, the request's texts and characters) come before the cache is
    asked: a request all kept (by the key's own request before it) is refused as one computed would be, and takes
    no hit."""
    short = next(t for t in GERMAN[10:] if CAROL_CHARS_PER_MINUTE / 3 < len(t) <= CAROL_CHARS_PER_MINUTE / 2)
    long = " ".join(GERMAN[12:16])
    assert len(long) > CAROL_CHARS_PER_MINUTE
    outcomes = {}
    for url in (servers.a, servers.c):
        hits = metric(servers.a, "transerve_translation_cache_hits_total")
        post = [httpx.post(url + "/translate", json={"text": text, "source_lang": "de", "target_lang": "en"} | extra,
                           headers={"Authorization": f"Bearer {KEYS['carol']}"}, timeout=120)
                for text, extra in ((long, {}), (short, {}), (short, {}), (short, {}),
                                    ([short] * 65, {}))]
        outcomes[url] = [r.status_code for r in post[:4]], refusal(post[0]), refusal(post[3]), refusal(post[4])
        if url == servers.a:
            # The second short, kept by the first; the refused ones take none
            assert metric(servers.a, "transerve_translation_cache_hits_total") - hits == 1
    assert outcomes[servers.a] == outcomes[servers.c]
    assert outcomes[servers.a][:3] == ([413, 200, 200, 429], (413, "over_key_limit", CAROL_CHARS_PER_MINUTE, []),
                                       (429, "rate_limited", CAROL_CHARS_PER_MINUTE,
                                        ["ratelimit", "ratelimit-policy", "retry-after"]))
    assert outcomes[servers.a][3][:2] == (413, "too_many_texts")


def admin(url: str, path: str = "", body: dict | None = None) -> httpx.Response:
    if body is None:
        return httpx.get(url + "/admin/models" + path, headers=ADMIN, timeout=30)
    return httpx.post(url + "/admin/models" + path, json=body, headers=ADMIN, timeout=300)


def test_redis_not_answering_costs_one_request_its_timeout_and_is_used_again_once_back(servers):
    """Redis takes A's connections and answers nothing: the first request's lookup waits --redis-timeout-ms, the
    next ones skip Redis (misses) and write to it off their path; once Redis answers, a probe at the back-off's end
    finds it and A reads what B wrote."""
    sentence = iter(f"Das ist der Satz Nummer {n}." for n in range(1000, 2000))
    errors = metric(servers.a, "transerve_translation_cache_store_errors_total")
    skipped = metric(servers.a, "transerve_translation_cache_redis_skipped_total", reason="backoff")
    servers.gate.set("drop")
    try:
        t0 = time.monotonic()
        translate(servers.a, {"text": next(sentence)})
        first = time.monotonic() - t0
        times = []
        for _ in range(10):
            t0 = time.monotonic()
            translate(servers.a, {"text": next(sentence)})
            times.append(time.monotonic() - t0)
    finally:
        servers.gate.set("pass")
    back = time.monotonic()
    assert first >= 0.8 * A_TIMEOUT_S                     # the lookup waited for Redis, then missed
    assert sum(times) < 3 * A_TIMEOUT_S, times            # uncached: 2 x the timeout each
    assert metric(servers.a, "transerve_translation_cache_store_errors_total") > errors
    assert metric(servers.a, "transerve_translation_cache_redis_skipped_total", reason="backoff") - skipped >= 10

    def hit_on_a() -> bool:
        text = {"text": next(sentence)}
        translate(servers.b, text)                        # in Redis a moment later (B writes off its path)
        time.sleep(0.2)
        hits = metric(servers.a, "transerve_translation_cache_hits_total", tier="redis")
        translate(servers.a, text)
        return metric(servers.a, "transerve_translation_cache_hits_total", tier="redis") > hits

    until(hit_on_a, BACKOFF_MOST_S + 4 * A_TIMEOUT_S, "a Redis hit on A")
    print(f"Redis not answering: the first request {first:.2f} s, the next 10 {sum(times):.2f} s in all; used again "
          f"{time.monotonic() - back:.1f} s after it answered (timeout {A_TIMEOUT_S} s, back-off {BACKOFF_S} s first)")


def test_nothing_asked_is_in_a_log_line_the_metrics_or_a_redis_key(servers):
    secret = "Geheimnis Zebrafink sagt Quittenbrot."
    translate(servers.a, {"text": secret})
    translate(servers.a, {"text": secret}, "bob")
    out = subprocess.run(["redis-cli", "-p", str(servers.redis.port), "--scan"], capture_output=True, text=True,
                         check=True).stdout.split()
    kept = [k for k in out if k.startswith("transerve:translation:")]
    assert kept and all(len(k.rsplit(":", 1)[1]) == 64 for k in kept)
    for proc, url in zip(servers.procs, (servers.a, servers.b)):
        scraped = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEYS['alice']}"}).text
        for where in (server_log(proc), scraped, " ".join(out)):
            assert "Zebrafink" not in where and not any(k in where for k in KEYS.values())


def test_a_request_partly_kept_whose_misses_another_version_answered_is_sent_again_whole(servers):
    """A swap between the request's routing and its worker: its kept sentence is v1's, v1 is unloaded before its
    misses reach the worker, so v2 answers them; the answer names v2, so v2 computes all of it. (Last: A serves v2
    after it, B v1, so they no longer share answers.)"""
    kept, new = GERMAN[16], GERMAN[17]
    store = redis_client.Redis(port=servers.redis.port)
    before = set(store.scan_iter("transerve:translation:*"))
    translate(servers.a, {"text": kept})                                   # kept for v1, the version serving
    until(lambda: set(store.scan_iter("transerve:translation:*")) - before, what="A's answer in Redis")
    v2 = servers.root / "v2"
    subprocess.run(["cp", "-r", str(ROOT / "models" / "de-en"), str(v2)], check=True)
    meta = json.loads((v2 / "model.json").read_text())
    (v2 / "model.json").write_text(json.dumps(meta | {"version": "v2"}))   # another checksum, the same weights
    r = admin(servers.a, "", {"path": str(v2), "canary": {"share": 0.0}})   # loaded beside v1, routed to by no one
    assert r.status_code == 200, r.text
    reference = translate(servers.c, {"text": f"{kept} {new}"})["translations"]
    new_tokens = translate(servers.c, {"text": new})["translations"][0]["input_tokens"]
    v2_tokens = {"endpoint": "translate", "model": "de-en@v2"}    # what v2's slot read
    work, resent = metric(servers.a, "transerve_input_tokens_total", **v2_tokens), \
        metric(servers.a, "transerve_translation_cache_resent_total")
    with cf.ThreadPoolExecutor(1) as pool:
        servers.gate.set("hold")     # the request's lookup waits for Redis's reply, routed to v1 already
        held = servers.gate.held
        answer = pool.submit(httpx.post, servers.a + "/translate", json={
            "text": f"{kept} {new}", "source_lang": "de", "target_lang": "en"},
            headers={"Authorization": f"Bearer {KEYS['alice']}"}, timeout=120)
        servers.gate.wait_held(held + 1)
        r = admin(servers.a, "/promote", {"name": "de-en"})     # v2 serves, v1 unloaded
        servers.gate.set("pass")
        assert r.status_code == 200, r.text
        answer = answer.result()
    assert answer.status_code == 200, answer.text
    out = answer.json()
    assert out["model_version"] == answer.headers["x-model-version"] == "v2"
    assert out["translations"] == reference
    # v2 computed the missing sentence, then, found mixed, the whole text: every sentence from the version named.
    assert metric(servers.a, "transerve_input_tokens_total", **v2_tokens) - work == \
        new_tokens + out["translations"][0]["input_tokens"]
    assert metric(servers.a, "transerve_translation_cache_resent_total") - resent == 1


# --- without a server ----------------------------------------------------------------------------------------------
def fields(texts=("Das Haus ist klein. Es ist alt.",), **options) -> dict:
    return {"texts": list(texts), "source_lang": "de", "target_lang": "en",
            "options": SearchOptions(**options), "glossary": None}


def test_memory_is_bounded_by_entries_and_bytes_least_recently_used_out_first():
    memory = MemoryCache(3, 10**6)
    assert [memory.put(k, b"x" * 10) for k in "abc"] == [0, 0, 0]
    memory.get("a")                                   # used: b is now the oldest
    assert memory.put("d", b"x") == 1 and list(memory.kept) == ["c", "a", "d"]
    small = MemoryCache(100, 3 * (ENTRY_OVERHEAD + 100))
    assert [small.put(str(i), b"y" * 100) for i in range(5)] == [0, 0, 0, 1, 1]
    assert small.bytes == 3 * (ENTRY_OVERHEAD + 100) and list(small.kept) == ["2", "3", "4"]
    assert small.put("huge", b"z" * 10**4) == 0 and "huge" not in small.kept   # larger than the bound: not kept


def test_the_key_names_every_option_the_pair_the_glossary_the_package_and_the_caller():
    base = request_key(fields(), "sum-1", "alice")
    assert base == request_key(fields(), "sum-1", "alice") and len(base) == 64
    changed = {"beam_size": 2, "num_hypotheses": 2, "length_penalty": 0.5, "max_length_a": 1.0, "max_length_b": 3,
               "max_length": 20, "min_length": 0, "no_repeat_ngram_size": 3, "repetition_penalty": 1.3,
               "temperature": 0.5, "top_k": 5, "top_p": 0.9, "seed": 7, "length_rule": "ctranslate2"}
    assert set(changed) | {"sampling"} == {f.name for f in dataclasses.fields(SearchOptions)}
    keys = {request_key(fields(**{name: value}), "sum-1", "alice") for name, value in changed.items()}
    keys |= {request_key(fields() | {"glossary": [("Haus", "building")]}, "sum-1", "alice"),
             request_key(fields() | {"glossary": []}, "sum-1", "alice"),
             request_key(fields() | {"target_lang": "fr"}, "sum-1", "alice"),
             request_key(fields(), "sum-2", "alice"), request_key(fields(sampling=True, seed=1), "sum-1", "alice")}
    keys.add(request_key(fields(), "sum-1", "bob"))
    assert base not in keys and len(keys) == len(changed) + 6
    assert request_key(fields(texts=["Anderes."]), "sum-1", "alice") == base   # texts: the units' part of the key


def test_sampling_without_a_seed_is_never_kept():
    assert request_key(fields(sampling=True), "sum-1", "alice") is None
    cache = TranslationCache(Settings(cache_size=10))
    served = SimpleNamespace(name="m", version="1", checksum="s")
    lookup = asyncio.run(cache.lookup(fields(sampling=True), served, "alice"))
    assert lookup.keys is None and lookup.sent() == fields()["texts"]


def test_a_text_splits_into_units_the_worker_splits_into_themselves():
    for text in TEXTS + GERMAN + ["Dr. Müller kommt. 3 Äpfel!", "  a\n\n b  ", "Ende.  \n  Anfang"]:
        pieces, seps = units(text)
        assert all(split_sentences(p) == ([p], []) for p in pieces)
        assert seps is not None and "".join(p + s for p, s in zip(pieces, seps + [""])) == text.strip()


def test_another_version_never_reads_an_answer_and_redis_down_is_a_miss_not_an_error():
    """Redis on a port no one listens on: every read a miss, every write dropped, counted; the memory still keeps."""
    cache = TranslationCache(Settings(cache_size=10, redis_url=f"redis://127.0.0.1:{free_port()}/0",
                                      redis_timeout_ms=200))
    v1, v2 = (SimpleNamespace(name="de-en", version=v, checksum=f"sum-{v}") for v in ("1", "2"))
    item = {"text": "The house is small.", "score": -0.25, "alternatives": [], "input_tokens": 6, "output_tokens": 5}

    async def run():
        first = await cache.lookup(fields(["Das Haus ist klein."]), v1, "alice")
        assert first.sent() == ["Das Haus ist klein."]
        cache.store(first, {"translations": [item], "model": "de-en", "model_version": "1"})
        again, other = await cache.lookup(fields(["Das Haus ist klein."]), v1, "alice"), \
            await cache.lookup(fields(["Das Haus ist klein."]), v2, "alice")
        assert again.sent() == [] and again.answer(None)["translations"] == [item]
        assert again.answer(None)["model_version"] == "1" and other.sent() == ["Das Haus ist klein."]
        # An answer from another version than the one routed to (the worker had unloaded it) is not kept.
        cache.store(other, {"translations": [item], "model": "de-en", "model_version": "1"})
        assert (await cache.lookup(fields(["Das Haus ist klein."]), v2, "alice")).sent() == ["Das Haus ist klein."]

    asyncio.run(run())
    assert cache.redis.down


def test_the_back_off_doubles_with_each_failed_probe_up_to_its_cap_and_ends_when_redis_answers(redis):
    """RedisTier's clock moved by hand (`until`): a failure backs off BACKOFF_S; at its end a request starts one
    probe and does not wait for it; each failed probe doubles the back-off up to BACKOFF_MOST_S; a probe answered
    ends it. Writes are queued, never awaited by the caller, and bounded."""
    tier = RedisTier(f"redis://127.0.0.1:{free_port()}/0", 0.2, 60_000)

    async def run():
        assert await tier.read(["a"]) == {} and tier.backoff_s == BACKOFF_S
        assert not tier.usable() and not tier.probing           # within the back-off: Redis not asked at all
        seen = []
        while len(seen) < 7:
            tier.until = 0.0                                    # the back-off over
            assert not tier.usable() and tier.probing           # one probe started; the request goes on without
            assert not tier.usable()
            await asyncio.gather(*tier.tasks)
            seen.append(tier.backoff_s)
        assert seen == [2.0, 4.0, 8.0, 16.0, BACKOFF_MOST_S, BACKOFF_MOST_S, BACKOFF_MOST_S]
        tier.write({"a": b"dropped"})                           # backed off: dropped, not queued
        assert tier.writes is None
        tier.redis = RedisCache(redis.url, 2.0)                 # Redis back
        tier.until = 0.0
        tier.usable()
        await asyncio.gather(*tier.tasks)
        assert not tier.down and tier.usable()
        for i in range(WRITES_QUEUED + 50):                     # never waits: a full queue drops
            tier.write({f"k{i}": b"v"})
        assert tier.writes.qsize() == WRITES_QUEUED
        deadline = time.monotonic() + 10
        while await tier.read(["k0", f"k{WRITES_QUEUED - 1}", f"k{WRITES_QUEUED}"]) != {
                "k0": b"v", f"k{WRITES_QUEUED - 1}": b"v"}:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)

    asyncio.run(run())


def test_a_kept_answer_round_trips_through_json_exactly():
    item = {"text": "Ä “quoted” 🙂", "score": -0.1234567890123456789, "alternatives": [{"text": "x", "score": -1e-300}],
            "input_tokens": 1, "output_tokens": 2}
    assert json.loads(json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode()) == item


def test_units_kept_by_something_else_join_without_an_error_or_are_misses():
    """Values in Redis of an answer's shape but not this server's (helper-43's review): a null glossary is a miss; a
    sentence with fewer alternatives than another joins with its best in their place, as the worker joins them."""
    item = {"text": "A.", "score": -1.0, "alternatives": [], "input_tokens": 1, "output_tokens": 1}
    assert parsed(json.dumps(item | {"glossary": None}).encode()) is None
    more = item | {"text": "B.", "alternatives": [{"text": "Bb.", "score": -3.0}]}
    assert joined([more, item], [" "])["alternatives"] == [{"text": "Bb. A.", "score": -2.0}]
    assert joined([more | {"glossary": []}, item], [" "])["glossary"] == []
