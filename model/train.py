"""Train a Transformer translator (or language model) on a corpus written by `model.data`.

    python -m model.train --preset small --data data/de-en --out runs/small [--direction both]
        [--device cpu|cuda] [--max-minutes M]
    python -m model.train --arch decoder --preset small --data data/mono --out runs/lm-small

`--arch decoder` trains the decoder-only variant (the same decoder blocks without cross-attention)
on monolingual text from `model.data --monolingual`: paragraphs cut into windows of at most
--max-positions pieces, next-token cross-entropy, dev perplexity instead of BLEU.

- token-budget batches from length buckets (model.batching); the corpus tokenized once into flat id
  arrays and cached (--token-cache, keyed by the corpus, the tokenizer and the example settings),
  batches padded from those arrays by numpy in a background thread a few steps ahead, copied to the GPU
  from pinned memory without blocking, masks built on the device; no host sync per step (the loss is
  read only when the progress bar is redrawn)
- label-smoothed cross-entropy (0.1), Adam(0.9, 0.98, eps 1e-9; fused on CUDA) with the paper's schedule
  lr = factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), gradient clipping
- mixed precision on CUDA (bf16 where supported, else fp16 with loss scaling)
- `checkpoint.pt` (everything needed to resume: fp32 weights, Adam's moments compacted to fp8/bf16 by
  model.checkpoint, 59 MB for the small preset) every few minutes and at the end; `best.pt` (weights
  only) whenever dev BLEU improves; a run directory is resumed when it already holds one
- --deadline-minutes: a wall-clock budget counted from the process's start, so that the tokenizer,
  loading, training, the final evaluation and the save all fit in it (the loop stops early by the
  measured time of an evaluation and a save); SIGTERM stops training and saves the checkpoint at once
- a progress bar with loss, target tokens/s and ETA; dev loss and greedy dev BLEU every --eval-every steps
- several GPUs or nodes through `torchrun --nproc-per-node N -m model.train …` (DistributedDataParallel)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import sacrebleu
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from .batching import (Example, Prefetcher, TokenArrays, batch_indices, cached_token_arrays, collate_ids,
                       concat_ranges, flatten, select_rows)
from .checkpoint import compact_optimizer_state, expand_optimizer_state, save_atomically
from .corpus.tsv import read_pairs
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
    max_minutes: float = 0.0        # minutes of the training loop alone, after loading (0 = no limit)
    deadline_minutes: float = 0.0   # the whole run's wall clock from the process's start (0 = no deadline)
    eval_every: int = 1000          # steps between dev evaluations (0 = only at the end)
    eval_sentences: int = 300       # dev sentences decoded (greedy) for the periodic BLEU
    save_every_minutes: float = 10.0
    max_positions: int = 200        # drop training pairs longer than this many pieces
    seed: int = 1


# With several processes and a time limit, the ranks agree to stop every this many steps (an all-reduce
# that waits for the device): at most this many steps past the limit.
STOP_CHECK_EVERY = 25
# Under a deadline, the first evaluation and save are timed this far into the training time (unless
# --eval-every came first): the loop then stops early enough for a final evaluation and save
# (DEADLINE_TAIL_FACTOR times their measured time, plus DEADLINE_MARGIN_S).
PROBE_AT_SHARE = 0.1
DEADLINE_TAIL_FACTOR = 1.5
DEADLINE_MARGIN_S = 5.0


def process_start_time() -> float:
    """When this process started (wall clock, from /proc), so that a deadline counts the interpreter's
    start and the imports too; where /proc is missing, when this module was imported."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])   # field 22, starttime
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return min(boot + ticks / os.sysconf("SC_CLK_TCK"), IMPORTED_AT)
    except (OSError, ValueError, IndexError, StopIteration):
        return IMPORTED_AT


IMPORTED_AT = time.time()


class SigtermFlag:
    """Notes a SIGTERM (a job's timeout, a spot machine going away) for the training loop to stop and
    save at its next step; the previous handler comes back on leaving the `with` block. Outside the
    main thread (where signals cannot be handled) it stays False."""

    def __init__(self):
        self.raised = False
        self._previous = None

    def __enter__(self) -> "SigtermFlag":
        try:
            self._previous = signal.signal(signal.SIGTERM, self._note)
        except ValueError:
            pass
        return self

    def _note(self, signum, frame) -> None:
        self.raised = True

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


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


def read_refs(path: Path, directions: list[tuple[str, str]]) -> dict:
    """(source, target) text pairs of each direction, for dev BLEU."""
    return {(s, t): read_pairs(path, direction=f"{s}-{t}") for s, t in directions}


def encode_pairs(path: Path, tok: Tokenizer, directions: list[tuple[str, str]], tagged: bool,
                 max_positions: int) -> TokenArrays:
    """Both directions come from the same de/en files; a tagged model gets <2xx> on the source.
    Each direction's pairs in file order, those with a side of 0 or >= max_positions pieces left out.
    Each column of the file is tokenized once, whichever directions read it."""
    base = read_pairs(path, direction="de-en")             # the file's first two columns as they stand
    n = len(base)
    flat, off = flatten(tok.encode_batch([c for c, _ in base] + [c for _, c in base]))   # rows: column 0, then 1
    lens = np.diff(off)                                     # (2n,)
    parts = []
    for (src_lang, tgt_lang), pairs in read_refs(path, directions).items():
        # read_pairs decides which column is the source (a two-column file is source<TAB>target whatever
        # the direction): where its source is not column 0, the sides are swapped.
        swapped = np.fromiter((p[0] != b[0] for p, b in zip(pairs, base)), dtype=bool, count=n)
        src_rows = np.where(swapped, np.arange(n) + n, np.arange(n))
        tgt_rows = np.where(swapped, np.arange(n), np.arange(n) + n)
        keep = ((lens[src_rows] > 0) & (lens[src_rows] < max_positions)
                & (lens[tgt_rows] > 0) & (lens[tgt_rows] < max_positions))
        tag = [tok.lang_id(tgt_lang)] if tagged else []
        parts.append(TokenArrays(*select_rows(flat, off, src_rows[keep], prefix=tag, suffix=[tok.special.eos]),
                                 *select_rows(flat, off, tgt_rows[keep])))
    return TokenArrays.concat(parts)


def encode_lm(path: Path, tok: Tokenizer, max_positions: int) -> TokenArrays:
    """Monolingual paragraphs as decoder-only examples: windows of at most max_positions - 1 pieces
    (bos and eos take the last position)."""
    texts = [t for _, t in read_texts(path)]
    width = max_positions - 1
    flat, off = flatten(tok.encode_batch(texts))
    lens = np.diff(off)
    per_para = -(-lens // width)                             # windows per paragraph (none for an empty one)
    first = np.cumsum(per_para) - per_para
    k = np.arange(int(per_para.sum())) - np.repeat(first, per_para)     # window number within its paragraph
    para = np.repeat(np.arange(len(lens)), per_para)
    starts = off[para] + k * width
    wlens = np.minimum(width, lens[para] - k * width)
    tgt_off = np.zeros(len(wlens) + 1, dtype=np.int64)
    np.cumsum(wlens, out=tgt_off[1:])
    return TokenArrays(np.zeros(0, dtype=flat.dtype), np.zeros(len(wlens) + 1, dtype=np.int64),
                       flat[concat_ranges(starts, wlens)], tgt_off)


def token_cache_dir(arg: str, data: Path, out: Path) -> Path | None:
    """--token-cache: "auto" is <data>/.token-cache where the data directory is writable, else
    <out>/token-cache; "none" turns the cache off."""
    if arg == "none":
        return None
    if arg != "auto":
        return Path(arg)
    return data / ".token-cache" if os.access(data, os.W_OK) else out / "token-cache"


def load_token_arrays(path: Path, tok: Tokenizer, directions: list[tuple[str, str]], tagged: bool,
                      max_positions: int, cache_dir: Path | None = None, lm: bool = False) -> tuple[TokenArrays, bool]:
    """A split's examples as TokenArrays, from the cache when the same corpus file, tokenizer model and
    settings were tokenized before. -> (arrays, whether they came from the cache)."""
    if lm:
        return cached_token_arrays(cache_dir, path, tok.model_file, lambda: encode_lm(path, tok, max_positions),
                                   kind="lm", max_positions=max_positions)
    return cached_token_arrays(cache_dir, path, tok.model_file,
                               lambda: encode_pairs(path, tok, directions, tagged, max_positions),
                               kind="pairs", directions=[f"{s}-{t}" for s, t in directions], tagged=tagged,
                               max_positions=max_positions)


def load_examples(path: Path, tok: Tokenizer, directions: list[tuple[str, str]], tagged: bool,
                  max_positions: int) -> list[Example]:
    """`encode_pairs` one example at a time in Python, every direction's columns tokenized again:
    the readable reference it is tested against (and the baseline of benchmarks/train_input.py)."""
    examples: list[Example] = []
    for src_lang, tgt_lang in directions:
        pairs = read_pairs(path, direction=f"{src_lang}-{tgt_lang}")
        srcs = tok.encode_batch([s for s, _ in pairs])
        tgts = tok.encode_batch([t for _, t in pairs])
        tag = [tok.lang_id(tgt_lang)] if tagged else []
        for s, t in zip(srcs, tgts):
            if 0 < len(s) < max_positions and 0 < len(t) < max_positions:
                examples.append(Example(tag + s + [tok.special.eos], t))
    return examples


def dev_loss_sum(model: Transformer, dev: TokenArrays, max_tokens: int, device, decoder_only: bool) -> tuple[float, int]:
    """Summed plain cross-entropy over every dev target token (eos included), and their number."""
    total, count = torch.zeros((), dtype=torch.float64, device=device), 0   # as a sum of Python floats was
    pin = torch.device(device).type == "cuda"
    with torch.no_grad():
        for idx in batch_indices(dev.src_len, dev.tgt_len, max_tokens, shuffle=False):
            b = collate_ids(dev, idx, decoder_only=decoder_only, pin_memory=pin).to(device)
            logits = model(b.src, b.tgt_in, b.src_mask, b.tgt_mask)
            total += F.cross_entropy(logits.float().view(-1, logits.size(-1)), b.tgt_out.view(-1),
                                     ignore_index=PAD_ID, reduction="sum").double()
            count += b.n_tokens
    return total.item(), count


def evaluate_lm_dev(model: Transformer, dev: TokenArrays, max_tokens: int, device) -> dict:
    """Dev loss per token (eos included) and its perplexity."""
    model.eval()
    total, count = dev_loss_sum(model, dev, max_tokens, device, decoder_only=True)
    model.train()
    loss = total / max(count, 1)
    return {"dev_loss": round(loss, 4), "dev_perplexity": round(math.exp(min(loss, 50)), 2)}


def evaluate_dev(model: Transformer, tok: Tokenizer, dev: TokenArrays, dev_refs: dict, tagged: bool,
                 max_tokens: int, n_sentences: int, device) -> dict:
    """Dev loss (plain cross-entropy per token) on all dev pairs, greedy BLEU on the first n per direction."""
    model.eval()
    total, count = dev_loss_sum(model, dev, max_tokens, device, decoder_only=False)
    out = {"dev_loss": total / max(count, 1)}
    for (s, t), pairs in dev_refs.items():
        pairs = pairs[:n_sentences]
        hyps = translate(model, tok, [p[0] for p in pairs], target_lang=t if tagged else None,
                         settings=DecodeSettings(beam_size=1))
        out[f"bleu_{s}-{t}"] = round(sacrebleu.corpus_bleu(hyps, [[p[1] for p in pairs]]).score, 2)
    model.train()
    return out


def main(argv=None, *, started: float | None = None) -> dict:
    """`started`: when the --deadline-minutes budget began (None: when this process started).
    -> {"step", "epoch", "sigterm": whether a SIGTERM stopped it}."""
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
    p.add_argument("--tokenizer", default=None, metavar="SPM_MODEL",
                   help="use this SentencePiece model (with <2xx> tags for --direction both) instead of training "
                        "one (default: train one on the training split)")
    p.add_argument("--token-cache", default="auto", metavar="DIR",
                   help="where the tokenized corpus is cached: auto (<data>/.token-cache, or <out>/token-cache "
                        "where the data directory is read-only), a directory, or none")
    for f, default in asdict(TrainConfig()).items():
        p.add_argument("--" + f.replace("_", "-"), type=type(default), default=default)
    args = p.parse_args(argv)
    tc = TrainConfig(**{f: getattr(args, f) for f in asdict(TrainConfig())})
    started = process_start_time() if started is None else started
    with SigtermFlag() as sigterm:
        return run_training(args, tc, argv, started, sigterm)


def run_training(args: argparse.Namespace, tc: TrainConfig, argv, started: float, sigterm: SigtermFlag) -> dict:
    deadline = started + tc.deadline_minutes * 60 if tc.deadline_minutes else math.inf
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
    if is_main and args.tokenizer and not (resume and spm_file.exists()):
        shutil.copy(args.tokenizer, spm_file)
    elif is_main and not (resume and spm_file.exists()):
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
    # Fused Adam on CUDA (one kernel for all parameters); the plain for-loop Adam on the CPU, as before.
    fused = True if device.type == "cuda" else None
    optimizer = torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9, fused=fused)
    step, epoch, batch_pos, best_bleu, history = 0, 0, 0, -math.inf, []
    if state:
        model.load_state_dict(state["model"])
        for g in state["optimizer"]["param_groups"]:   # this device's implementation, whichever saved it
            g["fused"], g["foreach"] = fused, None
        optimizer.load_state_dict(expand_optimizer_state(state["optimizer"]))
        step, epoch, batch_pos = state["step"], state["epoch"], state["batch_pos"]
        best_bleu, history = state["best_bleu"], state["history"]
        log(f"resumed {ckpt_path} at step {step} (epoch {epoch}, batch {batch_pos})")
    net = torch.nn.parallel.DistributedDataParallel(model) if distributed else model

    use_amp = device.type == "cuda"
    amp_dtype = torch.bfloat16 if use_amp and torch.cuda.is_bf16_supported() else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp and amp_dtype == torch.float16)

    t0 = time.time()
    cache_dir = token_cache_dir(args.token_cache, data, out)
    if distributed and not is_main:
        dist.barrier()                                   # rank 0 tokenizes and fills the cache first
    train, cached = load_token_arrays(data / "train.tsv", tok, directions, tagged, tc.max_positions, cache_dir, lm)
    dev, _ = load_token_arrays(data / "dev.tsv", tok, directions, tagged, tc.max_positions, cache_dir, lm)
    if distributed and is_main:
        dist.barrier()
    dev_refs = {} if lm else read_refs(data / "dev.tsv", directions)
    log(f"{len(train):,} training examples, {len(dev):,} dev examples ({time.time() - t0:.0f}s to "
        f"{'load from ' + str(cache_dir) if cached else 'tokenize'}); "
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

    save_seconds = eval_seconds = None                   # measured: what the deadline keeps back for the end

    def save(path: Path):
        nonlocal save_seconds
        t = time.time()
        save_atomically({"model": model.state_dict(), "optimizer": compact_optimizer_state(optimizer.state_dict()),
                         "config": config.to_dict(), "step": step, "epoch": epoch, "batch_pos": batch_pos,
                         "best_bleu": best_bleu, "history": history, "metrics": history[-1] if history else None,
                         "tagged": tagged, "directions": [f"{s}-{t}" for s, t in directions], "langs": langs}, path)
        save_seconds = max(save_seconds or 0.0, time.time() - t)

    def run_eval():
        nonlocal best_bleu, eval_seconds
        t = time.time()
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
        eval_seconds = max(eval_seconds or 0.0, time.time() - t)

    elapsed_before = history[-1]["minutes"] * 60 if history else 0.0
    t_start = last_save = time.time()
    loop_deadline = t_start + tc.max_minutes * 60 if tc.max_minutes else math.inf
    probe_at = t_start + PROBE_AT_SHARE * (deadline - t_start)   # inf without a deadline

    def out_of_time(now: float) -> bool:
        """Past --max-minutes, or too close to the deadline for the final evaluation and save."""
        if now >= loop_deadline:
            return True
        if deadline == math.inf or eval_seconds is None or save_seconds is None:
            return now >= deadline
        return now >= deadline - DEADLINE_TAIL_FACTOR * (eval_seconds + 2 * save_seconds) - DEADLINE_MARGIN_S

    net.train()
    stop = False
    bar = tqdm(total=tc.max_steps or None, initial=step, disable=not is_main, dynamic_ncols=True, mininterval=2.0)
    tokens_seen, t_window = 0, time.time()
    loss_sum, loss_steps = torch.zeros((), device=device), 0   # read (a host sync) only when the bar is redrawn
    pin = device.type == "cuda"

    def host_batches(epoch: int, batch_pos: int):
        """(epoch, batch number, padded ids on the host) from where the run stands on, epoch after epoch.
        Runs in the prefetch thread."""
        if pin and device.index is not None:
            torch.cuda.set_device(device)                  # pinned buffers in this process's device context
        while epoch < tc.epochs:
            batches = batch_indices(train.src_len, train.tgt_len, tc.max_tokens, seed=tc.seed + epoch)
            batches = batches[: len(batches) - len(batches) % world]  # every rank takes the same number of steps
            if not batches:
                raise SystemExit(f"{len(train)} examples make fewer batches than {world} processes; lower --max-tokens")
            for bi in range(batch_pos + rank, len(batches), world):
                yield epoch, bi, collate_ids(train, batches[bi], decoder_only=lm, pin_memory=pin)
            epoch, batch_pos = epoch + 1, 0

    with Prefetcher(host_batches(epoch, batch_pos), depth=3) as stream:   # the next batches built meanwhile
        for epoch, bi, host_batch in stream:
            b = host_batch.to(device)                      # one non-blocking copy; masks built on the device
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
            loss_sum += loss.detach()
            loss_steps += 1

            now = time.time()
            if is_main and now - t_window >= 2.0:
                remaining = min(deadline, loop_deadline) - now if min(deadline, loop_deadline) < math.inf else None
                bar.set_postfix_str(f"loss {loss_sum.item() / loss_steps:.3f} lr {optimizer.param_groups[0]['lr']:.2e} "
                                    f"tok/s {tokens_seen / (now - t_window):,.0f} ep {epoch}"
                                    + (f" eta {remaining / 60:.1f}m" if remaining is not None else ""))
                tokens_seen, t_window = 0, now
                loss_sum.zero_()
                loss_steps = 0
            bar.update(1)
            stop = bool(tc.max_steps and step >= tc.max_steps)
            if not distributed:
                stop = stop or sigterm.raised or out_of_time(now)
            elif step % STOP_CHECK_EVERY == 0:  # every rank asks at the same steps; a sync, so not every step
                flag = torch.tensor([float(sigterm.raised or out_of_time(now))], device=device)
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                stop = stop or bool(flag.item())
            probe = eval_seconds is None and now >= probe_at         # time an evaluation and a save early
            if is_main and ((tc.eval_every and step % tc.eval_every == 0) or probe) and not stop:
                run_eval()
            if is_main and (now - last_save >= tc.save_every_minutes * 60 or probe) and not stop:
                save(ckpt_path)
                last_save = now
            if stop:
                break
        else:
            if epoch < tc.epochs:                          # every epoch done
                epoch, batch_pos = tc.epochs, 0
    bar.close()
    if is_main:
        save(ckpt_path)                                  # first, so that a kill during the evaluation loses nothing
        if sigterm.raised:
            log(f"SIGTERM: stopped at step {step}, saved {ckpt_path}")
        elif not history or history[-1]["step"] != step:
            run_eval()
            save(ckpt_path)
        best = (f"best dev perplexity {math.exp(-best_bleu):.2f}" if lm else f"best dev BLEU {best_bleu:.2f}")
        log(f"done: step {step}, epoch {epoch}, {best}; checkpoints in {out}")
    if distributed:
        # Rank 0 may still be evaluating and saving: a rank that tore its gloo group down under it
        # aborted now and then ("terminate called without an active exception", SIGABRT).
        dist.barrier()
        dist.destroy_process_group()
    return {"step": step, "epoch": epoch, "sigterm": sigterm.raised}


if __name__ == "__main__":
    main()
