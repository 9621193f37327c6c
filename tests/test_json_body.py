"""http/json_body.read_model against what it stands in for: FastAPI's own `body: Model` parameter. Both routes sit in
one app with our error handlers (errors.install_handlers); every body, good or bad, must get the same status and
the same answer from both."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.testclient import TestClient

from service.errors import install_handlers, responder
from service.http.json_body import add_schema, model_response, read_model, request_body
from service.shared.schemas import TranslateRequest, TranslateResponse

GOOD = {"text": "Guten Morgen.", "source_lang": "de", "target_lang": "en", "beam_size": 2}
ANSWER = {"translations": [{"text": "Good morning.", "score": -0.5, "alternatives": [], "input_tokens": 4,
                            "output_tokens": 3, "detected_lang": None}],
          "model": "de-en", "source_lang": "de", "target_lang": "en",
          "timings": {"queue_ms": 0.1, "inference_ms": 2.0, "total_ms": 2.5}}

# (content-type, body) pairs: the ways a body goes wrong, and two that are right.
BODIES = [
    ("application/json", json.dumps(GOOD)),
    ("application/json; charset=utf-8", json.dumps(GOOD | {"text": ["Ja.", "Nein."]})),
    (None, json.dumps(GOOD)),                              # no Content-Type
    ("text/plain", json.dumps(GOOD)),
    ("application/x-www-form-urlencoded", "text=Hallo&source_lang=de&target_lang=en"),
    ("application/json", ""),                              # empty
    ("application/json", '{"text": '),                     # cut short
    ("application/json", "[1, 2]"),                        # not an object
    ("application/json", "null"),
    ("application/json", '"text"'),
    ("application/json", b'{"text": "\xff\xfe"}'),          # not UTF-8
    ("application/json", "[" * 100_000 + "]" * 100_000),   # nested too deeply
    ("application/json", '{"beam_size": %s, "text": "Ja", "source_lang": "de", "target_lang": "en"}' % ("1" * 5000)),
    # (an integer past Python's 4,300 digits: json.loads raises a plain ValueError)
    ("application/json", json.dumps(GOOD | {"beam_size": "4"})),       # a number as a string
    ("application/json", json.dumps(GOOD | {"beam_size": True})),
    ("application/json", json.dumps(GOOD | {"beam_size": 0})),
    ("application/json", json.dumps(GOOD | {"text": "   "})),          # blank
    ("application/json", json.dumps(GOOD | {"text": []})),
    ("application/json", json.dumps(GOOD | {"colour": "blue"})),       # not a field
    ("application/json", json.dumps(GOOD | {"source_lang": "Deutsch"})),
    ("application/json", '{"text": "\\ud800", "source_lang": "de", "target_lang": "en"}'),   # a lone surrogate
    ("application/json", '{"\\ud800": 1, "text": "Ja", "source_lang": "de", "target_lang": "en"}'),
    ("application/json", json.dumps({k: v for k, v in GOOD.items() if k != "text"})),   # missing
    ("application/json", '{"text": "Ja", "source_lang": "de", "target_lang": "en", "length_penalty": NaN}'),
    ("application/json", '{"text": "Ja", "source_lang": "de", "target_lang": "en", "length_penalty": Infinity}'),
    ("application/json", b"\xef\xbb\xbf" + json.dumps(GOOD).encode()),   # UTF-8 with a byte order mark
    ("application/json", json.dumps(GOOD).encode("utf-16")),              # UTF-16, which Python's reader detects
]

# Bodies read as Python's json.loads reads them (read_model parses in pydantic's Rust first, Python's after).
READ = [json.dumps(GOOD | {"text": "Grüße, 東京 \U0001F600", "beam_size": 4.0}, ensure_ascii=False).encode(),
        json.dumps(GOOD | {"text": ["Ja.", "Nein."], "max_length": 12, "length_penalty": 1e-3}).encode(),
        b"\xef\xbb\xbf" + json.dumps(GOOD).encode(), json.dumps(GOOD).encode("utf-16-le"),
        b'{"text": "a", "text": "Zweimal.", "source_lang": "de", "target_lang": "en"}']


@pytest.fixture(scope="module")
def client():
    app = FastAPI()

    async def by_fastapi(body: TranslateRequest) -> TranslateResponse:
        return ANSWER   # type: ignore[return-value]

    async def by_read_model(request: Request) -> Response:
        await read_model(request, TranslateRequest)
        return model_response(TranslateResponse, ANSWER, exclude_none=True)

    async def read(request: Request) -> dict:
        return (await read_model(request, TranslateRequest)).model_dump(mode="json")

    app.add_api_route("/read", read, methods=["POST"])
    app.add_api_route("/fastapi", by_fastapi, methods=["POST"], response_model=TranslateResponse,
                      response_model_exclude_none=True)
    app.add_api_route("/read_model", by_read_model, methods=["POST"], openapi_extra=request_body(TranslateRequest))
    install_handlers(app, 2**20, responder({}))
    with TestClient(app) as c:
        yield c


@pytest.mark.parametrize("ctype,body", BODIES, ids=range(len(BODIES)))
def test_a_body_is_answered_as_fastapi_answers_it(client, ctype, body):
    headers = {} if ctype is None else {"content-type": ctype}
    ours, theirs = (client.post(path, content=body, headers=headers) for path in ("/read_model", "/fastapi"))
    assert (ours.status_code, ours.json()) == (theirs.status_code, theirs.json())
    assert ours.status_code in (200, 400, 422), ours.text   # never a 500


@pytest.mark.parametrize("body", READ, ids=range(len(READ)))
def test_a_body_reads_as_pythons_json_reader_reads_it(client, body):
    read = client.post("/read", content=body, headers={"content-type": "application/json"})
    assert read.status_code == 200, read.text
    assert read.json() == TranslateRequest.model_validate(json.loads(body)).model_dump(mode="json")


def test_a_number_that_is_not_finite_is_told_so(client):
    """Python's JSON reader takes NaN and Infinity; they were told "should be less than or equal to 4", as if too
    large. Every request model refuses them as not finite numbers."""
    for value in ("NaN", "Infinity", "-Infinity"):
        body = '{"text": "Ja", "source_lang": "de", "target_lang": "en", "length_penalty": %s}' % value
        answer = client.post("/read_model", content=body, headers={"content-type": "application/json"})
        assert answer.status_code == 422 and "finite number" in answer.text, answer.text


def test_the_answer_is_the_response_models_json():
    out = json.loads(model_response(TranslateResponse, ANSWER, exclude_none=True).body)
    assert "detected_lang" not in out["translations"][0] and out["timings"]["total_ms"] == 2.5
    with pytest.raises(Exception):   # an answer that is not the model's shape is our bug: never sent as it is
        model_response(TranslateResponse, ANSWER | {"translations": None})


def test_the_schema_is_referenced_and_added_once():
    ref = request_body(TranslateRequest)["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    doc: dict = {}
    schema = add_schema(doc, TranslateRequest)
    assert ref == "#/components/schemas/TranslateRequest" and doc["components"]["schemas"]["TranslateRequest"] is schema
    assert schema["properties"]["text"] and "$defs" not in schema
