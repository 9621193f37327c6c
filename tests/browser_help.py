"""Debian's chromium driven by Selenium, headless, for the tests of web pages (tests/test_ui.py, our translate page;
tests/test_libretranslate_page.py, LibreTranslate's): its network blocked beyond 127.0.0.1 (every name but
127.0.0.1 unresolvable, every other connection sent to a proxy where nothing listens). Defined once here, since no
test module imports another."""

import shutil

BLOCKED = ["--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
           "--proxy-server=http://127.0.0.1:9"]   # 9 (discard): nothing listens; loopback bypasses proxies
QUIET = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--window-size=1100,640"]


def browser_missing() -> str | None:
    """Why no browser can be driven here (for pytest.skip), or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        return "no chromium/chromedriver on PATH (apt-get install chromium chromium-driver; scripts/test.sh does)"
    return None


def chromium(wait_s: float):
    """A headless chromium with its network blocked, logging its requests (performance) and console (browser)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in QUIET + BLOCKED:
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    driver.set_page_load_timeout(wait_s)
    return driver
