"""What an API key protects (service/auth.py, README "API keys"): every route but the probes and the
language lists; /docs, /openapi.json and /info too unless --public-docs; /metrics on the main port too,
or on its own port with no key (--metrics-port, for the cluster's scraper). LitServe's own routes are
not served."""

import httpx
import pytest

from conftest import free_port, start_server, stop_server

KEY = {"Authorization": "Bearer s3cret"}
GUARDED = ("/docs", "/openapi.json", "/info")


@pytest.fixture(scope="module")
def keyed(tiny_package):
    metrics_port = free_port()
    proc, url = start_server(tiny_package, "--api-keys", "s3cret", "--metrics-port", str(metrics_port))
    yield url, f"http://127.0.0.1:{metrics_port}"
    stop_server(proc)


def test_probes_and_language_lists_stay_open_and_the_rest_needs_the_key(keyed):
    url, _ = keyed
    for path in ("/health", "/ready", "/languages", "/libretranslate/languages"):
        assert httpx.get(url + path).status_code == 200, path
    for path in GUARDED:
        r = httpx.get(url + path)
        assert r.status_code == 401 and r.json()["error"]["type"] == "unauthorized", (path, r.text)
        assert httpx.get(url + path, headers={"Authorization": "Bearer wrong"}).status_code == 403, path
        assert httpx.get(url + path, headers=KEY).status_code == 200, path
    assert httpx.get(url + "/info", headers={"X-API-Key": "s3cret"}).json()["settings"]["auth"] is True


def test_metrics_have_their_own_port_without_a_key_and_leave_the_main_one(keyed):
    url, metrics = keyed
    r = httpx.get(metrics + "/metrics")
    assert r.status_code == 200 and "transerve_model_info" in r.text
    assert httpx.get(metrics + "/translate").status_code == 404          # that port serves /metrics only
    assert httpx.get(url + "/metrics", headers=KEY).status_code == 404   # nor is it on the main port


def test_litserve_routes_are_not_served(keyed):
    url, _ = keyed
    for path in ("/litserve/info", "/"):
        assert httpx.get(url + path, headers=KEY).status_code == 404, path


def test_public_docs_open_docs_and_info_and_metrics_on_the_main_port_need_the_key(tiny_package):
    proc, url = start_server(tiny_package, "--api-keys", "s3cret", "--public-docs")
    try:
        for path in GUARDED:
            assert httpx.get(url + path).status_code == 200, path
        assert httpx.get(url + "/metrics").status_code == 401
        assert "transerve_model_info" in httpx.get(url + "/metrics", headers=KEY).text
        r = httpx.post(url + "/translate", json={"text": "Guten Morgen.", "source_lang": "de", "target_lang": "en"})
        assert r.status_code == 401
    finally:
        stop_server(proc)
