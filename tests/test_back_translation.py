"""Tagged back-translation (model/back_translate.py, model/vocab.py): a vocabulary extended by a control piece keeps
every old piece and translation, the <bt> tag goes on synthetic sources only, `model.data --back-translate` writes
the synthetic pairs it says, and a package exported from a checkpoint trained on the extended vocabulary serves."""

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from model import back_translate, train
from model.back_translate import monolingual, read_back_translations
from model.corpus.text import CorpusError
from model.corpus.tsv import read_pairs
from model.data import main as data_main
from model.export import export_package
from model.tokenizer import BT_PIECE, EOS_ID, Tokenizer
from model.upgrade import load_weights
from model.vocab import extend_model, extend_package, extend_tokenizer
from service.inference.engine import Engine
from service.shared.package import load_package

from conftest import FIXTURES, ROOT, TINY, pairs64, start_server, stop_server

DING = FIXTURES / "ding_sample.txt"
DEFAULT_SPM = ROOT / "models" / "de-en" / "spm.model"


@pytest.fixture(scope="module")
def extended(tiny_package, tmp_path_factory) -> Path:
    """tiny_package with <bt> appended to its vocabulary."""
    out = tmp_path_factory.mktemp("extended") / "tiny-bt"
    extend_package(tiny_package, [BT_PIECE], out)
    return out


def test_extending_the_vocabulary_keeps_every_piece_id_and_the_greedy_translations(tiny_package, extended):
    old, new = Tokenizer(tiny_package / "spm.model"), Tokenizer(extended / "spm.model")
    assert new.vocab_size == old.vocab_size + 1
    assert [new.sp.id_to_piece(i) for i in range(old.vocab_size)] == [old.sp.id_to_piece(i)
                                                                     for i in range(old.vocab_size)]
    assert new.bt_id() == old.vocab_size and new.sp.is_control(new.bt_id())
    with pytest.raises(ValueError, match="model.vocab"):
        old.bt_id()
    texts = [de for de, _ in pairs64()]
    # A control symbol is never matched in text: a client's "<bt>" is cut as before, into ordinary pieces.
    assert new.encode_batch([*texts, f"{BT_PIECE} {texts[0]}"]) == old.encode_batch([*texts, f"{BT_PIECE} {texts[0]}"])
    assert new.decode([new.bt_id(), *new.encode(texts[0])]) == texts[0]

    before, after = (Engine(p, device="cpu", intra_op_threads=1) for p in (tiny_package, extended))
    a = before.translate(texts, source_lang="de", target_lang="en", beam_size=1)
    b = after.translate(texts, source_lang="de", target_lang="en", beam_size=1)
    assert [t.text for t in b] == [t.text for t in a]
    # The new row's logit is the mean of the others': it only adds a little to each step's normaliser.
    assert np.allclose([t.score for t in b], [t.score for t in a], atol=0.05)
    assert json.loads((extended / "model.json").read_text())["vocabulary_extended"]["ids"] == [old.vocab_size]


def test_new_embedding_rows_are_the_mean_of_the_ordinary_pieces_rows(tiny_package):
    model, _ = load_weights(tiny_package)
    bigger = extend_model(model, 2)
    old = model.embed.weight.detach()
    assert bigger.config.vocab_size == model.config.vocab_size + 2
    assert bigger.embed.weight[:len(old)].detach().equal(old)
    mean = old[EOS_ID + 1:].mean(dim=0)
    assert all(bigger.embed.weight[len(old) + k].detach().allclose(mean) for k in range(2))
    assert not bigger.final_logits_bias[len(old):].any()


def test_init_from_adds_the_rows_for_a_tokenizer_that_appends_pieces_to_the_packages(tiny_package, extended):
    model = train.weights_of_package(tiny_package, Tokenizer(extended / "spm.model"))
    reference, _ = load_weights(extended)
    assert model.config.vocab_size == reference.config.vocab_size
    assert model.embed.weight.detach().allclose(reference.embed.weight.detach(), atol=1e-6)
    with pytest.raises(SystemExit, match="model.vocab"):
        train.weights_of_package(tiny_package, Tokenizer(DEFAULT_SPM))


def test_appending_a_piece_the_vocabulary_has_is_refused(tmp_path):
    with pytest.raises(ValueError, match="<2en>"):
        extend_tokenizer(DEFAULT_SPM, ["<2en>"], tmp_path / "spm.model")


def test_the_bt_tag_goes_after_the_target_tag_on_synthetic_sources_only(tmp_path):
    tok = extend_tokenizer(DEFAULT_SPM, [BT_PIECE], tmp_path / "spm.model")
    rows = [("Das Haus ist groß.", "The house is big.", "ding"),
            ("Der Hund schläft.", "The dog sleeps.", "bt-fortunes:de"),        # German machine-made: trains de→en
            ("Ich habe keine Zeit.", "I have no time.", "bt-fortunes-de:en")]  # English machine-made: trains en→de
    path = tmp_path / "train.tsv"
    path.write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
    arrays = train.encode_pairs(path, tok, [("de", "en"), ("en", "de")], True, 200)
    examples = [(e.src, e.tgt) for e in arrays.examples()]
    en, de, bt = tok.lang_id("en"), tok.lang_id("de"), tok.bt_id()

    def src(text, tag, synthetic=False):
        return [tag, *([bt] if synthetic else []), *tok.encode(text), EOS_ID]

    assert sorted(examples) == sorted([
        (src("Das Haus ist groß.", en), tok.encode("The house is big.")),
        (src("The house is big.", de), tok.encode("Das Haus ist groß.")),
        (src("Der Hund schläft.", en, True), tok.encode("The dog sleeps.")),
        (src("I have no time.", de, True), tok.encode("Ich habe keine Zeit."))])
    assert all(bt not in t for _, t in examples)
    assert tok.source_ids("Der Hund schläft.", "en", synthetic=True) == src("Der Hund schläft.", en, True)
    # A corpus without synthetic pairs never asks for the piece: the committed vocabulary still trains on it.
    path.write_text("\t".join(rows[0]) + "\n", encoding="utf-8")
    assert len(train.encode_pairs(path, Tokenizer(DEFAULT_SPM), [("de", "en"), ("en", "de")], True, 200)) == 2


def fake_fortunes(cache: Path) -> None:
    """An unpacked fortunes-de and fortunes in the download cache (model/corpus/debian.py reuses them)."""
    de = cache / "extracted" / "fortunes-de" / "usr/share/games/fortunes/de"
    en = cache / "extracted" / "fortunes" / "usr/share/games/fortunes"
    de.mkdir(parents=True)
    en.mkdir(parents=True)
    (de / "witze").write_text("Ein Mann geht in eine Bar. Er bestellt ein Bier und\nsetzt sich an den Tisch.\n"
                              "\t\t-- Anonym\n%\nViel zu kurz.\n%\nEin Mann geht in eine Bar.\n%\n"
                              "This is the English original of a joke.\n%\n", encoding="utf-8")
    (de / "asciiart").write_text("Das ist nur eine Zeichnung hier.\n%\n", encoding="utf-8")
    (en / "wisdom").write_text("A penny saved is a penny earned. Mr. Smith said it twice.\n%\n"
                               "Where is the station?\n%\n", encoding="utf-8")
    (en / "wisdom.dat").write_bytes(b"\0\1")


def test_extract_splits_filters_and_leaves_out_held_out_sentences(tmp_path):
    fake_fortunes(tmp_path / "debs")
    sentences, info = monolingual(["fortunes-de", "fortunes"], tmp_path / "debs",
                                  held={"where is the station"})
    assert sentences["de"] == [("Ein Mann geht in eine Bar.", "fortunes-de"),
                               ("Er bestellt ein Bier und setzt sich an den Tisch.", "fortunes-de")]
    assert sentences["en"] == [("A penny saved is a penny earned.", "fortunes"),
                               ("Mr. Smith said it twice.", "fortunes")]
    assert info["fortunes-de"] | {"version": None} == {
        "lang": "de", "version": None, "licence": "GPL-2+", "origin": "bt-fortunes-de:en",
        "raw": 3, "kept": 2, "duplicate": 1}
    assert info["fortunes"]["held_out"] == 1 and info["fortunes"]["origin"] == "bt-fortunes:de"
    with pytest.raises(CorpusError, match="no monolingual reader"):
        monolingual(["hedgewars-data"], tmp_path / "debs", set())


def test_back_translate_writes_synthetic_pairs_after_the_real_ones_and_never_into_dev_or_test(tmp_path, capsys):
    common = ["--ding", str(DING), "--no-locale", "--test-size", "3", "--dev-size", "2"]
    assert data_main([*common, "--out", str(tmp_path / "real")]) == 0
    test_de = read_pairs(tmp_path / "real" / "test.tsv")[0][0]
    real_de, real_en = read_pairs(tmp_path / "real" / "train.tsv")[0]
    mono = tmp_path / "bt-mono"
    mono.mkdir()
    (mono / "meta.json").write_text(json.dumps({"packages": {
        "fortunes-de": {"licence": "GPL-2+", "version": "0.35-1"}, "fortunes": {"licence": "BSD-3-Clause"}}}))
    (mono / "de.bt.tsv").write_text(
        "Er bestellt ein Bier und setzt sich.\tHe orders a beer and sits down.\tbt-fortunes-de:en\n"
        f"{test_de}\tA test sentence, translated.\tbt-fortunes-de:en\n"                  # a test side: a leak
        f"{real_de}\t{real_en}\tbt-fortunes-de:en\n"                                     # a real pair: kept as real
        "Kurz und gut.\tShort and good, " + "and on and on " * 10 + "\tbt-fortunes-de:en\n",  # ratio: dropped
        encoding="utf-8")
    (mono / "en.bt.tsv").write_text("A penny saved is a penny earned.\tEin gesparter Pfennig ist ein verdienter.\t"
                                    "bt-fortunes:de\n", encoding="utf-8")
    argv = [*common, "--out", str(tmp_path / "bt"), "--back-translate", str(mono / "de.bt.tsv"),
            "--back-translate", str(mono / "en.bt.tsv")]
    assert data_main(argv) == 0
    for name in ("dev", "test"):
        assert (tmp_path / "bt" / f"{name}.tsv").read_bytes() == (tmp_path / "real" / f"{name}.tsv").read_bytes()
    rows = [line.split("\t") for line in (tmp_path / "bt" / "train.tsv").read_text(encoding="utf-8").splitlines()]
    synthetic = sorted(r for r in rows if r[2].startswith("bt-"))
    assert synthetic == [["Ein gesparter Pfennig ist ein verdienter.", "A penny saved is a penny earned.",
                          "bt-fortunes:de"],
                         ["Er bestellt ein Bier und setzt sich.", "He orders a beer and sits down.",
                          "bt-fortunes-de:en"]]
    assert len(rows) == len(read_pairs(tmp_path / "real" / "train.tsv")) + 2
    meta = json.loads((tmp_path / "bt" / "meta.json").read_text())
    assert meta["counts"]["bt-fortunes-de"] == {"raw": 4, "kept": 2}      # the leak leaves in the split, after
    assert meta["dropped"]["bt-fortunes-de"] == {"duplicate": 1, "length_ratio": 1}
    assert meta["origins"]["bt-fortunes:de"] == 1
    assert meta["licences"]["bt-fortunes-de"].startswith("GPL-2+ (Debian fortunes-de 0.35-1; machine-translated")
    assert meta["leaks_removed"] >= 1


def test_a_back_translation_file_of_another_shape_is_refused(tmp_path):
    path = tmp_path / "de.bt.tsv"
    path.write_text("Nur eine Spalte.\tOnly a column.\tding\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"de\.bt\.tsv:1: not real<TAB>translation"):
        list(read_back_translations(path))
    assert back_translate.synthetic_lang("bt-fortunes:de") == "de" and back_translate.synthetic_lang("ding") is None


def test_a_package_exported_from_a_checkpoint_trained_with_bt_pairs_serves(extended, data_dir, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    pairs = pairs64()
    synthetic = "".join(f"{de}\t{en}\tbt-test:de\n" for de, en in pairs[:16])    # German machine-made: de→en
    (data / "train.tsv").write_text((data_dir / "train.tsv").read_text(encoding="utf-8") + synthetic,
                                    encoding="utf-8")
    for split in ("dev", "test"):
        (data / f"{split}.tsv").write_text((data_dir / f"{split}.tsv").read_text(encoding="utf-8"), encoding="utf-8")
    (data / "meta.json").write_text(json.dumps({"langs": ["de", "en"]}))
    step = json.loads((extended / "model.json").read_text())["training"]["step"]
    run = tmp_path / "run"
    train.main(["--data", str(data), "--out", str(run), "--direction", "de-en", "--init-from", str(extended),
                "--max-steps", str(step + 5), "--eval-every", "0", "--eval-sentences", "8", "--threads", "1", *TINY])
    package = tmp_path / "package"
    export_package(run, package)
    loaded = load_package(package)                      # the service's package checks (files, sizes, hashes)
    assert loaded.config["vocab_size"] == Tokenizer(package / "spm.model").vocab_size
    assert Tokenizer(package / "spm.model").bt_id() == loaded.config["vocab_size"] - 1
    proc, url = start_server(package)
    try:
        texts = [de for de, _ in pairs[:8]] + [f"{BT_PIECE} {pairs[0][0]}"]
        r = httpx.post(url + "/translate", json={"text": texts, "source_lang": "de", "target_lang": "en"}, timeout=60)
        assert r.status_code == 200, r.text
        out = [t["text"] for t in r.json()["translations"]]
        assert len(out) == len(texts) and all(out) and not any(BT_PIECE in t for t in out)
    finally:
        stop_server(proc)
