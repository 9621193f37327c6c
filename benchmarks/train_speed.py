"""Training speed on the CPU: target tokens per second of model.train's own step, fp32 against bf16 autocast,
on 1 and 2 torch threads (and optionally torch.compile), in one process or several (`--processes 2`: data
parallel over gloo, as `torchrun --nproc-per-node 2 -m model.train` runs).

    python benchmarks/train_speed.py --data data/de-en --tokenizer runs/default/spm.model \
        --out benchmarks/results/train-speed-cpu.md

Each configuration runs in a child process of its own (torch's thread pool is set once per process) on the
same batches (the training split's first --steps + --warmup batches of --max-tokens, epoch 0's order), with
the same model initialisation; the figure is target tokens over the wall time of the timed steps. With
--processes N, N children run together, each on every Nth batch (the first N x (--steps + --warmup)) with its
gradients averaged over all (DistributedDataParallel, gloo): the figure is all their tokens over the slowest's
wall time. "before"
is what the trainer ran on a CPU until --precision existed (fp32 always); "after" is --precision auto, which
is bf16 only where the CPU has AVX-512 BF16 or AMX (model.train.cpu_has_bf16). Nothing is asserted: the
command, the CPU and its load are printed with the figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def one_config(args: argparse.Namespace) -> dict:
    """Runs in the child: times --steps steps after --warmup untimed ones; -> the figures."""
    import torch
    import torch.nn.functional as F

    from model.batching import batch_indices, collate_ids
    from model.tokenizer import PAD_ID, Tokenizer
    from model.train import TrainConfig, directions_for, load_token_arrays, lr_at
    from model.transformer import Transformer, preset

    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    rank, world = args.rank, args.processes
    tok = Tokenizer(args.tokenizer)
    directions = directions_for(args.direction, ["de", "en"])
    train, _ = load_token_arrays(Path(args.data) / "train.tsv", tok, directions, len(directions) > 1,
                                 TrainConfig.max_positions, Path(args.data) / ".token-cache")
    batches = batch_indices(train.src_len, train.tgt_len, args.max_tokens, seed=1)[: (args.warmup + args.steps) * world]
    batches = batches[rank::world]
    model = Transformer(preset(args.preset, vocab_size=tok.vocab_size))
    step_fn = torch.compile(model) if args.compile else model
    if world > 1:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world)
        step_fn = DistributedDataParallel(step_fn)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    tokens, t0 = 0, None
    for i, idx in enumerate(batches):
        if i == args.warmup:
            tokens, t0 = 0, time.perf_counter()
        b = collate_ids(train, idx).to("cpu")
        for g in optimizer.param_groups:
            g["lr"] = lr_at(i + 1, TrainConfig.lr, TrainConfig.warmup)
        with torch.autocast("cpu", dtype=dtype, enabled=args.precision == "bf16"):
            logits = step_fn(b.src, b.tgt_in, b.src_mask, b.tgt_mask)                        # (B, T, V)
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), b.tgt_out.view(-1),
                                   ignore_index=PAD_ID, label_smoothing=0.1, reduction="sum") / b.n_tokens
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        tokens += b.n_tokens
    wall = time.perf_counter() - t0
    if world > 1:
        total = torch.tensor([float(tokens), wall], dtype=torch.float64)
        dist.all_reduce(total[:1])
        dist.all_reduce(total[1:], op=dist.ReduceOp.MAX)
        tokens, wall = int(total[0]), float(total[1])
        dist.destroy_process_group()
    return {"tok_s": tokens / wall, "s_per_step": wall / args.steps, "loss": float(loss)}


def run_config(argv: list[str], processes: int, threads: int, precision: str, compiled: bool) -> dict:
    """One configuration's figures: its `processes` children started together, the first one's answer."""
    child = [a for a in argv if a not in ("--compile",)]
    port = 29500 + os.getpid() % 1000
    procs = [subprocess.Popen([sys.executable, __file__, *child, "--child",
                               json.dumps([threads, precision, compiled, rank, port])],
                              stdout=subprocess.PIPE, text=True) for rank in range(processes)]
    outs = [proc.communicate()[0] for proc in procs]
    if any(proc.returncode for proc in procs):
        raise SystemExit(f"a child failed: exit codes {[proc.returncode for proc in procs]}")
    return json.loads(outs[0].splitlines()[-1])


def publish(report: str, out: str | None) -> None:
    """Prints a markdown report and appends it to `out` (when given)."""
    print(report)
    if out:
        with open(out, "a") as f:
            f.write("\n" + report)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="data/de-en")
    p.add_argument("--tokenizer", required=True, help="the SentencePiece model the token cache was built with")
    p.add_argument("--direction", default="both")
    p.add_argument("--preset", default="small")
    p.add_argument("--max-tokens", type=int, default=6000, help="padded tokens per batch (model.train's default)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads-list", default="1,2")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--compile", action="store_true", help="also time torch.compile (after its compile steps)")
    p.add_argument("--processes", type=int, default=1,
                   help="training processes per configuration, data parallel over gloo (threads: each one's)")
    p.add_argument("--out", default=None, help="append the report (markdown) to this file")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        args.threads, args.precision, args.compile, args.rank, args.port = json.loads(args.child)
        print(json.dumps(one_config(args)))
        return
    rows = []
    for compiled in ([False, True] if args.compile else [False]):
        for threads in map(int, args.threads_list.split(",")):
            for precision in args.precisions.split(","):
                load = os.getloadavg()[0]
                r = run_config(argv if argv is not None else sys.argv[1:], args.processes, threads, precision, compiled)
                rows.append(f"| {precision}{' + compile' if compiled else ''} | {args.processes} x {threads} | "
                            f"{r['tok_s']:,.0f} | {r['s_per_step']:.2f} | {load:.1f} |")
                print(rows[-1], flush=True)
    from model.train import cpu_has_bf16
    header = [f"## {datetime.date.today()}: `python benchmarks/train_speed.py {' '.join(sys.argv[1:])}`", "",
              f"CPU: {cpu_name()}, {os.cpu_count()} logical CPUs, bf16 instructions: {cpu_has_bf16()}; "
              f"preset {args.preset}, --max-tokens {args.max_tokens} a process, {args.steps} timed steps after "
              f"{args.warmup}", "", "| precision | processes x threads | target tok/s | s/step | load before |",
              "|---|---:|---:|---:|---:|"]
    publish("\n".join(header + rows) + "\n", args.out)


if __name__ == "__main__":
    main()
