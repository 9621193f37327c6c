"""LibreTranslate's file API on a real server on 127.0.0.1 (the tiny model that memorised
tests/fixtures/pairs64.tsv; a file's texts are compared with what the same server's /libretranslate/translate
answers for them): POST /libretranslate/translate_file through plain multipart HTTP, as LibreTranslate's web
page sends it, then the URL it answers downloaded and opened with python-docx / polib; hostile files each
refused alone with a 4xx in LibreTranslate's shape naming the problem, the server translating the next file as
before; the download only for the key that sent the file, deleted after --file-ttl-s; /frontend/settings as
LibreTranslate's clients read it.

libretranslatepy (2.1.4, the client tests/test_libretranslate_html.py drives) has no file call, so the plain
HTTP client here is what a file client sends."""

import io
import time

import docx
import httpx
import polib
import pytest

from conftest import pairs64, server_log, start_server, stop_server
from documents_help import entity_bomb, many_runs, word, zip_bomb

KEY, OTHER = "k-first", "k-second"
GERMAN = [de for de, _ in pairs64()][:16]
MAX_FILE = 100_000
TTL_S = 6


@pytest.fixture(scope="module")
def files_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("translated-files")


@pytest.fixture(scope="module")
def served(tiny_package, files_dir):
    """(the server's process, its URL)."""
    proc, url = start_server(tiny_package, "--api-keys", f"{KEY},{OTHER}", "--max-file-bytes", str(MAX_FILE),
                             "--max-file-unpacked-bytes", "20000000", "--max-file-elements", "50000",
                             "--file-ttl-s", str(TTL_S), "--file-dir", str(files_dir))
    yield proc, url
    stop_server(proc)


@pytest.fixture(scope="module")
def server(served):
    return served[1]


@pytest.fixture(scope="module")
def english(server) -> dict[str, str]:
    """What the server answers for each German sentence as plain text (beam search: a few are not the pair's)."""
    r = httpx.post(server + "/libretranslate/translate", json={"q": GERMAN, "source": "de", "target": "en",
                                                               "api_key": KEY}, timeout=300)
    assert r.status_code == 200, r.text
    return dict(zip(GERMAN, r.json()["translatedText"]))


def send(url: str, name: str, data: bytes, key: str | None = KEY, source: str = "de") -> httpx.Response:
    fields = {"source": source, "target": "en"} | ({"api_key": key} if key else {})
    return httpx.post(url + "/libretranslate/translate_file", data=fields, files={"file": (name, data)}, timeout=300)


def download(answer: httpx.Response, key: str | None = KEY) -> httpx.Response:
    assert answer.status_code == 200, answer.text
    return httpx.get(answer.json()["translatedFileUrl"], headers={"X-API-Key": key} if key else {}, timeout=30)


def test_the_bar_a_docx_comes_back_translated_with_its_table_header_and_bold_run(server, english):
    body = (GERMAN[0] + " ", GERMAN[1], " " + GERMAN[2])
    data = word(body, GERMAN[3], [[GERMAN[4], GERMAN[5]], ["", GERMAN[6]]], footer=GERMAN[7])
    got = download(send(server, "Brief.docx", data))
    assert got.status_code == 200
    assert got.headers["content-type"].startswith("application/vnd.openxmlformats-officedocument.wordprocessingml")
    assert 'filename="Brief.docx"' in got.headers["content-disposition"]
    d = docx.Document(io.BytesIO(got.content))
    runs = d.paragraphs[0].runs
    assert [r.bold for r in runs] == [None, True, None] and runs[1].text.strip()   # the bold run kept, not empty
    assert " ".join("".join(r.text for r in runs).split()) == " ".join(english[t] for t in GERMAN[:3])
    assert d.sections[0].header.paragraphs[0].text == english[GERMAN[3]]
    assert d.sections[0].footer.paragraphs[0].text == english[GERMAN[7]]
    assert [[c.text for c in row.cells] for row in d.tables[0].rows] == \
        [[english[GERMAN[4]], english[GERMAN[5]]], ["", english[GERMAN[6]]]]


def test_a_catalog_keeps_its_placeholders_and_source_auto_is_detected(server, english):
    po = polib.POFile(wrapwidth=0)
    po.append(polib.POEntry(msgid=f"%(count)d: {GERMAN[8]}\n<b>{{name}}</b> {GERMAN[9]}", occurrences=[("a.py", "3")]))
    po.append(polib.POEntry(msgid=GERMAN[10], msgstr="Kept as it was."))
    got = download(send(server, "messages.po", str(po).encode(), source="auto"))
    out = polib.pofile(got.text)
    assert out[0].msgstr == f"%(count)d: {english[GERMAN[8]]}\n<b>{{name}}</b> {english[GERMAN[9]]}"
    assert "fuzzy" in out[0].flags and out[0].occurrences == [("a.py", "3")]
    assert out[1].msgstr == "Kept as it was." and "fuzzy" not in out[1].flags


def test_the_access_line_counts_the_whole_document_not_its_last_part(served):
    """A document is translated in requests of --max-texts texts (64 by default); its one access line holds the
    sum of their characters and tokens (it held whichever part finished last)."""
    proc, url = served
    paragraphs = GERMAN * 9                               # 144 texts: 3 parts
    r = httpx.post(url + "/libretranslate/translate_file", data={"source": "de", "target": "en", "api_key": KEY},
                   files={"file": ("brief.txt", "\n\n".join(paragraphs).encode())},
                   headers={"X-Request-ID": "file-access-1"}, timeout=300)
    assert r.status_code == 200, r.text
    time.sleep(0.5)                                       # the line is written as the answer leaves
    (line,) = [ln for ln in server_log(proc).splitlines() if "request_id=file-access-1" in ln]
    fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
    assert int(fields["chars_in"]) == sum(map(len, paragraphs)), line
    assert int(fields["tokens_in"]) >= len(paragraphs) and int(fields["tokens_out"]) >= len(paragraphs), line


def test_an_html_file_with_a_cell_of_nbsp_alone_comes_back_translated_the_cell_kept(server, english):
    # a run of non-breaking spaces alone was a text of its own, which the request refused: a 500 for a common
    # file (Word's HTML), and the document's texts in the logged traceback
    got = download(send(server, "table.html", f"<p>{GERMAN[13]}</p><td>&nbsp;</td>".encode()))
    assert got.text == f"<p>{english[GERMAN[13]]}</p><td>&nbsp;</td>"


def test_the_download_is_for_the_key_that_sent_the_file_and_is_deleted_after_its_time(server, files_dir, english):
    answer = send(server, "notes.txt", f"{GERMAN[11]}\n\n{GERMAN[12]}\n".encode())
    assert download(answer).text == f"{english[GERMAN[11]]}\n\n{english[GERMAN[12]]}\n"
    other = download(answer, OTHER)
    assert other.status_code == 404 and "only the key that sent a file" in other.json()["error"]
    assert download(answer, None).status_code == 401
    assert all(p.stat().st_mode & 0o077 == 0 for p in files_dir.iterdir())   # no other user of the host reads them
    deadline = time.time() + TTL_S + 10
    while any(files_dir.iterdir()) and time.time() < deadline:
        time.sleep(0.5)
    assert not any(files_dir.iterdir())
    assert download(answer).status_code == 404


@pytest.mark.parametrize("name, make, status, words", [
    ("bomb.docx", lambda d: zip_bomb(d, 60_000_000), 413, "zip bomb"),
    ("laughs.docx", entity_bomb, 400, "DTD"),
    ("runs.docx", lambda d: many_runs(d, 200_000), 413, "XML elements"),
    ("program.exe", lambda d: d, 400, "file format not supported"),
    ("letter.txt", lambda d: d, 400, "is a zip archive"),
    ("fake.docx", lambda d: b"Hallo Welt", 400, "not a zip archive"),
    ("large.txt", lambda d: b"Hallo Welt. " * (MAX_FILE // 12 + 100), 413, "limit is 100000"),
    ("larger.txt", lambda d: b"Hallo Welt. " * (MAX_FILE // 4), 413,
     f"larger than {MAX_FILE} bytes (--max-file-bytes)"),                 # the flag's number, not the form's slack
    ("empty.txt", lambda d: b"", 400, "empty.txt: the file is empty"),
    ("blank.srt", lambda d: b"\r\n", 400, "the file is empty"),
    ("cut.po", lambda d: b'msgid "Hallo\nmsgstr ""\n', 400, "the .po file's msgid on line 1 is not terminated"),
    ("dtd.html", lambda d: b'<!DOCTYPE html [ <!ENTITY b "x"> ]><p>Hallo &b;</p>', 400, "internal DTD subset"),
])
def test_hostile_files_are_refused_alone_with_a_4xx_naming_the_problem(server, english, name, make, status, words):
    data = make(word((GERMAN[0], GERMAN[1], ""), GERMAN[3], [[GERMAN[4]]]))
    answer = send(server, name, data)
    assert answer.status_code == status, answer.text
    assert list(answer.json()) == ["error"] and words in answer.json()["error"], answer.text
    ok = send(server, "after.txt", GERMAN[13].encode())     # the server goes on translating
    assert download(ok).text == english[GERMAN[13]]


def test_a_chunked_upload_over_the_limit_is_told_the_files_limit(server):
    """Without a Content-Length the body is counted as it is read: its 413 names --max-file-bytes, as a declared
    one's does, not --max-payload-bytes."""
    form = httpx.Request("POST", server + "/libretranslate/translate_file", data={"source": "de", "target": "en",
                         "api_key": KEY}, files={"file": ("large.txt", b"Hallo Welt. " * (MAX_FILE // 4))})
    body = form.read()
    answer = httpx.post(server + "/libretranslate/translate_file", content=iter([body[:50_000], body[50_000:]]),
                        headers={"Content-Type": form.headers["Content-Type"]}, timeout=60)
    assert answer.request.headers.get("transfer-encoding") == "chunked"
    assert answer.status_code == 413 and f"larger than {MAX_FILE} bytes (--max-file-bytes)" in answer.json()["error"]


def test_the_request_is_checked_as_libretranslate_checks_it(server):
    assert send(server, "a.txt", b"Hallo", key=None).status_code == 401
    assert send(server, "a.txt", b"Hallo", key="wrong").status_code == 401      # an unknown key, as on every route
    missing = httpx.post(server + "/libretranslate/translate_file", data={"source": "de", "target": "en",
                                                                          "api_key": KEY}, timeout=30)
    assert missing.status_code == 400 and missing.json() == {"error": "Invalid request: missing file parameter"}
    unserved = httpx.post(server + "/libretranslate/translate_file", data={"source": "de", "target": "fr",
                          "api_key": KEY}, files={"file": ("a.txt", b"Hallo")}, timeout=30)
    assert unserved.status_code == 400 and "de-fr" in unserved.json()["error"]
    json_body = httpx.post(server + "/libretranslate/translate_file", json={"api_key": KEY}, timeout=30)
    assert json_body.status_code == 400 and "multipart/form-data" in json_body.json()["error"]


def test_frontend_settings_list_the_file_formats_without_a_key(server):
    r = httpx.get(server + "/libretranslate/frontend/settings", timeout=30)
    assert r.status_code == 200
    body = r.json()
    assert body["filesTranslation"] is True and body["keyRequired"] is True
    assert {".docx", ".pptx", ".odt", ".odp", ".txt", ".html", ".po"} <= set(body["supportedFilesFormat"])
    assert body["language"]["source"]["code"] == "auto" and body["language"]["target"]["code"] == "en"


def test_behind_a_tls_proxy_on_this_host_the_download_link_is_https(server):
    """docs/serving.md (LibreTranslate's page): the link is built from the request, and a proxy on 127.0.0.1 that
    ends TLS says so with X-Forwarded-Proto, which uvicorn's proxy headers turn into the scheme the link names."""
    fields = {"source": "de", "target": "en", "api_key": KEY}
    answer = httpx.post(server + "/libretranslate/translate_file", data=fields, timeout=300,
                        files={"file": ("hallo.txt", b"Guten Morgen.")}, headers={"X-Forwarded-Proto": "https"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["translatedFileUrl"].startswith("https://127.0.0.1:"), answer.json()
