"""Our search against CTranslate2's on the same weights and inputs: a small random Marian model (an eos bias
in its final_logits_bias, so some outputs end in eos and some run to the budget), converted with
ct2-transformers-converter and imported with model.import_marian. With SearchOptions(length_rule="ctranslate2")
the engine's beam 4 and greedy search give CTranslate2's tokens for all 50 inputs; with the default rule
("transformers") a hypothesis cut by the budget is one token shorter and ends in eos, as generate() writes it.

Both searches count a finished hypothesis's length with its eos (CTranslate2 keeps the eos while it decodes and
drops it after scoring; transformers divides by cur_len + 1 - prompt length), so an eos written at the first
step is a hypothesis "" of length 1. Neither lets it win by default: CTranslate2's translate_batch forbids eos at
the first step (min_decoding_length=1), and so does our min_length=1. The same random model without the eos
bias (`untouched`, as MarianMTModel(config) initialises it) checks that nothing else differs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
ctranslate2 = pytest.importorskip("ctranslate2")

from conftest import pairs64  # noqa: E402
from service.inference.engine import Engine  # noqa: E402
from service.shared.options import SearchOptions  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TEXTS = [de for de, _ in pairs64()][:50]


def build_random_marian(out: Path, eos_bias: float = 5.0, std: float | None = 0.1) -> Path:
    """A randomly initialised MarianMTModel (weights N(0, std); None: transformers' own initialisation) over
    models/de-en's vocabulary, its <pad> (the decoder start) embedding zero as CTranslate2 assumes, and
    `eos_bias` added to eos's logit bias."""
    from model.export_marian import write_marian_vocabulary
    from model.tokenizer import Tokenizer
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    out.mkdir(parents=True, exist_ok=True)
    spm_file = ROOT / "models" / "de-en" / "spm.model"
    pieces = write_marian_vocabulary(Tokenizer(spm_file), out)
    V = len(pieces)
    config = MarianConfig(vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                          max_position_embeddings=256, activation_function="relu", scale_embedding=True,
                          pad_token_id=V - 1, decoder_start_token_id=V - 1, eos_token_id=0, forced_eos_token_id=0,
                          bad_words_ids=[[V - 1]])
    torch.manual_seed(0)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if std is not None and p.dim() > 1 and "embed_positions" not in name:
                p.normal_(0, std)
        model.model.shared.weight[V - 1].zero_()
        model.final_logits_bias[0, 0] += eos_bias
    model.save_pretrained(out)
    MarianTokenizer(str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json"),
                    source_lang="de", target_lang="en").save_pretrained(out)
    return out


def converted(work: Path, **build) -> tuple:
    """(tokenizer, CTranslate2 Translator, our Engine) over the same random weights (build_random_marian's)."""
    from transformers import MarianTokenizer

    from model.import_marian import import_marian

    marian = build_random_marian(work / "marian", **build)
    converter = Path(sys.executable).parent / "ct2-transformers-converter"
    subprocess.run([str(converter), "--model", str(marian), "--output_dir", str(work / "ct2")], check=True,
                   capture_output=True)
    import_marian(marian, work / "ours", source_lang="de", target_lang="en")
    return (MarianTokenizer.from_pretrained(str(marian)),
            ctranslate2.Translator(str(work / "ct2"), device="cpu", intra_threads=1),
            Engine(work / "ours", device="cpu", intra_op_threads=1))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The eos-biased random model: (tokenizer, CTranslate2 Translator, our Engine)."""
    return converted(tmp_path_factory.mktemp("ct2-search"))


@pytest.fixture(scope="module")
def untouched(tmp_path_factory):
    """The random model as transformers initialises it, no eos bias: (tokenizer, Translator, Engine, MarianMTModel)."""
    from transformers import MarianMTModel

    work = tmp_path_factory.mktemp("ct2-untouched")
    return converted(work, eos_bias=0.0, std=None) + (MarianMTModel.from_pretrained(str(work / "marian")).eval(),)


def ours(engine: Engine, ids: list[list[int]], beam: int, budget: int, rule: str, min_length: int = 0
         ) -> list[list[int]]:
    """The engine's best hypotheses with SearchOptions' length_rule `rule`."""
    options = SearchOptions(beam_size=beam, max_length_a=0, max_length_b=budget, max_length=budget,
                            length_rule=rule, min_length=min_length)
    return [h[0].tokens for h in engine.search(ids, options)]


def theirs(tok, translator, ids: list[list[int]], beam: int, budget: int, min_length: int = 0) -> list[list[int]]:
    results = translator.translate_batch([tok.convert_ids_to_tokens(i) for i in ids], beam_size=beam,
                                         max_decoding_length=budget, min_decoding_length=min_length,
                                         length_penalty=1.0)
    return [tok.convert_tokens_to_ids(r.hypotheses[0]) for r in results]


@pytest.mark.parametrize("budget", [3, 24])
@pytest.mark.parametrize("beam", [1, 4])
def test_rule_ctranslate2_gives_ctranslate2s_tokens(models, beam, budget):
    """Budget 3 cuts about half the outputs (the off-by-one of issue 29); 24 lets every one end in eos."""
    tok, translator, engine = models
    ids = [tok(t).input_ids for t in TEXTS]
    expected = theirs(tok, translator, ids, beam, budget)
    got = ours(engine, ids, beam, budget, "ctranslate2")
    assert sum(a == b for a, b in zip(got, expected)) == len(TEXTS), list(zip(got, expected))
    if budget == 3 and beam == 4:
        cut = [i for i, e in enumerate(expected) if len(e) == budget]
        assert 0 < len(cut) < len(TEXTS)      # both kinds of ending are compared
        # The default rule writes eos in the budget's last place: those hypotheses are one token shorter.
        default = ours(engine, ids, beam, budget, "transformers")
        assert all(len(default[i]) == budget - 1 for i in cut)



@pytest.mark.parametrize("beam", [1, 4])
def test_at_both_defaults_no_translation_is_empty(models, beam):
    """The eos-biased model writes eos first for every input, and at beam 4 a hypothesis "" finished at the
    first step scored log p(eos) / 1 and won on 17 of 50 inputs while CTranslate2 (min_decoding_length=1 by
    default) returned a translation. At both defaults (ours: min_length=1) the tokens are CTranslate2's."""
    tok, translator, engine = models
    ids = [tok(t).input_ids for t in TEXTS]
    assert all(not t for t in theirs(tok, translator, ids, 1, 24, min_length=0))   # eos first, where allowed
    expected = theirs(tok, translator, ids, beam, 24, min_length=1)
    got = ours(engine, ids, beam, 24, "ctranslate2", min_length=SearchOptions().min_length)
    assert not any(not t for t in expected) and not any(not t for t in got)
    assert sum(a == b for a, b in zip(got, expected)) == len(TEXTS), list(zip(got, expected))


@pytest.mark.parametrize("budget", [3, 24])
def test_untouched_random_model_beam_4_is_ctranslate2s_and_greedy_is_transformers(untouched, budget):
    """No eos bias: at the defaults beam 4 gives CTranslate2's tokens for all 50 inputs (rule "ctranslate2")
    and no empty best hypothesis where CTranslate2 has none; greedy search (the default rule) gives
    transformers' generate() tokens."""
    tok, translator, engine, hf = untouched
    ids = [tok(t).input_ids for t in TEXTS]
    default = SearchOptions().min_length
    expected = theirs(tok, translator, ids, 4, budget, min_length=1)
    got = ours(engine, ids, 4, budget, "ctranslate2", min_length=default)
    assert sum(a == b for a, b in zip(got, expected)) == len(TEXTS), list(zip(got, expected))
    assert not any(not g and e for g, e in zip(got, expected))
    with torch.no_grad():
        out = hf.generate(**tok(TEXTS, return_tensors="pt", padding=True), num_beams=1, do_sample=False,
                          max_new_tokens=budget)
    hf_tokens = [[t for t in row[1:] if t not in (tok.pad_token_id, tok.eos_token_id)] for row in out.tolist()]
    assert ours(engine, ids, 1, budget, "transformers", min_length=default) == hf_tokens
