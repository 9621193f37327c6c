"""LibreTranslate's POST /translate with a glossary, a field of ours (service/api/libretranslate.py): a list of
{source, target} objects in JSON, DeepL's TSV in a form, kept as POST /translate's glossary is, on a real server
over models/de-en; the answer in LibreTranslate's shape, a bad glossary refused in its error shape naming the
line or entry, and the OpenAPI schema's references resolvable. A form's alternatives field that is no number from 0
to 3 is refused likewise, and not logged."""

import httpx
import pytest

from conftest import ROOT, server_log, start_server, stop_server

PATH = "/libretranslate/translate"
TEXT = "Der Auftrag wurde gestern erteilt."


@pytest.fixture(scope="module")
def started():
    proc, url = start_server(ROOT / "models" / "de-en")
    yield proc, url
    stop_server(proc)


@pytest.fixture(scope="module")
def server(started):
    return started[1]


def libre(url: str, **fields) -> httpx.Response:
    return httpx.post(url + PATH, json={"q": TEXT, "source": "de", "target": "en"} | fields, timeout=120)


def libre_form(url: str, **fields) -> httpx.Response:
    return httpx.post(url + PATH, data={"q": TEXT, "source": "de", "target": "en"} | fields, timeout=120)


def test_a_json_or_form_glossary_keeps_its_terms_in_libretranslates_shape(server):
    plain = libre(server).json()
    assert "purchase order" not in plain["translatedText"]
    as_json = libre(server, glossary=[{"source": "Auftrag", "target": "purchase order"}])
    as_form = libre_form(server, glossary="Auftrag\tpurchase order\n\nHaus\tbuilding\n")
    for r in (as_json, as_form):
        assert r.status_code == 200, r.text
        assert r.json().keys() == {"translatedText"} and "purchase order" in r.json()["translatedText"]
    assert as_form.json() == as_json.json()
    listed = libre(server, q=[TEXT, "Es regnet."], glossary=[{"source": "Auftrag", "target": "purchase order"}])
    assert "purchase order" in listed.json()["translatedText"][0]
    assert libre_form(server, glossary="").json() == plain           # an empty field: no glossary


@pytest.mark.parametrize("send, glossary, message", [
    (libre_form, "Auftrag\tpurchase order\nHaus\tbuilding\tx\n", "glossary line 2: 3 fields"),
    (libre_form, "Auftrag purchase order\n", "glossary line 1: 1 fields"),
    (libre_form, "Haus\thouse\nHaus\thome\n", "glossary entry 2: its source term is already entry 1"),
    (libre, "Auftrag\torder\nHaus\n", "glossary line 2: 1 fields"),                # TSV in JSON too
    (libre, [{"source": "Dach", "target": "屋根"}], "glossary entry 1: its target term has characters de-en cannot"),
    (libre, [{"source": "Haus"}], "glossary.0.target"),
])
def test_a_bad_glossary_is_a_400_in_libretranslates_shape_naming_the_line_or_entry(server, send, glossary, message):
    r = send(server, glossary=glossary)
    assert r.status_code == 400, r.text
    assert r.json().keys() == {"error"} and message in r.json()["error"], r.text


@pytest.mark.parametrize("value", ["²³⁴₅₆⁷", "①", "1" * 5000])
def test_a_form_alternatives_that_is_no_number_from_0_to_3_is_a_400_not_logged(started, value):
    """Each is str.isdigit() and refused by int(): it was a 500, its traceback in the log quoting the value."""
    proc, url = started
    r = libre_form(url, alternatives=value)
    assert r.status_code == 400, r.text
    assert r.json() == {"error": "alternatives must be an integer from 0 to 3"}
    assert value not in server_log(proc)


def test_the_openapi_schema_documents_the_field_with_resolvable_references(server):
    spec = httpx.get(server + "/openapi.json").json()
    body = spec["paths"][PATH]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "$defs" not in body
    refs = [one["items"]["$ref"] for one in body["properties"]["glossary"]["anyOf"] if one.get("type") == "array"]
    assert refs == ["#/components/schemas/GlossaryEntry"]
    assert spec["components"]["schemas"]["GlossaryEntry"]["required"] == ["source", "target"]


def test_translate_file_keeps_a_glossary_sent_as_tsv_in_its_form(server):
    """/translate_file's form takes the same TSV field: its terms kept in every paragraph of the document."""
    def translated(**fields) -> str:
        r = httpx.post(server + "/libretranslate/translate_file", data={"source": "de", "target": "en"} | fields,
                       files={"file": ("brief.txt", f"{TEXT}\n\nDas Haus ist groß.\n".encode())}, timeout=120)
        assert r.status_code == 200, r.text
        return httpx.get(r.json()["translatedFileUrl"], timeout=60).text

    plain, kept = translated(), translated(glossary="Auftrag\tpurchase order\nHaus\tbuilding\n")
    assert "purchase order" not in plain and "purchase order" in kept and "building" in kept
    bad = httpx.post(server + "/libretranslate/translate_file", data={"source": "de", "target": "en",
                                                                      "glossary": "Auftrag purchase order"},
                     files={"file": ("brief.txt", TEXT.encode())}, timeout=120)
    assert bad.status_code == 400 and "glossary line 1: 1 fields" in bad.json()["error"], bad.text
