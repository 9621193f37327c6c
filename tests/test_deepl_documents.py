"""DeepL's documents as jobs (issue 52; service/api/deepl_documents.py, service/http/document_jobs.py), driven by
DeepL's own client (the `deepl` package, 1.32.0) where it can be: a .docx, .pptx, .html and .txt uploaded, polled
and downloaded (translate_document, translate_document_from_filepath), each opened and compared with what the same
server's /translate answers for its texts, one with a stored glossary; a file that cannot be read fails its job
(DocumentTranslationException); two servers on one redis-server, one translating and the other answering the
status and handing over the result, once (then DeepL's 503 "Document already downloaded"); another key or a wrong
document_key is the same 404 as an unknown id; an inference worker killed under a job fails it with a message, and
a server killed under one leaves a lease that runs out, so the other server reports the job failed, never
translating; hostile uploads each a 4xx in DeepL's shape; a key at --max-document-jobs-per-key gets DeepL's 429
(TooManyRequestsException) from either server until its jobs end, and transerve_document_jobs_active shows a job
translating, then none, however it ended; a failed job's error quotes nothing of its document, in its status or
in the store's file, and its log lines name its upload's request id, never its document id. The store itself
(SQLite and Redis): leases, a result taken once, expiry, the cap kept by ten uploads at once through two stores, a
20 MB result through Redis under a 50 ms budget.

The servers serve the committed package (models/de-en; TRANSERVE_TEST_PACKAGE names another): nothing to train.
redis-server comes from Debian's package (scripts/test.sh installs it); without it the Redis tests skip."""

from __future__ import annotations

import asyncio
import dataclasses
import html
import io
import os
import secrets
import signal
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor

import deepl
import docx
import httpx
import pptx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import ROOT, pairs64, server_log, start_server, stop_server
from documents_help import replaced, slides, word
from service.config import Settings
from service.errors import ApiError
from service.http.document_jobs import STOPPED, DocumentJobs, RedisJobs
from service.http.redis_bridge import TRANSFER_BYTES_PER_S, RedisDocuments, transfer_timeout_s

PACKAGE = os.environ.get("TRANSERVE_TEST_PACKAGE") or str(ROOT / "models" / "de-en")
KEYS = {"a": "deepl-documents-key-a", "b": "deepl-documents-key-b"}
GERMAN = [de for de, _ in pairs64()]
LEASE_S = 4            # server A's: killed mid-job, its jobs fail this long after
MAX_FILE = 200_000     # server C's --max-file-bytes
CAP = 2                # A's and B's --max-document-jobs-per-key
# Tens of seconds of translating, long enough to kill under on a loaded machine: every paragraph distinct (a
# number of its own), so that no repetition makes it quicker than it looks.
BIG = "\n\n".join(f"{GERMAN[i % 64]} Absatz {i}." for i in range(3000)).encode()


@pytest.fixture(scope="module")
def jobs_dir(tmp_path_factory):
    """C's --data-dir: its document store's SQLite file (and that file's WAL) are read byte for byte."""
    return tmp_path_factory.mktemp("jobs")


@pytest.fixture(scope="module")
def servers(redis, jobs_dir):
    """A and B on one redis-server (A with a short lease), C alone on SQLite under a --data-dir of its own; keyed,
    started together."""
    redis.flush()
    keyed = ("--api-keys", ",".join(KEYS.values()))
    shared = (*keyed, "--redis-url", redis.url, "--redis-timeout-ms", "2000", "--max-document-jobs-per-key", str(CAP))
    args = {"a": (*shared, "--document-lease-s", str(LEASE_S)), "b": shared,
            "c": (*keyed, "--max-file-bytes", str(MAX_FILE), "--data-dir", str(jobs_dir))}
    with ThreadPoolExecutor(3) as pool:
        started = {name: pool.submit(start_server, PACKAGE, *extra) for name, extra in args.items()}
        procs = {name: future.result() for name, future in started.items()}
    try:
        yield {name: url for name, (_, url) in procs.items()}, {name: proc for name, (proc, _) in procs.items()}
    finally:
        for proc, _ in procs.values():
            stop_server(proc)


def translator(url: str, key: str = "a") -> deepl.Translator:
    return deepl.Translator(KEYS[key], server_url=url + "/deepl/")


def english(url: str, texts: list[str]) -> dict[str, str]:
    """What the server answers for each text through POST /translate: what its documents must hold."""
    r = httpx.post(url + "/translate", json={"text": texts, "source_lang": "de", "target_lang": "en"},
                   headers={"Authorization": f"Bearer {KEYS['a']}"}, timeout=120)
    assert r.status_code == 200, r.text
    return dict(zip(texts, (t["text"] for t in r.json()["translations"])))


def named(data: bytes, name: str) -> io.BytesIO:
    """A file object with a name, as the client sends an open file (its name gives the document's type)."""
    f = io.BytesIO(data)
    f.name = name
    return f


def post(url: str, path: str, key: str = "a", headers: dict | None = None, **kwargs) -> httpx.Response:
    return httpx.post(url + path, headers={"Authorization": f"DeepL-Auth-Key {KEYS[key]}"} | (headers or {}),
                      timeout=60, **kwargs)


def status(url: str, handle: deepl.DocumentHandle, key: str = "a") -> dict:
    r = post(url, f"/deepl/v2/document/{handle.document_id}", key, json={"document_key": handle.document_key})
    assert r.status_code == 200, r.text
    return r.json()


def wait_for(url: str, handle: deepl.DocumentHandle, states: set[str], seconds: float = 60, key: str = "a") -> dict:
    deadline = time.time() + seconds
    while (now := status(url, handle, key))["status"] not in states:
        assert time.time() < deadline, now
        time.sleep(0.2)
    return now


def worker_pids(url: str) -> set[int]:
    """PIDs of the server's live translation workers, from transerve_model_info (one series per process)."""
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEYS['a']}"}).text
    return {int(s.labels["pid"]) for family in text_string_to_metric_families(text)
            if family.name == "transerve_model_info" for s in family.samples if s.value == 1}


def active_jobs(url: str) -> dict[str, float]:
    """transerve_document_jobs_active by state: the jobs the server's HTTP processes hold now."""
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEYS['a']}"}).text
    return {s.labels["state"]: s.value for family in text_string_to_metric_families(text)
            if family.name == "transerve_document_jobs_active" for s in family.samples}


def test_each_format_comes_back_translated_through_deepls_client(servers, tmp_path):
    urls, _ = servers
    url = urls["c"]
    sent = GERMAN[:12]
    want = english(url, sent)
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEYS['a']}"}, timeout=60)
    glossary = http.post("/glossaries", json={"name": "Einkauf", "source_lang": "de", "target_lang": "en", "entries": [
        {"source": "Auftrag", "target": "purchase order"}]}).json()["glossary_id"]
    documents = {"docx": word((sent[0] + " ", sent[1], " " + sent[2]), sent[3], [[sent[4]]], footer=sent[5]),
                 "pptx": slides(sent[6], ("", sent[7], ""), sent[8]),
                 "html": f"<html><body><p>{sent[9]}</p><p>{sent[10]}</p></body></html>".encode(),
                 "txt": f"{sent[11]}\n".encode(), "glossary": b"Der Auftrag wurde gestern erteilt.\n"}
    source = tmp_path / "Brief.txt"
    source.write_bytes(f"{sent[0]}\n\n{sent[1]}\n".encode())

    def one(kind: str) -> tuple[deepl.DocumentStatus, bytes]:
        out = io.BytesIO()
        extra = {"source_lang": "DE", "glossary": glossary} if kind == "glossary" else {}
        done = translator(url).translate_document(named(documents[kind], f"Dokument.{kind.replace('glossary', 'txt')}"),
                                                  out, target_lang="EN-US", **extra)
        return done, out.getvalue()

    with ThreadPoolExecutor(6) as pool:    # the client polls every 5 s: the jobs wait those out together
        path_job = pool.submit(translator(url).translate_document_from_filepath, source, tmp_path / "Letter.txt",
                               target_lang="EN-GB")
        jobs = {kind: pool.submit(one, kind) for kind in documents}
        outs, by_path = {kind: job.result() for kind, job in jobs.items()}, path_job.result()
    assert all(done.done and done.billed_characters > 0 for done, _ in outs.values())
    d = docx.Document(io.BytesIO(outs["docx"][1]))
    assert " ".join("".join(r.text for r in d.paragraphs[0].runs).split()) == " ".join(want[t] for t in sent[:3])
    assert d.sections[0].header.paragraphs[0].text == want[sent[3]]
    assert d.tables[0].rows[0].cells[0].text == want[sent[4]]
    slide = pptx.Presentation(io.BytesIO(outs["pptx"][1])).slides[0]
    assert slide.shapes.title.text == want[sent[6]]
    assert slide.notes_slide.notes_text_frame.text == want[sent[8]]
    page = html.unescape(outs["html"][1].decode())
    assert want[sent[9]] in page and want[sent[10]] in page and sent[9] not in page
    assert outs["txt"][1].decode() == f"{want[sent[11]]}\n"
    assert "purchase order" in outs["glossary"][1].decode()
    assert by_path.done and (tmp_path / "Letter.txt").read_text() == f"{want[sent[0]]}\n\n{want[sent[1]]}\n"
    metrics = {(s.name, s.labels.get("state")): s.value for f in text_string_to_metric_families(
        http.get("/metrics").text) if f.name.startswith("transerve_document") for s in f.samples}
    assert metrics[("transerve_document_jobs_total", "done")] >= 6
    assert metrics[("transerve_document_queue_wait_seconds_count", None)] >= 6


def test_a_document_that_cannot_be_read_fails_its_job_and_an_unknown_type_its_upload(servers):
    urls, _ = servers
    with pytest.raises(deepl.DocumentTranslationException, match="not a zip archive") as failed:
        translator(urls["c"]).translate_document(named(b"Hallo Welt", "Brief.docx"), io.BytesIO(), target_lang="EN-US")
    assert "Brief" not in str(failed.value)       # the file's name is not in its error
    with pytest.raises(deepl.DeepLException, match="Bad request.*type is not supported"):
        translator(urls["c"]).translate_document_upload(b"MZ", target_lang="EN-US", filename="setup.exe")


def hostile_documents() -> dict[str, tuple[str, bytes]]:
    """secret -> (format, a document with it where its refusal would quote it): an archive entry's name, an
    unterminated .po line, HTML markup that never closes, lxml's words (a tag name), python-docx's (a part's name)."""
    docx_file = word(("a", "b", "c"), "Kopf", [["Zelle"]])
    rels = "word/_rels/document.xml.rels"
    with zipfile.ZipFile(io.BytesIO(docx_file)) as z:
        links = z.read(rels).decode()
    s = ["zq" + secrets.token_hex(8) for _ in range(5)]
    return {s[0]: ("docx", replaced(docx_file, {f"word/{s[0]}.xml": "<!DOCTYPE x><x/>"})),
            s[1]: ("po", f'msgid "Patient {s[1]}\nmsgstr ""\n'.encode()),
            s[2]: ("html", (f"<p>Hallo</p><{s[2]} " + "<a <b <c " * 1100).encode()),
            s[3]: ("docx", replaced(docx_file, {"word/document.xml": f"<{s[3]}>Befund</Diagnose>"})),
            s[4]: ("docx", replaced(docx_file, {rels: links.replace("header1.xml", f"{s[4]}.xml")}))}


def test_a_failed_job_stores_and_serves_no_word_of_its_document(servers, jobs_dir):
    """Its error is stored and served on every poll, long after the upload: what it says of the document it says
    without quoting it (an answer within the request, LibreTranslate's translate_file, may quote it)."""
    urls, _ = servers
    failed = {}
    for secret, (fmt, data) in hostile_documents().items():
        handle = translator(urls["c"]).translate_document_upload(data, target_lang="EN-US", filename=f"a.{fmt}")
        failed[secret] = wait_for(urls["c"], handle, {"done", "error"})
    assert all(body["status"] == "error" and body["error_message"] for body in failed.values()), failed
    stored = b"".join(f.read_bytes() for f in jobs_dir.iterdir() if f.name.startswith("documents.sqlite3"))
    assert b"cannot be translated" in stored                 # the errors are in what was read
    for secret, body in failed.items():
        assert secret not in str(body) and secret.encode() not in stored, body


def test_a_failed_jobs_log_lines_name_its_upload_by_request_id_never_its_document_id(servers):
    """A document's id is half of its download's credential: a job's lines name the upload's request id."""
    urls, procs = servers
    rid = "rid" + secrets.token_hex(8)
    r = post(urls["c"], "/deepl/v2/document", headers={"X-Request-ID": rid}, data={"target_lang": "EN-US"},
             files={"file": ("a.docx", b"Hallo Welt")})
    assert r.status_code == 200, r.text
    handle = deepl.DocumentHandle(r.json()["document_id"], r.json()["document_key"])
    assert wait_for(urls["c"], handle, {"done", "error"})["status"] == "error"
    log = server_log(procs["c"])
    assert handle.document_id.lower() not in log.lower()
    assert any("document job failed" in line and f"request_id={rid}" in line for line in log.splitlines())


def test_one_replica_translates_another_answers_and_hands_the_result_over_once(servers, monkeypatch):
    urls, _ = servers
    want = english(urls["b"], GERMAN[20:22])
    handle = translator(urls["a"]).translate_document_upload(f"{GERMAN[20]}\n\n{GERMAN[21]}\n".encode(),
                                                             target_lang="EN-US", filename="notes.txt")
    assert len(handle.document_id) == 32 and len(handle.document_key) == 64
    done = translator(urls["b"]).translate_document_wait_until_done(handle)
    assert done.done and done.billed_characters == len(GERMAN[20]) + len(GERMAN[21])
    out = io.BytesIO()
    translator(urls["b"]).translate_document_download(handle, out)
    assert out.getvalue().decode() == f"{want[GERMAN[20]]}\n\n{want[GERMAN[21]]}\n"

    again = post(urls["a"], f"/deepl/v2/document/{handle.document_id}/result",
                 json={"document_key": handle.document_key})
    assert (again.status_code, again.json()) == (503, {"message": "Document already downloaded"})
    monkeypatch.setattr(deepl.http_client, "max_network_retries", 0)   # the client retries a 503 otherwise
    with pytest.raises(deepl.DocumentNotReadyException):   # (a download's body it does not read: no message)
        translator(urls["a"]).translate_document_download(handle, io.BytesIO())
    assert status(urls["b"], handle)["status"] == "downloaded"

    path, unknown = f"/deepl/v2/document/{handle.document_id}", "/deepl/v2/document/" + "F" * 32
    for key, where, document_key in (("b", path, handle.document_key),     # another key
                                     ("a", path, "0" * 64),                 # a wrong document_key
                                     ("a", unknown, handle.document_key)):  # an id no job has
        for tail in ("", "/result"):
            r = post(urls["b"], where + tail, key, data={"document_key": document_key})   # a form, as DeepL takes
            assert (r.status_code, r.json()) == (404, {"message": "Document not found"})
    with pytest.raises(deepl.DeepLException, match="Not found"):
        translator(urls["a"], "b").translate_document_get_status(handle)


def test_a_key_at_its_document_cap_gets_deepls_429_from_either_replica_until_its_jobs_end(servers):
    urls, _ = servers
    # Seconds of translating each, so that both are still queued or translating when the third comes
    slow = "\n\n".join(f"{GERMAN[i % 64]} Teil {i}." for i in range(600)).encode()
    handles = [translator(urls[name], "b").translate_document_upload(slow, target_lang="EN-US", filename="a.txt")
               for name in ("a", "b")]                     # one on each replica: the cap counts them together
    retries = deepl.http_client.max_network_retries
    deepl.http_client.max_network_retries = 0              # the client retries a 429 with backoff otherwise
    try:
        for name in ("a", "b"):
            with pytest.raises(deepl.TooManyRequestsException, match="--max-document-jobs-per-key"):
                translator(urls[name], "b").translate_document_upload(b"Hallo Welt.", target_lang="EN-US",
                                                                      filename="a.txt")
    finally:
        deepl.http_client.max_network_retries = retries
    r = post(urls["a"], "/deepl/v2/document", "b", data={"target_lang": "EN-US"}, files={"file": ("a.txt", b"Hallo")})
    assert (r.status_code, r.headers["retry-after"], r.json().keys()) == (429, "5", {"message"}), r.text
    assert "Too many documents" in r.json()["message"]
    for handle in handles:
        assert wait_for(urls["b"], handle, {"done", "error"}, seconds=300, key="b")["status"] == "done"
    assert active_jobs(urls["a"]) == active_jobs(urls["b"]) == {"queued": 0, "translating": 0}
    after = translator(urls["b"], "b").translate_document_upload(b"Hallo Welt.", target_lang="EN-US", filename="a.txt")
    assert wait_for(urls["b"], after, {"done", "error"}, key="b")["status"] == "done"


def test_hostile_requests_are_each_a_4xx_in_deepls_shape(servers):
    urls, _ = servers
    url, fields = urls["c"], {"target_lang": "EN-US"}
    answers = [
        post(url, "/deepl/v2/document", data=fields, files={"file": ("big.txt", b"Hallo. " * (MAX_FILE // 7 + 10))}),
        post(url, "/deepl/v2/document", data=fields, files={"file": ("bigger.txt", b"x" * (3 * MAX_FILE))}),
        post(url, "/deepl/v2/document", content=b"--xyz\r\nnot a part",
             headers={"Content-Type": "multipart/form-data; boundary=xyz"}),
        post(url, "/deepl/v2/document", files={"file": ("a.txt", b"Hallo")}),                       # no target_lang
        post(url, "/deepl/v2/document", data=fields),                                               # no file
        post(url, "/deepl/v2/document", data=fields | {"formality": "more"}, files={"file": ("a.txt", b"Hallo")}),
        post(url, "/deepl/v2/document", data={"target_lang": "XX"}, files={"file": ("a.txt", b"Hallo")}),
        post(url, "/deepl/v2/document", data=fields | {"output_format": "docx"}, files={"file": ("a.txt", b"Hallo")}),
        post(url, "/deepl/v2/document", data=fields | {"glossary_id": "0" * 32}, files={"file": ("a.txt", b"Hallo")}),
        post(url, "/deepl/v2/document/" + "A" * 32, json={}),                                       # no document_key
        post(url, "/deepl/v2/document/" + "A" * 32, content=b"{", headers={"Content-Type": "application/json"}),
        post(url, "/deepl/v2/document/abc", json={"document_key": "k"}),
    ]
    statuses = [r.status_code for r in answers]
    assert statuses == [413, 413, 400, 400, 400, 400, 400, 400, 400, 400, 400, 404], [r.text for r in answers]
    assert all(set(r.json()) == {"message"} for r in answers)
    assert "the limit is 200000" in answers[0].json()["message"]
    assert "Use of a glossary requires the source_lang" in answers[8].json()["message"]
    handle = translator(url).translate_document_upload(b"Hallo Welt.", target_lang="EN-US", filename="a.txt")
    assert status(url, handle)["status"] in ("queued", "translating", "done")      # the next one is served


def test_an_inference_worker_killed_under_a_job_fails_it_with_a_message(servers):
    urls, _ = servers
    (pid,) = worker_pids(urls["b"])
    handle = translator(urls["b"]).translate_document_upload(BIG, target_lang="EN-US", filename="big.txt")
    wait_for(urls["b"], handle, {"translating"})
    deadline = time.time() + 60
    while "seconds_remaining" not in status(urls["b"], handle):   # texts translated: its requests reach the worker
        assert time.time() < deadline
        time.sleep(0.2)
    assert active_jobs(urls["b"]) == {"queued": 0, "translating": 1}
    os.kill(pid, signal.SIGKILL)
    failed = wait_for(urls["b"], handle, {"done", "error"}, seconds=30)
    assert failed["status"] == "error" and "worker" in failed["error_message"], failed
    assert active_jobs(urls["b"]) == {"queued": 0, "translating": 0}     # a failed job is not left counted
    ended = translator(urls["b"]).translate_document_wait_until_done(handle)   # what translate_document checks
    assert not ended.ok and ended.error_message == failed["error_message"]


def test_a_server_killed_under_a_job_leaves_it_failed_once_its_lease_runs_out(servers):
    urls, procs = servers
    handle = translator(urls["a"]).translate_document_upload(BIG, target_lang="EN-US", filename="big.txt")
    wait_for(urls["b"], handle, {"translating"})
    os.killpg(procs["a"].pid, signal.SIGKILL)       # the HTTP process, its workers, all at once: no goodbye
    procs["a"].wait()
    assert status(urls["b"], handle)["status"] == "translating"    # until its lease runs out
    failed = wait_for(urls["b"], handle, {"error"}, seconds=LEASE_S + 10)
    assert failed["error_message"] == STOPPED
    log = server_log(procs["b"])
    assert "lease ran out" in log and handle.document_id.lower() not in log.lower()


# --- the store alone ---------------------------------------------------------------------------------------------
@pytest.fixture(params=["sqlite", "redis"])
def settings(request, tmp_path):
    if request.param == "redis":
        server = request.getfixturevalue("redis")
        return Settings(redis_url=server.url, file_ttl_s=1.5, document_lease_s=0.5)
    return Settings(data_dir=str(tmp_path), file_ttl_s=1.5, document_lease_s=0.5)


def test_the_store_hands_a_result_over_once_fails_a_lapsed_lease_and_forgets_after_its_time(settings):
    async def run():
        jobs = DocumentJobs(settings)
        fields = {"format": "txt", "source_lang": "de", "target_lang": "en", "glossary_id": ""}
        done_id, done_key = await jobs.create("team", fields, b"Hallo")
        assert await jobs.source("team", done_id) == b"Hallo"
        assert await jobs.change("team", done_id, {"status": "translating", "started": time.time()})
        assert await jobs.change("team", done_id, {"status": "done", "billed": 5}, b"Hello", drop_source=True)
        assert not await jobs.change("team", done_id, {"status": "error", "error": "late"})   # done stays done
        assert (await jobs.find("team", done_id, done_key))["billed"] == 5
        for owner, key in (("other", done_key), ("team", "0" * 64)):
            with pytest.raises(ApiError, match="Document not found"):
                await jobs.find(owner, done_id, key)
        assert (await jobs.take("team", done_id, done_key))[1] == b"Hello"
        with pytest.raises(ApiError, match="Document already downloaded"):
            await jobs.take("team", done_id, done_key)

        lapsed_id, lapsed_key = await jobs.create("team", fields, b"Hallo")
        jobs.holders.clear()              # this process as another server: the job's holder no longer renews it
        await asyncio.sleep(0.6)
        assert not await jobs.change("team", lapsed_id, {"translated": 1})              # not its lease to renew
        lapsed = await jobs.find("team", lapsed_id, lapsed_key)
        assert (lapsed["status"], lapsed["error"]) == ("error", STOPPED)
        assert await jobs.source("team", lapsed_id) is None                             # its file dropped
        await asyncio.sleep(1.6)
        for document_id, key in ((done_id, done_key), (lapsed_id, lapsed_key)):
            with pytest.raises(ApiError, match="Document not found"):
                await jobs.find("team", document_id, key)
        jobs.backend.sweep()
        if not settings.redis_url:
            assert not jobs.backend.connect().execute("SELECT count(*) FROM documents").fetchone()[0]

    asyncio.run(run())


def test_the_store_admits_a_keys_jobs_up_to_its_cap_over_two_servers_at_once(settings):
    """Ten uploads of one key at once, through two stores (two replicas, or two HTTP processes) on one Redis or
    SQLite file, under a cap of 3: three admitted, the others DeepL's 429; a job done or whose lease ran out
    leaves the count, and another key counts alone."""
    settings = dataclasses.replace(settings, document_lease_s=30.0, max_document_jobs_per_key=3)
    fields = {"format": "txt", "source_lang": "de", "target_lang": "en", "glossary_id": ""}

    async def upload(jobs: DocumentJobs, owner: str = "capped") -> tuple[DocumentJobs, str] | ApiError:
        try:
            return jobs, (await jobs.create(owner, fields, b"Hallo"))[0]
        except ApiError as e:
            return e

    async def run():
        servers = DocumentJobs(settings), DocumentJobs(settings)
        answers = await asyncio.gather(*(upload(servers[i % 2]) for i in range(10)))
        admitted = [a for a in answers if not isinstance(a, ApiError)]
        refused = [a for a in answers if isinstance(a, ApiError)]
        assert len(admitted) == 3, answers
        assert {(e.status, e.headers["Retry-After"]) for e in refused} == {(429, "5")}
        assert "--max-document-jobs-per-key" in refused[0].message
        assert not isinstance(await upload(servers[0], "another"), ApiError)
        jobs, document_id = admitted[0]
        assert await jobs.change("capped", document_id, {"status": "translating", "started": time.time()})
        assert isinstance(await upload(servers[1]), ApiError)            # translating still counts
        assert await jobs.change("capped", document_id, {"status": "done", "billed": 5}, b"Hello", drop_source=True)
        assert not isinstance(await upload(servers[1]), ApiError)        # done: out of the count
        assert isinstance(await upload(servers[0]), ApiError)

        short = DocumentJobs(dataclasses.replace(settings, document_lease_s=0.3, max_document_jobs_per_key=1))
        assert not isinstance(await upload(short, "stopped"), ApiError)
        assert isinstance(await upload(short, "stopped"), ApiError)
        await asyncio.sleep(0.4)          # its server stopped renewing: the job counts no longer, read or not
        assert not isinstance(await upload(short, "stopped"), ApiError)
        unlimited = DocumentJobs(dataclasses.replace(settings, max_document_jobs_per_key=0))
        assert not any(isinstance(a, ApiError) for a in await asyncio.gather(*(upload(unlimited) for _ in range(5))))

    asyncio.run(run())


def test_a_documents_redis_calls_get_time_for_its_bytes_and_a_20_mb_result_comes_back_whole(redis):
    assert transfer_timeout_s(0.1, 0) == 0.1
    assert transfer_timeout_s(0.1, 20_000_000) == pytest.approx(0.1 + 20_000_000 / TRANSFER_BYTES_PER_S)
    assert transfer_timeout_s(5.0, 20_000_000) > transfer_timeout_s(5.0, 1_000_000) > 5.0
    big = os.urandom(20_000_000)

    async def run():
        # A 50 ms budget, which the small calls keep: moving 20 MB through Redis and back takes longer than that
        store = RedisJobs(RedisDocuments(redis.url, 0.05))
        job = {"key_hash": "0" * 64, "status": "queued", "format": "txt", "source_lang": "de", "target_lang": "en",
               "created": time.time(), "holder": "me", "lease_until": time.time() + 30}
        assert await store.create("big", "A" * 32, job, big, 60, 0)
        assert await store.source("big", "A" * 32) == big
        assert await store.change("big", "A" * 32, 60, "me", None, True, big[::-1], {"status": "done"})
        assert await store.take("big", "A" * 32) == ("done", big[::-1])

    asyncio.run(run())


def test_a_restarted_server_deletes_the_jobs_that_expired_meanwhile_before_any_upload(tmp_path):
    """Without Redis, expired jobs (their source, their result) were deleted only by a sweep that the first upload of
    a process started: a server restarted after their expiry kept them for as long as no one uploaded."""
    from contextlib import closing

    from service.http.document_jobs import SqliteJobs
    from service.http.sqlite_file import reader

    path, now = tmp_path / "documents.sqlite3", time.time()
    job = {"key_hash": "k", "status": "done", "format": "txt", "source_lang": "de", "target_lang": "en",
           "created": now - 3600, "holder": "gone:1:x", "lease_until": now - 3600}
    assert asyncio.run(SqliteJobs(path).create("anonymous", "A" * 32, job, b"Hallo Welt", -1, 0))   # expired already

    def rows() -> int:
        with closing(reader(path)) as db:
            return db.execute("SELECT count(*) FROM documents").fetchone()[0]

    assert rows() == 1
    proc, url = start_server(ROOT / "models" / "de-en", "--data-dir", str(tmp_path))
    try:
        deadline = time.monotonic() + 30
        while rows():
            assert time.monotonic() < deadline, "the expired job is still stored"
            time.sleep(0.2)
    finally:
        stop_server(proc)


def test_an_upload_to_a_redis_at_its_maxmemory_is_refused_and_leaves_nothing_there(redis):
    """A full Redis (noeviction) refuses the job's first write, so nothing of it is stored: its creation's first
    command used to be a write Redis lets through when full, after which the rest (a 1 MB source) went too."""
    import redis as redis_client

    from service.http.redis_bridge import StoreDown

    admin = redis_client.Redis.from_url(redis.url)
    job = {"key_hash": "0" * 64, "status": "queued", "format": "txt", "source_lang": "de", "target_lang": "en",
           "created": time.time(), "holder": "me", "lease_until": time.time() + 30}

    async def run():
        store = RedisJobs(RedisDocuments(redis.url, 2.0))
        try:
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", admin.info("memory")["used_memory"] + 50_000)
            with pytest.raises(StoreDown) as refused:
                await store.create("full", "F" * 32, job, os.urandom(1_000_000), 60, 3)
            assert not list(admin.scan_iter("*{full}*"))
            assert not refused.value.unsure    # Redis answered: nothing to forget (no tombstone written into it)
        finally:
            admin.config_set("maxmemory", 0)
        assert await store.create("full", "F" * 32, job, b"Hallo", 60, 3)     # room again: stored

    asyncio.run(run())


def test_an_upload_answered_503_by_a_paused_redis_leaves_no_job_there(redis):
    """A Redis that stops answering for a while (here: paused) makes an upload's creation time out, a 503; but its
    script was sent, and ran once Redis went on: the job and the client's file stayed stored until their time to
    live, queued, counted against the key's cap, with no one to translate it and no id its client knows. The job is
    now forgotten once the store answers again, and a creation Redis runs only after that stores nothing (its
    tombstone)."""
    import redis as redis_client

    admin = redis_client.Redis.from_url(redis.url)
    settings = Settings(redis_url=redis.url, file_ttl_s=60, max_document_jobs_per_key=3)
    fields = {"format": "txt", "source_lang": "de", "target_lang": "en"}

    async def run():
        jobs = DocumentJobs(settings)
        store = jobs.backend = RedisJobs(RedisDocuments(redis.url, 0.3))   # a short bound: the 503 comes quickly
        await jobs.create("warm", fields, b"Hallo")          # connected, its scripts loaded in Redis
        redis.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(ApiError) as refused:
                await jobs.create("late", fields, b"Geheimer Text des Kunden.")
        finally:
            redis.proc.send_signal(signal.SIGCONT)
        assert refused.value.status == 503
        deadline = time.monotonic() + 10
        while jobs.to_forget or (jobs.forgetter is not None and not jobs.forgetter.done()):
            assert time.monotonic() < deadline, "the failed upload's job was not forgotten"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        left = sorted(k.decode() for k in admin.scan_iter("*{late}*"))
        assert left and all(k.endswith(":forgotten") and admin.get(k) == b"1" for k in left), left   # none of the file
        assert admin.zcard("transerve:{late}:documents:active") == 0
        forgotten = left[0].split(":")[3]
        job = {"key_hash": "0" * 64, "status": "queued", "created": time.time(), "holder": "me",
               "lease_until": time.time() + 30} | fields
        store.redis.timeout_s = 2.0
        assert not await store.create("late", forgotten, job, b"zu spaet", 60, 3)   # its creation, had it run late
        assert not admin.exists(f"transerve:{{late}}:document:{forgotten}")
        document_id, _ = await jobs.create("late", fields, b"Hallo")     # the store as before
        assert (await store.fields("late", document_id))["status"] == "queued"

    asyncio.run(run())
