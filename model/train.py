"""Train a Transformer translator (or language model) on a corpus written by `model.data`.

    python -m model.train --preset small --data data/de-en --out runs/small [--direction both]
        [--device cpu|cuda] [--max-minutes M]
    python -m model.train --arch decoder --preset small --data data/mono --out runs/lm-small

`--arch decoder` trains the decoder-only variant (the same decoder blocks without cross-attention)
on monolingual text from `model.data --monolingual`: paragraphs cut into windows of at most
--max-positions pieces, next-token cross-entropy, dev perplexity instead of BLEU.

- token-budget batches from length buckets (model.batching)
- label-smoothed cross-entropy (0.1), Adam(0.9, 0.98, eps 1e-9) with the paper's schedule
  lr = factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), gradient clipping
- mixed precision on CUDA (bf16 where supported, else fp16 with loss scaling)
- `checkpoint.pt` (everything needed to resume) every few minutes and at the end; `best.pt`
  (weights only) whenever dev BLEU improves; a run directory is resumed when it already holds one
- a progress bar with loss, target tokens/s and ETA; dev loss and greedy dev BLEU every --eval-every steps
- several GPUs or nodes through `torchrun --nproc-per-node N -m model.train …` (DistributedDataParallel)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import sacrebleu
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from .batching import Example, collate, token_batches
from .data import read_pairs
from .mono import read_texts
from .decoding import DecodeSettings, translate
from .tokenizer import PAD_ID, Tokenizer, train_tokenizer
from .transformer import PRESETS, Transformer, TransformerConfig, preset


@dataclass
class TrainConfig:
    max_tokens: int = 6000          # padded tokens per batch (per process)
    lr_factor: float = 2.0          # scales the paper's schedule (the paper uses 1.0 at 25k tokens/batch)
    warmup: int = 4000              # steps of linear warm-up
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    epochs: int = 1000              # an upper bound; --max-minutes / --max-steps usually stop first
    max_steps: int = 0              # 0 = no step limit
    max_minutes: float = 0.0        # 0 = no time limit
    eval_every: int = 1000          # steps between dev evaluations (0 = only at the end)
    eval_sentences: int = 300       # dev sentences decoded (greedy) for the periodic BLEU
    save_every_minutes: float = 10.0
    max_positions: int = 200        # drop training pairs longer than this many pieces
    seed: int = 1


def lr_at(step: int, d_model: int, warmup: int, factor: float) -> float:
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def directions_for(arg: str, langs: list[str]) -> list[tuple[str, str]]:
    if arg == "both":
        return [(langs[0], langs[1]), (langs[1], langs[0])]
    src, _, tgt = arg.partition("-")
    if {src, tgt} != set(langs):
        raise SystemExit(f"--direction {arg}: the corpus languages are {langs}; use e.g. {langs[0]}-{langs[1]} or both")
    return [(src, tgt)]


def load_examples(path: Path, tok: Tokenizer, directions: list[tuple[str, str]], tagged: bool,
                  max_positions: int, langs: list[str]) -> tuple[list[Example], dict]:
    """Both directions come from the same de/en files; a tagged model gets <2xx> on the source."""
    examples: list[Example] = []
    refs: dict = {}
    for src_lang, tgt_lang in directions:
        pairs = read_pairs(path, direction=f"{src_lang}-{tgt_lang}")
        srcs = tok.encode_batch([s for s, _ in pairs])
        tgts = tok.encode_batch([t for _, t in pairs])
        tag = [tok.lang_id(tgt_lang)] if tagged else []
        for s, t in zip(srcs, tgts):
            if 0 < len(s) < max_positions and 0 < len(t) < max_positions:
                examples.append(Example(tag + s + [tok.special.eos], t))
        refs[(src_lang, tgt_lang)] = pairs
    return examples, refs


def load_lm_examples(path: Path, tok: Tokenizer, max_positions: int) -> list[Example]:
    """Monolingual paragraphs as decoder-only examples: windows of at most max_positions - 1 pieces
    (bos and eos take the last position)."""
    texts = [t for _, t in read_texts(path)]
    width = max_positions - 1
    return [Example([], ids[i:i + width]) for ids in tok.encode_batch(texts) for i in range(0, len(ids), width)
            if ids[i:i + width]]


def evaluate_lm_dev(model: Transformer, dev: list[Example], max_tokens: int, device) -> dict:
    """Dev loss per token (eos included) and its perplexity."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for idx in token_batches(dev, max_tokens, shuffle=False):
            b = collate([dev[i] for i in idx], decoder_only=True).to(device)
            logits = model(None, b.tgt_in, None, b.tgt_mask)
            total += F.cross_entropy(logits.float().view(-1, logits.size(-1)), b.tgt_out.view(-1),
                                     ignore_index=PAD_ID, reduction="sum").item()
            count += b.n_tokens
    model.train()
    loss = total / max(count, 1)
    return {"dev_loss": round(loss, 4), "dev_perplexity": round(math.exp(min(loss, 50)), 2)}


def evaluate_dev(model: Transformer, tok: Tokenizer, dev: list[Example], dev_refs: dict, tagged: bool,
                 max_tokens: int, n_sentences: int, device) -> dict:
    """Dev loss (plain cross-entropy per token) on all dev pairs, greedy BLEU on the first n per direction."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for idx in token_batches(dev, max_tokens, shuffle=False):
            b = collate([dev[i] for i in idx]).to(device)
            logits = model(b.src, b.tgt_in, b.src_mask, b.tgt_mask)
            total += F.cross_entropy(logits.float().view(-1, logits.size(-1)), b.tgt_out.view(-1),
                                     ignore_index=PAD_ID, reduction="sum").item()
            count += b.n_tokens
    out = {"dev_loss": total / max(count, 1)}
    for (s, t), pairs in dev_refs.items():
        pairs = pairs[:n_sentences]
        hyps = translate(model, tok, [p[0] for p in pairs], target_lang=t if tagged else None,
                         settings=DecodeSettings(beam_size=1))
        out[f"bleu_{s}-{t}"] = round(sacrebleu.corpus_bleu(hyps, [[p[1] for p in pairs]]).score, 2)
    model.train()
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="small", choices=sorted(PRESETS))
    p.add_argument("--arch", default="encoder-decoder", choices=["encoder-decoder", "decoder"],
                   help="encoder-decoder (translation, parallel data) or decoder (language model, monolingual data)")
    p.add_argument("--data", required=True, help="directory with train.tsv and dev.tsv from model.data")
    p.add_argument("--out", required=True, help="run directory (resumed if it holds checkpoint.pt)")
    p.add_argument("--direction", default="both", help="de-en, en-de, or both (one model with a <2xx> target tag)")
    p.add_argument("--device", default="auto", help="cpu, cuda, or auto (cuda when available)")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--threads", type=int, default=0, help="CPU threads for torch (0 = all cores)")
    p.add_argument("--no-resume", action="store_true", help="start over even if --out holds a checkpoint")
    for f, default in asdict(TrainConfig()).items():
        p.add_argument("--" + f.replace("_", "-"), type=type(default), default=default)
    args = p.parse_args(argv)
    tc = TrainConfig(**{f: getattr(args, f) for f in asdict(TrainConfig())})

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    rank, world = 0, 1
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else ("cpu" if args.device == "auto" else args.device))
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(device)
    if args.threads:
        torch.set_num_threads(args.threads)
    is_main = rank == 0
    log = print if is_main else (lambda *a, **k: None)

    out, data = Path(args.out), Path(args.data)
    out.mkdir(parents=True, exist_ok=True)
    meta = json.loads((data / "meta.json").read_text()) if (data / "meta.json").exists() else {"langs": ["de", "en"]}
    langs = meta["langs"]
    lm = args.arch == "decoder"
    if lm != (meta.get("kind") == "monolingual"):
        want = "model.data --monolingual" if lm else "model.data (parallel)"
        raise SystemExit(f"--arch {args.arch} needs a corpus from {want}; {data} is "
                         f"{meta.get('kind', 'parallel')}")
    directions = [] if lm else directions_for(args.direction, langs)
    tagged = len(directions) > 1

    ckpt_path = out / "checkpoint.pt"
    resume = ckpt_path.exists() and not args.no_resume
    spm_file = out / "spm.model"
    if is_main and not (resume and spm_file.exists()):
        texts = ([t for _, t in read_texts(data / "train.tsv")] if lm else
                 [c for pair in read_pairs(data / "train.tsv", direction=f"{langs[0]}-{langs[1]}") for c in pair])
        train_tokenizer(texts, out / "spm", vocab_size=args.vocab_size, languages=langs if tagged else ())
    if distributed:
        dist.barrier()
    tok = Tokenizer(spm_file)

    torch.manual_seed(tc.seed)
    random.seed(tc.seed)
    state = torch.load(ckpt_path, map_location="cpu", weights_only=False) if resume else None
    config = (TransformerConfig(**state["config"]) if state else
              preset(args.preset, arch=args.arch, vocab_size=tok.vocab_size, pad_id=tok.special.pad,
                     bos_id=tok.special.bos, eos_id=tok.special.eos,
                     # A zero <s> is for Marian/CTranslate2 export of translators; a language model keeps it.
                     zero_bos_embedding=not lm))
    model = Transformer(config).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9)
    step, epoch, batch_pos, best_bleu, history = 0, 0, 0, -math.inf, []
    if state:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, epoch, batch_pos = state["step"], state["epoch"], state["batch_pos"]
        best_bleu, history = state["best_bleu"], state["history"]
        log(f"resumed {ckpt_path} at step {step} (epoch {epoch}, batch {batch_pos})")
    net = torch.nn.parallel.DistributedDataParallel(model) if distributed else model

    use_amp = device.type == "cuda"
    amp_dtype = torch.bfloat16 if use_amp and torch.cuda.is_bf16_supported() else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp and amp_dtype == torch.float16)

    t0 = time.time()
    if lm:
        train, dev, dev_refs = (load_lm_examples(data / "train.tsv", tok, tc.max_positions),
                                load_lm_examples(data / "dev.tsv", tok, tc.max_positions), {})
    else:
        train, _ = load_examples(data / "train.tsv", tok, directions, tagged, tc.max_positions, langs)
        dev, dev_refs = load_examples(data / "dev.tsv", tok, directions, tagged, tc.max_positions, langs)
    log(f"{len(train):,} training examples, {len(dev):,} dev examples ({time.time() - t0:.0f}s to load); "
        f"{config.arch} {args.preset}: {model.num_parameters() / 1e6:.1f}M parameters; device {device} x{world}")
    if is_main:
        (out / "config.json").write_text(json.dumps({"model": config.to_dict(), "train": asdict(tc),
                                                     "preset": args.preset, "arch": args.arch,
                                                     "task": "generation" if lm else "translation",
                                                     "direction": None if lm else args.direction,
                                                     "directions": [f"{s}-{t}" for s, t in directions],
                                                     "tagged": tagged, "langs": langs, "data": str(data),
                                                     "command": "python -m model.train " + " ".join(sys.argv[1:] if argv is None else argv)},
                                                    indent=2))

    def save(path: Path):
        tmp = path.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "config": config.to_dict(),
                    "step": step, "epoch": epoch, "batch_pos": batch_pos, "best_bleu": best_bleu,
                    "history": history, "tagged": tagged, "directions": [f"{s}-{t}" for s, t in directions],
                    "langs": langs}, tmp)
        tmp.replace(path)

    def run_eval():
        nonlocal best_bleu
        if lm:  # "best" is the lowest dev loss; kept in best_bleu's slot so resuming works alike
            metrics = evaluate_lm_dev(model, dev, tc.max_tokens, device)
            bleu = -metrics["dev_loss"]
        else:
            metrics = evaluate_dev(model, tok, dev, dev_refs, tagged, tc.max_tokens, tc.eval_sentences, device)
            bleu = sum(v for k, v in metrics.items() if k.startswith("bleu")) / max(1, len(dev_refs))
        metrics.update(step=step, minutes=round((time.time() - t_start + elapsed_before) / 60, 1))
        history.append(metrics)
        tqdm.write(json.dumps(metrics))
        if bleu > best_bleu:
            best_bleu = bleu
            torch.save({"model": model.state_dict(), "config": config.to_dict(), "step": step, "metrics": metrics,
                        "tagged": tagged, "directions": [f"{s}-{t}" for s, t in directions], "langs": langs},
                       out / "best.pt")
        with open(out / "train_log.jsonl", "a") as f:
            f.write(json.dumps(metrics) + "\n")

    elapsed_before = history[-1]["minutes"] * 60 if history else 0.0
    t_start = last_save = time.time()
    deadline = t_start + tc.max_minutes * 60 if tc.max_minutes else math.inf
    net.train()
    stop = False
    bar = tqdm(total=tc.max_steps or None, initial=step, disable=not is_main, dynamic_ncols=True, mininterval=2.0)
    tokens_seen, t_window = 0, time.time()
    while epoch < tc.epochs and not stop:
        batches = token_batches(train, tc.max_tokens, seed=tc.seed + epoch)
        batches = batches[: len(batches) - len(batches) % world]  # every rank takes the same number of steps
        if not batches:
            raise SystemExit(f"{len(train)} examples make fewer batches than {world} processes; lower --max-tokens")
        for bi in range(batch_pos + rank, len(batches), world):
            b = collate([train[i] for i in batches[bi]], decoder_only=lm).to(device)
            step += 1
            for g in optimizer.param_groups:
                g["lr"] = lr_at(step, config.d_model, tc.warmup, tc.lr_factor)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=use_amp):
                logits = net(b.src, b.tgt_in, b.src_mask, b.tgt_mask)                     # (B, T, V)
                loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), b.tgt_out.view(-1),
                                       ignore_index=PAD_ID, label_smoothing=tc.label_smoothing,
                                       reduction="sum") / b.n_tokens
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc.clip_norm)
            scaler.step(optimizer)
            scaler.update()
            batch_pos = bi + world - rank
            tokens_seen += b.n_tokens * world

            now = time.time()
            if is_main and now - t_window >= 2.0:
                remaining = deadline - now if deadline < math.inf else None
                bar.set_postfix_str(f"loss {loss.item():.3f} lr {optimizer.param_groups[0]['lr']:.2e} "
                                    f"tok/s {tokens_seen / (now - t_window):,.0f} ep {epoch}"
                                    + (f" eta {remaining / 60:.1f}m" if remaining is not None else ""))
                tokens_seen, t_window = 0, now
            bar.update(1)
            stop = (tc.max_steps and step >= tc.max_steps) or now >= deadline
            if distributed:  # every rank stops at the same step
                flag = torch.tensor([float(stop)], device=device)
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                stop = bool(flag.item())
            if is_main and tc.eval_every and step % tc.eval_every == 0:
                run_eval()
            if is_main and now - last_save >= tc.save_every_minutes * 60:
                save(ckpt_path)
                last_save = now
            if stop:
                break
        if not stop:
            epoch, batch_pos = epoch + 1, 0
    bar.close()
    if is_main:
        if not history or history[-1]["step"] != step:
            run_eval()
        save(ckpt_path)
        best = (f"best dev perplexity {math.exp(-best_bleu):.2f}" if lm else f"best dev BLEU {best_bleu:.2f}")
        log(f"done: step {step}, epoch {epoch}, {best}; checkpoints in {out}")
    if distributed:
        # Rank 0 may still be evaluating and saving: a rank that tore its gloo group down under it
        # aborted now and then ("terminate called without an active exception", SIGABRT).
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
