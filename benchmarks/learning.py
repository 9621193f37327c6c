"""Learning efficiency: dev loss and dev BLEU after a fixed number of target tokens, for chosen training
settings, so that a default (and the next GPU run) starts from measured settings.

    python benchmarks/learning.py --data data/de-en --tokenizer runs/default/spm.model \
        --target-tokens 400000 --out benchmarks/results/learning-cpu.md \
        --setting "before=--lr 0.001976 --warmup 4000 --short-weight 1" --setting "after="

Each setting is `name=model.train options` (added to the common ones below; `after=` is model.train's
defaults) and runs `python -m model.train` in a child process until --target-tokens target tokens
(`--max-target-tokens`), with the same seed, tokenizer and token cache; the final evaluation gives the dev
loss (every dev pair, both directions) and greedy dev BLEU on the first --eval-sentences of each
direction. Tokens, not minutes, are the budget, so the table does not depend on the CPU or its load; the
wall time is printed beside it. The whole table must fit in about 30 minutes on a 2-core CPU: at about
1,400 target tokens/s on one thread, 400k tokens take about 5 minutes a setting.

"before" reproduces the schedule model.train had until the defaults changed (the paper's, factor 2 and
4,000 warm-up steps at d_model 256: peak 0.001976 at step 4,000; every pair every epoch).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.train_speed import cpu_name, publish  # noqa: E402


def run_setting(name: str, extra: list[str], args: argparse.Namespace, work: Path) -> dict:
    out = work / name
    cmd = [sys.executable, "-m", "model.train", "--data", args.data, "--out", str(out), "--tokenizer",
           args.tokenizer, "--preset", args.preset, "--threads", str(args.threads), "--seed", str(args.seed),
           "--max-target-tokens", str(args.target_tokens), "--eval-every", "0",
           "--eval-sentences", str(args.eval_sentences), "--no-resume", *extra]
    t = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: model.train failed:\n{proc.stderr[-3000:]}")
    last = json.loads((out / "train_log.jsonl").read_text().splitlines()[-1])
    return {**last, "wall_min": (time.time() - t) / 60}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="data/de-en")
    p.add_argument("--tokenizer", required=True, help="one SentencePiece model for every setting")
    p.add_argument("--preset", default="small")
    p.add_argument("--target-tokens", type=int, default=400_000)
    p.add_argument("--eval-sentences", type=int, default=200)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--setting", action="append", default=[], metavar="NAME=OPTIONS",
                   help="a named setting: model.train options (repeatable; default: before and after)")
    p.add_argument("--out", default=None, help="append the report (markdown) to this file")
    args = p.parse_args(argv)
    settings = args.setting or ["before=--lr 0.001976 --warmup 4000 --short-weight 1", "after="]
    header = [f"## {datetime.date.today()}: `python benchmarks/learning.py {shlex.join(sys.argv[1:])}`", "",
              f"CPU: {cpu_name()}; preset {args.preset}, {args.target_tokens:,} target tokens, seed {args.seed}, "
              f"{args.threads} thread(s); BLEU greedy on the first {args.eval_sentences} dev pairs of each direction",
              "", "| setting | model.train options | dev loss | BLEU de-en | BLEU en-de | steps | minutes |",
              "|---|---|---:|---:|---:|---:|---:|"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="learning-") as tmp:
        for setting in settings:
            name, _, opts = setting.partition("=")
            r = run_setting(name, shlex.split(opts), args, Path(tmp))
            rows.append(f"| {name} | `{opts or '(defaults)'}` | {r['dev_loss']:.3f} | {r.get('bleu_de-en', '-')} | "
                        f"{r.get('bleu_en-de', '-')} | {r['step']} | {r['wall_min']:.1f} |")
            print(rows[-1], flush=True)
    publish("\n".join(header + rows) + f"\n\nload average at the end: {os.getloadavg()[0]:.1f}\n", args.out)


if __name__ == "__main__":
    main()
