"""Training and evaluation end to end on real sentence pairs (64 Ding sentences, tests/fixtures/pairs64.tsv,
from Debian's trans-de-en, GPL-2+)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model import evaluate, train
from model.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, train_tokenizer

from conftest import FIXTURES, ROOT, TINY


def test_tokenizer_has_fixed_special_ids_and_language_tags(tmp_path):
    texts = [line for row in (FIXTURES / "pairs64.tsv").read_text(encoding="utf-8").splitlines() for line in row.split("\t")]
    tok = train_tokenizer(texts, tmp_path / "spm", vocab_size=200, languages=["de", "en"])
    sp = tok.sp
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert tok.languages() == ["de", "en"]
    assert tok.lang_id("de") == 4 and tok.lang_id("en") == 5
    with pytest.raises(ValueError, match="no language tag <2fr>"):
        tok.lang_id("fr")
    ids = tok.source_ids("Das geht zu weit.", "en")
    assert ids[0] == tok.lang_id("en") and ids[-1] == EOS_ID
    assert tok.decode(ids) == "Das geht zu weit."
    assert Tokenizer(tmp_path / "spm.model").encode("Daran wirst du nicht sterben.") == tok.encode("Daran wirst du nicht sterben.")


def test_tiny_model_overfits_64_pairs_to_bleu_90(tiny_run, data_dir, capsys):
    capsys.readouterr()
    evaluate.main(["--checkpoint", str(tiny_run), "--data", str(data_dir / "test.tsv"), "--beam", "4", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert result["sentences"] == 64
    assert result["greedy"]["bleu"] >= 90, result
    assert result["beam4"]["bleu"] >= 90, result
    assert result["greedy"]["bleu_signature"].startswith("nrefs:1|case:mixed")


def test_training_writes_resumable_checkpoints(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    train.main(["--data", str(data_dir), "--out", str(out), "--direction", "both", "--max-steps", "6",
                "--eval-every", "0", "--eval-sentences", "4", *TINY])
    first = torch.load(out / "checkpoint.pt", weights_only=False)
    assert first["step"] == 6 and first["directions"] == ["de-en", "en-de"] and first["tagged"]
    capsys.readouterr()
    train.main(["--data", str(data_dir), "--out", str(out), "--direction", "both", "--max-steps", "10",
                "--eval-every", "0", "--eval-sentences", "4", *TINY])
    assert "resumed" in capsys.readouterr().out
    second = torch.load(out / "checkpoint.pt", weights_only=False)
    assert second["step"] == 10
    assert any(not torch.equal(first["model"][k], second["model"][k]) for k in first["model"])
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert {"dev_loss", "bleu_de-en", "bleu_en-de", "step"} <= set(log[-1])


def test_evaluate_rejects_a_direction_the_model_does_not_have(tiny_run, data_dir):
    with pytest.raises(SystemExit, match="translates de-en"):
        evaluate.main(["--checkpoint", str(tiny_run), "--data", str(data_dir / "test.tsv"), "--direction", "en-de"])


def test_torchrun_trains_with_two_processes(data_dir, tmp_path):
    out = tmp_path / "ddp"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "model.train", "--data", str(data_dir), "--out", str(out), "--direction", "de-en",
           "--max-steps", "4", "--eval-every", "0", "--eval-sentences", "4", *TINY, "--max-tokens", "300",
           "--threads", "1"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "device cpu x2" in proc.stdout
    assert torch.load(out / "checkpoint.pt", weights_only=False)["step"] == 4
