"""The searches' options and their defaults, written once: the engine, the training side's evaluation,
the HTTP API's schemas and the SDK all read them from here. No numpy, so the SDK needs none."""

from __future__ import annotations

from dataclasses import dataclass

# How a search ends at its length budget: transformers' generate() or CTranslate2's (service/shared/search.py
# explains the difference). Written here, not in search.py, because the SDK imports this module without numpy.
RULES = ("transformers", "ctranslate2")


@dataclass
class SearchOptions:
    """Decoding options; each says its "off" value."""
    beam_size: int = 4                # 1 = greedy search
    num_hypotheses: int = 1           # n-best returned per input (<= beam_size)
    length_penalty: float = 1.0       # score = log p / length ** length_penalty; 0 = off
    max_length_a: float = 1.5         # output budget a * source_length + b tokens ...
    max_length_b: int = 10
    max_length: int = 256             # ... never more than this (also capped by the model)
    # eos is not a candidate before this many tokens. 1: never an empty output, as CTranslate2's translate_batch
    # (min_decoding_length=1) and fairseq (min_len=1) default to; without it a beam search can finish eos at its
    # first step, score it log p(eos) / 1 and return "" ahead of every real translation. 0 = off (transformers'
    # generate(); the generation API's min_new_tokens).
    min_length: int = 1
    no_repeat_ngram_size: int = 0     # 0 = off
    repetition_penalty: float = 1.0   # 1.0 = off
    sampling: bool = False            # True = ancestral sampling instead of search
    temperature: float = 1.0          # sampling only
    top_k: int = 0                    # sampling only; 0 = off
    top_p: float = 1.0                # sampling only; 1.0 = off
    seed: int | None = None           # sampling only; None = random
    # "transformers" (default): the budget's last place may only be eos, as Marian's generate() writes it;
    # "ctranslate2": it takes any token, so a cut output has one token more and no eos, token for token
    # CTranslate2's. Every search honours it (service/shared/search.py's decode).
    length_rule: str = "transformers"

    def __post_init__(self):
        # Here, not at the first search step: a bad value is refused before any batch is built or queued.
        if self.length_rule not in RULES:
            raise ValueError(f"length_rule must be one of {', '.join(map(repr, RULES))}, "
                             f"got {self.length_rule!r}")
        # Greedy search and sampling would silently return one.
        most = self.rows_per_input
        if not 1 <= self.num_hypotheses <= most:
            raise ValueError(f"num_hypotheses must be between 1 and {most} "
                             f"({'sampling returns one per input' if self.sampling else 'beam_size'}), "
                             f"got {self.num_hypotheses}")

    @property
    def strategy(self) -> str:
        """"sampling", "greedy" or "beam": the one place the strategy is decided, which every search path asks
        (decode(), the running batch's pooled beams, the engines' decoders, generation's scheduler)."""
        if self.sampling:
            return "sampling"
        return "beam" if self.beam_size > 1 else "greedy"

    @property
    def rows_per_input(self) -> int:
        """The decoder rows a search gives each input: its beams, or 1 (greedy search, sampling)."""
        return self.beam_size if self.strategy == "beam" else 1

    def batch_key(self) -> tuple:
        """What the rows of one engine batch must share: every option but the seed (each row samples with
        its own generator)."""
        return tuple(value for name, value in vars(self).items() if name != "seed")


DEFAULTS = SearchOptions()   # the one place the defaults are written; the API's schemas show these
# Generation's own, where a continuation differs from a translation (the generation API's and Engine.generate's):
# its length budget is counted in new pieces, 64 unless asked, and it may end at once (min_length 0, "off")
GENERATION_MAX_NEW_TOKENS = 64
GENERATION_MIN_LENGTH = 0
# Below this a temperature is greedy search, as in vLLM (its _SAMPLING_EPS): log-probs divided by less overflow to
# -inf, and a sampler drawing from NaNs picked the padding token at every step, past the request's budget.
GREEDY_BELOW = 1e-5
