"""Language identification, for real: `python -m service` on 127.0.0.1 with the committed models/de-en package
(de-en and en-de), asked by libretranslatepy (detect, languages, translate with source "auto") and over HTTP
(/libretranslate/detect, source=auto with alternatives, our /translate with source_lang "auto"). The accuracy
bar is on 200 held-out sentences per language (tests/fixtures/langid-heldout.tsv, from model.data's test
split); benchmarks/langid.py measures more, short UI strings included."""

import json

import httpx
import pytest

from conftest import FIXTURES, ROOT, start_server, stop_server

KEY = "s3cret"
DE, EN = "Das geht zu weit.", "That goes much too far."


def held_out() -> list[tuple[str, str]]:
    lines = (FIXTURES / "langid-heldout.tsv").read_text(encoding="utf-8").splitlines()
    return [tuple(line.split("\t", 1)) for line in lines if not line.startswith("#")]


@pytest.fixture(scope="module")
def server():
    # With an API key, so that /detect is seen to check it as the other LibreTranslate routes do.
    proc, url = start_server(ROOT / "models" / "de-en", "--api-keys", KEY, "--max-output-tokens", "32")
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def one_way_server(tmp_path_factory):
    """models/de-en serving de-en only (its model.json's directions cut; the files are checked, not model.json):
    English detected with target de has no model."""
    pkg = tmp_path_factory.mktemp("pkg") / "de-en-one-way"
    pkg.mkdir()
    src = ROOT / "models" / "de-en"
    for f in src.iterdir():
        if f.name != "model.json":
            (pkg / f.name).symlink_to(f.resolve())
    meta = json.loads((src / "model.json").read_text())
    (pkg / "model.json").write_text(json.dumps(meta | {"directions": ["de-en"]}))
    proc, url = start_server(pkg, "--max-output-tokens", "32")
    yield url
    stop_server(proc)


def lt(url):
    from libretranslatepy import LibreTranslateAPI

    return LibreTranslateAPI(url + "/libretranslate/", api_key=KEY)


def post(url, path, body, **kw):
    return httpx.post(url + path, json=body, timeout=120, headers={"X-API-Key": KEY}, **kw)


def test_libretranslatepy_detects_held_out_sentences(server):
    """The bar: de and en right on at least 98% of 200 held-out sentences each, in LibreTranslate's shape."""
    api, right, seen = lt(server), {"de": 0, "en": 0}, {"de": 0, "en": 0}
    for lang, text in held_out():
        found = api.detect(text)
        assert [d["language"] for d in found] in (["de", "en"], ["en", "de"]), found
        assert found[0]["confidence"] >= found[1]["confidence"] and 0 <= found[1]["confidence"] <= 100
        right[lang] += found[0]["language"] == lang
        seen[lang] += 1
    assert seen == {"de": 200, "en": 200}
    assert right["de"] >= 196 and right["en"] >= 196, right


def test_libretranslatepy_whole_surface(server):
    api = lt(server)
    assert {"code": "de", "name": "German", "targets": ["en"]} in api.languages()
    assert isinstance(api.translate(DE, "de", "en"), str)
    assert api.translate(DE, "auto", "en") == api.translate(DE, "de", "en")
    assert api.translate(EN, "auto", "en") == EN        # detected en: into itself, unchanged
    assert api.detect(DE)[0]["language"] == "de" and api.detect(EN)[0]["language"] == "en"


def test_libretranslate_auto_with_alternatives_and_lists(server):
    r = post(server, "/libretranslate/translate", {"q": DE, "source": "auto", "target": "en", "alternatives": 2})
    body = r.json()
    assert r.status_code == 200 and isinstance(body["translatedText"], str) and len(body["alternatives"]) == 2
    assert body["detectedLanguage"]["language"] == "de" and 50 < body["detectedLanguage"]["confidence"] <= 100
    r = post(server, "/libretranslate/translate", {"q": [DE, EN], "source": "auto", "target": "en"})
    body = r.json()
    assert [d["language"] for d in body["detectedLanguage"]] == ["de", "en"] and body["translatedText"][1] == EN
    # Without auto, the answer is as before: no detectedLanguage. A form, as LibreTranslate's web UI sends.
    r = httpx.post(server + "/libretranslate/translate", timeout=120,
                   data={"q": DE, "source": "de", "target": "en", "alternatives": "1", "api_key": KEY})
    assert r.status_code == 200 and set(r.json()) == {"translatedText", "alternatives"}


def test_detect_route_shape_errors_and_key(server):
    r = httpx.post(server + "/libretranslate/detect", data={"q": "Guten Morgen, wie geht es dir?", "api_key": KEY})
    assert r.status_code == 200 and r.json()[0]["language"] == "de"
    assert sum(d["confidence"] for d in r.json()) == pytest.approx(100, abs=0.2)
    r = post(server, "/libretranslate/detect", {"q": ["Good morning,", "how are you?"]})
    assert r.status_code == 200 and r.json()[0]["language"] == "en"
    r = post(server, "/libretranslate/detect", {"q": ""})
    assert r.status_code == 400 and r.json() == {"error": "Invalid request: missing q parameter"}
    r = post(server, "/libretranslate/detect", {"q": 3})
    assert r.status_code == 400 and "q must be" in r.json()["error"]
    assert httpx.post(server + "/libretranslate/detect", data={"q": DE}).status_code == 401
    r = httpx.post(server + "/libretranslate/detect", data={"q": DE, "api_key": "wrong"})
    assert r.status_code == 401 and r.json() == {"error": "invalid API key"}
    spec = httpx.get(server + "/openapi.json", headers={"Authorization": f"Bearer {KEY}"}).json()   # docs need it
    assert "/libretranslate/detect" in spec["paths"]
    assert "auto" in spec["components"]["schemas"]["TranslateRequest"]["properties"]["source_lang"]["enum"]


def test_our_translate_with_auto(server):
    r = post(server, "/translate", {"text": DE, "source_lang": "auto", "target_lang": "en"})
    body = r.json()
    assert r.status_code == 200 and body["source_lang"] == "de" and body["model"] == "de-en"
    assert body["translations"][0]["detected_lang"]["language"] == "de"
    # A list: each text detected and translated from its own language, in order.
    r = post(server, "/translate", {"text": [EN, DE, EN], "source_lang": "auto", "target_lang": "de"})
    body = r.json()
    assert r.status_code == 200 and body["source_lang"] == "auto" and body["model"] == "de-en+identity"
    assert [t["detected_lang"]["language"] for t in body["translations"]] == ["en", "de", "en"]
    assert body["translations"][1]["text"] == DE and body["translations"][0]["text"] != EN
    assert body["translations"][0]["text"] == body["translations"][2]["text"]
    r = post(server, "/translate", {"text": DE, "source_lang": "de", "target_lang": "en"})
    assert "detected_lang" not in r.json()["translations"][0]       # only with auto
    r = post(server, "/translate", {"text": DE, "source_lang": "auto", "target_lang": "fr"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "unsupported_language_pair"


def test_a_detected_language_without_a_model_to_the_target_is_a_422(one_way_server):
    r = httpx.post(one_way_server + "/translate", json={"text": [DE, EN], "source_lang": "auto", "target_lang": "de"},
                   timeout=120)
    assert r.status_code == 422 and r.json()["error"]["type"] == "unsupported_detected_language"
    assert "text[1] was detected as en" in r.json()["error"]["message"]
    r = httpx.post(one_way_server + "/libretranslate/translate", json={"q": EN, "source": "auto", "target": "de"})
    assert r.status_code == 422 and "detected as en" in r.json()["error"]
    # Detection is among the served languages, en included (a target only, into itself).
    r = httpx.post(one_way_server + "/libretranslate/detect", data={"q": EN})
    assert [d["language"] for d in r.json()] == ["en", "de"]
