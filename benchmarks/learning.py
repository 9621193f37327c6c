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

With --test FILE (repeatable) each run's checkpoint is also scored on held-out test splits: greedy BLEU in each
direction on the first --test-sentences pairs (`python -m model.evaluate --checkpoint`), so a setting that adds a
corpus source shows what it adds to each test split, not only to dev; and its loss on every pair of the split in
each direction (teacher-forced, as the dev loss), which moves far less between seeds and samples than BLEU on a
few hundred sentences, so that small differences between settings can be told from noise. Settings may pass
their own `--data` (model.train keeps the last one given) and `--init-from PACKAGE` (the budget then counts on from
the package's target tokens: --target-tokens is what each setting trains beyond it).

With --cpu-minutes M the budget is CPU time instead: each setting trains for M CPU minutes of its training
steps (`--max-cpu-minutes`: the training process's own CPU time, so neither the machine's load nor a SIGSTOP
pause counts; evaluations and saves are left out), and the table adds the target tokens each reached, for
comparing model shapes per CPU hour (`--setting "wide=--shape d_model=384,h=6,d_ff=1536"`:
benchmarks/results/size-cpu.md). A budget of hours, on cores shared with other work, outlasts a session: with
--keep DIR --resume, a setting whose run DIR/NAME holds a checkpoint goes on from it (checkpoint.pt keeps the
CPU minutes spent, so it trains what is left), and one whose budget is spent is only read: the same command,
run again in each session, ends with the table.

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


def tokens_already_trained(extra: list[str]) -> int:
    """The target tokens of the package an --init-from setting starts from (its model.json), else 0."""
    return int(package_training(extra).get("target_tokens", 0))


def package_training(extra: list[str]) -> dict:
    """model.json's `training` of the package an --init-from setting starts from, else {}."""
    if "--init-from" not in extra:
        return {}
    return json.loads((ROOT / extra[extra.index("--init-from") + 1] / "model.json").read_text()).get("training", {})


def cpu_minutes_already(extra: list[str]) -> float:
    """The CPU minutes of training the package an --init-from setting starts from records (its last
    evaluation's), else 0: model.train's --max-cpu-minutes counts on from them."""
    return float(package_training(extra).get("dev_metrics", {}).get("cpu_minutes", 0.0))


def finished(out: Path, key: str, budget: float) -> bool:
    """Whether a kept run's last evaluation (train_log.jsonl) has its `key` (cpu_minutes, logged to 0.01, or
    target_tokens) at `budget` or past it: the run is done (model.train would train a step more before it looked)."""
    log = out / "train_log.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    return bool(lines) and json.loads(lines[-1]).get(key, 0) >= budget - 0.005


def test_bleu(run: Path, test: str, direction: str, sentences: int) -> float:
    """Greedy BLEU of a run's checkpoint on the first `sentences` pairs of a test split, in one direction."""
    cmd = [sys.executable, "-m", "model.evaluate", "--checkpoint", str(run), "--data", test, "--direction",
           direction, "--beam", "1", "--limit", str(sentences), "--json"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{run.name}: model.evaluate failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)["greedy"]["bleu"]


def test_loss(checkpoint: Path, test: str, direction: str, threads: int) -> float:
    """A checkpoint's cross-entropy per target token (eos included) on every pair of a test split in one
    direction, teacher-forced, computed as model.train computes its dev loss."""
    import torch

    from model.checkpoint import load_checkpoint
    from model.train import dev_loss_sum, encode_pairs

    torch.set_num_threads(threads)
    model, tok, info = load_checkpoint(checkpoint)
    pairs = encode_pairs(Path(test), tok, [tuple(direction.split("-"))], bool(info.get("tagged")),
                         model.config.max_len)
    total, count = dev_loss_sum(model, pairs, 4096, "cpu", decoder_only=False)
    return total / max(count, 1)


def run_setting(name: str, extra: list[str], args: argparse.Namespace, work: Path) -> dict:
    out = work / name
    # --resume: a kept run goes on from its checkpoint.pt, which keeps the CPU minutes and tokens it spent
    resumed = args.resume and (out / "checkpoint.pt").exists()
    key, limit = (("cpu_minutes", cpu_minutes_already(extra) + args.cpu_minutes) if args.cpu_minutes else
                  ("target_tokens", tokens_already_trained(extra) + args.target_tokens))
    budget = ["--max-cpu-minutes" if args.cpu_minutes else "--max-target-tokens", str(limit)]
    cmd = [sys.executable, "-m", "model.train", "--data", args.data, "--out", str(out), "--tokenizer",
           args.tokenizer, "--preset", args.preset, "--threads", str(args.threads), "--seed", str(args.seed),
           *budget, "--eval-every", "0",
           "--eval-sentences", str(args.eval_sentences), *([] if resumed else ["--no-resume"]), *extra]
    t = time.time()
    if resumed and finished(out, key, limit):   # its last evaluation is its result
        print(f"{name}: its budget was spent already; not trained further", file=sys.stderr)
    elif (proc := subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)).returncode != 0:
        raise SystemExit(f"{name}: model.train failed:\n{proc.stderr[-3000:]}")
    last = json.loads((out / "train_log.jsonl").read_text().splitlines()[-1])
    # checkpoint.pt, the run's end: a run directory alone would give model.evaluate best.pt, which a run saves
    # only at its periodic evaluations (with --eval-every 0, the weights it started from)
    tests = {f"{Path(test).stem} {d}": test_bleu(out / "checkpoint.pt", test, d, args.test_sentences)
             for test in args.test for d in ("de-en", "en-de")}
    losses = {f"{Path(test).stem} {d}": test_loss(out / "checkpoint.pt", test, d, args.threads)
              for test in args.test for d in ("de-en", "en-de")}
    # a resumed run's wall time is spread over sessions: its training minutes in all, as it logged them
    return {**last, "wall_min": last["minutes"] if resumed else (time.time() - t) / 60, "tests": tests,
            "losses": losses}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="data/de-en")
    p.add_argument("--tokenizer", required=True, help="one SentencePiece model for every setting")
    p.add_argument("--preset", default="small")
    p.add_argument("--target-tokens", type=int, default=400_000)
    p.add_argument("--cpu-minutes", type=float, default=0.0,
                   help="budget each setting this many CPU minutes of training instead of --target-tokens")
    p.add_argument("--eval-sentences", type=int, default=200)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--setting", action="append", default=[], metavar="NAME=OPTIONS",
                   help="a named setting: model.train options (repeatable; default: before and after)")
    p.add_argument("--test", action="append", default=[], metavar="TSV",
                   help="also score each run on this held-out split, both directions (repeatable)")
    p.add_argument("--test-sentences", type=int, default=500, help="pairs of each --test split scored")
    p.add_argument("--keep", default=None, metavar="DIR", help="keep each setting's run in DIR/NAME")
    p.add_argument("--resume", action="store_true", help="with --keep: a setting whose run DIR/NAME holds a "
                   "checkpoint goes on from it (a budget of hours spread over sessions), else each starts afresh")
    p.add_argument("--out", default=None, help="append the report (markdown) to this file")
    args = p.parse_args(argv)
    if args.resume and not args.keep:
        p.error("--resume needs --keep DIR (where the runs to resume are kept)")
    settings = args.setting or ["before=--lr 0.001976 --warmup 4000 --short-weight 1", "after="]
    header = [f"## {datetime.date.today()}: `python benchmarks/learning.py {shlex.join(sys.argv[1:])}`", "",
              f"CPU: {cpu_name()}; preset {args.preset}, "
              + (f"{args.cpu_minutes:g} CPU minutes of training" if args.cpu_minutes else
                 f"{args.target_tokens:,} target tokens") + f", seed {args.seed}, "
              f"{args.threads} thread(s); BLEU greedy on the first {args.eval_sentences} dev pairs of each direction"
              + (f"; test splits greedy BLEU on their first {args.test_sentences} pairs, and loss on every pair"
                 if args.test else ""),
              "", "| setting | model.train options | dev loss | BLEU de-en | BLEU en-de | "
              + "".join(f"{Path(t).stem} {d} | " for t in args.test for d in ("de-en", "en-de"))
              + "".join(f"{Path(t).stem} {d} loss | " for t in args.test for d in ("de-en", "en-de"))
              + "steps | target tokens | CPU minutes | minutes |",
              "|---|---|---:|---:|---:|" + "---:|" * (4 * len(args.test)) + "---:|---:|---:|---:|"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="learning-") as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        for setting in settings:
            name, _, opts = setting.partition("=")
            r = run_setting(name, shlex.split(opts), args, work)
            rows.append(f"| {name} | `{opts or '(defaults)'}` | {r['dev_loss']:.3f} | {r.get('bleu_de-en', '-')} | "
                        f"{r.get('bleu_en-de', '-')} | " + "".join(f"{b:.2f} | " for b in r["tests"].values())
                        + "".join(f"{x:.4f} | " for x in r["losses"].values())
                        + f"{r['step']} | {r['target_tokens']:,} | {r.get('cpu_minutes', '-')} | {r['wall_min']:.1f} |")
            print(rows[-1], flush=True)
    publish("\n".join(header + rows) + f"\n\nload average at the end: {os.getloadavg()[0]:.1f}\n", args.out)


if __name__ == "__main__":
    main()
