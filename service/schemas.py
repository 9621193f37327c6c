"""Request and response models of the HTTP API (they are the OpenAPI schema at /docs).

Structural checks (types, ranges, empty text) live here and run in the HTTP process before a
request is queued; checks that need the loaded models (language pair, token counts) run in
`decode_request` of the inference worker.
"""

from __future__ import annotations

from typing import Annotated, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

LangCode = Annotated[str, Field(min_length=2, max_length=8, pattern=r"^[a-z]{2,3}(-[A-Za-z]{2,4})?$",
                                examples=["de"])]


class TranslateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: Union[str, list[str]] = Field(..., description="A text, or a list of texts translated independently. "
                                         "Long texts are split into sentences and joined back.",
                                         examples=["Das geht zu weit."])
    source_lang: LangCode = Field(..., description="Language of the text, e.g. de")
    target_lang: LangCode = Field(..., description="Language to translate into, e.g. en")
    beam_size: int = Field(4, ge=1, le=16, description="1 = greedy search")
    num_alternatives: int = Field(0, ge=0, le=8, description="Extra translations per text (n-best); "
                                  "0 = off; needs beam_size > num_alternatives")
    length_penalty: float = Field(1.0, ge=0.0, le=4.0, description="score / length ** length_penalty; 0 = off")
    max_length: Optional[int] = Field(None, ge=1, le=1024, description="Output tokens per sentence at most "
                                      "(default: 1.5 × source tokens + 10, capped by the server)")
    no_repeat_ngram_size: int = Field(0, ge=0, le=10, description="0 = off")
    repetition_penalty: float = Field(1.0, ge=1.0, le=10.0, description="1.0 = off")

    @field_validator("text")
    @classmethod
    def _text_not_empty(cls, v):
        texts = [v] if isinstance(v, str) else v
        if not texts:
            raise ValueError("text must be a non-empty string or a non-empty list of strings")
        for i, t in enumerate(texts):
            if not t.strip():
                where = "text" if isinstance(v, str) else f"text[{i}]"
                raise ValueError(f"{where} is empty; send at least one non-space character")
        return v


class Alternative(BaseModel):
    text: str
    score: float


class TranslationItem(BaseModel):
    text: str = Field(..., description="The translation")
    score: float = Field(..., description="Length-normalised log-probability of the best hypothesis "
                         "(averaged over sentences for split texts)")
    alternatives: list[Alternative] = Field(default_factory=list)
    input_tokens: int
    output_tokens: int


class Timings(BaseModel):
    queue_ms: float = Field(..., description="From arrival to the start of the batch")
    inference_ms: float = Field(..., description="Batch decoding time (shared with batch-mates)")
    total_ms: float


class TranslateResponse(BaseModel):
    translations: list[TranslationItem] = Field(..., description="One per input text, in order")
    model: str = Field(..., description="Model package id that translated")
    source_lang: str
    target_lang: str
    timings: Timings


class ErrorBody(BaseModel):
    type: str = Field(..., examples=["invalid_request"])
    message: str
    limit: Optional[int] = None


class ErrorResponse(BaseModel):
    error: ErrorBody
    request_id: Optional[str] = None


class Language(BaseModel):
    code: str
    name: str
    targets: list[str]
