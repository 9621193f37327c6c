"""The whole recipe (model/recipe.py) on a CPU with the tiny preset, inside a one-minute budget: train,
export int8 and fp16, evaluate, write the card, cut everything into pieces that JOIN.sh puts back."""

import hashlib
import random
import shutil
import subprocess
import time

import pytest
import torch

from model import recipe

from conftest import TINY


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_the_recipe_trains_exports_evaluates_and_leaves_joinable_pieces_inside_its_budget(data_dir, tmp_path):
    out, started = tmp_path / "out", time.time()
    report = recipe.main(["--data", str(data_dir), "--out", str(out), "--minutes", "1", "--after-training-minutes",
                          "0.4", "--direction", "de-en", "--piece-mb", "0.5",
                          "--", *TINY, "--threads", "1", "--eval-sentences", "8"], started=started)
    # Training keeps its deadline (the budget less the 0.4 minutes reserved for what follows) whatever the
    # load, since it measures its own pace; what follows is fixed work that a loaded CI machine slows down
    # (96 s in all once, beside three other jobs), so the whole run is held to the bar of 2 minutes.
    assert report["stage_seconds"]["train"] <= 0.6 * 60 + 10, report["stage_seconds"]
    assert time.time() - started <= 120 and report["wall_minutes"] <= 2.0

    assert report["training"]["step"] > 50 and report["training"]["directions"] == ["de-en"]
    assert report["pairs"] == {"train": 64, "dev": 64, "test": 64}
    int8 = report["evaluation"]["package-int8"]["scores"]
    assert int8["sentences"] == 64 and int8["precision"] == "int8" and {"greedy", "beam4"} <= set(int8)
    fp16 = report["evaluation"]["package-fp16"]
    if recipe.cuda_onnxruntime() is None:
        assert fp16["scores"]["precision"] == "fp16"
    else:
        assert "CUDAExecutionProvider" in fp16["skipped"]
    card = (out / "MODEL_CARD.md").read_text()
    assert f"| package-int8 | int8 | {int8['greedy']['bleu']:.2f} | {int8['greedy']['chrf']:.2f} |" in card
    assert "python -m model.recipe" in card and "train 64 pairs" in card and "package-fp16" in card

    pieces = sorted((out / "pieces").glob("outputs.tar.xz.part-*"))
    assert len(pieces) > 2 and all(p.stat().st_size <= 0.5e6 for p in pieces)
    joined = tmp_path / "joined"
    shutil.copytree(out / "pieces", joined)
    subprocess.run(["sh", "JOIN.sh"], cwd=joined, check=True, capture_output=True)
    produced = recipe.produced_files(out, "all", out / "pieces")
    assert {"run/checkpoint.pt", "package-int8/model.json", "package-fp16/model.json", "MODEL_CARD.md",
            "results.json"} <= {str(f.relative_to(out)) for f in produced}
    for f in produced:
        assert sha256(joined / f.relative_to(out)) == sha256(f), f
    state = torch.load(joined / "run" / "checkpoint.pt", weights_only=False)
    assert state["step"] == report["training"]["step"]

    spot = recipe.produced_files(out, "spot", out / "pieces")
    assert [str(f.relative_to(out)) for f in spot] == list(recipe.SPOT_FILES)


def test_a_broken_piece_fails_the_join(tmp_path):
    root = tmp_path / "files"
    root.mkdir()
    (root / "a.bin").write_bytes(random.Random(0).randbytes(25_600))     # xz cannot shrink it: pieces remain
    pieces = recipe.cut_into_pieces(root, [root / "a.bin"], tmp_path / "pieces", 10_000)
    assert len(pieces) >= 3 and all(p.stat().st_size <= 10_000 for p in pieces)   # tar adds headers, padding
    pieces[1].write_bytes(pieces[1].read_bytes()[:-1] + b"x")
    join = subprocess.run(["sh", "JOIN.sh"], cwd=tmp_path / "pieces", capture_output=True, text=True)
    assert join.returncode != 0 and "FAILED" in join.stdout + join.stderr
    assert not (tmp_path / "pieces" / "a.bin").exists()
