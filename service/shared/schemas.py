"""Request and response models of the HTTP API (they are the OpenAPI schema at /docs).

Structural checks (types, ranges, empty text) live here and run in the HTTP process before a
request is queued; checks that need the loaded models (language pair, token counts) run in
`decode_request` of the inference worker.
"""

from __future__ import annotations

import functools
import json
from typing import Annotated, Literal, Optional, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, field_validator, model_validator

from .glossary import MAX_TERM_CHARS
from .options import DEFAULTS, GENERATION_MAX_NEW_TOKENS, GENERATION_MIN_LENGTH, GREEDY_BELOW, SearchOptions

LangCode = Annotated[str, Field(min_length=2, max_length=8, pattern=r"^[a-z]{2,3}(-[A-Za-z]{2,4})?$",
                                examples=["de"])]
# A source language, or "auto": detected per text among the languages the server translates from.
SourceLang = Annotated[str, Field(min_length=2, max_length=8, pattern=r"^(auto|[a-z]{2,3}(-[A-Za-z]{2,4})?)$",
                                  examples=["de", "auto"])]
AUTO = "auto"
StopSequence = Annotated[str, Field(min_length=1, max_length=64)]


def _json_types(model: type[BaseModel], data):
    """Before any field is read: JSON true and "4" are not numbers, nor "true" and 1 booleans, as the schema
    says, though pydantic's lax mode would take them (its strict mode would refuse 4.0, which JSON Schema
    counts as an integer); and no string holds a lone UTF-16 surrogate (JSON "\\ud800" without its pair),
    which is not Unicode text and would fail the tokenizer for the whole batch it joined."""
    if isinstance(data, dict):
        kinds = _kinds(model)
        for name, value in data.items():
            if name not in kinds:   # not a field: refused by the model itself (extra="forbid")
                continue
            number, boolean = kinds[name]
            if isinstance(value, (bool, str)) and number:
                raise ValueError(f"{name} must be a JSON number, got {json.dumps(value)}")
            if boolean and value is not None and not isinstance(value, bool):
                raise ValueError(f"{name} must be true or false, got {json.dumps(value)}")
            for where, text in ([(name, value)] if isinstance(value, str) else
                                [(f"{name}[{i}]", v) for i, v in enumerate(value) if isinstance(v, str)]
                                if isinstance(value, list) else []):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise ValueError(f"{where} has a lone UTF-16 surrogate ({text[e.start]!r} at character "
                                     f"{e.start}), which is not Unicode text; send its pair or drop it") from None
    return data


@functools.cache
def _kinds(model: type[BaseModel]) -> dict[str, tuple[bool, bool]]:
    """Each field of `model`: (whether it takes a number, whether a boolean), for _json_types."""
    out = {}
    for name, field in model.model_fields.items():
        kinds = {field.annotation, *get_args(field.annotation)}
        out[name] = (bool(kinds & {int, float}), bool in kinds)
    return out


MAX_GLOSSARY_ENTRIES = 1000          # inline in one request (glossary.py's MAX_TERM_CHARS bounds each term)


class GlossaryEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Each term 1 to MAX_TERM_CHARS characters, checked with the rest of the glossary (glossary.check_entries):
    # a 400 invalid_glossary naming the entry, as for a TSV glossary, not pydantic's 422.
    source: str = Field(..., description="A term as it may stand in the source text (whole words; its first letter "
                        f"in either case; inflected forms are not matched); 1 to {MAX_TERM_CHARS} characters",
                        examples=["Auftrag"])
    target: str = Field(..., description=f"Its fixed translation, written as given; 1 to {MAX_TERM_CHARS} characters",
                        examples=["order"])

    _types = model_validator(mode="before")(classmethod(_json_types))   # no lone surrogate in a term


class TranslateRequest(BaseModel):
    # allow_inf_nan=False: a NaN length_penalty was told "should be less than or equal to 4", as if it were too large
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    text: Union[str, list[str]] = Field(..., description="A text, or a list of texts translated independently. "
                                         "Long texts are split into sentences and joined back.",
                                         examples=["Das geht zu weit."])
    source_lang: SourceLang = Field(..., description="Language of the text, e.g. de; \"auto\" detects each text's "
                                    "language among the served ones (each item then says what was detected; a "
                                    "detected language with no model to target_lang gets 422)")
    target_lang: LangCode = Field(..., description="Language to translate into, e.g. en; the source language "
                                  "itself returns each text unchanged (score 0.0, no tokens, model \"identity\")")
    beam_size: int = Field(DEFAULTS.beam_size, ge=1, le=16, description="1 = greedy search")
    num_alternatives: int = Field(0, ge=0, le=8, description="Extra translations per text (n-best); "
                                  "0 = off; needs beam_size > num_alternatives")
    length_penalty: float = Field(DEFAULTS.length_penalty, ge=0.0, le=4.0,
                                  description="score / length ** length_penalty; 0 = off")
    max_length: Optional[int] = Field(None, ge=1, le=1024, description="Output tokens per sentence at most "
                                      "(default: 1.5 × source tokens + 10, capped by the server)")
    no_repeat_ngram_size: int = Field(DEFAULTS.no_repeat_ngram_size, ge=0, le=10, description="0 = off")
    repetition_penalty: float = Field(DEFAULTS.repetition_penalty, ge=1.0, le=10.0, description="1.0 = off")
    glossary: Optional[list[GlossaryEntry]] = Field(
        None, max_length=MAX_GLOSSARY_ENTRIES, description="Fixed translations of terms: the entries whose source "
        "term a sentence holds are kept by the beam search (needs beam_size ≥ 2), and each translation says which "
        "held; null = none")
    glossary_id: Optional[str] = Field(
        None, min_length=1, max_length=64, description="A stored glossary of this key (POST /glossaries), used as "
        "`glossary` is; its language pair must be the request's (so not with source_lang \"auto\"); not with "
        "`glossary`; null = none")

    @field_validator("text")
    @classmethod
    def _text_not_empty(cls, v):
        texts = [v] if isinstance(v, str) else v
        if not texts:
            raise ValueError("text must be a non-empty string or a non-empty list of strings")
        for i, t in enumerate(texts):
            where = "text" if isinstance(v, str) else f"text[{i}]"
            if not t.strip():
                raise ValueError(f"{where} is empty; send at least one non-space character")
        return v

    _types = model_validator(mode="before")(classmethod(_json_types))

    @model_validator(mode="after")
    def _alternatives_need_beams(self):
        if self.num_alternatives and self.num_alternatives >= self.beam_size:
            raise ValueError(f"num_alternatives ({self.num_alternatives}) needs beam_size > num_alternatives, "
                             f"e.g. beam_size={self.num_alternatives + 1}")
        if (self.glossary or self.glossary_id) and self.beam_size < 2:
            raise ValueError("a glossary is kept by beam search: it needs beam_size 2 or more (the default is "
                             f"{DEFAULTS.beam_size})")
        if self.glossary is not None and self.glossary_id is not None:
            raise ValueError("send glossary (its entries) or glossary_id (a stored one), not both")
        if self.glossary_id is not None and self.source_lang == AUTO:
            # DeepL asks the same: a glossary is one language pair, and detection may pick another per text
            raise ValueError("glossary_id needs source_lang: a stored glossary is for one language pair, which "
                             "source_lang \"auto\" cannot promise")
        return self

    def glossary_pairs(self) -> list[tuple[str, str]] | None:
        """The glossary as the worker reads it: (source, target) pairs, or None."""
        return [(e.source, e.target) for e in self.glossary] if self.glossary else None

    def to_search_options(self, max_output_tokens: int) -> SearchOptions:
        """This request's engine options, mapped once (search_options()), in the Gateway: they travel in the
        worker's payload, and the worker applies no default of its own."""
        return search_options({name: getattr(self, name) for name in (*SEARCH_FIELDS, "num_alternatives")},
                              max_output_tokens)


class GlossaryCreateRequest(BaseModel):
    """POST /glossaries: a glossary stored for the calling key, as DeepL's glossary API takes one (its entries as
    TSV or CSV text with entries_format), or with its entries as objects, as /translate's glossary."""
    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., min_length=1, max_length=256, description="The glossary's name, for its owner",
                      examples=["Procurement"])
    source_lang: LangCode = Field(..., description="The language of the source terms: a served source language")
    target_lang: LangCode = Field(..., description="The language of the target terms; the pair must be served",
                                  examples=["en"])
    entries: Union[list[GlossaryEntry], str] = Field(
        ..., description="Its entries: a list of {source, target} objects, or DeepL's TSV (a source term TAB its "
        "target term a line) or CSV (source,target a line) text", examples=["Auftrag\tpurchase order\n"])
    entries_format: Optional[Literal["tsv", "csv"]] = Field(None, description="The format of entries given as "
                                                             "text (default tsv); not with a list")

    _types = model_validator(mode="before")(classmethod(_json_types))

    @model_validator(mode="after")
    def _format_for_text(self):
        if self.entries_format is not None and not isinstance(self.entries, str):
            raise ValueError("entries_format is for entries given as TSV or CSV text, not for a list of entries")
        return self


class GlossaryInfo(BaseModel):
    """A stored glossary, without its entries (DeepL's glossary object)."""
    glossary_id: str = Field(..., description="Its id, for /translate's glossary_id and these routes")
    name: str
    ready: bool = Field(True, description="Always true: a glossary is usable once it is created (DeepL's field)")
    source_lang: str
    target_lang: str
    creation_time: str = Field(..., description="When it was created: ISO 8601, UTC",
                               examples=["2025-01-31T09:30:00.000Z"])
    entry_count: int


class GlossaryList(BaseModel):
    glossaries: list[GlossaryInfo] = Field(..., description="The calling key's glossaries, oldest first")


# The fields of POST /translate that choose the search, as the bulk command takes them too (service/bulk/options.py
# makes one command-line option of each, with this schema's default, range and description).
SEARCH_FIELDS = ("beam_size", "length_penalty", "max_length", "no_repeat_ngram_size", "repetition_penalty")


def search_options(request: dict, max_output_tokens: int) -> SearchOptions:
    """POST /translate's fields (those given; the others take the schema's defaults) -> the engine's options:
    the one mapping, called once for a request, in the Gateway (translate_payload: the options travel to the
    worker in its payload), and by the bulk command, so a file translated in-process gets what the service would
    answer. max_output_tokens caps max_length (the server's setting)."""
    d = DEFAULTS
    beam = request.get("beam_size", d.beam_size)
    n_alt = request.get("num_alternatives", 0)   # < beam_size: TranslateRequest checked it
    return SearchOptions(
        beam_size=beam, num_hypotheses=n_alt + 1 if beam > 1 else 1,
        length_penalty=request.get("length_penalty", d.length_penalty),
        max_length=min(request.get("max_length") or max_output_tokens, max_output_tokens),
        no_repeat_ngram_size=request.get("no_repeat_ngram_size", d.no_repeat_ngram_size),
        repetition_penalty=request.get("repetition_penalty", d.repetition_penalty))


class DetectedLanguage(BaseModel):
    """LibreTranslate's shape for a detection, here as in its /detect and detectedLanguage."""
    language: str = Field(..., examples=["de"])
    confidence: float = Field(..., ge=0, le=100, description="Probability among the served languages, in percent",
                              examples=[97.0])


class Alternative(BaseModel):
    text: str
    score: float


class GlossaryResult(BaseModel):
    source: str
    target: str
    held: bool = Field(..., description="The target term is in the translation, as written, wherever the source "
                       "term was")


class TranslationItem(BaseModel):
    text: str = Field(..., description="The translation")
    score: float = Field(..., description="Length-normalised log-probability of the best hypothesis "
                         "(averaged over sentences for split texts)")
    alternatives: list[Alternative] = Field(default_factory=list)
    detected_lang: Optional[DetectedLanguage] = Field(None, description="With source_lang \"auto\": the language "
                                                      "this text was detected in and translated from")
    input_tokens: int
    output_tokens: int
    glossary: Optional[list[GlossaryResult]] = Field(None, description="With a glossary: each entry whose source "
                                                     "term this text holds, and whether its target term is in the "
                                                     "translation")


class Timings(BaseModel):
    queue_ms: float = Field(..., description="From arrival to the start of the batch")
    inference_ms: float = Field(..., description="Batch decoding time (shared with batch-mates)")
    total_ms: float


class TranslateResponse(BaseModel):
    translations: list[TranslationItem] = Field(..., description="One per input text, in order")
    model: str = Field(..., description="Model package id that translated (\"identity\" when source_lang == "
                       "target_lang)")
    model_version: Optional[str] = Field(None, description="The version of the package that translated (model "
                                         "control: a canary's candidate or the active one; also the X-Model-Version "
                                         "header); none for identity")
    source_lang: str = Field(..., description="As sent, or with \"auto\" the detected language (\"auto\" still "
                             "where the texts were detected in more than one: see each item's detected_lang)")
    target_lang: str
    timings: Timings


class ErrorBody(BaseModel):
    type: str = Field(..., examples=["invalid_request"])
    message: str
    limit: Optional[int] = None


class Canary(BaseModel):
    """A candidate version's share of traffic, as the admin routes (service/api/admin.py) and the models file
    (service/http/models_file.py) both take it."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    # Strict: a lax float takes JSON true (YAML's too) as 1.0, every request to the candidate; an int stays a number
    share: StrictFloat = Field(0.0, ge=0.0, le=1.0, description="The candidate's share of the other keys' requests, "
                               "0-1")
    keys: list[str] = Field([], max_length=256, description="Names of the keys (keys file) whose requests all go "
                            "to the candidate")


class ErrorResponse(BaseModel):
    error: ErrorBody
    request_id: Optional[str] = None


class LibreTranslateRequest(BaseModel):
    """LibreTranslate's POST /translate body, JSON or form, for the OpenAPI schema: the route parses the body
    itself, to answer in LibreTranslate's error shape."""
    q: Union[str, list[str]] = Field(..., description="A text or a list of texts")
    source: str = Field(..., description="Language of q, or \"auto\" to detect it (each text's) among the served "
                        "languages; the response then has detectedLanguage")
    target: str = Field(..., description="Language to translate into")
    format: Literal["text", "html"] = "text"
    alternatives: int = Field(0, ge=0, le=3, description="Extra translations per text")
    api_key: Optional[str] = Field(None, description="The API key, when the server has keys")
    glossary: Optional[Union[Annotated[list[GlossaryEntry], Field(max_length=MAX_GLOSSARY_ENTRIES)], str]] = Field(
        None, description="Not LibreTranslate's: fixed translations of terms, kept by the search as POST "
        "/translate's glossary (translatedText then holds them); a list of {source, target} objects, or DeepL's TSV "
        "(a source term TAB its target term a line), the form's way; null = none")


class LibreTranslateResponse(BaseModel):
    translatedText: Union[str, list[str]]
    alternatives: Optional[Union[list[str], list[list[str]]]] = None
    detectedLanguage: Optional[Union[DetectedLanguage, list[DetectedLanguage]]] = Field(
        None, description="With source \"auto\": the detection, one per text when q is a list")


class LibreTranslateDetectRequest(BaseModel):
    """LibreTranslate's POST /detect body, JSON or form (the route parses it itself, as for translate)."""
    q: Union[Annotated[str, Field(min_length=1)], Annotated[list[Annotated[str, Field(min_length=1)]], Field(
        min_length=1)]] = Field(
        ..., description="The text; a list is detected as one text, as LibreTranslate does")
    api_key: Optional[str] = Field(None, description="The API key, when the server has keys")


class LibreTranslateError(BaseModel):
    error: str


class Language(BaseModel):
    code: str
    name: str
    targets: list[str]


class GenerateRequest(BaseModel):
    # The beam search rule, in the schema too, so generated clients and fuzzers know it.
    model_config = ConfigDict(extra="forbid", protected_namespaces=(), allow_inf_nan=False, json_schema_extra={
        "if": {"properties": {"beam_size": {"minimum": 2}}, "required": ["beam_size"]},
        "then": {"properties": {"temperature": {"enum": [0, 1]}, "top_k": {"const": 0}, "top_p": {"const": 1}}}})

    prompt: str = Field(..., description="Text to continue; an empty prompt starts a new text",
                        examples=["Die Datei wird"])
    model: Optional[str] = Field(None, description="Generation package id (default: the first one loaded)")
    max_new_tokens: int = Field(GENERATION_MAX_NEW_TOKENS, ge=1, le=4096,
                                description="Pieces to generate at most (capped by the server)")
    min_new_tokens: int = Field(GENERATION_MIN_LENGTH, ge=0, le=4096, description="Pieces to generate before the "
                                "end of text may come, at most max_new_tokens; 0 = off")
    temperature: float = Field(DEFAULTS.temperature, ge=0.0, le=5.0, description="Sampling temperature; 0 "
                               f"(or below {GREEDY_BELOW:g}) = greedy (no sampling); 0 (or below {GREEDY_BELOW:g}) or "
                               "1.0 with beam_size > 1")
    top_k: int = Field(DEFAULTS.top_k, ge=0, le=1000, description="Sample among the k most likely pieces; 0 = "
                       "off (the only value with beam_size > 1)")
    top_p: float = Field(DEFAULTS.top_p, gt=0.0, le=1.0, description="Nucleus sampling mass; 1.0 = off (the only value "
                         "with beam_size > 1)")
    repetition_penalty: float = Field(DEFAULTS.repetition_penalty, ge=1.0, le=10.0,
                                      description="Penalty on pieces already generated; 1.0 = off")
    stop: Union[StopSequence, Annotated[list[StopSequence], Field(max_length=4)]] = Field(
        default_factory=list, description="Up to 4 stop sequences; the text ends before the first one found (it "
        "is not returned)")
    seed: Optional[int] = Field(None, ge=0, le=2**63 - 1, description="Sampling seed: the same request with the "
                                "same seed returns the same text, alone or batched (fp32 and int8; fp16 not yet "
                                "checked on a GPU: docs/serving.md, \"Text generation\"); None = random")
    num_return_sequences: int = Field(1, ge=1, le=8, description="Continuations to return (sampled with seeds "
                                      "seed, seed+1, …; with beam search the n best beams)")
    beam_size: int = Field(1, ge=1, le=16, description="> 1 = beam search (deterministic; needs temperature, "
                           "top_k and top_p at their defaults); 1 = off")
    stream: bool = Field(False, description="Stream pieces as server-sent events; the last event carries the "
                         "finish reasons and token counts")

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        return [v] if isinstance(v, str) else list(v)

    _types = model_validator(mode="before")(classmethod(_json_types))

    def to_search_options(self, max_output_tokens: int) -> SearchOptions:
        """This request's engine options, mapped once (generation_options()), in the Gateway: its budget is
        max_new_tokens capped by the server's max_output_tokens (the worker caps it again by the model's room for
        the prompt). ValueError where num_return_sequences asks more of greedy search than its one text."""
        return generation_options(self, min(self.max_new_tokens, max_output_tokens))

    @model_validator(mode="after")
    def _consistent(self):
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"min_new_tokens ({self.min_new_tokens}) is more than max_new_tokens "
                             f"({self.max_new_tokens}); send min_new_tokens={self.max_new_tokens} or less, or raise "
                             "max_new_tokens")
        sampled = self.temperature >= GREEDY_BELOW and self.temperature != 1.0   # 1.0: the default, no change
        if self.beam_size > 1 and (sampled or self.top_k or self.top_p < 1.0):
            raise ValueError("beam search does not sample: leave temperature, top_k and top_p at their defaults "
                             "with beam_size > 1, or use beam_size=1")
        return self


def generation_options(body: GenerateRequest, max_new: int) -> SearchOptions:
    """POST /generate's request -> the engine's options: the one mapping, as search_options() is translation's,
    which /v1/completions reaches through the GenerateRequest it builds. Temperature 0 is greedy search; beam_size
    > 1 is beam search returning the num_return_sequences best; else sampling, one row a sequence. max_new: the
    request's budget after the server's cap. ValueError where num_return_sequences asks more of greedy search than
    its one text (GenerateRequest refused sampling options with beam search already). A temperature below
    GREEDY_BELOW (1e-5) is greedy search too."""
    beam, n = body.beam_size, body.num_return_sequences
    sampling = beam == 1 and body.temperature >= GREEDY_BELOW
    if n > 1 and not sampling and n > beam:
        raise ValueError(f"num_return_sequences={n} needs sampling (temperature >= {GREEDY_BELOW:g}) or beam_size >= "
                         f"{n}; greedy search returns one text")
    return SearchOptions(beam_size=beam, num_hypotheses=n if beam > 1 else 1, max_length=max_new + 1,
                         min_length=min(body.min_new_tokens, max_new), repetition_penalty=body.repetition_penalty,
                         sampling=sampling, temperature=body.temperature if sampling else DEFAULTS.temperature,
                         top_k=body.top_k, top_p=body.top_p)


class GenerationChoice(BaseModel):
    index: int
    text: str = Field(..., description="The continuation (without the prompt)")
    finish_reason: str = Field(..., description="stop (end of text or a stop sequence), length "
                               "(max_new_tokens) or cancelled")
    tokens: int = Field(..., description="Generated pieces")


class GenerationUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int


class GenerationTimings(BaseModel):
    queue_ms: float = Field(..., description="From arrival to the start of the batch")
    first_token_ms: Optional[float] = Field(None, description="From arrival to the first generated piece")
    total_ms: float


class GenerateResponse(BaseModel):
    model: str
    choices: list[GenerationChoice]
    usage: GenerationUsage
    timings: GenerationTimings
