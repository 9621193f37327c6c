"""Checkpoints that fit a spot job's limits and resume the schedule; a wall-clock deadline from the
process's start; SIGTERM saves (model/checkpoint.py, model/train.py)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F

from model import train
from model.checkpoint import compact_optimizer_state, expand_optimizer_state, save_atomically
from model.transformer import Transformer, causal_mask, padding_mask, preset

from conftest import ROOT, TINY


def adam_after_steps(model, steps=3):
    """Adam with real moments: a few steps of next-token loss on random ids."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = torch.randint(4, model.config.vocab_size, (4, 12), generator=g)            # (B, T)
        mask = padding_mask(ids, 0) & causal_mask(ids.size(1))
        logits = model(ids, ids, padding_mask(ids, 0), mask)                              # (B, T, V)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), ids.roll(-1, 1).view(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return optimizer


def test_small_preset_checkpoint_is_at_most_60_mb_and_restores_adam(tmp_path):
    torch.manual_seed(0)
    model = Transformer(preset("small", vocab_size=8000, pad_id=0, bos_id=2, eos_id=3))
    optimizer = adam_after_steps(model)
    path = tmp_path / "checkpoint.pt"
    save_atomically({"model": model.state_dict(), "optimizer": compact_optimizer_state(optimizer.state_dict()),
                     "config": model.config.to_dict(), "step": 3}, path)
    size = path.stat().st_size
    fp32_moments = 2 * 4 * model.num_parameters()
    assert size <= 60e6 and size < 4 * model.num_parameters() + fp32_moments / 2, size

    state = torch.load(path, weights_only=False)
    assert all(torch.equal(state["model"][k], v) for k, v in model.state_dict().items())   # weights exact
    restored = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
    restored.load_state_dict(expand_optimizer_state(state["optimizer"]))
    for key, want in optimizer.state_dict()["state"].items():
        got = restored.state_dict()["state"][key]
        assert float(got["step"]) == float(want["step"]) == 3
        m, v = want["exp_avg"], want["exp_avg_sq"]
        row_max = (m.abs().amax(dim=tuple(range(1, m.dim())), keepdim=True) if m.dim() > 1 else m.abs().max())
        assert (got["exp_avg"] - m).abs().le(row_max / 8 + 1e-30).all()                # fp8: ~6% of the row's max
        assert torch.allclose(got["exp_avg_sq"], v, rtol=1 / 128, atol=0)              # bf16: 8 bits of mantissa
    assert expand_optimizer_state(optimizer.state_dict()) is not None                  # an fp32 checkpoint loads as is


def run_args(data_dir, out, *extra):
    return ["--data", str(data_dir), "--out", str(out), "--direction", "de-en", "--eval-sentences", "4",
            *TINY, "--max-tokens", "300", "--threads", "1", "--seed", "1", *extra]


def test_keep_saves_keeps_the_newest_saves_weights_for_averaging(data_dir, tmp_path):
    """--keep-saves N: every save also writes snap-STEP.pt (weights, config, step; no optimizer), the newest N
    kept (a file that only looks like one stays); model.average takes them."""
    from model.average import main as average_main

    out = tmp_path / "run"
    out.mkdir()
    (out / "snap-notes.pt").write_bytes(b"not a save")
    train.main(run_args(data_dir, out, "--max-steps", "4", "--eval-every", "0", "--save-every-minutes", "0",
                        "--keep-saves", "2"))
    snaps = sorted(p.name for p in out.glob("snap-*.pt"))
    assert snaps == ["snap-3.pt", "snap-4.pt", "snap-notes.pt"], snaps
    snap = torch.load(out / "snap-4.pt", weights_only=False)
    final = torch.load(out / "checkpoint.pt", weights_only=False)
    assert snap["step"] == 4 and "optimizer" not in snap and snap["config"] == final["config"]
    assert all(torch.equal(snap["model"][k], v) for k, v in final["model"].items())
    average_main([str(out / "snap-3.pt"), str(out / "snap-4.pt"), "--out", str(out / "average.pt")])
    assert torch.load(out / "average.pt", weights_only=False)["averaged_steps"] == [3, 4]


def test_a_resumed_run_continues_the_schedule_and_the_data(data_dir, tmp_path):
    """12 steps in one run against 6 + 6 in two: the same step, epoch and batch position, Adam's step
    count and the learning rate of step 12, weights as far along, dev loss alike."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    train.main(run_args(data_dir, straight, "--max-steps", "12", "--eval-every", "0"))
    train.main(run_args(data_dir, split, "--max-steps", "6", "--eval-every", "0"))
    halfway = torch.load(split / "checkpoint.pt", weights_only=False)
    assert halfway["optimizer"]["moments"]                                  # written compacted
    train.main(run_args(data_dir, split, "--max-steps", "12", "--eval-every", "0"))
    a, b = (torch.load(d / "checkpoint.pt", weights_only=False) for d in (straight, split))
    assert (a["step"], a["epoch"], a["batch_pos"]) == (b["step"], b["epoch"], b["batch_pos"]) and b["step"] == 12
    config = json.loads((split / "config.json").read_text())
    want_lr = train.lr_at(12, config["train"]["lr"], config["train"]["warmup"])
    assert b["optimizer"]["param_groups"][0]["lr"] == a["optimizer"]["param_groups"][0]["lr"] == want_lr
    assert all(float(s["step"]) == 12 for s in b["optimizer"]["state"].values())
    moved = sum((b["model"][k] - halfway["model"][k]).norm() for k in a["model"])
    apart = sum((b["model"][k] - a["model"][k]).norm() for k in a["model"])
    assert apart < moved                  # dropout draws differ after a resume; the rounding of the moments is smaller
    assert abs(a["history"][-1]["dev_loss"] - b["history"][-1]["dev_loss"]) < 0.05 * a["history"][-1]["dev_loss"]


@pytest.mark.slow
def test_the_deadline_counts_from_the_start_and_leaves_time_for_evaluation_and_save(data_dir, tmp_path):
    """A 60 s budget of which 40 s are already spent: training stops by itself, and the final
    evaluation and the save are done inside the 20 s left."""
    started = time.time() - 40
    out = tmp_path / "run"
    train.main(run_args(data_dir, out, "--deadline-minutes", "1", "--eval-every", "0"), started=started)
    finished = time.time()
    assert finished <= started + 60, finished - started
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    assert state["step"] > 10 and state["history"][-1]["step"] == state["step"]   # the final evaluation was made
    assert state["history"][0]["step"] < state["step"]                            # and timed early (the probe)


def test_sigterm_stops_training_and_saves_a_loadable_checkpoint(data_dir, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "model.train", *run_args(data_dir, out, "--eval-every", "0")]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        for line in proc.stdout:                                 # training starts once the examples are loaded
            if "training examples" in line:
                break
        time.sleep(3)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-2000:]
    assert "SIGTERM: stopped at step" in stdout
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    assert state["step"] > 0 and state["model"] and state["optimizer"]["moments"]


def test_averaged_checkpoints_hold_the_mean_weights_and_load_for_export(tiny_run, tmp_path):
    from model.average import main as average_main
    from model.checkpoint import load_checkpoint

    state = torch.load(tiny_run / "checkpoint.pt", map_location="cpu", weights_only=False)
    nudged = state | {"step": state["step"] + 200,
                      "model": {k: v + 0.5 if v.is_floating_point() else v for k, v in state["model"].items()}}
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    save_atomically(state, a)
    save_atomically(nudged, b)
    (tmp_path / "spm.model").write_bytes((tiny_run / "spm.model").read_bytes())
    average_main([str(b), str(a), "--out", str(tmp_path / "average.pt")])

    averaged = torch.load(tmp_path / "average.pt", map_location="cpu", weights_only=False)
    assert averaged["averaged_steps"] == [state["step"], state["step"] + 200]
    assert averaged["step"] == state["step"] + 200 and "optimizer" not in averaged
    for name, tensor in state["model"].items():
        if tensor.is_floating_point():
            assert torch.allclose(averaged["model"][name], tensor + 0.25, atol=1e-6), name
    model, _, info = load_checkpoint(tmp_path / "average.pt")
    assert info["step"] == state["step"] + 200 and sum(p.numel() for p in model.parameters()) > 0
    assert info["averaged_steps"] == [state["step"], state["step"] + 200]      # model.json's training records them

    other = state | {"config": state["config"] | {"d_ff": state["config"]["d_ff"] * 2}}
    save_atomically(other, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="another model"):
        average_main([str(a), str(tmp_path / "other.pt"), "--out", str(tmp_path / "bad.pt")])
