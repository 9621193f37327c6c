"""model.upgrade: a package's weights read back out of its ONNX graphs and exported again.

The committed models/ packages were upgraded this way from the older graph layout (their model cards
say so). Here: the round trip on the tiny fixtures, whose checkpoints are at hand, and a real
older-layout package (tests/fixtures/old-layout-tiny, exported by the code of that time).
"""

import json
import re
import shutil

import onnx
import pytest
import torch

from model import evaluate
from model.export import export_package
from model.upgrade import load_weights, main as upgrade_main
from service.inference.engine import Engine
from service.shared.package import PackageError

from conftest import FIXTURES, pairs64

PAIRS = pairs64()
SOURCES = [de for de, _ in PAIRS]


@pytest.mark.parametrize("fixture", ["tiny_run", "tiny_lm_run"])
def test_the_weights_read_from_an_fp32_package_are_the_checkpoints(fixture, request):
    run = request.getfixturevalue(fixture)
    package = request.getfixturevalue(fixture.replace("_run", "_package"))
    model, _, _ = evaluate.load_checkpoint(run)
    upgraded, _ = load_weights(package)
    expected, got = model.state_dict(), upgraded.state_dict()
    assert set(got) == set(expected)
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


def test_the_weights_read_from_an_fp16_package_are_the_checkpoints_in_fp16(tiny_run, tmp_path):
    export_package(tiny_run, tmp_path / "fp16", fp16=True)
    model, _, _ = evaluate.load_checkpoint(tiny_run)
    got = load_weights(tmp_path / "fp16")[0].state_dict()
    for name, value in model.state_dict().items():
        assert torch.equal(got[name], value.half().float()), name


def int8_weights(package) -> list[bytes]:
    """Every int8 initializer of a package's graphs, sorted: the quantized weights, whatever their names."""
    return sorted(i.raw_data for g in ("encoder.onnx", "decoder.onnx") if (package / g).exists()
                  for i in onnx.load(str(package / g)).graph.initializer if i.data_type == onnx.TensorProto.INT8)


@pytest.fixture(scope="module")
def int8_package(tiny_int8, tmp_path_factory):
    """(quantize, weight_bits=8) -> conftest's tiny_int8 export, copied with a model card (carried by an upgrade)."""
    made = {}

    def get(quantize, weight_bits=8):
        key = quantize, weight_bits
        if key not in made:
            made[key] = tmp_path_factory.mktemp(quantize) / "tiny-int8"
            shutil.copytree(tiny_int8(quantize, weight_bits), made[key])
            (made[key] / "MODEL_CARD.md").write_text("# tiny\n")
        return made[key]
    return get


def greedy(package) -> list[tuple[str, float]]:
    out = Engine(package, device="cpu", intra_op_threads=1).translate(SOURCES, source_lang="de", target_lang="en",
                                                                      beam_size=1)
    return [(t.text, t.score) for t in out]


@pytest.mark.parametrize("quantize, scheme, weight_bits", [("int8", "int8-static", 8), ("int8", "int8-static", 7),
                                                         ("int8-rows", "int8-rows", 8)])   # the exports test_engine's
def test_an_upgraded_int8_package_keeps_its_form_int8_weights_metadata_and_answers(
        quantize, scheme, weight_bits, int8_package, data_dir, tmp_path, capsys):
    """int8-rows: the same graph with the same weights, so the same scores to the bit. int8-static is
    calibrated again on fp32 graphs whose weights are the dequantized int8 ones, so its activation scales
    move a little: the same translations, scores within 1e-3 (measured at most 5e-6 on an AMD EPYC, 1.1e-4 on an
    Intel Xeon with AMX; 64 of 64 not equal)."""
    old, new = int8_package(quantize, weight_bits), tmp_path / "new"
    calibration = ["--calibration", str(data_dir / "dev.tsv")] if quantize == "int8" else []
    upgrade_main([str(old), "--out", str(new), *calibration])
    assert "wrote" in capsys.readouterr().out
    assert int8_weights(new) == int8_weights(old) and len(int8_weights(old)) > 10
    meta_old, meta_new = (json.loads((p / "model.json").read_text()) for p in (old, new))
    assert meta_new["quantization"] == scheme and meta_new["weight_bits"] == weight_bits
    for key in ("precision", "quantization", "calibration", "directions", "config", "special_ids", "tokenizer",
                "training", "name", "weight_bits"):
        assert meta_new.get(key) == meta_old.get(key), key
    assert (new / "MODEL_CARD.md").read_text() == "# tiny\n"
    products = [n for n in onnx.load(str(new / "decoder.onnx")).graph.node if n.op_type == "MatMulIntegerToFloat"]
    own_bias = [n for n in products if len(n.input) > 6 and n.input[6].endswith(".bias")]   # int8-static's
    assert products and len(own_bias) == (len(products) if scheme == "int8-static" else 0)
    before, after = greedy(old), greedy(new)
    assert [t for t, _ in after] == [t for t, _ in before]
    worst = max(abs(a - b) for (_, a), (_, b) in zip(after, before))
    assert worst == 0 if scheme == "int8-rows" else worst < 1e-3, worst


def test_an_int8_static_package_is_upgraded_only_with_calibration_text(int8_package, tmp_path):
    with pytest.raises(ValueError, match=r"int8-static.*--calibration FILE"):
        upgrade_main([str(int8_package("int8", 7)), "--out", str(tmp_path / "new")])
    assert not (tmp_path / "new").exists()


def test_an_int8_rows_package_upgraded_with_calibration_text_becomes_int8_static(int8_package, data_dir, tmp_path):
    old, new = int8_package("int8-rows"), tmp_path / "new"
    upgrade_main([str(old), "--out", str(new), "--calibration", str(data_dir / "dev.tsv")])
    assert int8_weights(new) == int8_weights(old)
    assert json.loads((new / "model.json").read_text())["quantization"] == "int8-static"


def test_calibration_text_is_refused_where_nothing_uses_it(tiny_package, data_dir, tmp_path):
    with pytest.raises(ValueError, match=r"--calibration .* re-exported as fp32, which has none"):
        upgrade_main([str(tiny_package), "--out", str(tmp_path / "new"), "--calibration", str(data_dir / "dev.tsv")])


def test_an_older_layout_package_is_refused_then_upgraded_and_translates(tmp_path):
    """The fixture has a stacked past_kv cache, cross_rows, no top_k and a cache the graph reorders and
    appends (past_rows): the engine names the command,
    and the command's package translates the 64 memorised pairs (measured: 64 greedy, 63 beam 4)."""
    old = FIXTURES / "old-layout-tiny"
    with pytest.raises(PackageError, match=r"without positions, top_k, one cache per layer, a cache written in place.*"
                       + re.escape(f"python -m model.upgrade {old} --out NEW_DIR")):
        Engine(old, device="cpu")
    upgrade_main([str(old), "--out", str(tmp_path / "new")])
    engine = Engine(tmp_path / "new", device="cpu", intra_op_threads=1)
    assert engine.past_names[:2] == ["past_key_0", "past_value_0"]
    assert engine.package.meta["quantization"] == "int8-rows"      # per tensor before: no --calibration given
    for beam in (1, 4):
        out = engine.translate(SOURCES, source_lang="de", target_lang="en", beam_size=beam)
        assert sum(t.text == en for t, (_, en) in zip(out, PAIRS)) >= 60, beam


def test_an_older_int8_package_upgraded_with_calibration_text_is_int8_static(data_dir, tmp_path):
    upgrade_main([str(FIXTURES / "old-layout-tiny"), "--out", str(tmp_path / "new"),
                  "--calibration", str(data_dir / "dev.tsv")])
    engine = Engine(tmp_path / "new", device="cpu", intra_op_threads=1)
    assert engine.package.meta["quantization"] == "int8-static"
    assert engine.package.meta["calibration"] == {"sentences": 64}
    out = engine.translate(SOURCES, source_lang="de", target_lang="en", beam_size=1)
    assert sum(t.text == en for t, (_, en) in zip(out, PAIRS)) >= 60


def test_upgrade_refuses_to_overwrite_its_input(tiny_package):
    with pytest.raises(ValueError, match="--out must differ"):
        upgrade_main([str(tiny_package), "--out", str(tiny_package)])


def test_upgrade_sends_an_imported_marian_package_back_to_its_importer(tmp_path):
    (tmp_path / "model.json").write_text(json.dumps({"tokenizer": {"source": "source.spm", "vocab": "vocab.json"}}))
    with pytest.raises(ValueError, match="model.import_marian"):
        load_weights(tmp_path)
