"""scripts/gpu-session.sh's `measure`, dry-run on the CPU (issue 55 item 6): the device call's whole script with
DEVICE=cpu, the tiny packages and a short budget. Every stage runs or fails alone and the script goes on (the
CUDA agreement stages cannot run without CUDA); what a call brings back is there: the GPU benchmark's report,
the serving tables, every stage's log in one file, and the recipe's checkpoint in pieces that JOIN.sh puts back."""

import lzma
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import ROOT

pytestmark = pytest.mark.slow   # every stage of a GPU session, each on the tiny models


def test_measure_on_a_cpu_brings_back_the_reports_the_logs_and_the_recipes_pieces(tiny_package, tiny_lm_package,
                                                                                   data_dir, tmp_path):
    corpus = tmp_path / "gpu-data"                      # what `pack` makes of the corpus
    corpus.mkdir()
    for name in ("dev.tsv", "test.tsv", "meta.json"):
        shutil.copy(data_dir / name, corpus / name)
    (corpus / "train.tsv.xz").write_bytes(lzma.compress((data_dir / "train.tsv").read_bytes()))
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}", "OUT": str(out),
           "DEVICE": "cpu", "PACKAGE": str(tiny_package), "LM_PACKAGE": str(tiny_lm_package),
           "GPU_DATA": str(corpus), "WORK": str(tmp_path / "work"), "BUDGET_S": "240",
           "SERVE_SECONDS": "1", "SERVE_CONCURRENCY": "1,8", "AFTER_TRAINING_MINUTES": "0.35",
           "MIN_TRAINING_MINUTES": "0.1", "RECIPE_MINUTES": "0.6", "RECIPE_OPTS": "--direction de-en --piece-mb 1",
           "TRAIN_OPTS": "--threads 1 --eval-every 0 --eval-sentences 8 --max-tokens 2000"}
    run = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-session.sh"), "measure"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:]

    status = dict(re.findall(r"^== (\S+): status (\d+) after", log, re.M))
    assert status["gpu-bench"] == "0" and status["copies"] == "0" and status["serving"] == "0", log[-4000:]
    assert status["agreement"] != "0"                  # no CUDA here: it says so, and the script went on
    assert status["recipe"] == "0", log[-4000:]
    stages = (out / "stages.log").read_text()                                # every stage's output came back
    assert set(status) == set(re.findall(r"^== (\S+): status \d+ after", stages, re.M))
    agreement = stages[stages.index("== agreement: limit"):stages.index("== agreement: status")]
    assert "no CUDAExecutionProvider" in agreement
    ops = stages[stages.index("== ops: limit"):stages.index("== ops: status")]
    assert "total from the host, one address" in ops and status["ops"] == "0"
    # A device call brings back 8 files at most (on 2026-12-04 per-stage logs made 12, the pieces stayed behind).
    assert len([p for p in out.rglob("*") if p.is_file()]) <= 8, sorted(out.rglob("*"))

    assert "ratio_vs_ctranslate2_gpu" in (out / "gpu-h200.md").read_text()
    assert "| closed | 8 clients |" in (out / "serving-gpu.md").read_text()

    joined = tmp_path / "joined"                       # the checkpoint's pieces, joined as back home
    shutil.copytree(out / "pieces", joined)
    subprocess.run(["sh", "JOIN.sh"], cwd=joined, check=True, capture_output=True)
    state = torch.load(joined / "run" / "checkpoint.pt", weights_only=False)
    assert state["step"] > 500                         # went on from the tiny package's 500 steps (--init-from)
    assert "BLEU greedy" in stages[stages.index("== recipe: status"):]          # the recipe's model card
