"""The translation cache (service/http/translation_cache.py, --cache-size), against real servers over models/de-en:
A and B keep answers in their memory and in one real redis-server, C keeps none (the reference: what the worker answers
for each text whole). A cached answer is C's answer, per sentence joined back into texts (alternatives, scores,
glossary reports); a request whose sentences are all kept makes no decoder call and takes no worker (/metrics say
so), whichever key asks; a glossary or another option is an entry of its own; a document translated again makes no
decoder call and comes back the same; what A computed is a hit on B. Without servers: the memory's bounds, the key
(every option, the glossary, the package's version; never the API key), sampling without a seed never kept, Redis
down as misses. Timings are benchmarks/translation_cache.py's to print, not asserted here.

redis-server comes from Debian's package (scripts/test.sh installs it); without it the server tests skip."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import dataclasses
import json
import subprocess
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import ROOT, free_port, pairs64, server_log, start_server, stop_server
from service.config import Settings
from service.http.translation_cache import ENTRY_OVERHEAD, MemoryCache, TranslationCache, request_key, units
from service.shared.options import SearchOptions
from service.shared.text import split_sentences

KEYS = {"alice": "alice-cache-key-0001", "bob": "bob-cache-key-0002"}
GERMAN = [de for de, _ in pairs64()]
# Texts of several sentences, one with a line break, one with a sentence twice.
TEXTS = [" ".join(GERMAN[0:3]), GERMAN[3] + "\n" + GERMAN[4] + " " + GERMAN[5], GERMAN[6],
         f"{GERMAN[7]} {GERMAN[8]} {GERMAN[7]}"]
GLOSSARY = [{"source": "Haus", "target": "building"}, {"source": "Trick", "target": "knack"}]
# The last: at max_length 4 its first sentence holds "building", its second does not (it writes "knack" only).
GLOSSED = ["Das Haus ist klein. Das ist der ganze Trick.", "Das Haus ist alt. Das Haus ist groß.",
           "Das Haus. Das Haus ist sehr sehr groß und schön, und das ist der ganze Trick."]


@pytest.fixture(scope="module")
def servers(redis, tmp_path_factory):
    """A and B (a cache each, one redis-server between them) and C (no cache), started together; keyed."""
    redis.flush()
    keys = tmp_path_factory.mktemp("keys") / "keys.yaml"
    keys.write_text("keys:\n" + "".join(f"  - name: {n}\n    key: {k}\n" for n, k in KEYS.items()))
    keyed = ("--api-keys-file", str(keys))
    cached = (*keyed, "--cache-size", "10000", "--redis-url", redis.url, "--redis-timeout-ms", "2000")
    with cf.ThreadPoolExecutor(3) as pool:
        started = list(pool.map(lambda extra: start_server(ROOT / "models" / "de-en", *extra),
                                [cached, cached, (*keyed, "--cache-size", "0")]))
    yield SimpleNamespace(a=started[0][1], b=started[1][1], c=started[2][1], procs=[p for p, _ in started],
                          redis=redis)
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


def test_a_request_all_kept_reaches_no_worker_whichever_key_asks_and_is_still_charged(servers):
    body = {"text": [GERMAN[30], f"{GERMAN[31]} {GERMAN[32]}"], "beam_size": 3}
    computed = translate(servers.a, body)
    work, hits = worker_work(servers.a), metric(servers.a, "transerve_translation_cache_hits_total", tier="memory")
    chars = {n: metric(servers.a, "transerve_key_characters_total", key=n) for n in KEYS}
    answers = [translate(servers.a, body, key) for key in ("alice", "bob", "bob")]
    assert worker_work(servers.a) == work                      # no decoder call, no request taken, no token read
    assert metric(servers.a, "transerve_translation_cache_hits_total", tier="memory") - hits == 3 * 3
    n = sum(map(len, body["text"]))
    assert [metric(servers.a, "transerve_key_characters_total", key=k) - chars[k] for k in KEYS] == [n, 2 * n]
    for answer in answers:
        assert answer["translations"] == computed["translations"] and answer["model"] == computed["model"]
        assert answer["timings"]["queue_ms"] == answer["timings"]["inference_ms"] == 0.0   # no worker ran


def test_a_glossary_or_an_option_is_an_entry_of_its_own_and_a_stored_glossary_its_entries(servers):
    body = {"text": ["Das Haus ist neu. Der Trick ist alt.", "Das Haus steht dort."]}   # asked nowhere else
    translate(servers.a, body)
    for other in ({"glossary": GLOSSARY}, {"beam_size": 2}, {"no_repeat_ngram_size": 2}, {"repetition_penalty": 1.2}):
        work = worker_work(servers.a)
        translate(servers.a, body | other, "bob")
        assert worker_work(servers.a)[0] > work[0], other          # computed: the options change the answer
    r = httpx.post(servers.a + "/glossaries", json={"name": "Bau", "source_lang": "de", "target_lang": "en",
                                                    "entries": GLOSSARY},
                   headers={"Authorization": f"Bearer {KEYS['alice']}"}, timeout=30)
    assert r.status_code in (200, 201), r.text
    work = worker_work(servers.a)
    stored = translate(servers.a, body | {"glossary_id": r.json()["glossary_id"]})
    assert worker_work(servers.a) == work                       # its entries are bob's inline glossary's
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
    assert translate(servers.b, body, "bob")["translations"] == computed["translations"]
    assert worker_work(servers.b) == work
    assert metric(servers.b, "transerve_translation_cache_hits_total", tier="redis") - hits == 3
    # Now in B's memory too.
    assert translate(servers.b, body)["translations"] == computed["translations"]
    assert metric(servers.b, "transerve_translation_cache_hits_total", tier="redis") - hits == 3
    # A value under our keys that is not an answer (written by something else) is a miss, never an error.
    fresh = {"text": [GERMAN[63]]}
    computed = translate(servers.a, fresh)
    cli = ["redis-cli", "-p", str(servers.redis.port)]
    for key in subprocess.run([*cli, "--scan", "--pattern", "transerve:translation:*"], capture_output=True,
                              text=True, check=True).stdout.split():
        subprocess.run([*cli, "set", key, '{"text": 1}'], check=True, capture_output=True)
    work = worker_work(servers.b)
    assert translate(servers.b, fresh)["translations"] == computed["translations"]
    assert worker_work(servers.b)[0] > work[0]


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


def test_the_key_names_every_option_the_pair_the_glossary_and_the_package_never_the_caller():
    base = request_key(fields(), "sum-1")
    assert base == request_key(fields(), "sum-1") and len(base) == 64
    changed = {"beam_size": 2, "num_hypotheses": 2, "length_penalty": 0.5, "max_length_a": 1.0, "max_length_b": 3,
               "max_length": 20, "min_length": 0, "no_repeat_ngram_size": 3, "repetition_penalty": 1.3,
               "temperature": 0.5, "top_k": 5, "top_p": 0.9, "seed": 7, "length_rule": "ctranslate2"}
    assert set(changed) | {"sampling"} == {f.name for f in dataclasses.fields(SearchOptions)}
    keys = {request_key(fields(**{name: value}), "sum-1") for name, value in changed.items()}
    keys |= {request_key(fields() | {"glossary": [("Haus", "building")]}, "sum-1"),
             request_key(fields() | {"glossary": []}, "sum-1"), request_key(fields() | {"target_lang": "fr"}, "sum-1"),
             request_key(fields(), "sum-2"), request_key(fields(sampling=True, seed=1), "sum-1")}
    assert base not in keys and len(keys) == len(changed) + 5
    assert request_key(fields(texts=["Anderes."]), "sum-1") == base     # texts are the units' part of the key


def test_sampling_without_a_seed_is_never_kept():
    assert request_key(fields(sampling=True), "sum-1") is None
    cache = TranslationCache(Settings(cache_size=10))
    lookup = asyncio.run(cache.lookup(fields(sampling=True), SimpleNamespace(name="m", version="1", checksum="s")))
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
        first = await cache.lookup(fields(["Das Haus ist klein."]), v1)
        assert first.sent() == ["Das Haus ist klein."]
        await cache.store(first, {"translations": [item], "model": "de-en", "model_version": "1"})
        again, other = await cache.lookup(fields(["Das Haus ist klein."]), v1), \
            await cache.lookup(fields(["Das Haus ist klein."]), v2)
        assert again.sent() == [] and again.answer(None)["translations"] == [item]
        assert again.answer(None)["model_version"] == "1" and other.sent() == ["Das Haus ist klein."]
        # An answer from another version than the one routed to (the worker had unloaded it) is not kept.
        await cache.store(other, {"translations": [item], "model": "de-en", "model_version": "1"})
        assert (await cache.lookup(fields(["Das Haus ist klein."]), v2)).sent() == ["Das Haus ist klein."]

    asyncio.run(run())
    assert cache.redis_down


def test_a_kept_answer_round_trips_through_json_exactly():
    item = {"text": "Ä “quoted” 🙂", "score": -0.1234567890123456789, "alternatives": [{"text": "x", "score": -1e-300}],
            "input_tokens": 1, "output_tokens": 2}
    assert json.loads(json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode()) == item
