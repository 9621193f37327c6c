"""A request's cost bound (--max-request-cost, issue 27): a large request is refused with the limit in its
error, one just under it is served. Fairness between requests in a worker, which weighs the same cost, is
tested in tests/test_translate_scheduler.py."""

import sys
from pathlib import Path

import httpx
import pytest

from service.worker.cancel import CancelBoard
from service.config import Settings, parse_settings
from service.inference.engine import Engine
from service.worker.translate_scheduler import Job, request_cost
from service.worker.translate_api import TranslateAPI
from service.http.gateway import translate_payload
from service.shared.schemas import TranslateRequest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from fairness import large_texts  # noqa: E402
from conftest import start_server, stop_server  # noqa: E402

DE_EN, LM = ROOT / "models" / "de-en", ROOT / "models" / "lm-small"


@pytest.fixture(scope="module")
def engine():
    return Engine(DE_EN, device="cpu", intra_op_threads=1)


def make_api(engine, **settings) -> TranslateAPI:
    api = TranslateAPI(Settings(**settings), CancelBoard())
    api.use_engines({engine.package.name: engine})
    return api


def large(n_texts: int, beam: int, request_id: str) -> dict:
    texts = large_texts(n_texts)
    body = TranslateRequest(text=texts, source_lang="de", target_lang="en", beam_size=beam)
    return translate_payload(body, texts, Settings().max_output_tokens) | {"request_id": request_id, "number": 0}


def cost_of(engine, request) -> int:
    api = make_api(engine)
    return api.decode_request(request).cost


# --- the cost bound ---------------------------------------------------------------------------------

def test_the_cost_is_source_tokens_times_beam(engine):
    request = large(2, 8, "r")
    job = make_api(engine).decode_request(request)
    assert isinstance(job, Job) and job.cost == request_cost(sum(map(len, job.sentences)), 8) == 8 * sum(
        map(len, job.sentences))


def test_over_the_cost_bound_is_413_with_the_limit_and_just_under_is_served(engine):
    request = large(1, 4, "r")
    cost = cost_of(engine, request)
    refused = make_api(engine, max_request_cost=cost - 1).decode_request(request).to_dict()
    assert refused["status"] == 413 and refused["error"]["type"] == "request_too_costly"
    assert refused["error"]["limit"] == cost - 1 and f"costs {cost}" in refused["error"]["message"]
    api = make_api(engine, max_request_cost=cost)
    job = api.decode_request(request)
    assert isinstance(job, Job)
    out = api.encode_response(api.scheduler.run({"r": job})["r"])
    assert out["translations"][0]["text"] and "error" not in out


def test_the_default_bound_lets_the_largest_default_request_through_and_refuses_the_issues():
    s = Settings()
    assert request_cost(s.max_request_tokens, 4) <= s.max_request_cost      # any token limit at the default beam
    assert request_cost(8152, 16) > s.max_request_cost                      # 64 x 341 characters at beam 16


def test_the_bound_is_a_flag_with_an_environment_twin(monkeypatch):
    assert parse_settings(["--max-request-cost", "1000"]).max_request_cost == 1000
    monkeypatch.setenv("TRANSERVE_MAX_REQUEST_COST", "2000")
    assert parse_settings([]).max_request_cost == 2000
    with pytest.raises(SystemExit):
        parse_settings(["--max-request-cost", "0"])


def test_over_http_translate_and_generate_answer_413_with_the_limit():
    proc, url = start_server(DE_EN, "--model", str(LM), "--max-request-cost", "400")
    try:
        body = {"text": ["Das Haus ist klein. Der Hund schläft."] * 3, "source_lang": "de", "target_lang": "en"}
        r = httpx.post(url + "/translate", json=body | {"beam_size": 16}, timeout=60)
        assert r.status_code == 413, r.text
        err = r.json()
        assert err["error"]["type"] == "request_too_costly" and err["error"]["limit"] == 400 and err["request_id"]
        assert "the limit is 400" in err["error"]["message"]
        r = httpx.post(url + "/translate", json=body | {"beam_size": 2}, timeout=60)
        assert r.status_code == 200 and len(r.json()["translations"]) == 3, r.text
        r = httpx.post(url + "/generate", json={"prompt": "Die Datei", "max_new_tokens": 100, "beam_size": 8,
                                                "temperature": 0}, timeout=60)
        assert r.status_code == 413 and r.json()["error"]["limit"] == 400, r.text
        r = httpx.post(url + "/generate", json={"prompt": "Die Datei", "max_new_tokens": 5}, timeout=60)
        assert r.status_code == 200, r.text
    finally:
        stop_server(proc)
