"""OpenAI's API for generation, for the clients that speak it (the `openai` package, LiteLLM, LangChain):

    POST /v1/completions         a prompt (or a list of them) continued, JSON or OpenAI's `data:` chunks
    GET  /v1/models              every loaded package, translation ones included, with its task
    GET  /v1/models/{model}      one of them
    POST /v1/chat/completions    a 400 that says why: no served model has a chat template
                                 (docs/serving.md, "OpenAI's API")

No second engine path: each prompt becomes the GenerateRequest that POST /generate would take and goes
through Gateway.generate, whose typed events (gateway.Pieces, gateway.Finished) this module writes as OpenAI's
chunks, so the queue, batching, admission, limits, API keys, cancellation and metrics are
/generate's (the HTTP request counter and its errors under the endpoint label "completions", the work
itself, queue wait and token timings under "generate"). The same prompt, options and seed give the same
text as /generate, alone or batched.

OpenAI's options this server does not implement (logprobs, echo, suffix, best_of, penalties, logit_bias)
are taken at their neutral values only, which clients send by default; any other value, and any field
OpenAI does not have, gets a 400 in OpenAI's error shape naming them (error_body).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Annotated, AsyncIterator, Literal, Optional, Union

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, model_validator

from . import sse
from ..errors import NOT_JSON, ApiError, declares_json, parse_error
from .flavour import Flavour
from ..http.gateway import Finished, Gateway, GenerationStream
from ..shared.options import DEFAULTS, GREEDY_BELOW
from ..shared.schemas import GenerateRequest, StopSequence, _json_types, generation_options

ENDPOINT = "completions"      # the metrics' endpoint label of POST /v1/completions
OWNER = "transerve"
DEFAULT_MAX_TOKENS = 16       # OpenAI's default for /v1/completions (vLLM's too)
# Options taken at these values only (what clients send when the user did not ask for them).
NEUTRAL = {"logprobs": (None,), "echo": (None, False), "suffix": (None,), "best_of": (None, 1),
           "frequency_penalty": (None, 0), "presence_penalty": (None, 0), "logit_bias": (None, {})}


# The Gateway's and the worker's errors about a prompt's size, which name no field of ours: OpenAI's `param` is prompt.
PROMPT_ERRORS = frozenset({"too_many_tokens", "text_too_long"})


class OpenAIError(ApiError):
    """An ApiError that names the request field at fault (OpenAI's `param`)."""

    def __init__(self, status: int, type_: str, message: str, param: str | None = None, limit: int | None = None):
        super().__init__(status, type_, message, limit)
        self.param = param


def error_body(e: ApiError, request_id: str | None = None) -> dict:
    """OpenAI's error object: our error type is its `code`, the field at fault (if known) its `param`."""
    kind = ("authentication_error" if e.status in (401, 403) else "rate_limit_error" if e.status == 429 else
            "server_error" if e.status >= 500 else "invalid_request_error")
    param = getattr(e, "param", None) or ("prompt" if e.type in PROMPT_ERRORS else None)
    return {"error": {"message": e.message, "type": kind, "param": param, "code": e.type}}


def _neutral(values: tuple) -> dict:
    return {"json_schema_extra": {"enum": list(values)}}


class CompletionRequest(BaseModel):
    """OpenAI's completion request, as far as this server implements it."""
    # allow_inf_nan=False: a NaN was told "should be less than or equal to 2", as if it were a number too large.
    # read_request's rules between fields, in the schema too, so generated clients and fuzzers know them:
    # stream_options only with stream: true, best_of (1 at most here) not below n.
    model_config = ConfigDict(extra="forbid", protected_namespaces=(), allow_inf_nan=False, json_schema_extra={
        "allOf": [{"if": {"not": {"properties": {"stream": {"const": True}}, "required": ["stream"]}},
                   "then": {"properties": {"stream_options": {"type": "null"}}}},
                  {"if": {"properties": {"best_of": {"const": 1}}, "required": ["best_of"]},
                   "then": {"properties": {"n": {"enum": [None, 1]}}}}]})

    model: str = Field(..., min_length=1, max_length=200, description="A generation package's id (GET /v1/models)")
    prompt: Union[str, Annotated[list[str], Field(min_length=1)]] = Field(
        ..., description="A prompt, or a list of prompts (their choices in order, n per prompt); token ids are "
        "not taken")
    max_tokens: Optional[int] = Field(DEFAULT_MAX_TOKENS, ge=1, le=4096, description="Pieces to generate at most "
                                      "(capped by the server)")
    temperature: Optional[float] = Field(DEFAULTS.temperature, ge=0.0, le=2.0,
                                         description=f"0 (or below {GREEDY_BELOW:g}) = greedy")
    top_p: Optional[float] = Field(DEFAULTS.top_p, gt=0.0, le=1.0)
    n: Optional[int] = Field(1, ge=1, le=8, description="Choices per prompt (seeds seed, seed+1, …)")
    # up to 2**53 - 1, read exactly by every JSON parser (2**63 - 1 is read as 2**63 by those that use floats)
    seed: Optional[int] = Field(None, ge=0, le=2**53 - 1)
    stop: Union[None, StopSequence, Annotated[list[StopSequence], Field(max_length=4)]] = None
    stream: Optional[bool] = False
    stream_options: Optional[dict[str, StrictBool]] = Field(None, json_schema_extra={
        "properties": {"include_usage": {"type": "boolean"}}, "additionalProperties": False})
    user: Optional[str] = Field(None, max_length=256, description="Accepted and not used")
    # Not implemented: their neutral values only (NEUTRAL); any other is a 400 naming them.
    logprobs: Optional[int] = Field(None, **_neutral(NEUTRAL["logprobs"]))
    echo: Optional[bool] = Field(None, **_neutral(NEUTRAL["echo"]))
    suffix: Optional[str] = Field(None, **_neutral(NEUTRAL["suffix"]))
    best_of: Optional[int] = Field(None, **_neutral(NEUTRAL["best_of"]))
    frequency_penalty: Optional[float] = Field(None, **_neutral(NEUTRAL["frequency_penalty"]))
    presence_penalty: Optional[float] = Field(None, **_neutral(NEUTRAL["presence_penalty"]))
    logit_bias: Optional[dict[str, float]] = Field(None, json_schema_extra={"maxProperties": 0})

    _types = model_validator(mode="before")(classmethod(_json_types))

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class CompletionChoice(BaseModel):
    text: str
    index: int
    logprobs: Optional[dict] = None
    finish_reason: Optional[Literal["stop", "length"]]


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Optional[CompletionUsage] = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    task: str = Field(..., description="generation (POST /v1/completions, /generate) or translation (/translate)")
    directions: list[str] = Field(..., description="Translation directions; [] for a generation model")


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


TAKEN = [f for f in CompletionRequest.model_fields if f not in NEUTRAL]


def _printable(name: str) -> str:
    """A field name as it can be answered: a lone UTF-16 surrogate, which no UTF-8 can carry, escaped."""
    return name.encode("utf-8", "backslashreplace").decode("utf-8")


# --- the request ------------------------------------------------------------------------------------
async def read_request(request: Request) -> CompletionRequest:
    """The body as a CompletionRequest, or a 400 naming the field at fault (or the Content-Type, which must
    say JSON, as on /generate: OpenAI's clients send application/json)."""
    if not declares_json(request.headers.get("content-type", "")):
        raise OpenAIError(400, "invalid_json", NOT_JSON)
    try:
        data = await request.json()
    except (ValueError, RecursionError) as e:
        raise OpenAIError(400, "invalid_json", parse_error(e)) from None
    if not isinstance(data, dict):
        raise OpenAIError(400, "invalid_request", "the body must be a JSON object")
    if unknown := sorted(_printable(k) for k in set(data) - set(CompletionRequest.model_fields)):
        raise OpenAIError(400, "unsupported_parameter", f"unrecognized request argument(s): {', '.join(unknown)} "
                          f"(this server takes: {', '.join(TAKEN)})", unknown[0])
    if isinstance(data.get("prompt"), list) and any(not isinstance(p, str) for p in data["prompt"]):
        raise OpenAIError(400, "invalid_request", "prompt must be a string or a list of strings; token ids are not "
                          "taken", "prompt")
    try:
        body = CompletionRequest.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = [str(x) for x in err.get("loc", ())]
        msg = err.get("msg", "invalid").removeprefix("Value error, ")
        if loc:   # a union field (prompt, stop) fails in each of its forms: each one's reason
            msg = f"{loc[0]}: " + "; or ".join(dict.fromkeys(
                ".".join(str(x) for x in other["loc"][2:]) + (": " if len(other["loc"]) > 2 else "") + other["msg"]
                for other in e.errors() if other["loc"][:1] == err["loc"][:1]))
        else:   # _json_types' checks, before any field is read: their message starts with the field's name
            loc = [msg.split(" ")[0].split("[")[0]]
        param = loc[0] if loc[0] in CompletionRequest.model_fields else None
        raise OpenAIError(400, "invalid_request", msg, param) from None
    if bad := [name for name, neutral in NEUTRAL.items() if getattr(body, name) not in neutral]:
        raise OpenAIError(400, "unsupported_parameter", f"not supported by this server: {', '.join(bad)} (only "
                          + "; ".join(f"{n}={json.dumps(NEUTRAL[n][-1])}" for n in bad) + " is taken)", bad[0])
    if unknown := sorted(set(body.stream_options or {}) - {"include_usage"}):
        raise OpenAIError(400, "unsupported_parameter", f"stream_options: unrecognized {', '.join(unknown)} (only "
                          "include_usage is taken)", "stream_options")
    if body.stream_options is not None and not body.stream:   # OpenAI's and vLLM's answer too
        raise OpenAIError(400, "invalid_request", "stream_options is only allowed with stream: true", "stream_options")
    if body.best_of is not None and body.best_of < (body.n or 1):
        raise OpenAIError(400, "invalid_request", f"best_of ({body.best_of}) must be at least n ({body.n})", "best_of")
    return body


class OpenAIRoutes:
    """The /v1/ routes, each a thin translation into and out of the Gateway's."""

    def __init__(self, gateway: Gateway):
        self.gateway = gateway
        self._cards: tuple[tuple, list[dict]] = ((), [])

    @property
    def models(self) -> list[dict]:
        """A card per package serving now (model control loads and unloads translation models while the server
        runs), made again only when they change: model.json's time is read once a package."""
        packages = self.gateway.served_packages()
        served = tuple((p["name"], p["path"]) for p in packages)
        if served != self._cards[0]:
            self._cards = (served, [_card(p) for p in packages])
        return self._cards[1]

    def check(self, body: CompletionRequest, request: Request) -> list[str]:
        """The prompts, once the model and the request's size are checked (OpenAI's statuses: 404 for a model
        that is unknown, or that the key may not use, as GET /v1/models/{model})."""
        cards = self.visible(request)
        task = {m["id"]: m["task"] for m in cards}.get(body.model)
        if task is None:
            raise not_found(body.model, cards)
        if task != "generation":
            raise OpenAIError(400, "invalid_request", f"{body.model!r} is a {task} model: POST /translate (or "
                              "/libretranslate/translate) uses it; /v1/completions takes a generation model (GET "
                              "/v1/models lists each with its task)", "model")
        prompts, s = body.prompts(), self.gateway.settings
        if len(prompts) > s.max_texts:
            raise OpenAIError(413, "too_many_texts", f"{len(prompts)} prompts in one request; the limit is "
                              f"{s.max_texts}", "prompt", s.max_texts)
        return prompts

    def generate_requests(self, body: CompletionRequest, prompts: list[str]) -> tuple[list[GenerateRequest], int]:
        """The /generate requests of `body`, one per prompt, and how many choices each of their sequences
        stands for: greedy search (temperature 0) has one answer, which OpenAI repeats n times."""
        n = body.n or 1
        # temperature and top_p sent as null take GenerateRequest's defaults, as left out.
        given = {name: value for name, value in (("temperature", body.temperature), ("top_p", body.top_p))
                 if value is not None}
        common = dict(model=body.model, max_new_tokens=body.max_tokens or DEFAULT_MAX_TOKENS, seed=body.seed,
                      stop=body.stop or [], stream=bool(body.stream), **given)
        try:
            runs = [GenerateRequest(prompt=p, **common) for p in prompts]   # one sequence each
        except ValidationError as e:   # CompletionRequest's bounds are within GenerateRequest's: not expected
            raise OpenAIError(400, "invalid_request", str(e.errors()[0].get("msg"))) from None
        # the strategy asked where /generate's is decided; sampling draws n sequences (n <= 8 as GenerateRequest's)
        if generation_options(runs[0], runs[0].max_new_tokens).strategy == "greedy":
            return runs, n
        return [r.model_copy(update={"num_return_sequences": n}) for r in runs], 1

    async def completions(self, request: Request) -> Response:
        body = await read_request(request)
        prompts = self.check(body, request)
        runs, copies = self.generate_requests(body, prompts)
        streams = await _all_started(self.gateway, runs, request)
        # A completion's own id, as OpenAI gives each (the request's id, which a client may choose, is X-Request-ID).
        head = {"id": "cmpl-" + uuid.uuid4().hex, "object": "text_completion", "created": int(time.time()),
                "model": body.model}
        n = body.n or 1
        if body.stream:
            return sse.response(_chunks(head, streams, n, copies, body.include_usage()))
        answers = await asyncio.gather(*(s.result(request) for s in streams))
        if any(a is None for a in answers):
            return Response(status_code=499)   # the client went away
        return JSONResponse(_completion(head, answers, n, copies))

    def visible(self, request: Request) -> list[dict]:
        """The cards of the models the request's key may use (every one for a key without a `models` list): as
        OpenAI's list shows an account its own, and a model a key may not use is not found."""
        allowed = self.gateway.tenant(request).models
        return self.models if allowed is None else [m for m in self.models if m["id"] in allowed]

    def list_models(self, request: Request) -> dict:
        return {"object": "list", "data": self.visible(request)}

    def model(self, model: str, request: Request) -> dict:
        cards = self.visible(request)
        for card in cards:
            if card["id"] == model:
                return card
        raise not_found(model, cards)

    async def chat(self) -> Response:
        raise OpenAIError(400, "chat_not_supported", "no served model has a chat template: they are plain language "
                          "models, not trained on conversations, so /v1/chat/completions is not served; send the "
                          "text to continue to POST /v1/completions", "messages")

    def install(self, app: FastAPI) -> None:
        s, gateway = self.gateway.settings, self.gateway
        schema = CompletionRequest.model_json_schema()
        props = schema["properties"]
        if gateway.generators:
            props["model"]["enum"] = gateway.generators
        for one in props["prompt"]["anyOf"]:
            one.update({"maxLength": s.max_text_chars} if one["type"] == "string" else
                       {"maxItems": s.max_texts, "items": {"type": "string", "maxLength": s.max_text_chars}})
        errors = {c: {"description": "OpenAI's error shape: {\"error\": {\"message\", \"type\", \"param\", "
                      "\"code\"}}"} for c in (400, 401, 403, 404, 413, 503, 504)}
        app.add_api_route("/v1/completions", self.completions, methods=["POST"], response_model=Completion,
                          responses=errors | {200: {"content": {"text/event-stream": {}}, "description": "JSON, or "
                                                    "OpenAI's data: chunks then data: [DONE] with stream=true"}},
                          openapi_extra={"requestBody": {"required": True,
                                                         "content": {"application/json": {"schema": schema}}}},
                          summary="OpenAI-compatible completions (a generation model)", tags=["openai"])
        app.add_api_route("/v1/models", self.list_models, methods=["GET"], response_model=ModelList,
                          summary="OpenAI-compatible: every loaded package with its task (those the key may use)",
                          tags=["openai"])
        app.add_api_route("/v1/models/{model}", self.model, methods=["GET"], response_model=ModelCard,
                          responses={404: errors[404]}, summary="OpenAI-compatible: one package", tags=["openai"])
        app.add_api_route("/v1/chat/completions", self.chat, methods=["POST"], include_in_schema=False)


def not_found(model: str, cards: list[dict]) -> OpenAIError:
    """OpenAI's 404 for a model that is not served, or that the key may not use (`cards`: those it may)."""
    return OpenAIError(404, "model_not_found", f"the model {model!r} does not exist or the key may not use it; "
                       "its models: " + ", ".join(m["id"] for m in cards), "model")


def _card(package: dict) -> dict:
    model_json = Path(package["path"]) / "model.json"
    created = int(model_json.stat().st_mtime) if model_json.exists() else 0
    return {"id": package["name"], "object": "model", "created": created, "owned_by": OWNER, "task": package["task"],
            "directions": list(package["directions"]) if package["task"] != "generation" else []}


# --- the answer -------------------------------------------------------------------------------------
async def _all_started(gateway: Gateway, runs: list[GenerateRequest], request: Request) -> list[GenerationStream]:
    """Gateway.generate's stream of each run, started together (so that they share the workers' batches). When
    one fails, the others are closed (their places and rows given back) and its error is raised."""
    started = await asyncio.gather(*(gateway.generate(r, request) for r in runs), return_exceptions=True)
    failed = next((s for s in started if isinstance(s, BaseException)), None)
    if failed is not None:
        for s in started:
            if isinstance(s, GenerationStream):
                await s.aclose()
        raise failed
    return started     # type: ignore[return-value]


FINISH = {"stop": "stop", "length": "length"}   # "cancelled" only reaches a client that is gone


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _completion(head: dict, answers: list[Finished], n: int, copies: int) -> dict:
    """Each prompt's Finished as one OpenAI completion: prompt i's choices at i*n…i*n+n-1."""
    choices, prompt_tokens, completion_tokens = [], 0, 0
    for i, answer in enumerate(answers):
        for c in answer.choices:
            for j in range(copies):
                choices.append({"text": c["text"], "index": i * n + c["index"] * copies + j, "logprobs": None,
                                "finish_reason": FINISH.get(c["finish_reason"], "stop")})
        prompt_tokens += answer.usage["prompt_tokens"]
        completion_tokens += answer.usage["completion_tokens"] * copies
    choices.sort(key=lambda c: c["index"])
    return head | {"choices": choices, "usage": _usage(prompt_tokens, completion_tokens)}


async def _chunks(head: dict, streams: list[GenerationStream], n: int, copies: int,
                  include_usage: bool) -> AsyncIterator[str]:
    """Each prompt's events, merged as they come, as OpenAI's chunks: one per choice and piece, one with each
    choice's finish_reason, the usage with stream_options.include_usage, then [DONE]. A worker's failure after
    the 200 comes as OpenAI's error object (which its client raises). With the usage asked for, every other chunk
    has "usage": null, as OpenAI's."""
    prompt_tokens = completion_tokens = 0
    merged = _merged(streams)
    each = head | {"usage": None} if include_usage else head     # every chunk but the usage chunk
    try:
        async for i, event in merged:
            if isinstance(event, Finished):
                for c in event.choices:
                    for j in range(copies):
                        yield sse.event(each | {"choices": [{
                            "text": "", "index": i * n + c["index"] * copies + j, "logprobs": None,
                            "finish_reason": FINISH.get(c["finish_reason"], "stop")}]})
                prompt_tokens += event.usage["prompt_tokens"]
                completion_tokens += event.usage["completion_tokens"] * copies
                continue
            for p in event.pieces:
                for j in range(copies):
                    yield sse.event(each | {"choices": [{"text": p["text"], "index": i * n + p["index"] * copies + j,
                                                         "logprobs": None, "finish_reason": None}]})
    except ApiError as e:    # the others are closed as _merged is left
        yield sse.event({"error": error_body(e)["error"] | {"type": "server_error"}})
    else:
        if include_usage:
            yield sse.event(head | {"choices": [], "usage": _usage(prompt_tokens, completion_tokens)})
    finally:
        await merged.aclose()   # at once, also when the client went away: its streams' rows cancelled
    yield sse.event("[DONE]")


async def _merged(streams: list[GenerationStream]) -> AsyncIterator[tuple[int, object]]:
    """(stream index, event) from every stream as each comes; leaving early, or a stream's error (raised
    here), closes them all (their rows cancelled, their places given back)."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int) -> None:
        try:
            async for event in streams[i]:
                queue.put_nowait((i, event))
        except Exception as e:
            queue.put_nowait((i, e))
            return
        queue.put_nowait((i, None))

    tasks = [asyncio.ensure_future(pump(i)) for i in range(len(streams))]
    try:
        left = len(tasks)
        while left:
            i, item = await queue.get()
            if isinstance(item, Exception):
                raise item
            if item is None:
                left -= 1
                continue
            yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            await stream.aclose()


def install(app: FastAPI, gateway: Gateway) -> None:
    OpenAIRoutes(gateway).install(app)


FLAVOUR = Flavour(install, prefix="/v1/", error_body=error_body,
                  endpoints={"/v1/completions": ENDPOINT})
