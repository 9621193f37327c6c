"""service/shared/schemas.py's generation_options(): POST /generate's fields to the engine's options, the one
mapping (the OpenAI flavour reaches it through the GenerateRequest it builds), and SearchOptions.strategy, the one
place a strategy is decided."""

import pytest

from service.api.openai_api import CompletionRequest, OpenAIRoutes
from service.shared.options import DEFAULTS, SearchOptions
from service.shared.schemas import GenerateRequest, generation_options
from service.shared.search import _sampler


@pytest.mark.parametrize("options, strategy, rows", [
    (SearchOptions(sampling=True, beam_size=1), "sampling", 1),
    (SearchOptions(beam_size=1), "greedy", 1),
    (SearchOptions(beam_size=4), "beam", 4),
])
def test_the_strategy_and_its_rows(options, strategy, rows):
    assert (options.strategy, options.rows_per_input) == (strategy, rows)


def test_fields_left_out_take_the_request_models_defaults():
    options = generation_options(GenerateRequest(prompt="x"), max_new=10)
    assert options.strategy == "sampling"          # GenerateRequest: temperature 1.0, beam_size 1
    assert (options.temperature, options.top_k, options.top_p, options.repetition_penalty) == (
        DEFAULTS.temperature, DEFAULTS.top_k, DEFAULTS.top_p, DEFAULTS.repetition_penalty)
    assert (options.max_length, options.min_length) == (11, 0)   # eos included; min_new_tokens 0 = off
    assert GenerateRequest(prompt="x").to_search_options(max_output_tokens=10) == options    # 64 capped to 10


def test_temperature_0_is_greedy_and_beams_return_the_n_best():
    greedy = generation_options(GenerateRequest(prompt="x", temperature=0.0, top_k=5), max_new=8)
    assert greedy.strategy == "greedy" and greedy.temperature == DEFAULTS.temperature
    beam = generation_options(GenerateRequest(prompt="x", beam_size=3, num_return_sequences=2, min_new_tokens=20),
                              max_new=8)
    assert (beam.strategy, beam.num_hypotheses, beam.min_length) == ("beam", 2, 8)
    with pytest.raises(ValueError, match="num_return_sequences=2 needs sampling"):
        generation_options(GenerateRequest(prompt="x", temperature=0, num_return_sequences=2), max_new=8)


@pytest.mark.parametrize("temperature", [5e-324, 1e-310, 1e-308, 9e-6])
def test_a_temperature_too_small_to_divide_by_is_greedy(temperature):
    """Log-probs divided by 1e-308 overflow to -inf; sampling from them drew the padding token at every step, past
    the budget (an empty text of max_tokens + 1 pieces). Below GREEDY_BELOW a temperature is greedy, as in vLLM."""
    options = generation_options(GenerateRequest(prompt="x", temperature=temperature), max_new=8)
    assert options.strategy == "greedy"
    with pytest.raises(ValueError, match="at least 1e-05 for sampling"):
        _sampler(SearchOptions(sampling=True, temperature=temperature), [0])
    assert generation_options(GenerateRequest(prompt="x", temperature=1e-5), max_new=8).strategy == "sampling"
    # with beam search too a temperature below it is 0's: no sampling asked, so not refused as sampling
    beam = generation_options(GenerateRequest(prompt="x", temperature=temperature, beam_size=4), max_new=8)
    assert beam.strategy == "beam"
    with pytest.raises(ValueError, match="beam search does not sample"):
        GenerateRequest(prompt="x", temperature=1e-5, beam_size=4)


def test_openai_nulls_take_the_same_defaults_as_left_out():
    runs, copies = OpenAIRoutes.generate_requests(None, CompletionRequest(model="lm", prompt="x", temperature=None,
                                                                     top_p=None), ["x"])
    assert (runs[0].temperature, runs[0].top_p, copies) == (DEFAULTS.temperature, DEFAULTS.top_p, 1)
    greedy = CompletionRequest(model="lm", prompt="x", temperature=0, n=3)
    runs, copies = OpenAIRoutes.generate_requests(None, greedy, ["x"])
    assert (runs[0].temperature, runs[0].num_return_sequences, copies) == (0.0, 1, 3)


def test_the_gateway_maps_a_request_once_and_refuses_what_its_strategy_cannot_give():
    from service.errors import ApiError
    from service.http.gateway import generate_payload

    payload = generate_payload(GenerateRequest(prompt="x", max_new_tokens=500, seed=3), max_output_tokens=256)
    assert payload["options"].max_length == 257          # capped by the server, eos included
    assert set(payload) == {"prompt", "model", "num_return_sequences", "seed", "stop", "options"}
    assert payload["options"].strategy == "sampling"
    with pytest.raises(ApiError) as refused:
        generate_payload(GenerateRequest(prompt="x", temperature=0, num_return_sequences=2), 256)
    assert refused.value.status == 422 and "needs sampling" in str(refused.value)
