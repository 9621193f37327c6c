"""DeepL's API (service/api/deepl.py) driven by DeepL's own client, the `deepl` package, against a real server over
models/de-en with keys (one of them a tiny characters_per_day, one a tiny requests_per_minute): texts translated
as POST /translate translates them, detected where no source is named, markup kept (xml's non_splitting_tags
keeping a sentence whole, its splitting_tags cutting one), a glossary the client made held
and managed by its key alone, formality, usage, languages, and every refusal raised as the client's own exception;
hostile raw requests each a 4xx in DeepL's shape `{"message": ...}`, never a 500, and the server still serving."""

import re

import deepl
import httpx
import pytest

from conftest import ROOT, server_log, start_server, stop_server

KEYS = {"alice": "alice-key-0001", "bob": "bob-key-0002", "tiny": "tiny-key-0003", "chatty": "chatty-key-0004"}
LIMITS = {"tiny": "{characters_per_day: 40}", "chatty": "{requests_per_minute: 2}"}
TEXT = "Das Haus ist klein."


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.yaml"
    lines = ["keys:"]
    for name, key in KEYS.items():
        lines += [f"  - name: {name}", f"    key: {key}"] + ([f"    limits: {LIMITS[name]}"] if name in LIMITS else [])
    keys.write_text("\n".join(lines) + "\n")
    proc, url = start_server(ROOT / "models" / "de-en", "--api-keys-file", str(keys))
    yield proc, url
    stop_server(proc)


@pytest.fixture(scope="module")
def url(server):
    return server[1]


def client(url: str, name: str = "alice") -> deepl.Translator:
    # The trailing slash matters: the client joins "v2/translate" to server_url as a relative URL (urljoin), which
    # would replace a last path segment without one ("/deepl" -> "/v2/translate").
    return deepl.Translator(KEYS.get(name, name), server_url=f"{url}/deepl/")


def ours(url: str, text: str) -> str:
    """What our own POST /translate answers for text, de-en."""
    r = httpx.post(url + "/translate", json={"text": text, "source_lang": "de", "target_lang": "en"},
                   headers={"Authorization": f"Bearer {KEYS['alice']}"}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["translations"][0]["text"]


def test_one_text_and_many_translated_as_post_translate_does_named_or_detected(url):
    t = client(url)
    one = t.translate_text(TEXT, source_lang="DE", target_lang="EN-US")
    assert (one.text, one.detected_source_lang, one.billed_characters) == (ours(url, TEXT), "DE", len(TEXT))
    many = t.translate_text([TEXT, "Good morning.", "  "], target_lang="en-gb")   # no source_lang: detected
    assert [r.detected_source_lang for r in many] == ["DE", "EN", "DE"]   # a blank: the first language detected
    assert [r.text for r in many] == [one.text, "Good morning.", "  "]     # English into English, a blank as sent
    form = httpx.post(url + "/deepl/v2/translate", data={"text": [TEXT, "Guten Morgen."], "target_lang": "EN-US",
                                                         "source_lang": "de"},
                      headers={"Authorization": f"DeepL-Auth-Key {KEYS['alice']}"}, timeout=60)
    assert form.status_code == 200, form.text
    assert [x["text"] for x in form.json()["translations"]] == [one.text, ours(url, "Guten Morgen.")]
    assert "billed_characters" not in form.json()["translations"][0]      # only when asked, as the client does


def test_html_and_xml_keep_their_markup_and_the_ignored_elements_as_written(url):
    t = client(url)
    html = t.translate_text(f"<p>{TEXT[:-7]}<b>klein</b>.</p>", target_lang="EN-US", tag_handling="html").text
    assert html.startswith("<p>") and "<b>" in html and html.endswith("</b>.</p>"), html
    xml = t.translate_text(f"<doc><p>{TEXT}</p><keep a='1'>Das Haus</keep><keep/></doc>", source_lang="DE",
                           target_lang="EN-US", tag_handling="xml", ignore_tags=["keep", "other"]).text
    assert xml == f"<doc><p>{ours(url, TEXT)}</p><keep a='1'>Das Haus</keep><keep/></doc>", xml
    assert "transerve" not in xml


def test_xml_non_splitting_tags_keep_a_sentence_whole_and_splitting_tags_cut_it(url):
    t = client(url)

    def xml(text: str, **tags) -> str:
        return t.translate_text(text, source_lang="DE", target_lang="EN-US", tag_handling="xml", **tags).text

    def untagged(text: str) -> str:
        return re.sub(r"<[^>]*>", "", text)

    sentence = "Er hat das Haus gekauft."          # the verb at its end: cut at the tags, it is three phrases
    cut = f"<p>{ours(url, 'Er hat')} <x>{ours(url, 'das Haus')}</x> {ours(url, 'gekauft.')}</p>"
    assert untagged(cut) != ours(url, sentence)
    assert xml("<p>Er hat <x>das Haus</x> gekauft.</p>") == cut                   # an XML tag splits by default
    assert xml("<p>Er hat <x>das Haus</x> gekauft.</p>", splitting_tags=["x"]) == cut
    whole = xml("<p>Er hat <x>das Haus</x> gekauft.</p>", non_splitting_tags=["x", "y"])
    assert untagged(whole) == ours(url, sentence) and "<x>" in whole and "</x>" in whole, whole   # one sentence
    assert untagged(xml("<p>Er hat das Haus<ph/> gekauft.</p>", non_splitting_tags="ph")) == ours(url, sentence)
    assert untagged(xml("<p>Er hat <b>das Haus</b> gekauft.</p>")) == ours(url, sentence)   # HTML's inline b...
    assert xml("<p>Er hat <b>das Haus</b> gekauft.</p>", splitting_tags=["b"]) == cut.replace("x>", "b>")  # ...listed


def test_a_glossary_the_client_makes_is_held_and_its_keys_alone(url):
    alice, bob = client(url), client(url, "bob")
    glossary = alice.create_glossary("Bau", "DE", "EN", {"Haus": "building"})
    assert (glossary.source_lang, glossary.target_lang, glossary.entry_count, glossary.ready) == ("DE", "EN", 1, True)
    held = alice.translate_text(TEXT, source_lang="DE", target_lang="EN-US", glossary=glossary)
    assert "building" in held.text and "building" not in ours(url, TEXT)
    assert glossary.glossary_id in [g.glossary_id for g in alice.list_glossaries()]
    assert alice.get_glossary(glossary.glossary_id).name == "Bau"
    assert alice.get_glossary_entries(glossary) == {"Haus": "building"}
    from_csv = alice.create_glossary_from_csv("Csv", "de", "en", csv_data="Haus,home\n")
    assert alice.get_glossary_entries(from_csv) == {"Haus": "home"}
    assert bob.list_glossaries() == []
    for call in (bob.get_glossary, bob.get_glossary_entries, bob.delete_glossary):
        with pytest.raises(deepl.GlossaryNotFoundException):
            call(glossary.glossary_id)
    with pytest.raises(deepl.DeepLException, match="Not found"):     # another key's glossary, named in a translation
        bob.translate_text(TEXT, source_lang="DE", target_lang="EN-US", glossary=glossary.glossary_id)
    alice.delete_glossary(glossary)
    alice.delete_glossary(from_csv)
    with pytest.raises(deepl.GlossaryNotFoundException):
        alice.get_glossary(glossary.glossary_id)


def test_formality_prefer_is_accepted_and_more_or_less_refused_as_deepl_refuses_it(url):
    t = client(url)
    plain = t.translate_text(TEXT, source_lang="DE", target_lang="EN-US").text
    assert t.translate_text(TEXT, source_lang="DE", target_lang="EN-US", formality="prefer_less").text == plain
    with pytest.raises(deepl.DeepLException, match="'formality' is not supported for given 'target_lang'."):
        t.translate_text(TEXT, source_lang="DE", target_lang="EN-US", formality="less")


def test_languages_glossary_pairs_and_usage_in_deepls_shapes(url):
    t = client(url)
    assert sorted(x.code for x in t.get_source_languages()) == ["DE", "EN"]
    targets = t.get_target_languages()
    assert sorted(x.code for x in targets) == ["DE", "EN-GB", "EN-US"]
    assert {x.supports_formality for x in targets} == {False}
    assert {(p.source_lang, p.target_lang) for p in t.get_glossary_languages()} == {("de", "en"), ("en", "de")}
    unlimited = t.get_usage().character
    assert (unlimited.count, unlimited.limit) == (0, 10**12)                  # a key without characters_per_day


def test_a_wrong_key_a_used_up_quota_and_a_rate_raise_the_clients_exceptions(url, monkeypatch):
    with pytest.raises(deepl.AuthorizationException):
        client(url, "no-such-key").translate_text(TEXT, target_lang="EN-US")
    tiny = client(url, "tiny")
    assert (tiny.get_usage().character.count, tiny.get_usage().character.limit) == (0, 40)
    tiny.translate_text(TEXT, source_lang="DE", target_lang="EN-US")
    assert tiny.get_usage().character.count == len(TEXT)
    with pytest.raises(deepl.QuotaExceededException):
        tiny.translate_text(TEXT + " " + TEXT, source_lang="DE", target_lang="EN-US")
    assert tiny.get_usage().character.count == len(TEXT)                   # the refused text is not counted
    monkeypatch.setattr(deepl.http_client, "max_network_retries", 0)       # the client retries a 429 with backoff
    chatty = client(url, "chatty")
    chatty.get_usage(), chatty.get_usage()
    with pytest.raises(deepl.TooManyRequestsException):
        chatty.translate_text(TEXT, target_lang="EN-US")
    r = httpx.get(url + "/deepl/v2/usage", headers={"Authorization": f"DeepL-Auth-Key {KEYS['chatty']}"})
    assert r.status_code == 429 and int(r.headers["retry-after"]) > 0 and r.json().keys() == {"message"}


JSON = {"content-type": "application/json"}
FORM = {"content-type": "application/x-www-form-urlencoded"}
HOSTILE = [
    ("translate", {"json": {"text": [TEXT], "target_lang": "XX"}}, 400, "Value for 'target_lang' not supported."),
    ("translate", {"json": {"text": [TEXT]}}, 400, "Parameter 'target_lang' not specified."),
    ("translate", {"json": {"target_lang": "EN-US"}}, 400, "Parameter 'text' not specified."),
    ("translate", {"json": {"text": [5], "target_lang": "EN-US"}}, 400, "Value for 'text' not supported."),
    ("translate", {"json": {"text": TEXT, "target_lang": "DE", "source_lang": "FR"}}, 400, "'source_lang'"),
    ("translate", {"json": {"text": TEXT, "target_lang": "EN-US", "source_lang": "DE", "glossary_id": "0" * 32}},
     404, "no glossary"),
    ("translate", {"json": {"text": TEXT, "target_lang": "EN-US", "glossary_id": "0" * 32}}, 400,
     "Use of a glossary requires the source_lang parameter to be specified"),
    ("translate", {"content": b'{"text": ', "headers": JSON}, 400, "not valid JSON"),
    ("translate", {"content": b"[" * 100_000, "headers": JSON}, 400, "nested too deeply"),
    ("translate", {"content": b"text=Hal\xfflo&target_lang=DE", "headers": FORM}, 400, "not valid UTF-8"),
    ("translate", {"content": b"text=%ED%A0%80&target_lang=DE", "headers": FORM}, 400, "not valid UTF-8"),
    ("translate", {"content": b"hello", "headers": {"content-type": "text/plain"}}, 400, "send the fields as JSON"),
    ("translate", {"json": {"text": ["a" * 20_000], "target_lang": "EN-US"}}, 413, "the limit is"),
    ("translate", {"json": {"text": ["a " * 600_000], "target_lang": "EN-US"}}, 413, "--max-payload-bytes"),
    ("translate", {"json": {"text": ["<b>" * 300], "target_lang": "EN-US", "tag_handling": "html"}}, 400, "deep"),
    ("translate", {"json": {"text": ["<a>x</a>"], "target_lang": "EN-US", "tag_handling": "xml",
                            "ignore_tags": ["a b"]}}, 400, "Value for 'ignore_tags' not supported."),
    ("translate", {"json": {"text": [TEXT], "target_lang": "EN-US", "split_sentences": 3}}, 400, "'split_sentences'"),
    ("translate", {"content": b'{"text": ["\\ud800"], "target_lang": "EN-US"}', "headers": JSON}, 400, "surrogate"),
    ("translate", {"data": {"text": TEXT, "target_lang": "EN-US", "source_lang": "DE", "glossary_ids": "a,b"}}, 400,
     "Value for 'glossary_ids' not supported."),                          # one glossary at most here
    ("translate", {"json": {"text": TEXT, "target_lang": "EN-US", "formality": "more"}}, 400, "'formality'"),
    ("glossaries", {"json": {"name": "g", "source_lang": "DE", "target_lang": "DE", "entries": "a\tb",
                             "entries_format": "tsv"}}, 400, "two languages"),
    ("glossaries", {"data": {"name": "g", "source_lang": "DE", "target_lang": "EN", "entries": '"' + "a" * 140_000,
                             "entries_format": "csv"}}, 400, "not CSV that can be read"),
    ("glossaries", {"json": {"name": "g", "source_lang": "DE", "target_lang": "EN", "entries": "a\tb"}}, 400,
     "Parameter 'entries_format' not specified."),
    ("languages?type=both", {}, 400, "Parameter 'type' is invalid"),
]


@pytest.mark.parametrize("path, send, status, message", HOSTILE, ids=[f"{i}-{c[0]}" for i, c in enumerate(HOSTILE)])
def test_a_hostile_request_gets_its_4xx_in_deepls_shape_and_the_next_one_is_served(url, path, send, status, message):
    headers = {"Authorization": f"DeepL-Auth-Key {KEYS['alice']}"} | send.pop("headers", {})
    r = httpx.post(f"{url}/deepl/v2/{path}", headers=headers, timeout=60, **send)
    assert r.status_code == status and r.json().keys() == {"message"} and message in r.json()["message"], r.text
    r = httpx.post(f"{url}/deepl/v2/translate", json={"text": TEXT, "target_lang": "EN-US", "source_lang": "DE"},
                   headers={"Authorization": f"DeepL-Auth-Key {KEYS['alice']}"}, timeout=60)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("headers, status", [({}, 401), ({"Authorization": "Basic YTpi"}, 401),
                                             ({"Authorization": "DeepL-Auth-Key wrong"}, 403)])
def test_a_missing_or_wrong_key_is_refused_in_deepls_shape(url, headers, status):
    r = httpx.post(url + "/deepl/v2/translate", json={"text": TEXT, "target_lang": "EN-US"}, headers=headers)
    assert r.status_code == status and r.json().keys() == {"message"}, r.text


def test_its_requests_are_counted_under_its_endpoint_label_and_nothing_failed_inside(server):
    proc, url = server
    metrics = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEYS['alice']}"}).text
    assert 'transerve_requests_total{endpoint="deepl",status="200"}' in metrics
    assert 'transerve_requests_total{endpoint="deepl",status="500"}' not in metrics
    log = server_log(proc)
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-4000:]
