"""LibreTranslate's own web page, its file tab, against our server in a real headless browser (the browser:
tests/browser_help.py). The page is LibreTranslate's, not a copy: its templates and static files come from its
PyPI wheel (AGPL-3.0, so never committed here), downloaded at test time into a cache, its sha256 pinned. It is
served as a deployment would put it in front of our server (docs/serving.md, "LibreTranslate's web page"): its
files from one origin, whose /libretranslate/ paths a small reverse proxy passes to our server with their Host,
so that the page's BaseUrl (its origin + url_prefix, "/libretranslate") reaches our routes, and the
translatedFileUrl our server answers names the page's origin.

In the browser: the page loads our /frontend/settings and /languages with no error and lists our file formats;
on its file tab a German docx is chosen, translated, and downloaded by the page itself; the file opened with
python-docx has each paragraph translated as our /libretranslate/translate translates it, its bold run and table
kept. Every request the browser makes stays on the page's origin. A file we refuse shows our error there; the
text tab shows what our /translate answers. On a keyed server, the key typed into the page's prompt is sent with
the file, and the page's download, which carries no key, gets 401 (the result is the key's alone:
docs/serving.md).

The wheel must be obtainable (PyPI: CI installs from it anyway), so a failed download fails the test; without
chromium, chromedriver or selenium the browser tests skip, saying why, as tests/test_ui.py's do."""

import contextlib
import hashlib
import json
import mimetypes
import os
import subprocess
import sys
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NamedTuple

import docx
import httpx
import pytest

from browser_help import browser_missing, chromium
from conftest import pairs64, start_server, stop_server

# LibreTranslate's release whose page is tested; its wheel's sha256 as PyPI lists it. Bump both together.
LIBRETRANSLATE = "1.9.6"
WHEEL_SHA256 = "4e23bec15a1a6d9e5f639dd44fa7614c77b4e671b9d807a94efa96a6f3cefa39"
KEY = "k-page"                       # the keyed server's one key
PREFIX = "/libretranslate"           # LibreTranslate's --url-prefix: where our server serves its API
GERMAN = [de for de, _ in pairs64()][:6]   # the tiny model knows these sentences
WAIT_S = 60                          # a loaded 2-core machine: a translation may wait for the CPU
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization",
              "proxy-authenticate", "content-length", "host"}


# --- LibreTranslate's page, from its wheel -----------------------------------------------------------------
def wheel_cache() -> Path:
    """Where the wheel is kept between runs (a second run needs no network)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "transerve-tests" / "libretranslate"


@pytest.fixture(scope="module")
def wheel() -> zipfile.ZipFile:
    """LibreTranslate's wheel, pinned by version and hash; pip downloads it (no dependencies, nothing installed)
    the first time."""
    cache = wheel_cache()
    path = cache / f"libretranslate-{LIBRETRANSLATE}-py3-none-any.whl"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        run = subprocess.run([sys.executable, "-m", "pip", "download", f"libretranslate=={LIBRETRANSLATE}",
                              "--no-deps", "--only-binary=:all:", "--dest", str(cache), "--retries", "2",
                              "--timeout", "15", "--progress-bar", "off"], capture_output=True, text=True)
        assert run.returncode == 0 and path.exists(), \
            f"could not download LibreTranslate {LIBRETRANSLATE}'s wheel from PyPI:\n{run.stdout}\n{run.stderr}"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest == WHEEL_SHA256, f"{path} has sha256 {digest}, not the pinned {WHEEL_SHA256}: delete it"
    with zipfile.ZipFile(path) as z:
        yield z


def render(wheel: zipfile.ZipFile, api_keys: bool) -> dict[str, bytes]:
    """index.html and js/app.js rendered with jinja2 as LibreTranslate's Flask app renders them (app.py's
    index() and appjs(), --url-prefix /libretranslate, --api-keys as our server has keys or not (the page's
    key button), no secret, English), Flask's and Babel's helpers stood in for: url_for gives the static files'
    paths, _e and _h the English text as JSON and as HTML."""
    import jinja2
    from markupsafe import Markup, escape

    def url_for(endpoint: str, filename: str = "") -> str:
        return f"/static/{filename}" if endpoint == "static" else "/"

    def english(text: str, **variables) -> str:
        return text % variables if variables else text

    def escaped_html(text: str, **variables) -> Markup:   # locales.gettext_html: variables are already HTML
        return Markup(str(escape(text)) % {k: Markup(v) for k, v in variables.items()} if variables else escape(text))

    templates = {name.rsplit("/", 1)[1]: wheel.read(name).decode()
                 for name in wheel.namelist() if name.startswith("libretranslate/templates/")}
    # Flask escapes only .html templates: app.js.template's _e texts are JSON, not HTML.
    env = jinja2.Environment(loader=jinja2.DictLoader(templates), autoescape=jinja2.select_autoescape(["html"]))
    env.globals.update(url_for=url_for, _=english, _e=lambda text, **v: json.dumps(english(text, **v)),
                       _h=escaped_html)
    page = env.get_template("index.html").render(
        frontendTimeout=500, api_keys=api_keys, get_api_key_link="", web_version=False, version=LIBRETRANSLATE,
        swagger_url=PREFIX + "/docs", available_locales=[{"code": "en", "name": "English"}], current_locale="en",
        alternate_locales=[], under_attack=False, hide_api=False, frontend_title="")
    script = env.get_template("app.js.template").render(url_prefix=PREFIX, get_api_key_link="", api_secret="",
                                                         bogus_api_secret="", under_attack=False)
    return {"/": page.encode(), "/js/app.js": script.encode()}


class Origin(NamedTuple):
    url: str                                  # where LibreTranslate's page is
    passed: list[tuple[str, str, int]]        # (method, path, our status) of each request passed to our server


def page_handler(files: dict[str, bytes], wheel: zipfile.ZipFile, api: str, passed: list[tuple[str, str, int]]):
    """The page's origin: its two rendered files, its static files straight from the wheel, and every path under
    PREFIX passed to our server with the page's Host, as a reverse proxy in front of it would pass it; `passed`
    gets each request passed (a download is no request in the browser's performance log)."""
    static = {"/" + n.removeprefix("libretranslate/"): n for n in wheel.namelist() if "/static/" in n}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.route()

        def do_HEAD(self):
            self.route()

        def do_POST(self):
            self.route()

        def route(self):
            path = self.path.split("?", 1)[0]
            if path.startswith(PREFIX + "/"):
                return self.proxy()
            if path in files:
                return self.answer(200, files[path], "text/html" if path == "/" else "application/javascript")
            if path in static:
                return self.answer(200, wheel.read(static[path]), mimetypes.guess_type(path)[0] or "")
            self.answer(404, b"not found", "text/plain")

        def proxy(self):
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            with httpx.Client(timeout=WAIT_S * 2) as client:
                r = client.request(self.command, api + self.path, content=body,
                                   headers=headers | {"Host": self.headers["host"]})
            passed.append((self.command, self.path, r.status_code))
            self.answer(r.status_code, r.content, None, [(k, v) for k, v in r.headers.multi_items()
                                                         if k.lower() not in HOP_BY_HOP | {"content-encoding"}])

        def answer(self, status: int, body: bytes, ctype: str | None, headers=()):
            self.send_response(status)
            for k, v in headers:
                self.send_header(k, v)
            if ctype is not None:
                self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_message(self, *args):   # quiet: pytest shows what failed
            pass

    return Handler


# --- fixtures: our server, the page's origin, the browser ----------------------------------------------
@pytest.fixture(scope="module")
def package(request):
    """The tiny package; TRANSERVE_TEST_PACKAGE=DIR serves one exported earlier instead."""
    return os.environ.get("TRANSERVE_TEST_PACKAGE") or request.getfixturevalue("tiny_package")


@pytest.fixture(scope="module")
def server(package, tmp_path_factory):
    """Our server without keys, as LibreTranslate's page's file tab needs it (docs/serving.md)."""
    proc, url = start_server(package, "--file-dir", str(tmp_path_factory.mktemp("translated-files")))
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def keyed(package, tmp_path_factory):
    proc, url = start_server(package, "--api-keys", KEY, "--file-dir", str(tmp_path_factory.mktemp("keyed-files")))
    yield url
    stop_server(proc)


@contextlib.contextmanager
def origin(wheel: zipfile.ZipFile, api: str):
    """LibreTranslate's page on a port of 127.0.0.1, its API proxied to our server at `api`."""
    passed = []
    files = render(wheel, api_keys=httpx.get(api + PREFIX + "/frontend/settings").json()["apiKeys"])
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), page_handler(files, wheel, api, passed))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield Origin(f"http://127.0.0.1:{httpd.server_address[1]}", passed)
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def page(wheel, server):
    with origin(wheel, server) as o:
        yield o


@pytest.fixture(scope="module")
def keyed_page(wheel, keyed):
    with origin(wheel, keyed) as o:
        yield o


@pytest.fixture(scope="module")
def downloads(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def browser(downloads):
    if why := browser_missing():
        pytest.skip(why)
    driver = chromium(WAIT_S)
    # The page downloads the result itself (a link with `download` it clicks): into this folder, unasked.
    driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    yield driver
    driver.quit()


# --- helpers ---------------------------------------------------------------------------------------------
def wait_for(driver, check, what: str):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, WAIT_S, poll_frequency=0.2).until(lambda d: check(d))
    except TimeoutException:
        pytest.fail(f"{what}: not seen in {WAIT_S} s; the page shows: {shown_error(driver)!r}\n"
                    f"console: {console_errors(driver)}")


def shown_error(driver) -> str:
    """The error the page shows (a card in place of the whole form: its `[[ error ]]`), or ''."""
    return driver.execute_script("const p = document.querySelector('.card.horizontal .card-content p');"
                                 "return p ? p.innerText.trim() : ''")


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def requests_made(driver) -> list[tuple[str, str]]:
    """(method, url) of every request the browser sent since the last call (its performance log)."""
    made = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            made.append((message["params"]["request"]["method"], message["params"]["request"]["url"]))
    return made


def open_page(driver, page: str) -> None:
    """The page loaded, its languages listed (from our /languages); the logs read so far dropped."""
    driver.get_log("performance")
    driver.get_log("browser")
    driver.get(page + "/")
    wait_for(driver, lambda d: d.find_elements("css selector", "select[aria-labelledby=sourceLangLabel] "
                                                               "option[value=de]"), "the languages listed")


def open_file_tab(driver, page: str) -> None:
    """The page loaded, then its "Translate Files" button."""
    open_page(driver, page)
    driver.find_element("xpath", "//button[contains(., 'Translate Files')]").click()
    wait_for(driver, lambda d: d.find_elements("css selector", ".file-dropzone input[type=file]"), "the file tab")


def translate_on_the_page(driver, path: Path) -> str:
    """German into English, `path` chosen and sent from the file tab; the Download link's URL once it shows."""
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element("css selector", "select[aria-labelledby=sourceLangLabel]")).select_by_value("de")
    Select(driver.find_element("css selector", "select[aria-labelledby=targetLangLabel]")).select_by_value("en")
    driver.find_element("css selector", ".file-dropzone input[type=file]").send_keys(str(path))
    driver.find_element("xpath", "//div[contains(@class, 'file-dropzone')]//button[normalize-space()='Translate']"
                        ).click()
    return wait_for(driver, lambda d: d.find_elements("xpath", "//a[normalize-space()='Download']"),
                    "the Download link")[0].get_attribute("href")


def letter(path: Path) -> Path:
    """A German docx: a paragraph of two runs (the second bold), a second paragraph, a table of two cells."""
    d = docx.Document()
    p = d.add_paragraph(GERMAN[0] + " ")
    p.add_run(GERMAN[1]).bold = True
    d.add_paragraph(GERMAN[2])
    table = d.add_table(rows=1, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = GERMAN[3], GERMAN[4]
    d.save(path)
    return path


def wait_until(check, seconds: float = WAIT_S) -> bool:
    deadline = time.time() + seconds
    while not check() and time.time() < deadline:
        time.sleep(0.2)
    return check()


# --- the tests --------------------------------------------------------------------------------------------
def test_the_page_loads_our_settings_and_lists_our_file_formats(page, server, browser):
    settings = httpx.get(server + PREFIX + "/frontend/settings").json()
    open_file_tab(browser, page.url)
    listed = ", ".join(settings["supportedFilesFormat"])
    zone = browser.find_element("css selector", ".file-dropzone").text
    assert f"Supported file formats: {listed}" in zone, zone
    assert browser.find_element("css selector", ".file-dropzone input[type=file]").get_attribute("accept") == listed
    assert not shown_error(browser) and not console_errors(browser), (shown_error(browser), console_errors(browser))
    made = requests_made(browser)
    assert {("GET", page.url + PREFIX + "/frontend/settings"), ("GET", page.url + PREFIX + "/languages")} <= set(made)
    assert all(u.startswith(page.url + "/") for _, u in made), made     # nothing beyond the page's origin


def test_a_german_docx_from_the_file_tab_comes_back_translated(page, server, browser, downloads, tmp_path):
    english = httpx.post(server + PREFIX + "/translate", json={"q": GERMAN[:5], "source": "de", "target": "en"},
                         timeout=WAIT_S * 2).json()["translatedText"]
    open_file_tab(browser, page.url)
    link = translate_on_the_page(browser, letter(tmp_path / "Brief.docx"))
    assert link.startswith(page.url + PREFIX + "/download_file/") and link.endswith(".Brief.docx"), link
    # The page clicked a link to that URL itself: the browser saved the file under the name our server gave it.
    saved = downloads / "Brief.docx"
    assert wait_until(saved.exists), (list(downloads.iterdir()), shown_error(browser), console_errors(browser))
    d = docx.Document(str(saved))
    runs = d.paragraphs[0].runs
    assert [r.bold for r in runs] == [None, True] and runs[1].text.strip()      # the bold run kept, not empty
    assert " ".join(d.paragraphs[0].text.split()) == f"{english[0]} {english[1]}"
    assert d.paragraphs[1].text == english[2]
    assert [c.text for c in d.tables[0].rows[0].cells] == english[3:5]
    assert all(p.text not in GERMAN for p in d.paragraphs), [p.text for p in d.paragraphs]   # no German left
    assert not shown_error(browser), shown_error(browser)
    made = requests_made(browser)
    assert ("POST", page.url + PREFIX + "/translate_file") in made, made
    assert all(u.startswith(page.url + "/") for _, u in made), made
    assert ("GET", link.removeprefix(page.url), 200) in page.passed, page.passed   # the download, via the origin


def test_a_file_our_server_refuses_shows_its_error_on_the_page(page, browser, tmp_path):
    """Our 400 in LibreTranslate's shape, {"error": ...}, is what the page shows (its file input's `accept` is
    only a hint: a user may pick any file)."""
    program = tmp_path / "program.exe"
    program.write_bytes(b"MZ")
    open_file_tab(browser, page.url)
    browser.find_element("css selector", ".file-dropzone input[type=file]").send_keys(str(program))
    browser.find_element("xpath", "//div[contains(@class, 'file-dropzone')]//button[normalize-space()='Translate']"
                         ).click()
    wait_for(browser, lambda d: "file format not supported ('program.exe')" in shown_error(d), "our error")
    assert ("POST", PREFIX + "/translate_file", 400) in page.passed, page.passed

def test_its_text_tab_shows_what_our_translate_answers(page, server, browser):
    """Not the file tab, but the page's first use: typed text sent as its multipart form (alternatives=3)."""
    from selenium.webdriver.support.ui import Select

    expected = httpx.post(server + PREFIX + "/translate", data={"q": GERMAN[5], "source": "de", "target": "en"},
                          timeout=WAIT_S * 2).json()["translatedText"]
    open_page(browser, page.url)      # the text tab is the one shown first
    Select(browser.find_element("css selector", "select[aria-labelledby=sourceLangLabel]")).select_by_value("de")
    browser.find_element("id", "textarea1").send_keys(GERMAN[5])
    wait_for(browser, lambda d: d.find_element("id", "textarea2").get_attribute("value") == expected, expected)
    assert not shown_error(browser), shown_error(browser)


def test_with_keys_the_page_sends_the_key_but_its_download_is_refused(keyed_page, browser, tmp_path):
    """A server with keys keeps each result for the key that sent it (README, "API keys"); LibreTranslate's page
    sends the key with the file but downloads the result with none (its own /download_file asks for none), so
    there the file tab translates and the download gets 401: docs/serving.md says so."""
    from selenium.webdriver.support import expected_conditions

    open_file_tab(browser, keyed_page.url)
    browser.find_element("css selector", "a[href='javascript:setApiKey()']").click()   # the page's key button
    prompt = wait_for(browser, expected_conditions.alert_is_present(), "the page's prompt for the key")
    prompt.send_keys(KEY)
    prompt.accept()
    link = translate_on_the_page(browser, letter(tmp_path / "Schluessel.docx"))
    assert ("POST", PREFIX + "/translate_file", 200) in keyed_page.passed, keyed_page.passed
    assert wait_until(lambda: ("GET", link.removeprefix(keyed_page.url), 401) in keyed_page.passed), keyed_page.passed
    assert httpx.get(link, headers={"X-API-Key": KEY}).status_code == 200     # the key that sent it reads it

