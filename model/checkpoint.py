"""Checkpoint files: saved by model.train, loaded by model.train (to resume), model.evaluate and model.export.

A run directory holds `checkpoint.pt` (everything needed to resume) and `best.pt` (the weights of the
best dev evaluation only); `load_checkpoint` reads either as a model for decoding.

Resumable training checkpoints are small enough to carry from one machine (or spot job) to the next.

`checkpoint.pt` keeps the weights in fp32, so that training continues from exactly the weights it
stopped at, and stores Adam's two moments compacted:

- the first moment (`exp_avg`, a momentum that fades with beta1 = 0.9, i.e. within ~10 steps) in fp8
  e4m3 with one fp32 scale per row: ~6% relative rounding per element;
- the second moment (`exp_avg_sq`, which sets each weight's step size and fades with beta2 = 0.98,
  ~50 steps) in bf16: 0.4% relative rounding, the full fp32 exponent range.

For the small preset (8.4M parameters) that is 59 MB instead of 100 MB with fp32 moments (bf16 for
both would be 67 MB). The rounding nudges the step sizes of the first steps after a resume; the
weights, the step count (hence the learning-rate schedule) and the data position are exact.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .tokenizer import Tokenizer
from .transformer import Transformer, TransformerConfig

# Written into the checkpoint next to the compacted state: a checkpoint without it holds fp32 moments.
MOMENTS_FORMAT = "exp_avg:fp8_e4m3/row,exp_avg_sq:bf16"
FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max                                # 448


def fp8_rows(t: torch.Tensor) -> dict:
    """t -> {"fp8": same shape in e4m3, "scale": one fp32 scale per row (per tensor for a vector)}."""
    rows = t.float().reshape(t.shape[0], -1) if t.dim() > 1 else t.float().reshape(1, -1)   # (R, C)
    amax = rows.abs().amax(dim=1, keepdim=True)                                            # (R, 1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return {"fp8": (rows / scale).to(FP8).reshape(t.shape), "scale": scale}


def from_fp8_rows(packed: dict) -> torch.Tensor:
    q = packed["fp8"]
    rows = q.float().reshape(packed["scale"].shape[0], -1) * packed["scale"]                # (R, C)
    return rows.reshape(q.shape)


def compact_optimizer_state(state_dict: dict) -> dict:
    """An Adam `state_dict()` with its moments compacted (on the CPU); everything else as it is."""
    state = {}
    for key, s in state_dict["state"].items():
        s = dict(s)
        if "exp_avg" in s:
            s["exp_avg"] = fp8_rows(s["exp_avg"].detach().cpu())
        if "exp_avg_sq" in s:
            s["exp_avg_sq"] = s["exp_avg_sq"].detach().cpu().to(torch.bfloat16)
        state[key] = s
    return {"state": state, "param_groups": state_dict["param_groups"], "moments": MOMENTS_FORMAT}


def expand_optimizer_state(state_dict: dict) -> dict:
    """`compact_optimizer_state`'s output back to an fp32 Adam `state_dict()`; a checkpoint written
    before compaction (no "moments" key) is returned as it is."""
    if "moments" not in state_dict:
        return state_dict
    if state_dict["moments"] != MOMENTS_FORMAT:
        raise ValueError(f"unknown optimizer moments format {state_dict['moments']!r}")
    state = {}
    for key, s in state_dict["state"].items():
        s = dict(s)
        if "exp_avg" in s:
            s["exp_avg"] = from_fp8_rows(s["exp_avg"])
        if "exp_avg_sq" in s:
            s["exp_avg_sq"] = s["exp_avg_sq"].float()
        state[key] = s
    return {"state": state, "param_groups": state_dict["param_groups"]}


def save_atomically(obj: dict, path: Path) -> None:
    """torch.save through a temporary file: a job killed while writing leaves the previous file whole."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


@dataclass
class Progress:
    """Where a training run stands: saved in checkpoint.pt and restored on resume."""

    step: int = 0
    epoch: int = 0
    batch_pos: int = 0              # the next batch of `epoch` (counted over all processes)
    # Higher is better: the mean dev BLEU of a translator, minus the dev loss of a language model (one
    # slot for both, so that resuming and the "best.pt" rule work alike).
    best_score: float = -math.inf
    history: list[dict] = field(default_factory=list)   # every dev evaluation's metrics, in order
    target_tokens: int = 0          # target tokens trained on so far (all processes), for learning curves
    # The step at which a fresh optimizer joined a schedule already under way (--init-from a package):
    # the learning rate climbs back to the schedule's over TrainConfig.rewarm steps from here. 0: none.
    rewarm_from: int = 0
    # CPU seconds of training steps so far, every resume's (--init-from: the package's run's, as its last
    # evaluation counted them), for --max-cpu-minutes and the curve's cpu_minutes
    cpu_seconds: float = 0.0


def save_training_checkpoint(path: Path, model: Transformer, optimizer: torch.optim.Optimizer,
                             progress: Progress, labels: dict) -> None:
    """checkpoint.pt: fp32 weights, compacted Adam moments, the progress and the run's `labels`
    (tagged, directions, langs), written atomically."""
    save_atomically({"model": model.state_dict(), "optimizer": compact_optimizer_state(optimizer.state_dict()),
                     "config": model.config.to_dict(), "step": progress.step, "epoch": progress.epoch,
                     "batch_pos": progress.batch_pos, "target_tokens": progress.target_tokens,
                     # The key keeps its first name so that every checkpoint written so far resumes.
                     "best_bleu": progress.best_score, "history": progress.history,
                     "metrics": progress.history[-1] if progress.history else None,
                     "rewarm_from": progress.rewarm_from, "cpu_seconds": progress.cpu_seconds, **labels}, path)


def save_best(path: Path, model: Transformer, step: int, metrics: dict, labels: dict) -> None:
    """best.pt: the weights only, with the evaluation that made them the best."""
    torch.save({"model": model.state_dict(), "config": model.config.to_dict(), "step": step, "metrics": metrics,
                **labels}, path)


def keep_snap(out: Path, model: Transformer, progress: Progress, labels: dict, keep: int) -> Path:
    """out/snap-STEP.pt: the weights alone (as best.pt, with the step and target tokens), for model.average; the
    snaps past the newest `keep` are removed. Returns the new one's path."""
    path = out / f"snap-{progress.step}.pt"
    save_atomically({"model": model.state_dict(), "config": model.config.to_dict(), "step": progress.step,
                     "target_tokens": progress.target_tokens,
                     "metrics": progress.history[-1] if progress.history else None, **labels}, path)
    snaps = sorted((p for p in out.glob("snap-*.pt") if p.stem[5:].isdigit()), key=lambda p: int(p.stem[5:]))
    for old in snaps[:-keep]:
        old.unlink(missing_ok=True)
    return path


def load_training_checkpoint(path: Path) -> dict:
    """checkpoint.pt as saved, on the CPU."""
    return torch.load(path, map_location="cpu", weights_only=False)


def restore_training(state: dict, model: Transformer, optimizer: torch.optim.Optimizer,
                     fused: bool | None) -> Progress:
    """Loads a checkpoint's weights and optimizer state into `model` and `optimizer`; -> its progress."""
    model.load_state_dict(state["model"])
    for g in state["optimizer"]["param_groups"]:   # this device's implementation, whichever saved it
        g["fused"], g["foreach"] = fused, None
    optimizer.load_state_dict(expand_optimizer_state(state["optimizer"]))
    history = state["history"]
    # A checkpoint written before cpu_seconds was kept: its last evaluation's count (what followed it is lost)
    cpu = state.get("cpu_seconds", history[-1].get("cpu_minutes", 0.0) * 60 if history else 0.0)
    return Progress(state["step"], state["epoch"], state["batch_pos"], state["best_bleu"], history,
                    state.get("target_tokens", 0), state.get("rewarm_from", 0), cpu)


def load_checkpoint(path: str | Path, device: str = "cpu") -> tuple[Transformer, Tokenizer, dict]:
    """A run directory (best.pt preferred, else checkpoint.pt) or a .pt file -> (model, tokenizer, info)."""
    path = Path(path)
    run = path if path.is_dir() else path.parent
    if path.is_dir():
        path = run / "best.pt" if (run / "best.pt").exists() else run / "checkpoint.pt"
    if not path.exists():
        raise SystemExit(f"no checkpoint at {path}: pass a run directory from model.train (holding best.pt)")
    state = torch.load(path, map_location=device, weights_only=False)
    model = Transformer(TransformerConfig(**state["config"])).to(device)
    model.load_state_dict(state["model"])
    model.eval()
    info = {k: state.get(k) for k in ("step", "target_tokens", "tagged", "directions", "langs", "metrics",
                                      "averaged_steps")}
    info["file"] = str(path)
    return model, Tokenizer(run / "spm.model"), info
