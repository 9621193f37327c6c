"""model.upgrade: a package's weights read back out of its ONNX graphs and exported again.

The committed models/ packages were upgraded this way from the older graph layout (their model cards
say so). Here: the round trip on the tiny fixtures, whose checkpoints are at hand, and a real
older-layout package (tests/fixtures/old-layout-tiny, exported by the code of that time).
"""

import json
import re

import onnx
import pytest
import torch

from model import evaluate
from model.export import export_package
from model.upgrade import load_weights, main as upgrade_main
from service.engine import Engine, PackageError

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


def test_an_upgraded_int8_package_has_the_same_int8_weights_and_metadata(tiny_run, tmp_path, capsys):
    old, new = tmp_path / "old", tmp_path / "new"
    export_package(tiny_run, old, quantize="int8")
    (old / "MODEL_CARD.md").write_text("# tiny\n")
    upgrade_main([str(old), "--out", str(new)])
    assert "wrote" in capsys.readouterr().out
    assert int8_weights(new) == int8_weights(old) and len(int8_weights(old)) > 10
    meta_old, meta_new = (json.loads((p / "model.json").read_text()) for p in (old, new))
    for key in ("precision", "directions", "config", "special_ids", "tokenizer", "training", "name"):
        assert meta_new[key] == meta_old[key], key
    assert (new / "MODEL_CARD.md").read_text() == "# tiny\n"


def test_an_older_layout_package_is_refused_then_upgraded_and_translates(tmp_path):
    """The fixture has a stacked past_kv cache, cross_rows and no top_k: the engine names the command,
    and the command's package translates the 64 memorised pairs (measured: 64 greedy, 63 beam 4)."""
    old = FIXTURES / "old-layout-tiny"
    with pytest.raises(PackageError, match=r"without top_k, sources, one cache per layer.*"
                       + re.escape(f"python -m model.upgrade {old} --out NEW_DIR")):
        Engine(old, device="cpu")
    upgrade_main([str(old), "--out", str(tmp_path / "new")])
    engine = Engine(tmp_path / "new", device="cpu", intra_op_threads=1)
    assert engine.past_names[:2] == ["past_key_0", "past_value_0"]
    for beam in (1, 4):
        out = engine.translate(SOURCES, source_lang="de", target_lang="en", beam_size=beam)
        assert sum(t.text == en for t, (_, en) in zip(out, PAIRS)) >= 60, beam


def test_upgrade_refuses_to_overwrite_its_input(tiny_package):
    with pytest.raises(ValueError, match="--out must differ"):
        upgrade_main([str(tiny_package), "--out", str(tiny_package)])


def test_upgrade_sends_an_imported_marian_package_back_to_its_importer(tmp_path):
    (tmp_path / "model.json").write_text(json.dumps({"tokenizer": {"source": "source.spm", "vocab": "vocab.json"}}))
    with pytest.raises(ValueError, match="model.import_marian"):
        load_weights(tmp_path)
