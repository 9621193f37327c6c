"""Average the weights of a run's last checkpoints into one checkpoint to export.

    python -m model.average runs/default/snap-4600.pt runs/default/snap-4800.pt ... --out runs/default/average.pt
    python -m model.export --checkpoint runs/default/average.pt --out models/de-en --quantize int8

The paper averaged its base models' last 5 checkpoints, written 10 minutes apart (big models: the last 20):
the last updates of a run scatter the weights around the minimum they approach, and the mean of a few such
points lies nearer to it than any one of them. Only checkpoints of one run average well (the same
initialisation, a few hundred steps apart); the files must share the model's config and parameter names.

The output holds the mean weights (fp32) and the newest input's metadata (config, step, tokens, directions),
with `averaged_steps` listing the steps averaged, and no optimizer state: it is exported or evaluated, not
resumed (`model.train` resumes from checkpoint.pt).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from .checkpoint import save_atomically


def average_checkpoints(paths: list[Path]) -> dict:
    """The mean of the checkpoints' "model" weights, with the newest checkpoint's metadata (see above)."""
    if len(paths) < 2:
        raise ValueError(f"give at least two checkpoints to average, got {len(paths)}")
    states = [torch.load(p, map_location="cpu", weights_only=False) for p in paths]
    states.sort(key=lambda s: s.get("step") or 0)
    newest = states[-1]
    for path, state in zip(paths, states):
        if state["config"] != newest["config"] or state["model"].keys() != newest["model"].keys():
            raise ValueError(f"{path}: another model (config or parameters differ from the newest checkpoint's)")
    mean = {name: sum(s["model"][name].double() for s in states).div(len(states)).to(tensor.dtype)
            for name, tensor in newest["model"].items()}
    out = {k: v for k, v in newest.items() if k != "optimizer"}
    return out | {"model": mean, "averaged_steps": [s.get("step") for s in states]}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Average the weights of a run's last checkpoints (see the docstring).")
    p.add_argument("checkpoints", nargs="+", type=Path, help="checkpoint files of one run (.pt), at least two")
    p.add_argument("--out", required=True, type=Path,
                   help="the averaged checkpoint, e.g. runs/default/average.pt (its directory must hold the "
                        "run's spm.model for model.export and model.evaluate)")
    args = p.parse_args(argv)
    state = average_checkpoints(args.checkpoints)
    save_atomically(state, args.out)
    print(f"wrote {args.out}: the mean of steps {state['averaged_steps']}")


if __name__ == "__main__":
    main()
