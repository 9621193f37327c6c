"""The request models' own checks (service/shared/schemas.py, the OpenAI flavour's): what a client is told."""

import math

import pytest
from pydantic import ValidationError

from service.api.openai_api import CompletionRequest
from service.shared.schemas import GenerateRequest, TranslateRequest

CASES = [
    (TranslateRequest, {"text": "Ja", "source_lang": "de", "target_lang": "en"}, "length_penalty"),
    (TranslateRequest, {"text": "Ja", "source_lang": "de", "target_lang": "en"}, "repetition_penalty"),
    (GenerateRequest, {"prompt": "Das"}, "temperature"),
    (GenerateRequest, {"prompt": "Das"}, "top_p"),
    (CompletionRequest, {"model": "lm-small", "prompt": "Das"}, "temperature"),
]


@pytest.mark.parametrize("model,fields,name", CASES)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_float_that_is_not_finite_is_told_so_not_that_it_is_too_large(model, fields, name, value):
    with pytest.raises(ValidationError) as refused:
        model.model_validate(fields | {name: value})
    (error,) = refused.value.errors()
    assert error["type"] == "finite_number" and error["loc"] == (name,), error
