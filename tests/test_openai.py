"""OpenAI's API (/v1/completions, /v1/models) on a real server (127.0.0.1) with an API key, through the real
`openai` package (and LiteLLM where it is installed): what it answers is what POST /generate answers for the
same prompt, options and seed; what we do not implement is a 400 in OpenAI's shape naming it."""

import concurrent.futures as cf
import json
import os

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import pairs64, start_server, stop_server

openai = pytest.importorskip("openai")

KEY = "sk-test-0123"
AUTH = {"Authorization": f"Bearer {KEY}"}
HALVES = [" ".join(s.split()[: len(s.split()) // 2]) for pair in pairs64() for s in pair]


@pytest.fixture(scope="module")
def server(tiny_package, tiny_lm_package):
    proc, url = start_server(tiny_package, "--model", str(tiny_lm_package), "--batch-timeout-ms", "100",
                             "--max-batch-size", "16", "--max-output-tokens", "200", "--max-texts", "8",
                             "--api-keys", KEY)
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=60)


def generate(url, **body) -> dict:
    r = httpx.post(url + "/generate", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def texts_of(completion) -> list[str]:
    return [c.text for c in sorted(completion.choices, key=lambda c: c.index)]


def test_models_list_every_package_with_its_task(client):
    models = {m.id: m for m in client.models.list()}
    assert len(models) == 2, models
    tasks = {m.id: m.model_extra["task"] for m in models.values()}
    assert sorted(tasks.values()) == ["generation", "translation"]
    lm = next(i for i, t in tasks.items() if t == "generation")
    assert models[lm].object == "model" and models[lm].owned_by == "transerve" and models[lm].created > 0
    assert client.models.retrieve(lm).id == lm
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def lm_name(client) -> str:
    return next(m.id for m in client.models.list() if m.model_extra["task"] == "generation")


def test_each_completion_has_its_own_id_whatever_request_id_the_client_chose(server, client):
    body = {"model": lm_name(client), "prompt": "Das", "max_tokens": 2}
    answers = [httpx.post(server + "/v1/completions", json=body, headers=AUTH | {"x-request-id": "mine-1"})
               for _ in range(2)]
    assert all(r.status_code == 200 and r.headers["x-request-id"] == "mine-1" for r in answers)
    ids = [r.json()["id"] for r in answers]
    assert ids[0] != ids[1] and all(i.startswith("cmpl-") and "mine-1" not in i for i in ids)


def test_plain_completion_is_generates_answer(server, client):
    lm = lm_name(client)
    r = client.completions.create(model=lm, prompt=HALVES[3], max_tokens=20, seed=7, temperature=1.2, top_p=0.9)
    g = generate(server, prompt=HALVES[3], max_new_tokens=20, seed=7, temperature=1.2, top_p=0.9)
    assert r.object == "text_completion" and r.model == lm and r.id.startswith("cmpl-")
    assert texts_of(r) == [g["choices"][0]["text"]]
    assert r.choices[0].finish_reason == g["choices"][0]["finish_reason"] and r.choices[0].logprobs is None
    assert r.usage.prompt_tokens == g["usage"]["prompt_tokens"] > 0
    assert r.usage.completion_tokens == g["usage"]["completion_tokens"]
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # OpenAI's defaults: 16 tokens at most, temperature 1
    r = client.completions.create(model=lm, prompt="zzz", seed=2)
    assert texts_of(r) == [generate(server, prompt="zzz", seed=2, max_new_tokens=16)["choices"][0]["text"]]
    greedy = client.completions.create(model=lm, prompt=HALVES[5], max_tokens=30, temperature=0)
    assert texts_of(greedy) == [generate(server, prompt=HALVES[5], max_new_tokens=30, temperature=0)
                                ["choices"][0]["text"]]


def test_n_choices_are_generates_sequences(server, client):
    lm = lm_name(client)
    r = client.completions.create(model=lm, prompt="Das", max_tokens=12, seed=1, n=2)
    g = generate(server, prompt="Das", max_new_tokens=12, seed=1, num_return_sequences=2)
    assert texts_of(r) == [c["text"] for c in g["choices"]] and [c.index for c in r.choices] == [0, 1]
    # greedy search has one answer: OpenAI returns it n times (where /generate refuses n > 1 without sampling)
    r = client.completions.create(model=lm, prompt=HALVES[1], max_tokens=12, temperature=0, n=3)
    one = generate(server, prompt=HALVES[1], max_new_tokens=12, temperature=0)
    assert texts_of(r) == [one["choices"][0]["text"]] * 3
    assert r.usage.completion_tokens == 3 * one["usage"]["completion_tokens"]


def test_batched_prompts_each_as_alone(server, client):
    lm = lm_name(client)
    prompts = HALVES[:4]
    r = client.completions.create(model=lm, prompt=prompts, max_tokens=15, seed=4, n=2)
    assert [c.index for c in r.choices] == list(range(8))
    alone = [generate(server, prompt=p, max_new_tokens=15, seed=4, num_return_sequences=2) for p in prompts]
    assert texts_of(r) == [c["text"] for g in alone for c in g["choices"]]
    assert r.usage.prompt_tokens == sum(g["usage"]["prompt_tokens"] for g in alone)
    assert r.usage.completion_tokens == sum(g["usage"]["completion_tokens"] for g in alone)
    # and the same with other requests in the same batches
    with cf.ThreadPoolExecutor(6) as pool:
        others = [pool.submit(generate, server, prompt=p, max_new_tokens=15, seed=i)
                  for i, p in enumerate(HALVES[8:13])]
        again = pool.submit(client.completions.create, model=lm, prompt=prompts, max_tokens=15, seed=4, n=2)
        assert texts_of(again.result()) == texts_of(r)
        assert all(f.result()["choices"] for f in others)


def streamed(client, **kw) -> tuple[dict[int, str], dict[int, str], object]:
    texts, finish, usage = {}, {}, None
    for chunk in client.completions.create(stream=True, **kw):
        assert chunk.object == "text_completion"
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason is not None:
                finish[c.index] = c.finish_reason
        usage = chunk.usage or usage
    return texts, finish, usage


def test_streaming_chunks_concatenate_to_the_completion(client):
    lm = lm_name(client)
    for kw in ({"prompt": "zzz", "max_tokens": 25, "seed": 5, "temperature": 1.5},
               {"prompt": HALVES[7], "max_tokens": 30, "temperature": 0},
               {"prompt": ["Das", HALVES[2]], "max_tokens": 12, "seed": 1, "n": 3}):
        whole = client.completions.create(model=lm, **kw)
        texts, finish, usage = streamed(client, model=lm, stream_options={"include_usage": True}, **kw)
        assert [texts.get(c.index, "") for c in whole.choices] == texts_of(whole)
        assert [finish[c.index] for c in whole.choices] == [c.finish_reason for c in whole.choices]
        assert usage.model_dump() == whole.usage.model_dump()
    texts, _, usage = streamed(client, model=lm, prompt="zzz", max_tokens=25, seed=5)
    assert usage is None and texts[0]   # usage only when asked for, as OpenAI


def test_streaming_ends_with_done(server):
    with httpx.stream("POST", server + "/v1/completions", headers=AUTH, timeout=60,
                      json={"model": "tiny-lm", "prompt": "Das", "max_tokens": 5, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]" and len(lines) >= 3
    assert all("usage" not in json.loads(line[6:]) for line in lines[:-1])   # not asked for: none


def test_with_the_usage_asked_for_every_other_chunk_has_usage_null(server):
    """OpenAI: 'All other chunks will also include a usage field, but with a null value.'"""
    with httpx.stream("POST", server + "/v1/completions", headers=AUTH, timeout=60,
                      json={"model": "tiny-lm", "prompt": "Das", "max_tokens": 5, "stream": True,
                            "stream_options": {"include_usage": True}}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line and line != "data: [DONE]"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1
    assert len(chunks) >= 3 and all("usage" in c and c["usage"] is None for c in chunks[:-1])


def test_stop_sequences(server, client):
    lm = lm_name(client)
    full = generate(server, prompt=HALVES[4], max_new_tokens=40, temperature=0)["choices"][0]["text"]
    words = full.split()
    assert len(words) >= 2, full
    stop = " " + words[1]
    r = client.completions.create(model=lm, prompt=HALVES[4], max_tokens=40, temperature=0, stop=[stop, "@@@"])
    assert texts_of(r) == [full[: full.index(stop)]] and r.choices[0].finish_reason == "stop"
    texts, finish, _ = streamed(client, model=lm, prompt=HALVES[4], max_tokens=40, temperature=0, stop=stop)
    assert texts[0] == full[: full.index(stop)] and finish[0] == "stop"
    r = client.completions.create(model=lm, prompt="zzz", max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason == ("length" if r.usage.completion_tokens == 3 else "stop")


@pytest.mark.parametrize("kw, status, param", [
    ({"logprobs": 2}, 400, "logprobs"),
    ({"echo": True}, 400, "echo"),
    ({"suffix": "!"}, 400, "suffix"),
    ({"best_of": 3}, 400, "best_of"),
    ({"frequency_penalty": 0.5}, 400, "frequency_penalty"),
    ({"presence_penalty": 1.0}, 400, "presence_penalty"),
    ({"logit_bias": {"50256": -100}}, 400, "logit_bias"),
    ({"extra_body": {"top_k": 5}}, 400, "top_k"),
    ({"extra_body": {"stream_options": {"continuous_usage_stats": True}}}, 400, "stream_options"),
    ({"temperature": 3.0}, 400, "temperature"),
    ({"n": 9}, 400, "n"),
    ({"prompt": [1, 2, 3]}, 400, "prompt"),
    ({"prompt": ["x"] * 9}, 413, "prompt"),
    ({"model": "no-such-model"}, 404, "model"),
    ({"model": "translation"}, 400, "model"),
    ({"stream_options": {"include_usage": True}}, 400, "stream_options"),      # without stream: true
    ({"best_of": 1, "n": 2}, 400, "best_of"),
    ({"prompt": "x " * 3000}, 413, "prompt"),                                  # over the model's tokens
])
def test_what_we_do_not_take_is_a_400_naming_it(client, kw, status, param):
    models = {m.model_extra["task"]: m.id for m in client.models.list()}
    kw = {"model": models["generation"], "prompt": "Das", "max_tokens": 4} | kw
    kw["model"] = models.get(kw["model"], kw["model"])
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(**kw)
    assert e.value.status_code == status
    err = e.value.body
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param, err
    assert param in err["message"] or status == 404 or param == "model"
    assert err["type"] == "invalid_request_error"


def test_errors_in_openais_shape_and_the_key_as_openai_sends_it(server, client):
    r = httpx.post(server + "/v1/completions", json={"model": "tiny-lm", "prompt": "x"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError) as e:   # a wrong key: 401, as OpenAI's API answers it
        openai.OpenAI(base_url=server + "/v1", api_key="wrong", max_retries=0).models.list()
    assert e.value.body["code"] == "unauthorized" and e.value.body["type"] == "authentication_error"
    r = httpx.post(server + "/v1/completions", content=b"{nope", headers=AUTH | {"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(server + "/v1/completions", json={"prompt": "x"}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    r = httpx.post(server + "/v1/completions", json={"model": "tiny-lm", "prompt": "x", "stream": "yes"},
                   headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"
    r = httpx.get(server + "/v1/nothing", headers=AUTH)
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    # /v1/chat/completions: plain language models have no chat template, so a clear 400
    # (docs/serving.md, "OpenAI's API")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=lm_name(client), messages=[{"role": "user", "content": "Hallo"}])
    assert e.value.code == "chat_not_supported" and "/v1/completions" in e.value.message


def test_metrics_label_the_endpoint(server, client):
    client.completions.create(model=lm_name(client), prompt="Das", max_tokens=2)
    text = httpx.get(server + "/metrics", headers=AUTH).text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("transerve_requests_total", (("endpoint", "completions"), ("status", "200")))] >= 1
    assert ("transerve_errors_total", (("endpoint", "completions"), ("kind", "validation"))) in samples


def test_openapi_documents_the_routes(server):
    paths = httpx.get(server + "/openapi.json", headers=AUTH).json()["paths"]
    assert {"/v1/completions", "/v1/models", "/v1/models/{model}"} <= set(paths)
    body = paths["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["model"]["enum"] == ["tiny-lm"] and body["additionalProperties"] is False


@pytest.mark.slow
def test_litellm(server, client):
    """LiteLLM's text completion against the server, offline (its model price list from the package)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = pytest.importorskip("litellm")
    lm = lm_name(client)
    kw = {"model": "text-completion-openai/" + lm, "api_base": server + "/v1", "api_key": KEY, "max_tokens": 12,
          "seed": 3}
    r = litellm.text_completion(prompt="Die Datei", **kw)
    assert r.choices[0].text == generate(server, prompt="Die Datei", max_new_tokens=12, seed=3)["choices"][0]["text"]
    r = litellm.text_completion(prompt=["Das", "zzz"], **kw)
    assert [c.text for c in r.choices] == [generate(server, prompt=p, max_new_tokens=12, seed=3)["choices"][0]["text"]
                                           for p in ("Das", "zzz")]
