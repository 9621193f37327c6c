"""Fuzzing: schemathesis against the running service's own OpenAPI schema (every route, the
LibreTranslate-compatible ones included), and hypothesis on the tokenizer/engine boundary. The bar
is zero 5xx and zero dead workers: every generated request gets a well-formed answer, and the server
still translates afterwards."""

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("schemathesis")

from conftest import pairs64, server_log, start_server, stop_server  # noqa: E402
from service.inference.engine import Engine  # noqa: E402
from service.shared.options import SearchOptions  # noqa: E402


class Url(str):
    """The server's URL, which also knows its process (for the log)."""
    def __new__(cls, url: str, proc):
        self = super().__new__(cls, url)
        self.proc = proc
        return self


@pytest.fixture(scope="module")
def fuzz_server(tiny_package, tiny_lm_package):
    proc, url = start_server(tiny_package, "--model", str(tiny_lm_package), "--max-output-tokens", "24",
                             "--max-texts", "8", "--max-text-chars", "2000")
    yield Url(url, proc)
    stop_server(proc)


def test_no_generated_request_gets_a_5xx_or_breaks_the_schema(fuzz_server, tmp_path):
    """schemathesis' own runner (its CLI): 40 generated requests per operation of /openapi.json in every
    phase, with every check (no 5xx, status codes, content types and bodies as documented, schema-valid
    requests accepted and invalid ones refused), told by tests/schemathesis.toml where the API documents
    another answer than it assumes (docs/serving.md, "Faults and fuzzing")."""
    cli = Path(sys.executable).parent / "schemathesis"
    r = subprocess.run([str(cli), "--config-file", str(Path(__file__).parent / "schemathesis.toml"), "run",
                        fuzz_server + "/openapi.json", "--checks", "all",
                        "--max-examples", "40", "--seed", "1", "--request-timeout", "60",
                        "--report", "junit", "--report-junit-path", str(tmp_path / "junit.xml")],
                       capture_output=True, text=True, timeout=900, env=dict(os.environ, NO_COLOR="1"),
                       cwd=tmp_path)  # its .schemathesis/ cache stays out of the checkout
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    report = (tmp_path / "junit.xml").read_text()
    # Every operation of the schema was exercised, the LibreTranslate ones included.
    for path in ("/translate", "/generate", "/libretranslate/translate", "/languages", "/health", "/info",
                 "/v1/completions", "/v1/models"):
        assert path in report, path
    log = server_log(fuzz_server.proc)
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-6000:]


def test_the_service_still_works_after_fuzzing(fuzz_server, tiny_package):
    de = pairs64()[0][0]
    r = httpx.post(fuzz_server + "/translate", json={"text": de, "source_lang": "de", "target_lang": "en"}, timeout=60)
    # what the engine computes for it at the service's default beam 4 (not the memorised pair itself)
    (expected,) = Engine(tiny_package, device="cpu", intra_op_threads=1).translate(
        [de], source_lang="de", target_lang="en", beam_size=4)
    assert r.status_code == 200 and r.json()["translations"][0]["text"] == expected.text
    assert httpx.get(fuzz_server + "/ready").status_code == 200   # every worker is alive
    r = httpx.post(fuzz_server + "/generate", json={"prompt": "Das", "max_new_tokens": 3}, timeout=60)
    assert r.status_code == 200


# --- the tokenizer/engine boundary -------------------------------------------------------------------

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=200)
NASTY = st.one_of(
    TEXT,
    st.just(""),
    st.text(alphabet="!?.,;:-–—()[]{}«»\"'…", min_size=1, max_size=50),       # only punctuation
    st.builds(lambda n: "a" * n, st.integers(200, 3000)),                    # one very long word
    st.text(st.characters(min_codepoint=0x1F300, max_codepoint=0x1FAFF), max_size=30),  # emoji
    st.text(st.characters(max_codepoint=0x1F), max_size=30),                  # control characters
)


@pytest.fixture(scope="module")
def engine(tiny_package):
    return Engine(tiny_package, device="cpu", intra_op_threads=1)


@pytest.fixture(scope="module")
def lm_engine(tiny_lm_package):
    return Engine(tiny_lm_package, device="cpu", intra_op_threads=1)


@given(texts=st.lists(NASTY, min_size=1, max_size=4), beam=st.sampled_from([1, 3]))
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_engine_translates_any_unicode(engine, texts, beam):
    """Arbitrary text is tokenized, clipped to the model's positions, searched and detokenized into a
    string for each input, in order; the output budget is kept."""
    ids = [s[: engine.max_positions] for s in engine.source_ids(texts, "en")]
    assert all(s[-1] == engine.eos_id or len(s) == engine.max_positions for s in ids)
    hyps = engine.search(ids, SearchOptions(beam_size=beam, max_length=20))
    assert len(hyps) == len(texts)
    for h in hyps:
        assert len(h[0].tokens) < 20 and isinstance(engine.detokenize(h[0].tokens), str)


@given(prompt=NASTY, seed=st.integers(0, 2**32))
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_generation_continues_any_unicode(lm_engine, prompt, seed):
    prompt = prompt[:300]
    room = lm_engine.max_positions - len(lm_engine.prompt_ids([prompt])[0])
    if room < 2:
        return
    out = lm_engine.generate([prompt], max_new_tokens=8, sampling=True, seed=seed)[0]
    assert out.tokens <= 8 and isinstance(out.text, str) and out.finish_reason in ("stop", "length")
