"""Marian (OPUS-MT) interoperability, offline: a small MarianMTModel built here from a MarianConfig and
SentencePiece models trained on the 64 test pairs, imported with model.import_marian and compared with
transformers token for token; and the reverse, our tiny checkpoint written with model.export_marian and
run by transformers and by CTranslate2 (converted with ct2-transformers-converter)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import sentencepiece as spm  # noqa: E402

from conftest import pairs64, start_server, stop_server  # noqa: E402
from service.inference.decoders import OrtDecoder  # noqa: E402
from service.inference.engine import Engine  # noqa: E402
from service.shared.options import SearchOptions  # noqa: E402

TEXTS = [de for de, _ in pairs64()][:50]
MAX_NEW = 40
# Two beam search hypotheses whose scores are closer than this are a tie, which float summation order
# (onnxruntime's against PyTorch's) may break either way. Ours and transformers' best scores agree to
# 4e-7 here, and the closest two best hypotheses of one input are 3e-3 apart.
TIE = 1e-4


def build_marian(out: Path) -> Path:
    """A MarianMTModel in OPUS-MT's layout (source.spm, target.spm, vocab.json with </s>=0 and <pad>
    last, swish, scaled embeddings, a final logits bias), saved with save_pretrained. Randomly
    initialised, then 80 Adam steps on the 64 pairs: a random Marian writes the same tokens for every
    input, which would make the comparison below say little."""
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    out.mkdir(parents=True, exist_ok=True)
    pairs = pairs64()
    for side, k in (("source", 0), ("target", 1)):
        (out / f"{side}.txt").write_text("\n".join(p[k] for p in pairs), encoding="utf-8")
        spm.SentencePieceTrainer.train(input=str(out / f"{side}.txt"), model_prefix=str(out / side), vocab_size=150,
                                       model_type="unigram", character_coverage=1.0, pad_id=-1, bos_id=-1,
                                       eos_id=1, unk_id=0, hard_vocab_limit=False, minloglevel=2)
        (out / f"{side}.model").rename(out / f"{side}.spm")
    pieces = ["</s>", "<unk>"]
    for side in ("source", "target"):
        sp = spm.SentencePieceProcessor(model_file=str(out / f"{side}.spm"))
        pieces += [p for p in (sp.id_to_piece(i) for i in range(sp.get_piece_size()))
                   if p not in pieces and p not in ("<unk>", "</s>")]
    pieces.append("<pad>")
    (out / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}, ensure_ascii=False))
    V = len(pieces)
    config = MarianConfig(vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                          max_position_embeddings=128, pad_token_id=V - 1, decoder_start_token_id=V - 1,
                          eos_token_id=0, forced_eos_token_id=0, activation_function="swish", scale_embedding=True,
                          bad_words_ids=[[V - 1]], dropout=0.0)
    tok = MarianTokenizer(str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json"),
                          source_lang="de", target_lang="en")
    torch.manual_seed(0)
    model = MarianMTModel(config)
    with torch.no_grad():   # wider than transformers' init (std 0.02), which 40 steps do not move far enough
        for name, p in model.named_parameters():
            if p.dim() > 1 and "embed_positions" not in name:
                p.normal_(0, 0.05)
    batch = tok([p[0] for p in pairs], text_target=[p[1] for p in pairs], return_tensors="pt", padding=True)
    labels = batch["labels"].masked_fill(batch["labels"] == V - 1, -100)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    # On one thread: the trained weights depend on torch's thread count, so with the machine's core count
    # every machine would test a different model (and its own near-ties).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(80):
            loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    with torch.no_grad():
        model.final_logits_bias.normal_(0, 0.1)   # a real one is imported, not assumed zero
    model.eval().save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory):
    return build_marian(tmp_path_factory.mktemp("marian") / "opus-mt-de-en")


@pytest.fixture(scope="module")
def hf(marian_dir):
    from transformers import MarianMTModel, MarianTokenizer

    return MarianMTModel.from_pretrained(str(marian_dir)).eval(), MarianTokenizer.from_pretrained(str(marian_dir))


@pytest.fixture(scope="module")
def marian_package(marian_dir, tmp_path_factory):
    from model.import_marian import import_marian

    out = tmp_path_factory.mktemp("pkg") / "opus-mt-de-en"
    import_marian(marian_dir, out)   # languages from the opus-mt-de-en name / tokenizer_config.json
    return out


def hf_tokens(out: "torch.Tensor", tok) -> list[list[int]]:
    """generate() rows -> generated ids without the decoder start, </s> and padding."""
    return [[t for t in row[1:] if t not in (tok.pad_token_id, tok.eos_token_id)] for row in out.tolist()]


def hf_beams(model, tok, texts: list[str], beam: int, max_new_tokens: int) -> list[list[tuple[list[int], float]]]:
    """transformers' beam search: for each text its `beam` finished hypotheses, best first, as
    (generated ids, score: log-prob per generated token, </s> included)."""
    with torch.no_grad():
        out = model.generate(**tok(texts, return_tensors="pt", padding=True), num_beams=beam, num_return_sequences=beam,
                             do_sample=False, max_new_tokens=max_new_tokens, length_penalty=1.0, early_stopping=True,
                             output_scores=True, return_dict_in_generate=True)
    ids, scores = hf_tokens(out.sequences, tok), out.sequences_scores.tolist()
    return [list(zip(ids[i * beam:(i + 1) * beam], scores[i * beam:(i + 1) * beam])) for i in range(len(texts))]


def assert_same_beam_search(ours: list[list[int] | None], theirs: list[list[tuple[list[int], float]]],
                            max_ties: int):
    """Our best hypothesis for each input is transformers' best, except where transformers itself scores
    another of its finished hypotheses within TIE of its best (a tie) and ours is that one; at most
    max_ties such inputs. A search that differs otherwise (how it scores, prunes, stops or orders) fails."""
    ties = []
    for i, (tokens, hyps) in enumerate(zip(ours, theirs)):
        if tokens == hyps[0][0]:
            continue
        score = None if tokens is None else {tuple(t): s for t, s in hyps}.get(tuple(tokens))
        assert score is not None and abs(score - hyps[0][1]) < TIE, \
            f"input {i}: ours {tokens} (transformers' score {score}), transformers' {hyps[0][0]} ({hyps[0][1]:.6f})"
        ties.append(i)
    assert len(ties) <= max_ties, f"ties at inputs {ties}"


def test_import_writes_a_package_with_the_marian_vocabulary(marian_package):
    meta = json.loads((marian_package / "model.json").read_text())
    assert meta["directions"] == ["de-en"] and meta["tokenizer"]["vocab"] == "vocab.json"
    assert meta["config"]["pe_layout"] == "halves" and meta["config"]["activation"] == "swish"
    V = meta["config"]["vocab_size"]
    assert meta["special_ids"] == {"pad": V - 1, "unk": 1, "bos": V - 1, "eos": 0}


def test_source_ids_equal_marian_tokenizer(marian_package, hf):
    _, tok = hf
    engine = Engine(marian_package, device="cpu")
    assert engine.source_ids(TEXTS, "en") == [tok(t).input_ids for t in TEXTS]


@pytest.mark.parametrize("beam", [1, 4])
def test_engine_equals_transformers_generate(marian_package, hf, beam):
    """All 50 inputs: greedy search token for token; beam 4 the same best hypothesis with the same score,
    ties aside (see assert_same_beam_search)."""
    model, tok = hf
    engine = Engine(marian_package, device="cpu")
    ours = engine.search(engine.source_ids(TEXTS, "en"),
                         SearchOptions(beam_size=beam, max_length_a=0, max_length_b=MAX_NEW, max_length=MAX_NEW))
    if beam == 1:
        with torch.no_grad():
            out = model.generate(**tok(TEXTS, return_tensors="pt", padding=True), num_beams=1, do_sample=False,
                                 max_new_tokens=MAX_NEW)
        assert [h[0].tokens for h in ours] == hf_tokens(out, tok)
    else:
        theirs = hf_beams(model, tok, TEXTS, beam, MAX_NEW)
        assert_same_beam_search([h[0].tokens for h in ours], theirs, max_ties=2)
        for h, hyps in zip(ours, theirs):
            if h[0].tokens == hyps[0][0] and len(h[0].tokens) < MAX_NEW - 1:   # ended before the limit
                assert abs(h[0].score - hyps[0][1]) < TIE, (h[0].score, hyps[0][1])
    texts = [engine.detokenize(h[0].tokens) for h in ours]
    assert texts == tok.batch_decode([h[0].tokens for h in ours], skip_special_tokens=True)
    assert len(set(texts)) >= 8   # the outputs really depend on the input


def test_decoder_log_probs_within_1e4_of_transformers(marian_package, hf):
    """Teacher-forced along transformers' greedy outputs: every step's log-softmax, all 50 inputs."""
    model, tok = hf
    engine = Engine(marian_package, device="cpu")
    enc = tok(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**enc, num_beams=1, do_sample=False, max_new_tokens=MAX_NEW)
        logits = model(**enc, decoder_input_ids=out).logits                        # (B, T, V)
    theirs = torch.log_softmax(logits.double(), -1).numpy()
    src = enc.input_ids.numpy()
    decoder = OrtDecoder(engine.graph, engine.encode(src), src != engine.pad_id)
    worst = 0.0
    for t in range(out.shape[1]):
        ours = decoder.step(out[:, t].numpy())                                      # (B, V)
        worst = max(worst, float(np.abs(ours - theirs[:, t]).max()))
    assert worst < 1e-4, worst


def test_imported_package_is_served(marian_package, hf):
    import httpx

    model, tok = hf
    proc, url = start_server(marian_package)
    try:
        r = httpx.post(url + "/translate", json={"text": TEXTS[:8], "source_lang": "de", "target_lang": "en",
                                                 "beam_size": 4}, timeout=60)
        assert r.status_code == 200, r.text
        theirs = hf_beams(model, tok, TEXTS[:8], 4, 256)
        texts = [t["text"] for t in r.json()["translations"]]
        # The served text is that of transformers' best hypothesis (or of one it ties with).
        by_text = [{tok.decode(ids, skip_special_tokens=True): ids for ids, _ in reversed(hyps)} for hyps in theirs]
        assert_same_beam_search([known.get(text) for known, text in zip(by_text, texts)], theirs, max_ties=1)
        assert r.json()["model"] == "opus-mt-de-en"
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def marian_int8(marian_dir, data_dir, tmp_path_factory):
    """The Marian model imported as int8-static by the command, calibrated on the 64 pairs (model.data's
    de/en/origin TSV, read de-en)."""
    from model.import_marian import main

    out = tmp_path_factory.mktemp("pkg") / "opus-mt-de-en-int8"
    main([str(marian_dir), "--out", str(out), "--quantize", "int8", "--calibration", str(data_dir / "dev.tsv")])
    return out


def greedy_agreement(package, hf) -> int:
    """How many of the 50 inputs the package's greedy search translates as transformers' fp32 model does
    (token for token: int8 rounding moves a near-tie here and there)."""
    model, tok = hf
    engine = Engine(package, device="cpu", intra_op_threads=1)
    ours = engine.search(engine.source_ids(TEXTS, "en"),
                         SearchOptions(beam_size=1, max_length_a=0, max_length_b=MAX_NEW, max_length=MAX_NEW))
    with torch.no_grad():
        out = model.generate(**tok(TEXTS, return_tensors="pt", padding=True), num_beams=1, do_sample=False,
                             max_new_tokens=MAX_NEW)
    return sum(h[0].tokens == t for h, t in zip(ours, hf_tokens(out, tok)))


def static_scales(package) -> dict[str, bytes]:
    return {i.name: i.raw_data for g in ("encoder.onnx", "decoder.onnx")
            for i in onnx.load(str(package / g)).graph.initializer if "/static_int8/" in i.name}


def test_int8_import_is_calibrated_and_translates_as_transformers_mostly(marian_int8, hf):
    meta = json.loads((marian_int8 / "model.json").read_text())
    assert (meta["precision"], meta["quantization"], meta["calibration"]) == ("int8", "int8-static", {"sentences": 64})
    assert len(static_scales(marian_int8)) > 10
    assert greedy_agreement(marian_int8, hf) >= 42        # measured 46 of 50


def test_int8_calibration_text_may_be_given_as_sentences(marian_int8, marian_dir, tmp_path):
    """A benchmark's own list of (source, target language) calibrates exactly as the same text in a file."""
    from model.import_marian import import_marian

    import_marian(marian_dir, tmp_path / "int8", quantize="int8", calibration=[(de, "en") for de, _ in pairs64()])
    assert static_scales(tmp_path / "int8") == static_scales(marian_int8)


def test_int8_import_needs_calibration_text_and_int8_rows_none(marian_dir, hf, tmp_path):
    from model.import_marian import import_marian

    with pytest.raises(ValueError, match=r"pass --calibration FILE.*or --quantize int8-rows"):
        import_marian(marian_dir, tmp_path / "static", quantize="int8")
    assert not (tmp_path / "static").exists()
    import_marian(marian_dir, tmp_path / "rows", quantize="int8-rows")
    meta = json.loads((tmp_path / "rows" / "model.json").read_text())
    assert (meta["precision"], meta["quantization"], "calibration" in meta) == ("int8", "int8-rows", False)
    assert greedy_agreement(tmp_path / "rows", hf) >= 45  # measured 49 of 50


def test_an_int8_import_with_7_bit_weights_records_them(marian_dir, tmp_path):
    from model.import_marian import main

    main([str(marian_dir), "--out", str(tmp_path / "w7"), "--quantize", "int8-rows", "--int8-weight-bits", "7"])
    assert json.loads((tmp_path / "w7" / "model.json").read_text())["weight_bits"] == 7
    weights = [onnx.numpy_helper.to_array(i) for i in onnx.load(str(tmp_path / "w7" / "decoder.onnx")).graph.initializer
               if i.data_type == onnx.TensorProto.INT8]
    assert weights and max(int(np.abs(w.astype(np.int16)).max()) for w in weights) == 63


def test_unsupported_checkpoints_are_refused_with_the_reason():
    from transformers import MarianConfig

    from model.import_marian import marian_config

    with pytest.raises(ValueError, match="separate source and target vocabularies"):
        marian_config(MarianConfig(vocab_size=100, decoder_vocab_size=90, share_encoder_decoder_embeddings=False))
    with pytest.raises(ValueError, match="activation 'tanh'"):
        marian_config(MarianConfig(vocab_size=100, activation_function="tanh"))


# --- the reverse: our checkpoint in Marian format ----------------------------------------------------

def test_halves_layout_computes_the_same_function(tiny_run):
    from model.checkpoint import load_checkpoint
    from model.export_marian import to_halves_layout
    from model.transformer import causal_mask, padding_mask

    model, _, _ = load_checkpoint(tiny_run)
    src = torch.randint(4, model.config.vocab_size, (3, 9))
    tgt = torch.randint(4, model.config.vocab_size, (3, 6))
    args = (src, tgt, padding_mask(src, 0), causal_mask(6))
    with torch.no_grad():
        before = model(*args)
        after = to_halves_layout(model)(*args)
    assert model.config.pe_layout == "halves"
    assert (before - after).abs().max() < 1e-4   # the same function, up to float summation order


@pytest.fixture(scope="module")
def exported_marian(tiny_run, tmp_path_factory):
    from model.export_marian import export_marian

    return export_marian(tiny_run, tmp_path_factory.mktemp("hf") / "tiny-marian")


def test_export_marian_runs_the_same_in_transformers(exported_marian, tiny_package):
    from transformers import MarianMTModel, MarianTokenizer

    texts = [de for de, _ in pairs64()]
    ours = Engine(tiny_package, device="cpu").translate(texts, source_lang="de", target_lang="en", beam_size=1)
    tok = MarianTokenizer.from_pretrained(str(exported_marian))
    model = MarianMTModel.from_pretrained(str(exported_marian)).eval()
    with torch.no_grad():
        out = model.generate(**tok(texts, return_tensors="pt", padding=True), num_beams=1, max_new_tokens=100)
    assert tok.batch_decode(out, skip_special_tokens=True) == [t.text for t in ours]


def test_round_trip_through_ctranslate2_gives_our_greedy_output(exported_marian, tiny_package, tmp_path):
    """our checkpoint -> Marian format -> ct2-transformers-converter -> CTranslate2: the same greedy
    translations of the test split as our engine."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from transformers import MarianTokenizer

    converter = Path(sys.executable).parent / "ct2-transformers-converter"
    r = subprocess.run([str(converter), "--model", str(exported_marian), "--output_dir", str(tmp_path / "ct2")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    texts = [de for de, _ in pairs64()]
    ours = Engine(tiny_package, device="cpu").translate(texts, source_lang="de", target_lang="en", beam_size=1)
    tok = MarianTokenizer.from_pretrained(str(exported_marian))
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    sources = [tok.convert_ids_to_tokens(tok(t).input_ids) for t in texts]
    results = translator.translate_batch(sources, beam_size=1, max_decoding_length=256, min_decoding_length=0)
    assert [tok.convert_tokens_to_string(r.hypotheses[0]) for r in results] == [t.text for t in ours]


def test_a_package_exports_to_the_same_marian_weights_as_its_checkpoint(exported_marian, tiny_package, tmp_path):
    """model.export_marian --package reads the weights back out of the package's graphs (fp32: exactly
    the checkpoint's), so it writes the same Marian model as --checkpoint."""
    from safetensors.torch import load_file

    from model.export_marian import main as export_marian_main

    export_marian_main(["--package", str(tiny_package), "--out", str(tmp_path / "from-package")])
    a, b = load_file(exported_marian / "model.safetensors"), load_file(tmp_path / "from-package" / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert (exported_marian / "vocab.json").read_text() == (tmp_path / "from-package" / "vocab.json").read_text()
