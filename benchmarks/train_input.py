"""The training input pipeline on the CPU: the old per-example collate against the flat-array one.

    python benchmarks/train_input.py --data data/de-en --tokenizer models/de-en/spm.model \
        --max-tokens 25000 --out benchmarks/results/train-input-cpu.md

On one torch thread (one core) it measures, for the same corpus, tokenizer and batches:

    load        the training split into examples: the old `load_examples` (tokenize every run, one
                Python list per example) against `model.train.load_token_arrays` with an empty
                cache (tokenize once, each column once) and with the cache filled
    batches     one epoch's token-budget batch list: the old `token_batches` against `batch_indices`
                (asserted to be the same batches in the same order)
    input       target tokens per second building --batches batches of --max-tokens: the old
                `collate` (pads with Python loops and builds the masks on the host), `collate_ids`
                (the padded ids, what train.py builds on the host and copies to the device) and
                `collate_ids` + the masks built on the CPU (what a CPU run does); the new batches are
                asserted equal to the old ones (ids, masks, token counts)
    profile     a CPU training step loop under torch.profiler, old input path against new, same model,
                same batches: milliseconds per step in input / forward / backward / optimizer and the
                share of the step spent outside forward, backward and optimizer

The old path is the per-example reference code the flat-array pipeline replaced and is tested against:
`load_examples` and `token_batches` (tests/oracles.py) and `model.batching.collate`. Nothing is asserted
about speed: figures vary with the machine and its load (the load average is printed before and after
each part), so the command, the machine and the date are written next to them.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]     # the repository, and tests/oracles.py (the old code)

from model.batching import Batch, Prefetcher, batch_indices, collate, collate_ids  # noqa: E402
from model.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer  # noqa: E402
from model.train import TrainConfig, directions_for, load_token_arrays, lr_at  # noqa: E402
from oracles import load_examples, token_batches  # noqa: E402
from model.transformer import Transformer, preset  # noqa: E402


# --- measuring ---------------------------------------------------------------------------------------

@dataclass
class Corpus:
    """The training split, its tokenizer and directions: what every part reads."""

    train_path: Path
    tok: Tokenizer
    directions: list
    tagged: bool


def load() -> str:
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def best_of(repeats: int, fn) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def same_batch(a: Batch, b: Batch) -> bool:
    pairs = [(a.src, b.src), (a.src_mask, b.src_mask), (a.tgt_in, b.tgt_in), (a.tgt_out, b.tgt_out),
             (a.tgt_mask, b.tgt_mask)]
    return a.n_tokens == b.n_tokens and all((x is None and y is None) or (x is not None and y is not None and
                                            x.dtype == y.dtype and torch.equal(x, y)) for x, y in pairs)


PHASES = ("input", "forward", "backward", "optimizer")


def profile_steps(model: Transformer, batches, steps: int, warmup: int, label_smoothing: float) -> dict:
    """A training step loop as model/train.py runs it on the CPU, each phase in a record_function;
    `batches` yields Batch objects. -> ms per step of each phase, of the whole step, and the share of
    the step outside forward/backward/optimizer."""
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile, record_function

    optimizer = torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9)
    model.train()
    loss_sum = torch.zeros(())
    step = 0

    def one_step():
        nonlocal step, loss_sum
        with record_function("step"):
            with record_function("input"):
                b = next(batches)
            step += 1
            for g in optimizer.param_groups:
                g["lr"] = lr_at(step, TrainConfig.lr, TrainConfig.warmup)
            with record_function("forward"):
                logits = model(b.src, b.tgt_in, b.src_mask, b.tgt_mask)
                loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), b.tgt_out.view(-1),
                                       ignore_index=PAD_ID, label_smoothing=label_smoothing,
                                       reduction="sum") / b.n_tokens
            with record_function("backward"):
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
            with record_function("optimizer"):
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
            loss_sum += loss.detach()

    for _ in range(warmup):
        one_step()
    t = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            one_step()
    wall = time.perf_counter() - t
    totals = {e.key: e.cpu_time_total / 1000 / steps for e in prof.key_averages() if e.key in ("step", *PHASES)}
    inside = sum(totals.get(k, 0.0) for k in ("forward", "backward", "optimizer"))
    return {**{k: totals.get(k, 0.0) for k in ("step", *PHASES)}, "outside_share": 1 - inside / totals["step"],
            "wall_ms": wall * 1000 / steps, "loss": loss_sum.item() / (warmup + steps)}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/de-en", help="directory with train.tsv from model.data")
    p.add_argument("--tokenizer", default="models/de-en/spm.model",
                   help="a SentencePiece model (with <2xx> tags for --direction both)")
    p.add_argument("--direction", default="both")
    p.add_argument("--max-tokens", type=int, default=25000)
    p.add_argument("--max-positions", type=int, default=200)
    p.add_argument("--batches", type=int, default=200, help="batches timed in the input part")
    p.add_argument("--repeats", type=int, default=3, help="each timing is the best of this many")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--profile-preset", action="append", default=None,
                   help="model preset(s) for the profiled step loop (repeatable; default tiny and small)")
    p.add_argument("--profile-max-tokens", type=int, default=6000,
                   help="batch size of the profiled steps (default: model.train's; at 25000 a CPU step of the tiny "
                        "preset takes seconds, most of it in the 8000-way output layer)")
    p.add_argument("--profile-steps", type=int, default=20)
    p.add_argument("--profile-warmup", type=int, default=3)
    p.add_argument("--cache-dir", default=None, help="token cache for the new path (default: a temporary directory, "
                                                     "so that the empty-cache load is measured)")
    p.add_argument("--out", default=None, help="also write the report (markdown) here")
    return p.parse_args(argv)


def cpu_model() -> str:
    if not Path("/proc/cpuinfo").exists():
        return platform.processor()
    return next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")), platform.processor())


def report_header(say, args: argparse.Namespace, argv, corpus: Corpus) -> None:
    say("# Training input pipeline on the CPU")
    say()
    say(f"- command: `python benchmarks/train_input.py {' '.join(sys.argv[1:] if argv is None else argv)}`")
    say(f"- date: {datetime.date.today()}")
    say(f"- machine: {cpu_model()}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}; "
        f"torch {torch.__version__}, numpy {np.__version__}, 1 torch thread")
    say(f"- corpus: {corpus.train_path} ({args.direction}), tokenizer {args.tokenizer}, --max-tokens {args.max_tokens}")
    say()


def measure_load(say, args: argparse.Namespace, corpus: Corpus):
    """The old per-example load against load_token_arrays, empty cache then filled. -> (examples, arrays)"""
    c = corpus
    say(f"## Load ({load()})")
    t = time.perf_counter()
    examples = load_examples(c.train_path, c.tok, c.directions, c.tagged, args.max_positions)
    t_old = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(args.cache_dir) if args.cache_dir else Path(tmp)
        t = time.perf_counter()
        arrays, hit_first = load_token_arrays(c.train_path, c.tok, c.directions, c.tagged, args.max_positions, cache)
        t_first = time.perf_counter() - t
        t = time.perf_counter()
        arrays, hit_second = load_token_arrays(c.train_path, c.tok, c.directions, c.tagged, args.max_positions, cache)
        t_second = time.perf_counter() - t
    assert hit_second and len(arrays) == len(examples)
    say()
    say("| path | seconds |")
    say("|---|---:|")
    say(f"| old: tokenize every run, Example lists | {t_old:.2f} |")
    say(f"| new: {'cache hit' if hit_first else 'empty cache (tokenize, store)'} | {t_first:.2f} |")
    say(f"| new: cache hit | {t_second:.2f} |")
    say()
    say(f"{len(examples):,} examples ({load()})")
    say()
    return examples, arrays


def measure_batch_list(say, args: argparse.Namespace, examples, arrays) -> list:
    """One epoch's batch list, old token_batches against batch_indices. -> the (old) batches"""
    say(f"## One epoch's batch list ({load()})")
    old_batches = token_batches(examples, args.max_tokens, seed=args.seed)
    new_batches = batch_indices(arrays.src_len, arrays.tgt_len, args.max_tokens, seed=args.seed)
    assert [b.tolist() for b in new_batches] == old_batches, "batch_indices differs from token_batches"
    t_old = best_of(args.repeats, lambda: token_batches(examples, args.max_tokens, seed=args.seed))
    t_new = best_of(args.repeats,
                    lambda: batch_indices(arrays.src_len, arrays.tgt_len, args.max_tokens, seed=args.seed))
    say()
    say(f"{len(old_batches)} batches, the same in both. old `token_batches` {t_old:.2f} s, new `batch_indices` "
        f"{t_new:.2f} s (of which the example shuffle, kept for the same batches, is Python's `random.shuffle`) "
        f"({load()})")
    say()
    return old_batches


def measure_input(say, args: argparse.Namespace, examples, arrays, old_batches: list) -> None:
    """Target tokens/s building the first --batches batches: old collate against collate_ids."""
    say(f"## Input: target tokens/s on one core ({load()})")
    chosen = old_batches[:args.batches]
    for idx in chosen[:20]:
        assert same_batch(collate([examples[i] for i in idx]), collate_ids(arrays, idx).to("cpu"))
    n_tokens = sum(collate_ids(arrays, idx).n_tokens for idx in chosen)
    runs = {
        "old `collate` (ids and masks on the host)": lambda: [collate([examples[i] for i in idx]) for idx in chosen],
        "new `collate_ids` (ids: the host's part on CUDA)": lambda: [collate_ids(arrays, idx) for idx in chosen],
        "new `collate_ids` + masks on the CPU (a CPU run)":
            lambda: [collate_ids(arrays, idx).to("cpu") for idx in chosen],
    }
    say()
    say(f"{len(chosen)} batches, {n_tokens:,} target tokens (eos included); best of {args.repeats}")
    say()
    say("| path | ms/batch | target tok/s | × old |")
    say("|---|---:|---:|---:|")
    base = None
    for name, fn in runs.items():
        secs = best_of(args.repeats, fn)
        base = base or secs
        say(f"| {name} | {secs * 1000 / len(chosen):.2f} | {n_tokens / secs:,.0f} | {base / secs:.1f} |")
    say()
    say(f"({load()})")
    say()


def profile_path(args: argparse.Namespace, preset_name: str, path: str, tok: Tokenizer, examples, arrays,
                 batches: list) -> dict:
    """profile_steps on a fresh `preset_name` model, fed by the old path (collate in the step) or the new one
    (collate_ids in a Prefetcher thread)."""
    steps = args.profile_warmup + args.profile_steps
    torch.manual_seed(args.seed)
    config = preset(preset_name, vocab_size=tok.vocab_size, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID)
    model = Transformer(config)
    if path == "old":
        stream = (collate([examples[i] for i in idx]).to("cpu") for idx in batches[:steps])
        return profile_steps(model, stream, args.profile_steps, args.profile_warmup, 0.1)
    with closing(Prefetcher((collate_ids(arrays, idx) for idx in batches[:steps]), depth=3)) as stream:
        return profile_steps(model, (hb.to("cpu") for hb in stream), args.profile_steps, args.profile_warmup, 0.1)


def measure_profile(say, args: argparse.Namespace, tok: Tokenizer, examples, arrays) -> None:
    """A CPU training step loop under torch.profiler, old input path against new, per preset."""
    presets = args.profile_preset or ["tiny", "small"]
    say(f"## CPU training steps under torch.profiler ({load()})")
    say()
    say(f"{args.profile_steps} steps after {args.profile_warmup} of warm-up, --max-tokens {args.profile_max_tokens}, "
        "the same batches for both paths. Old: `collate` in the step. New: `collate_ids` in a background thread "
        "(`Prefetcher`, as model/train.py), the step takes the next batch and builds the masks. ms per step; "
        "outside = the share of the step not in forward, backward or optimizer, and host = its milliseconds.")
    say()
    say("| preset | path | step ms | input | forward | backward | optimizer | outside | host ms | mean loss |")
    say("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    batches = {"old": token_batches(examples, args.profile_max_tokens, seed=args.seed),
               "new": batch_indices(arrays.src_len, arrays.tgt_len, args.profile_max_tokens, seed=args.seed)}
    for name in presets:
        for path in ("old", "new"):
            r = profile_path(args, name, path, tok, examples, arrays, batches[path])
            say(f"| {name} | {path} | {r['step']:.1f} | {r['input']:.2f} | {r['forward']:.1f} | "
                f"{r['backward']:.1f} | {r['optimizer']:.1f} | {r['outside_share']:.2%} | "
                f"{r['outside_share'] * r['step']:.2f} | {r['loss']:.4f} |")
    say()
    say(f"({load()})")


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)

    directions = directions_for(args.direction, ["de", "en"])
    corpus = Corpus(Path(args.data) / "train.tsv", Tokenizer(args.tokenizer), directions, len(directions) > 1)
    lines: list[str] = []

    def say(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    report_header(say, args, argv, corpus)
    examples, arrays = measure_load(say, args, corpus)
    old_batches = measure_batch_list(say, args, examples, arrays)
    measure_input(say, args, examples, arrays, old_batches)
    measure_profile(say, args, corpus.tok, examples, arrays)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
