"""model.upgrade: a package's weights read back out of its ONNX graphs and exported again.

The committed models/ packages were upgraded this way from the older graph layout (their model cards
say so); here the round trip is checked on the tiny fixtures, whose checkpoints are at hand.
"""

import json
import re
import shutil

import numpy as np
import onnx
import pytest
import torch

from model import evaluate
from model.export import _sha256, export_package
from model.upgrade import graph_weights, load_weights, main as upgrade_main
from service.engine import Engine, PackageError

from conftest import pairs64

SOURCES = [de for de, _ in pairs64()]


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


def test_an_upgraded_int8_package_keeps_its_int8_weights_and_translations(tiny_run, tmp_path, capsys):
    old, new = tmp_path / "old", tmp_path / "new"
    export_package(tiny_run, old, quantize="int8")
    (old / "MODEL_CARD.md").write_text("# tiny\n")
    upgrade_main([str(old), "--out", str(new)])
    assert "wrote" in capsys.readouterr().out
    for graph in ("encoder.onnx", "decoder.onnx"):
        a, b = graph_weights(old / graph), graph_weights(new / graph)
        assert set(a) == set(b)
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    meta_old, meta_new = (json.loads((p / "model.json").read_text()) for p in (old, new))
    for key in ("precision", "directions", "config", "special_ids", "tokenizer", "training", "name"):
        assert meta_new[key] == meta_old[key], key
    assert (new / "MODEL_CARD.md").read_text() == "# tiny\n"
    # Same graphs, so the same outputs.
    texts = [Engine(p, device="cpu", intra_op_threads=1).translate(SOURCES, source_lang="de", target_lang="en",
                                                                   beam_size=4) for p in (old, new)]
    assert [t.text for t in texts[0]] == [t.text for t in texts[1]]


def test_upgrade_refuses_to_overwrite_its_input(tiny_package):
    with pytest.raises(ValueError, match="--out must differ"):
        upgrade_main([str(tiny_package), "--out", str(tiny_package)])


def test_an_older_graph_layout_is_refused_with_the_upgrade_command(tiny_package, tmp_path):
    """A decoder from before 2026-11-23 took `cross_rows` instead of `sources`: the engine names the fix."""
    pkg = tmp_path / "old-layout"
    shutil.copytree(tiny_package, pkg)
    m = onnx.load(str(pkg / "decoder.onnx"))
    for node in m.graph.node:
        node.input[:] = ["cross_rows" if i == "sources" else i for i in node.input]
    for i in m.graph.input:
        if i.name == "sources":
            i.name = "cross_rows"
    onnx.save(m, str(pkg / "decoder.onnx"))
    meta = json.loads((pkg / "model.json").read_text())
    meta["files"]["decoder.onnx"] = {"sha256": _sha256(pkg / "decoder.onnx"),
                                     "bytes": (pkg / "decoder.onnx").stat().st_size}
    (pkg / "model.json").write_text(json.dumps(meta))
    with pytest.raises(PackageError, match=re.escape(f"python -m model.upgrade {pkg} --out NEW_DIR")):
        Engine(pkg, device="cpu")
