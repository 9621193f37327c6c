"""POST /generate on a real server (127.0.0.1) that also serves /translate from one process, with the
tiny translation and generation packages, and the SDK's generate() and stream() against it."""

import asyncio
import concurrent.futures as cf
import json
import os
import signal
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.client import AsyncClient, Client
from service.inference.engine import Engine

from conftest import pairs64, start_server, stop_server, worker_pids

SENTENCES = [s for pair in pairs64() for s in pair]
HALVES = [" ".join(s.split()[: len(s.split()) // 2]) for s in SENTENCES]


@pytest.fixture(scope="module")
def server(tiny_package, tiny_lm_package):
    proc, url = start_server(tiny_package, "--model", str(tiny_lm_package), "--batch-timeout-ms", "200",
                             "--max-batch-size", "16", "--max-prompt-tokens", "60",
                             "--max-output-tokens", "1000")
    yield url
    stop_server(proc)


def generate(url, **body):
    return httpx.post(url + "/generate", json=body, timeout=60)


def sse_events(url, **body) -> list[dict]:
    with httpx.stream("POST", url + "/generate", json=body | {"stream": True}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]


@pytest.fixture(scope="module")
def engines(tiny_package, tiny_lm_package):
    """Both packages loaded in this process (one thread, as the server runs them): what the server should
    answer is what they compute, not the memorised sentence itself (which the tiny models may get slightly
    wrong on another processor, where torch's kernels train them to other weights)."""
    return (Engine(tiny_package, device="cpu", intra_op_threads=1),
            Engine(tiny_lm_package, device="cpu", intra_op_threads=1))


def greedy_continuation(lm: Engine, prompt: str, max_new_tokens: int) -> str:
    (g,) = lm.generate([prompt], max_new_tokens=max_new_tokens, beam_size=1)
    return g.text


def test_both_endpoints_from_one_process(server, engines):
    mt, lm = engines
    info = httpx.get(server + "/info").json()
    assert {m["task"] for m in info["models"]} == {"translation", "generation"}
    r = httpx.post(server + "/translate", json={"text": SENTENCES[0], "source_lang": "de", "target_lang": "en"})
    (expected,) = mt.translate([SENTENCES[0]], source_lang="de", target_lang="en", beam_size=4)
    assert r.status_code == 200 and r.json()["translations"][0]["text"] == expected.text
    r = generate(server, prompt=HALVES[2], max_new_tokens=40, temperature=0)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["text"] == greedy_continuation(lm, HALVES[2], 40)   # temperature 0: greedy
    assert body["choices"][0]["finish_reason"] == "stop" and body["model"] == "tiny-lm"
    assert body["usage"]["completion_tokens"] == body["choices"][0]["tokens"] > 0
    assert body["timings"]["total_ms"] >= body["timings"]["first_token_ms"] >= body["timings"]["queue_ms"] >= 0
    assert "/generate" in httpx.get(server + "/openapi.json").json()["paths"]


def test_streamed_pieces_concatenate_to_the_non_streamed_text(server):
    for body in ({"prompt": "zzz", "max_new_tokens": 30, "seed": 5, "temperature": 1.5},
                 {"prompt": HALVES[7], "max_new_tokens": 30, "temperature": 0},
                 {"prompt": "Das", "max_new_tokens": 12, "seed": 1, "num_return_sequences": 3}):
        whole = generate(server, **body).json()
        events = sse_events(server, **body)
        assert events[-1]["type"] == "done" and all(e["type"] == "token" for e in events[:-1])
        for choice in whole["choices"]:
            streamed = "".join(e["text"] for e in events[:-1] if e["index"] == choice["index"])
            assert streamed == choice["text"]
        assert [c["finish_reason"] for c in events[-1]["choices"]] == [c["finish_reason"] for c in whole["choices"]]
        assert events[-1]["usage"] == whole["usage"]
    assert len(events) > 3  # really piece by piece, not one event


def test_seeded_request_is_the_same_alone_or_batched(server):
    body = {"prompt": "zzz qqq", "max_new_tokens": 20, "seed": 11, "temperature": 1.4, "top_p": 0.9}
    alone = generate(server, **body).json()["choices"][0]["text"]
    others = [{"prompt": p, "max_new_tokens": 20, "seed": i, "temperature": 1.4, "top_p": 0.9}
              for i, p in enumerate(HALVES[:11])]
    with cf.ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(generate, server, **b) for b in others + [body]]
        results = [f.result().json() for f in futures]
    assert results[-1]["choices"][0]["text"] == alone
    three = generate(server, **body | {"num_return_sequences": 3}).json()["choices"]
    assert three[0]["text"] == alone and len({c["text"] for c in three}) > 1  # seeds seed, seed+1, seed+2


def test_a_request_arriving_mid_stream_joins_the_running_batch_and_answers_as_alone(server):
    """A short request sent while a long generation streams is answered before the long one ends (it joins the
    running batch at the next step instead of waiting for it), with the text it gets alone."""
    short = {"prompt": HALVES[5], "max_new_tokens": 8, "seed": 3, "temperature": 1.2}
    alone = generate(server, **short).json()["choices"][0]["text"]
    long = {"prompt": "zzz", "max_new_tokens": 1000, "min_new_tokens": 1000, "seed": 4, "num_return_sequences": 8,
            "stream": True}
    arrivals: list[tuple[float, dict]] = []
    started = cf.Future()

    def read_long():
        with httpx.stream("POST", server + "/generate", json=long, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    arrivals.append((time.perf_counter(), json.loads(line[6:])))
                    if not started.done():
                        started.set_result(True)

    with cf.ThreadPoolExecutor(1) as pool:
        reader = pool.submit(read_long)
        started.result(timeout=60)
        got = generate(server, **short).json()
        answered = time.perf_counter()
        reader.result(timeout=120)
    assert got["choices"][0]["text"] == alone
    done_at, last = arrivals[-1]
    assert last["type"] == "done" and last["usage"]["completion_tokens"] == 8000
    assert answered < done_at and sum(t > answered for t, _ in arrivals) > 10, "the short one waited for the long"


def test_stop_sequences_end_the_text_before_them(server):
    full = generate(server, prompt=HALVES[4], max_new_tokens=40, temperature=0).json()["choices"][0]["text"]
    words = full.split()
    assert len(words) >= 2, full
    stop = " " + words[1]
    r = generate(server, prompt=HALVES[4], max_new_tokens=40, temperature=0, stop=[stop, "@@@"]).json()
    assert r["choices"][0]["text"] == full[: full.index(stop)] and r["choices"][0]["finish_reason"] == "stop"
    events = sse_events(server, prompt=HALVES[4], max_new_tokens=40, temperature=0, stop=stop)
    assert "".join(e["text"] for e in events[:-1]) == r["choices"][0]["text"]


def test_beam_search_and_length_limit(server):
    r = generate(server, prompt=HALVES[9], max_new_tokens=30, beam_size=4, num_return_sequences=2).json()
    assert [c["index"] for c in r["choices"]] == [0, 1] and r["choices"][0]["text"] != r["choices"][1]["text"]
    r = generate(server, prompt="zzz", max_new_tokens=3, temperature=0).json()
    assert r["choices"][0]["tokens"] <= 3
    assert (r["choices"][0]["finish_reason"] == "length") == (r["choices"][0]["tokens"] == 3)


@pytest.mark.parametrize("body, status, needle", [
    ({"max_new_tokens": 5}, 422, "prompt"),
    ({"prompt": 5}, 422, "prompt"),
    ({"prompt": "a", "temperature": -1}, 422, "temperature"),
    ({"prompt": "a", "top_p": 0}, 422, "top_p"),
    ({"prompt": "a", "stop": ["1", "2", "3", "4", "5"]}, 422, "at most 4"),
    ({"prompt": "a", "beam_size": 4, "temperature": 0.5}, 422, "beam search does not sample"),
    ({"prompt": "a", "temperature": 0, "num_return_sequences": 2}, 422, "num_return_sequences"),
    ({"prompt": "a", "model": "nope"}, 400, "tiny-lm"),
    ({"prompt": "wort " * 200}, 413, "60"),
    ({"prompt": "a", "unknown": 1}, 422, "unknown"),
])
def test_bad_requests_get_a_clear_4xx(server, body, status, needle):
    r = generate(server, **body)
    assert r.status_code == status, r.text
    assert needle in json.dumps(r.json()["error"])
    # The same refusal before a stream starts is a JSON error, not an event stream.
    if isinstance(body.get("prompt"), str):
        r = httpx.post(server + "/generate", json=body | {"stream": True}, timeout=60)
        assert r.status_code == status and r.headers["content-type"].startswith("application/json")


def test_a_disconnected_client_stops_its_generation(server):
    """A long generation is abandoned mid-stream; its rows leave the batch, so the tokens counted as
    cancelled stop growing and the server keeps answering."""
    def cancelled_tokens() -> float:
        for family in text_string_to_metric_families(httpx.get(server + "/metrics").text):
            if family.name == "transerve_generated_tokens":
                return sum(s.value for s in family.samples
                           if s.name.endswith("_total") and s.labels.get("finish_reason") == "cancelled")
        return 0.0

    before = cancelled_tokens()
    body = {"prompt": "zzz", "max_new_tokens": 400, "min_new_tokens": 400, "seed": 3, "stream": True}
    with httpx.stream("POST", server + "/generate", json=body, timeout=60) as r:
        lines = r.iter_lines()
        got = [line for _, line in zip(range(6), lines)]
        assert any(line.startswith("data: ") for line in got)
    deadline = time.time() + 20
    while cancelled_tokens() == before and time.time() < deadline:
        time.sleep(0.2)
    after = cancelled_tokens()
    assert before < after < 400, (before, after)
    # Non-streamed: the client times out and goes away. 8 x 1000 tokens take seconds even on a fast
    # CPU (the tiny model writes 400 in 0.2 s), so the server sees the disconnect mid-generation.
    long = body | {"stream": False, "seed": 4, "max_new_tokens": 1000, "min_new_tokens": 1000,
                   "num_return_sequences": 8}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server + "/generate", json=long, timeout=0.5)
    deadline = time.time() + 20
    while cancelled_tokens() == after and time.time() < deadline:
        time.sleep(0.2)
    assert after < cancelled_tokens() < after + 8000
    assert generate(server, prompt="Das", max_new_tokens=3).status_code == 200


def test_generation_metrics(server):
    generate(server, prompt="Das", max_new_tokens=5, seed=1)
    names = {s.name for f in text_string_to_metric_families(httpx.get(server + "/metrics").text) for s in f.samples}
    for name in ("transerve_time_to_first_token_seconds_count", "transerve_time_per_output_token_seconds_count",
                 "transerve_generated_tokens_total"):
        assert name in names
    text = httpx.get(server + "/metrics").text
    assert 'transerve_requests_total{endpoint="generate",status="200"}' in text
    # The running batch's: a decoder call of 1 row at least (its prompt's), nothing left running or waiting.
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    rows = {"endpoint": "generate", "model": "tiny-lm"}
    assert samples[("transerve_step_batch_rows_count", tuple(sorted(rows.items())))] >= 2
    assert samples[("transerve_scheduler_running_rows", tuple(sorted(rows.items())))] == 0
    assert samples[("transerve_cache_bytes", tuple(sorted(rows.items())))] == 0
    assert samples[("transerve_scheduler_waiting_requests", (("endpoint", "generate"),))] == 0


def test_sdk_generate_and_stream(server, engines):
    with Client(server) as c:
        result = c.generate(HALVES[3], max_new_tokens=40, temperature=0)
        assert result.text == greedy_continuation(engines[1], HALVES[3], 40)
        with c.stream(HALVES[3], max_new_tokens=40, temperature=0) as s:
            pieces = list(s)
        assert "".join(pieces) == result.text and len(pieces) > 1
        assert s.result.choices[0].finish_reason == "stop"

    async def run():
        async with AsyncClient(server) as c:
            r = await c.generate("zzz", max_new_tokens=10, seed=2)
            pieces = [p async for p in c.stream("zzz", max_new_tokens=10, seed=2)]
            return r.text, "".join(pieces)

    a, b = asyncio.run(run())
    assert a == b


def test_a_stalled_generation_worker_answers_504_before_the_first_event_and_an_error_event_after(tiny_lm_package):
    """Twice --request-timeout-s bounds each wait of a generation, as it bounds a translation's answer: the wait for
    its first event (a 504) and, streamed, for its next (an error event of type timeout); a stream that goes on
    producing is not cut. The worker is stopped (SIGSTOP) to stall it."""
    proc, url = start_server(tiny_lm_package, "--request-timeout-s", "2")
    (pid,) = worker_pids(url, tiny_lm_package.name)
    try:
        body = {"prompt": HALVES[0], "max_new_tokens": 200, "min_new_tokens": 200, "temperature": 0}
        assert generate(url, **body).status_code == 200            # 200 tokens in well under 4 s here
        with httpx.stream("POST", url + "/generate", json=body | {"stream": True}, timeout=30) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            os.kill(pid, signal.SIGSTOP)
            t0 = time.monotonic()
            events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
        assert json.loads(first[6:])["type"] == "token" and time.monotonic() - t0 < 10
        assert events[-1] == {"type": "error", "error": {"type": "timeout", "message": "no answer within 4 s"}}
        t0 = time.monotonic()
        refused = generate(url, **body)
        assert refused.status_code == 504 and refused.json()["error"]["type"] == "timeout", refused.text
        assert time.monotonic() - t0 < 10
        os.kill(pid, signal.SIGCONT)
        assert generate(url, **body).status_code == 200
    finally:
        os.kill(pid, signal.SIGCONT)
        stop_server(proc)
