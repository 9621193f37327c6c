"""The translate page (GET /ui, service/api/ui.py) and the API docs (/docs, /redoc), in a real headless browser:
Debian's chromium driven by Selenium, its network blocked beyond 127.0.0.1 (every name but 127.0.0.1
unresolvable, every other connection sent to a proxy where nothing listens). Typed German shows what
POST /translate answers for the same text (the page adds nothing of its own), the detected language, an
error as the API gives it, the key asked for and sent, markup in a translation shown as text; every
request the browser makes goes to the server (the browser: tests/browser_help.py). The browser tests skip,
saying why, without chromium, chromedriver or selenium (scripts/test.sh installs them as root).
TRANSERVE_UI_SCREENSHOT=docs/ui.png writes the page's screenshot there (else under the test's tmp_path)."""

import base64
import hashlib
import json
import os
import re

import httpx
import pytest

from browser_help import browser_missing, chromium
from conftest import ROOT, start_server, stop_server

KEY = "s3cret"
GERMAN = "Daran wirst du nicht sterben."   # tests/fixtures/pairs64.tsv: the tiny model knows it
MAX_CHARS = 200                            # --max-text-chars of the unkeyed server, for a 413 to show
WAIT_S = 60                                # a loaded 2-core machine: a translation may wait for the CPU


@pytest.fixture(scope="module")
def server(tiny_package):
    proc, url = start_server(tiny_package, "--max-text-chars", str(MAX_CHARS))
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def keyed(tiny_package):
    proc, url = start_server(tiny_package, "--api-keys", KEY)
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def browser():
    if why := browser_missing():
        pytest.skip(why)
    driver = chromium(WAIT_S)
    yield driver
    driver.quit()


def requests_made(driver) -> list[tuple[str, str]]:
    """(method, url) of every request the browser sent since the last call (its performance log); one that
    the page's Content-Security-Policy refused never left the browser and is not counted."""
    sent, refused = {}, set()
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        params = message["params"]
        if message["method"] == "Network.requestWillBeSent":
            sent[params["requestId"]] = (params["request"]["method"], params["request"]["url"])
        elif message["method"] == "Network.loadingFailed" and params.get("blockedReason") == "csp":
            refused.add(params["requestId"])
    return [r for rid, r in sent.items() if rid not in refused]


def only_local(made: list[tuple[str, str]], url: str) -> None:
    away = [u for _, u in made if not u.startswith((url + "/", "data:", f"blob:{url}/"))]
    assert made and not away, away


def open_page(driver, url: str) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get_log("performance")
    driver.get_log("browser")
    driver.get(url + "/ui")
    driver.execute_script("sessionStorage.clear()")
    WebDriverWait(driver, WAIT_S).until(lambda d: d.find_elements("css selector", "#source option[value=de]"))


def type_text(driver, text: str) -> None:
    box = driver.find_element("id", "input")
    box.clear()
    box.send_keys(text)


def wait_for(driver, check, what: str):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, WAIT_S, poll_frequency=0.2).until(lambda d: check(d))
    except TimeoutException:
        state = {i: driver.find_element("id", i).get_attribute("value") or driver.find_element("id", i).text
                 for i in ("output", "error", "status", "detected")}
        pytest.fail(f"{what}: not seen in {WAIT_S} s; the page shows {state}")


def value(driver, element_id: str) -> str:
    return driver.find_element("id", element_id).get_attribute("value")


def text(driver, element_id: str) -> str:
    return driver.find_element("id", element_id).text


def select(driver, element_id: str, code: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element("id", element_id)).select_by_value(code)


def severe(driver) -> list[str]:
    """The browser console's errors (a CSP violation, a script error, a failed load), favicon.ico aside."""
    return [e["message"] for e in driver.get_log("browser")
            if e["level"] == "SEVERE" and "favicon.ico" not in e["message"]]


# --- the page as served --------------------------------------------------------------------------------
def test_the_page_is_open_self_contained_and_allows_only_its_own_inline_blocks(server, keyed):
    for url, required in ((server, "false"), (keyed, "true")):
        r = httpx.get(url + "/ui")   # no key, even where the server has keys
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), r.text
        page = r.text
        assert f'data-key-required="{required}"' in page
        assert not re.search(r"(https?:)?//[a-z0-9]", page), "the page names something outside the server"
        policy = r.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "connect-src 'self'" in policy
        for kind, block in (("script", r"<script>(.*?)</script>"), ("style", r"<style>(.*?)</style>")):
            inline = re.findall(block, page, re.S)
            digest = base64.b64encode(hashlib.sha256(inline[0].encode()).digest()).decode()
            assert len(inline) == 1 and f"{kind}-src 'sha256-{digest}'" in policy, kind
    assert httpx.get(keyed + "/", headers={"Authorization": f"Bearer {KEY}"}).status_code == 404   # LitServe's root


def test_docs_load_their_scripts_from_the_server_under_the_docs_key_rule(server, keyed):
    page = httpx.get(server + "/docs").text
    assert "cdn" not in page and "/docs/swagger-ui-bundle.js" in page and "/docs/swagger-ui.css" in page, page
    assert "/redoc/redoc.standalone.js" in httpx.get(server + "/redoc").text
    for path, kind in (("/docs/swagger-ui-bundle.js", "text/javascript"), ("/docs/swagger-ui.css", "text/css"),
                       ("/redoc/redoc.standalone.js", "text/javascript"), ("/docs/favicon.png", "image/png")):
        r = httpx.get(server + path)
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind) and len(r.content) > 1000, path
        assert httpx.get(keyed + path).status_code == 401, path             # as /docs itself (--public-docs opens)
        assert httpx.get(keyed + path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200, path


# --- in the browser -------------------------------------------------------------------------------------
def test_the_browser_reaches_nothing_beyond_127_0_0_1(server, browser):
    browser.get(server + "/health")   # a page without the UI's Content-Security-Policy: only the network stops it
    outcome = browser.execute_async_script(
        "const done = arguments[0]; fetch('https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui.css')"
        ".then(r => done('answered ' + r.status), e => done('failed: ' + e))")
    assert outcome.startswith("failed"), outcome


def test_typed_german_shows_what_the_api_translates_it_to(server, browser, tmp_path):
    expected = httpx.post(server + "/translate", json={"text": GERMAN, "source_lang": "auto", "target_lang": "en"},
                          timeout=WAIT_S).json()["translations"][0]
    assert expected["detected_lang"]["language"] == "de", expected
    open_page(browser, server)
    assert browser.find_element("id", "source").get_attribute("value") == "auto"
    assert browser.find_element("id", "target").get_attribute("value") == "en"
    assert not browser.find_element("id", "key-row").is_displayed()   # this server has no keys
    type_text(browser, GERMAN)
    wait_for(browser, lambda d: value(d, "output") == expected["text"], f"the translation {expected['text']!r}")
    assert text(browser, "detected").startswith("Detected: German"), text(browser, "detected")
    assert not browser.find_element("id", "error").is_displayed()
    assert browser.find_element("id", "copy").is_enabled()
    shot = os.environ.get("TRANSERVE_UI_SCREENSHOT")
    path = ROOT / shot if shot else tmp_path / "ui.png"
    assert browser.save_screenshot(str(path)) and path.stat().st_size > 10_000
    made = requests_made(browser)
    only_local(made, server)
    posts = [u for m, u in made if m == "POST"]
    # Typed key by key, translated once typing paused (debounced), not once per key.
    assert posts and all(u == server + "/translate" for u in posts) and len(posts) < len(GERMAN) // 3, posts
    errors = severe(browser)
    assert not errors, errors


def test_a_glossary_typed_in_its_box_is_sent_and_what_held_is_shown(server, browser):
    glossary = [{"source": "sterben", "target": "perish"}]
    expected = httpx.post(server + "/translate", json={"text": GERMAN, "source_lang": "auto", "target_lang": "en",
                                                       "glossary": glossary}, timeout=WAIT_S).json()
    assert "perish" in expected["translations"][0]["text"], expected
    open_page(browser, server)
    browser.find_element("css selector", "#glossary-box summary").click()
    browser.find_element("id", "glossary").send_keys("sterben = perish")
    type_text(browser, GERMAN)
    wait_for(browser, lambda d: value(d, "output") == expected["translations"][0]["text"], "the kept term")
    wait_for(browser, lambda d: text(d, "glossary-held") == "1 of 1 terms held", "what held")
    assert text(browser, "glossary-count") == "(1)"
    # A source term given twice (" = ": a typed tab would move the focus).
    browser.find_element("id", "glossary").send_keys("\nsterben = die")
    wait_for(browser, lambda d: "invalid_glossary: glossary entry 2" in text(d, "error"), "the entry named")
    assert text(browser, "glossary-held") == ""


def test_a_stored_glossary_is_listed_for_its_pair_and_sent_by_its_id(server, browser):
    made = httpx.post(server + "/glossaries", json={"name": "ui words", "source_lang": "de", "target_lang": "en",
                                                     "entries": [{"source": "sterben", "target": "perish"}]},
                      timeout=WAIT_S).json()
    expected = httpx.post(server + "/translate", json={"text": GERMAN, "source_lang": "de", "target_lang": "en",
                                                       "glossary_id": made["glossary_id"]}, timeout=WAIT_S).json()
    open_page(browser, server)
    browser.find_element("css selector", "#glossary-box summary").click()
    # Read in one script: the page may rebuild the list as its glossaries arrive, and an option element read
    # one by one then goes stale (CI, once: StaleElementReferenceException).
    options = browser.execute_script("return [...document.getElementById('glossary-id').options].map(o => o.text)")
    assert options == ["none"]                                                    # source "auto": no pair yet
    select(browser, "source", "de")
    wait_for(browser, lambda d: "ui words (1 entry)" in text(d, "glossary-id"), "the glossary listed")
    select(browser, "glossary-id", made["glossary_id"])
    type_text(browser, GERMAN)
    wait_for(browser, lambda d: value(d, "output") == expected["translations"][0]["text"], "the stored glossary's")
    wait_for(browser, lambda d: text(d, "glossary-held") == "1 of 1 terms held", "what held")
    httpx.delete(f"{server}/glossaries/{made['glossary_id']}", timeout=WAIT_S)


def test_an_error_is_shown_as_the_api_gives_it(server, browser):
    long = (GERMAN + " ") * (MAX_CHARS // len(GERMAN) + 1)
    api = httpx.post(server + "/translate", json={"text": long, "source_lang": "auto", "target_lang": "en"}).json()
    assert api["error"]["type"] == "text_too_long", api
    open_page(browser, server)
    browser.find_element("id", "input").send_keys(long)
    shown = f"413 text_too_long: {api['error']['message']} (limit {MAX_CHARS})"
    wait_for(browser, lambda d: text(d, "error").startswith(shown), shown)
    assert value(browser, "output") == "" and "request id: " in text(browser, "error")
    type_text(browser, GERMAN)   # a good text again: the error goes
    wait_for(browser, lambda d: value(d, "output") and not d.find_element("id", "error").is_displayed(), "no error")


def test_markup_in_a_translation_is_shown_as_text(server, browser):
    hostile = '<img src=x onerror="document.title=\'owned\'"><b>fett</b> &amp; <script>document.title="x"</script>'
    open_page(browser, server)
    select(browser, "source", "de")
    select(browser, "target", "de")   # a language into itself: the API returns the text unchanged
    type_text(browser, hostile)
    wait_for(browser, lambda d: value(d, "output") == hostile, "the markup back as text")
    assert browser.execute_script("return document.querySelectorAll('img, b').length") == 0
    assert browser.title == "transerve: translate"


def test_the_key_is_asked_for_and_sent(keyed, browser):
    expected = httpx.post(keyed + "/translate", json={"text": GERMAN, "source_lang": "auto", "target_lang": "en"},
                          headers={"Authorization": f"Bearer {KEY}"}, timeout=WAIT_S).json()["translations"][0]
    open_page(browser, keyed)
    assert browser.find_element("id", "key-row").is_displayed()   # the server said it has keys
    type_text(browser, GERMAN)
    wait_for(browser, lambda d: text(d, "error").startswith("401 unauthorized: missing API key"), "the 401")
    browser.find_element("id", "key").send_keys("wrong\t")
    wait_for(browser, lambda d: text(d, "error").startswith("401 unauthorized: invalid API key"), "the 401")
    browser.find_element("id", "key").clear()
    browser.find_element("id", "key").send_keys(KEY + "\t")
    wait_for(browser, lambda d: value(d, "output") == expected["text"], f"the translation {expected['text']!r}")
    assert not browser.find_element("id", "error").is_displayed()
    only_local(requests_made(browser), keyed)


def test_docs_and_redoc_render_offline(server, browser):
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get_log("performance")
    browser.get_log("browser")
    browser.get(server + "/docs")
    WebDriverWait(browser, WAIT_S).until(lambda d: d.find_elements("css selector", ".swagger-ui .opblock"))
    assert "transerve" in browser.find_element("css selector", ".swagger-ui .info .title").text
    assert any("/translate" in e.text for e in browser.find_elements("css selector", ".opblock-summary-path"))
    browser.get(server + "/redoc")
    WebDriverWait(browser, WAIT_S).until(lambda d: "Translate one text" in d.find_element("tag name", "body").text)
    only_local(requests_made(browser), server)
    # Redocly's logo from its CDN, refused by the page's policy before any request (service/api/ui.py REDOC_POLICY).
    errors = severe(browser)
    assert all("cdn.redoc.ly" in m for m in errors), errors
