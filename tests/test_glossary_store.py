"""Stored glossaries (issue 51 item 2; service/api/glossaries.py, service/http/glossary_store.py): created from
entries or DeepL's TSV and CSV, listed, read, their entries as TSV, deleted; each key's own (another key's id is a
404 everywhere, /translate included); the limits, each with its limit in the error; POST /translate by
`glossary_id` keeping the term; two servers sharing one redis-server see the same glossaries; and without Redis a
restarted server still has them (SQLite under --data-dir).

The servers serve the committed package (models/de-en; TRANSERVE_TEST_PACKAGE names another): nothing to train.
redis-server comes from Debian's package (scripts/test.sh installs it); without it the Redis tests skip."""

from __future__ import annotations

import asyncio
import os
import secrets
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from conftest import ROOT, server_log, start_server, stop_server
from service.config import Settings
from service.errors import ApiError
from service.http.glossary_store import GlossaryLimits, GlossaryStore
from service.shared.glossary import Entry

PACKAGE = os.environ.get("TRANSERVE_TEST_PACKAGE") or str(ROOT / "models" / "de-en")
KEYS = {"a": "glossary-key-a-0001", "b": "glossary-key-b-0002", "full": "glossary-key-full-0003"}
SENTENCE = "Der Auftrag wurde gestern erteilt."
ORDER = [{"source": "Auftrag", "target": "purchase order"}]


def client(url: str, key: str | None = None) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {KEYS[key]}"} if key else {})


def glossary(**fields) -> dict:
    return {"name": "Procurement", "source_lang": "de", "target_lang": "en", "entries": ORDER} | fields


def translate(http: httpx.Client, **fields) -> httpx.Response:
    return http.post("/translate", json={"text": SENTENCE, "source_lang": "de", "target_lang": "en"} | fields)


@pytest.fixture(scope="module")
def servers(redis):
    """Two keyed servers on one redis-server, started together; bodies up to 3 MB, so that a glossary over the
    1 MiB of entries reaches its own limit."""
    redis.flush()
    extra = ("--api-keys", ",".join(KEYS.values()), "--redis-url", redis.url, "--redis-timeout-ms", "2000",
             "--max-payload-bytes", "3000000")
    with ThreadPoolExecutor(2) as pool:
        started = [pool.submit(start_server, PACKAGE, *extra) for _ in range(2)]
        procs = [f.result() for f in started]
    try:
        yield [url for _, url in procs], [proc for proc, _ in procs]
    finally:
        for proc, _ in procs:
            stop_server(proc)


# --- the routes -----------------------------------------------------------------------------------------------
def test_create_list_read_entries_and_delete(servers):
    (url, _), (proc, _) = servers
    name, term = "zq" + secrets.token_hex(6), "Zq" + secrets.token_hex(6)   # planted: never to be logged
    with client(url, "a") as a:
        made = a.post("/glossaries", json=glossary(name=name, entries=[*ORDER, {"source": term, "target": "t"}]))
        assert made.status_code == 201, made.text
        info = made.json()
        assert info | {"glossary_id": "", "creation_time": ""} == {
            "glossary_id": "", "name": name, "ready": True, "source_lang": "de", "target_lang": "en",
            "creation_time": "", "entry_count": 2}
        assert made.headers["location"] == f"/glossaries/{info['glossary_id']}"
        tsv = a.post("/glossaries", json=glossary(entries="Auftrag\tpurchase order\n\nHaus\tbuilding\n"))
        csv = a.post("/glossaries", json=glossary(entries='"Auftrag, groß",order\n', entries_format="csv"))
        assert (tsv.status_code, tsv.json()["entry_count"], csv.status_code) == (201, 2, 201), (tsv.text, csv.text)
        ids = [info["glossary_id"], tsv.json()["glossary_id"], csv.json()["glossary_id"]]
        assert [g["glossary_id"] for g in a.get("/glossaries").json()["glossaries"]] == ids   # oldest first
        assert a.get(f"/glossaries/{ids[0]}").json() == info
        entries = a.get(f"/glossaries/{ids[0]}/entries")
        assert entries.headers["content-type"].startswith("text/tab-separated-values")
        assert entries.text == f"Auftrag\tpurchase order\n{term}\tt\n"
        assert a.get(f"/glossaries/{ids[2]}/entries").text == "Auftrag, groß\torder\n"
        for gid in ids:
            assert a.delete(f"/glossaries/{gid}").status_code == 204
        assert a.get(f"/glossaries/{ids[0]}").status_code == 404 and a.get("/glossaries").json() == {"glossaries": []}
        assert a.delete(f"/glossaries/{ids[0]}").status_code == 404
    log = server_log(proc)
    assert name not in log and term not in log and "/glossaries/{glossary_id}" in log   # routes as templates


def test_another_keys_glossary_is_a_404_that_says_nothing_more(servers):
    (url, _), _ = servers
    with client(url, "a") as a, client(url, "b") as b:
        gid = a.post("/glossaries", json=glossary()).json()["glossary_id"]
        unknown = secrets.token_hex(16)
        for method, path in (("GET", "/glossaries/{}"), ("GET", "/glossaries/{}/entries"),
                             ("DELETE", "/glossaries/{}")):
            theirs, none = b.request(method, path.format(gid)), b.request(method, path.format(unknown))
            assert theirs.status_code == none.status_code == 404
            assert theirs.json()["error"]["message"].replace(gid, unknown) == none.json()["error"]["message"]
        used = translate(b, glossary_id=gid)
        assert used.status_code == 404 and used.json()["error"]["type"] == "glossary_not_found"
        assert b.get("/glossaries").json() == {"glossaries": []}
        assert a.get(f"/glossaries/{gid}").status_code == 200          # b's DELETE left it alone
        assert a.delete(f"/glossaries/{gid}").status_code == 204


def test_a_glossary_made_on_one_server_is_used_and_deleted_on_the_other(servers):
    """Two replicas on one Redis: the glossary one stores, the other lists, uses by id (its term kept and
    reported) and deletes, and the first then knows it no more."""
    (one, other), _ = servers
    with client(one, "a") as first, client(other, "a") as second:
        gid = first.post("/glossaries", json=glossary()).json()["glossary_id"]
        assert [g["glossary_id"] for g in second.get("/glossaries").json()["glossaries"]] == [gid]
        plain, kept = translate(second), translate(second, glossary_id=gid)
        assert kept.status_code == 200, kept.text
        item = kept.json()["translations"][0]
        assert "purchase order" in item["text"] and "purchase order" not in plain.json()["translations"][0]["text"]
        assert item["glossary"] == [{"source": "Auftrag", "target": "purchase order", "held": True}]
        assert second.delete(f"/glossaries/{gid}").status_code == 204
        assert translate(first, glossary_id=gid).status_code == 404


def test_translate_by_id_is_refused_where_it_cannot_apply(servers):
    (url, _), _ = servers
    with client(url, "a") as a:
        gid = a.post("/glossaries", json=glossary()).json()["glossary_id"]
        cases = [({"glossary_id": gid, "glossary": ORDER}, 422, "not both"),
                 ({"glossary_id": gid, "source_lang": "auto"}, 422, "glossary_id needs source_lang"),
                 ({"glossary_id": gid, "beam_size": 1}, 422, "beam_size 2 or more"),
                 ({"glossary_id": gid, "source_lang": "en", "target_lang": "de"}, 400, "is for de-en"),
                 ({"glossary_id": secrets.token_hex(16)}, 404, "no glossary")]
        for fields, status, message in cases:
            r = translate(a, **fields)
            assert r.status_code == status and message in r.json()["error"]["message"], (fields, r.text)
        assert a.delete(f"/glossaries/{gid}").status_code == 204


@pytest.mark.parametrize("fields, status, message", [
    ({"target_lang": "fr"}, 400, "no model translates de-fr"),
    ({"target_lang": "de"}, 400, "between two languages"),
    ({"entries": "Auftrag\torder\nHaus\n"}, 400, "glossary line 2: 1 fields"),
    ({"entries": "Auftrag\torder\nAuftrag\tcontract\n"}, 400, "entry 2: its source term is already entry 1"),
    ({"entries": [{"source": "Auftrag", "target": "a\nb"}]}, 400, "entry 1: its target term holds a tab or a line"),
    ({"entries": [{"source": "", "target": "a"}]}, 400, "entry 1: its source term is empty"),
    ({"entries": [{"source": "a" * 201, "target": "a"}]}, 400, "entry 1: its source term has 201 characters"),
    ({"entries": "\n\n"}, 400, "no entries"),
    ({"entries_format": "csv"}, 422, "entries_format is for entries given as TSV or CSV text"),
    ({"entries": "a\tb", "entries_format": "xlsx"}, 422, "entries_format"),
    ({"name": ""}, 422, "name"),
])
def test_a_bad_glossary_is_refused_saying_why(servers, fields, status, message):
    (url, _), _ = servers
    with client(url, "a") as a:
        r = a.post("/glossaries", json=glossary(**fields))
        assert r.status_code == status and message in r.json()["error"]["message"], r.text


def test_each_limit_is_refused_with_its_limit(servers):
    (url, _), _ = servers
    many = "".join(f"Wort{i}\tword{i}\n" for i in range(10_001))
    big = "".join(f"{i:05d}{'x' * 180}\tword\n" for i in range(6000))       # 1.14 MB of entries
    with client(url, "full") as full:
        for entries, status, kind, limit in ((many, 413, "too_many_glossary_entries", 10_000),
                                             (big, 413, "glossary_too_large", 2**20)):
            r = full.post("/glossaries", json=glossary(entries=entries))
            assert (r.status_code, r.json()["error"]["type"], r.json()["error"]["limit"]) == (status, kind, limit)
        assert full.post("/glossaries", json=glossary(entries=many.split("Wort10000")[0])).status_code == 201
        made = [full.post("/glossaries", json=glossary()).status_code for _ in range(99)]
        assert made == [201] * 99
        r = full.post("/glossaries", json=glossary())
        assert (r.status_code, r.json()["error"]["type"], r.json()["error"]["limit"]) == (409, "too_many_glossaries",
                                                                                          100)
        first = full.get("/glossaries").json()["glossaries"][0]
        assert first["entry_count"] == 10_000
        assert full.delete(f"/glossaries/{first['glossary_id']}").status_code == 204
        assert full.post("/glossaries", json=glossary()).status_code == 201             # room for one again


def test_a_405_names_every_method_of_its_path(servers):
    """Starlette's 405 names the first route's methods; a path of several routes names them all."""
    (url, _), _ = servers
    with client(url, "a") as a:
        r = a.put("/glossaries")
        assert r.status_code == 405 and r.headers["allow"] == "GET, POST, HEAD"
        assert a.put(f"/glossaries/{secrets.token_hex(16)}").headers["allow"] == "DELETE, GET, HEAD"


# --- the stores in-process: the per-key limit under concurrent creates -----------------------------------------
async def creates(stores: list[GlossaryStore], n: int) -> list:
    async def one(store):
        try:
            return await store.create("k", "n", "de", "en", [Entry("Auftrag", "order")])
        except ApiError as e:
            return e

    return await asyncio.gather(*(one(stores[i % len(stores)]) for i in range(n)))


@pytest.mark.parametrize("where", ["sqlite", "redis"])
def test_two_processes_worth_of_stores_keep_a_keys_limit_exactly(where, tmp_path, request):
    settings = Settings(data_dir=str(tmp_path))
    if where == "redis":
        redis = request.getfixturevalue("redis")
        redis.flush()
        settings = Settings(redis_url=redis.url, redis_timeout_ms=5000)
    limits = GlossaryLimits(entries=2, entry_bytes=40, per_key=3)
    out = asyncio.run(creates([GlossaryStore(settings, limits), GlossaryStore(settings, limits)], 12))
    assert sum(isinstance(o, dict) for o in out) == 3
    assert {(o.status, o.type, o.limit) for o in out if isinstance(o, ApiError)} == {(409, "too_many_glossaries", 3)}
    store = GlossaryStore(settings, limits)
    for entries, kind, limit in (([Entry("a", "b")] * 3, "too_many_glossary_entries", 2),
                                 ([Entry("a" * 30, "b" * 30)], "glossary_too_large", 40)):
        with pytest.raises(ApiError) as e:
            asyncio.run(store.create("other", "n", "de", "en", entries))
        assert (e.value.status, e.value.type, e.value.limit) == (413, kind, limit)


# --- without Redis: SQLite under --data-dir, across a restart ---------------------------------------------------
def test_a_restarted_server_without_redis_still_has_its_glossaries(tmp_path):
    data = tmp_path / "data"
    proc, url = start_server(PACKAGE, "--data-dir", str(data))
    try:
        with client(url) as anon:
            gid = anon.post("/glossaries", json=glossary()).json()["glossary_id"]
    finally:
        stop_server(proc)
    assert oct((data / "glossaries.sqlite3").stat().st_mode & 0o777) == "0o600"
    assert oct(data.stat().st_mode & 0o777) == "0o700"
    proc, url = start_server(PACKAGE, "--data-dir", str(data))
    try:
        with client(url) as anon:
            assert [g["glossary_id"] for g in anon.get("/glossaries").json()["glossaries"]] == [gid]
            item = translate(anon, glossary_id=gid).json()["translations"][0]
            assert "purchase order" in item["text"] and item["glossary"][0]["held"]
    finally:
        stop_server(proc)
