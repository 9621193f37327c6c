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
  by its peak: lr = peak · min(step / warmup, sqrt(warmup / step)), gradient clipping
- short pairs (dictionary entries, UI labels) sampled at --short-weight per epoch, so sentences are not
  drowned by them
- mixed precision (--precision auto): bf16 autocast on CUDA and on CPUs with AVX-512 BF16 or AMX, fp16 with
  loss scaling on older GPUs, fp32 elsewhere
- `checkpoint.pt` (everything needed to resume: fp32 weights, Adam's moments compacted to fp8/bf16 by
  model.checkpoint, 59 MB for the small preset) every few minutes and at the end; `best.pt` (weights
  only) whenever dev BLEU improves; a run directory is resumed when it already holds one
- --deadline-minutes: a wall-clock budget counted from the process's start, so that the tokenizer,
  loading, training, the final evaluation and the save all fit in it (the loop stops early by the
  measured time of an evaluation and a save); SIGTERM stops training and saves the checkpoint at once;
  --max-cpu-minutes: a CPU-time budget of the run's training steps (the processes' own CPU time, summed over
  torchrun's processes, evaluations and saves left out: the machine's load and SIGSTOP pauses do not count; kept
  in checkpoint.pt, so a resumed run spends what is left), for comparing shapes per CPU hour
- --shape d_model=384,h=6,d_ff=1536 (or n_encoder_layers=6,n_decoder_layers=2): a preset with another shape
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
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import sacrebleu
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from service.shared.options import SearchOptions

from .batching import (Batch, IdBatch, Prefetcher, TokenArrays, batch_indices, cached_token_arrays,
                       collate_ids, concat_ranges, flatten, select_rows)
from .checkpoint import (Progress, keep_snap, load_training_checkpoint, restore_training, save_best,
                         save_training_checkpoint)
from . import jemalloc
from .back_translate import synthetic_lang
from .corpus.tsv import read_origins, read_pairs
from .decoding import translate
from .mono import read_texts
from .tokenizer import PAD_ID, Tokenizer, train_tokenizer
from .transformer import PRESETS, Transformer, TransformerConfig, fairseq_init, preset


@dataclass
class TrainConfig:
    max_tokens: int = 6000          # padded tokens per batch (per process)
    # The paper's schedule (linear warm-up, then 1/sqrt(step) decay) by its peak: 4,000 warm-up steps
    # never ended inside a CPU or spot-GPU run; the peak and warm-up were picked by benchmarks/learning.py.
    lr: float = 1e-3                # peak learning rate, reached at step `warmup`
    warmup: int = 400               # steps of linear warm-up
    # --init-from a package that records its step: the schedule goes on from that step, not from a new
    # warm-up to the peak; Adam's moments start afresh, so its rate climbs to the schedule's over this many
    # steps (0: at once), as a fresh Adam's first steps are as large as the rate whatever the gradient.
    rewarm: int = 200
    # Steps of a linear decay to zero that end the run at --max-steps (the decay phase of a warmup-stable-decay
    # schedule, Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations"):
    # from step max_steps - cooldown the rate falls from the schedule's value there to 0 at max_steps. A branch
    # to ship: the run itself goes on from the checkpoint before it. 0: no decay beyond the schedule's.
    cooldown: int = 0
    # Dictionary entries and UI labels (targets under `short_pieces` pieces) are most of the corpus's
    # pairs but teach little about sentences: each epoch keeps this random share of them (1 = all).
    short_weight: float = 0.25
    short_pieces: int = 6
    precision: str = "auto"         # fp32 or bf16 (autocast); auto: bf16 on CUDA and on CPUs with bf16 instructions
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    epochs: int = 1000              # an upper bound; --max-minutes / --max-steps usually stop first
    max_steps: int = 0              # 0 = no step limit
    max_target_tokens: int = 0      # stop once this many target tokens were trained on (0 = no limit)
    max_minutes: float = 0.0        # minutes of the training loop alone, after loading (0 = no limit)
    # CPU minutes of the run's training steps (all threads; evaluations and saves not counted), resumes
    # included and counted on from an --init-from package's (as --max-target-tokens counts its tokens), so
    # that a budget buys the same training whatever the machine's load or a SIGSTOP pause (0 = no limit)
    max_cpu_minutes: float = 0.0
    deadline_minutes: float = 0.0   # the whole run's wall clock from the process's start (0 = no deadline)
    eval_every: int = 1000          # steps between dev evaluations (0 = only at the end)
    eval_sentences: int = 300       # dev sentences decoded (greedy) for the periodic BLEU
    save_every_minutes: float = 10.0
    # Each save also keeps the weights alone as snap-STEP.pt, the newest this many (0 = none): what
    # model.average means to ship from a run whose single saves move more than its trend (models/de-en's phase 20)
    keep_saves: int = 0
    max_positions: int = 200        # drop training pairs longer than this many pieces
    seed: int = 1


# With several processes, the ranks agree to stop (a SIGTERM, a time limit) every this many steps on GPUs (an
# all-reduce that waits for the device): at most this many steps past the limit. On CPUs at every step: there it
# costs a gloo round trip against a step of seconds, and 25 steps (minutes at nice 19) outlast the 30 s torchrun
# gives its ranks between the SIGTERM it passes on and a SIGKILL, so a stopped run lost everything since its last
# save (2026-12-04: the default's run, stopped by a SIGTERM to torchrun, saved nothing).
STOP_CHECK_EVERY = {"cuda": 25, "cpu": 1}
# Under jemalloc told never to hand pages back on its own (docs/training.md), the loop hands them back every this
# many steps (model/jemalloc.py): the page faults of a purge once in so many steps, and a bounded footprint.
PURGE_EVERY = 25
# Under a deadline, the first evaluation and save are timed this far into the training time (unless
# --eval-every came first): the loop then stops early enough for a final evaluation and save
# (DEADLINE_TAIL_FACTOR times their measured time, plus DEADLINE_MARGIN_S).
PROBE_AT_SHARE = 0.1
DEADLINE_TAIL_FACTOR = 1.5
DEADLINE_MARGIN_S = 5.0


SHAPE_FIELDS = ("d_model", "h", "d_ff", "n_encoder_layers", "n_decoder_layers")


def parse_shape(arg: str) -> dict[str, int]:
    """--shape "d_model=384,n_encoder_layers=6" -> {"d_model": 384, "n_encoder_layers": 6}."""
    shape = {}
    for item in filter(None, (part.strip() for part in arg.split(","))):
        field, _, value = item.partition("=")
        if field not in SHAPE_FIELDS or not value.isdigit() or int(value) < 1:
            raise SystemExit(f"--shape: {item!r} is not FIELD=N with FIELD one of {', '.join(SHAPE_FIELDS)}")
        shape[field] = int(value)
    return shape


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


def lr_at(step: int, peak: float, warmup: int, rewarm_from: int = 0, rewarm: int = 0, *,
          end: int = 0, cooldown: int = 0) -> float:
    """The paper's schedule, factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), by its peak value;
    over the last `cooldown` steps before `end`, falling linearly from its value there to 0
    (TrainConfig.cooldown); from `rewarm_from` on (a fresh optimizer joining a run under way), that ramped up
    over `rewarm` steps. The two multiply: a cooldown branch started from a package (--init-from) inside its
    cooldown ramps up to the cooldown's line, not to the rate before it, nor stays at 0."""
    rate = paper_lr(min(step, end - cooldown) if cooldown else step, peak, warmup)
    if cooldown and step > end - cooldown:
        rate *= max(end - step, 0) / cooldown
    if rewarm_from and rewarm and step - rewarm_from < rewarm:
        rate *= max(step - rewarm_from, 0) / rewarm
    return rate


def paper_lr(step: int, peak: float, warmup: int) -> float:
    """The paper's schedule alone: a linear warm-up to `peak` at `warmup`, then 1/sqrt(step)."""
    step = max(step, 1)
    return peak * min(step / warmup, (warmup / step) ** 0.5)


def cpu_has_bf16() -> bool:
    """Does this CPU multiply bf16 in hardware (AVX-512 BF16 or AMX)? Elsewhere autocast would emulate it,
    slower than fp32."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return False
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.split()))


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """--precision as the autocast dtype (None: plain fp32). auto: bf16 where the device computes it
    natively (fp16 with loss scaling on an older GPU), else fp32."""
    if precision not in ("auto", "fp32", "bf16"):
        raise SystemExit(f"--precision {precision}: use auto, fp32 or bf16")
    if precision == "fp32":
        return None
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() or precision == "bf16" else torch.float16
    return torch.bfloat16 if precision == "bf16" or cpu_has_bf16() else None


def epoch_sample(tgt_len: np.ndarray, short_pieces: int, weight: float, seed: int) -> np.ndarray | None:
    """The examples an epoch trains on: every one whose target has at least `short_pieces` pieces, and a
    random `weight` share of the shorter ones (another share each epoch). None: all of them."""
    if weight >= 1.0:
        return None
    short = tgt_len < short_pieces
    rng = np.random.default_rng(seed)
    return np.flatnonzero(~short | (rng.random(len(tgt_len)) < weight))


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
    # A back-translated pair's machine-made side ("" for a real pair): it trains only the direction from that side,
    # its source marked by <bt> (model/back_translate.py); a real pair trains every direction, as before.
    synthetic = np.array([synthetic_lang(o) or "" for o in read_origins(path)], dtype=object)
    parts = []
    for (src_lang, tgt_lang), pairs in read_refs(path, directions).items():
        # read_pairs decides which column is the source (a two-column file is source<TAB>target whatever
        # the direction): where its source is not column 0, the sides are swapped.
        swapped = np.fromiter((p[0] != b[0] for p, b in zip(pairs, base)), dtype=bool, count=n)
        src_rows = np.where(swapped, np.arange(n) + n, np.arange(n))
        tgt_rows = np.where(swapped, np.arange(n), np.arange(n) + n)
        keep = ((lens[src_rows] > 0) & (lens[src_rows] < max_positions)
                & (lens[tgt_rows] > 0) & (lens[tgt_rows] < max_positions))
        target = tgt_lang if tagged else None
        for rows, bt in ((keep & (synthetic == ""), False), (keep & (synthetic == src_lang), True)):
            if bt and not rows.any():
                continue                                    # no <bt> asked of a vocabulary that may lack it
            prefix = tok.source_prefix(target, synthetic=bt)
            parts.append(TokenArrays(*select_rows(flat, off, src_rows[rows], prefix=prefix, suffix=[tok.special.eos]),
                                     *select_rows(flat, off, tgt_rows[rows])))
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


def dev_loss_sum(model: Transformer, dev: TokenArrays, max_tokens: int, device,
                 decoder_only: bool) -> tuple[float, int]:
    """Summed plain cross-entropy over every dev target token (eos included), and their number."""
    # Summed on the device in float64 (one host sync at the end), as precise as a sum of Python floats.
    total, count = torch.zeros((), dtype=torch.float64, device=device), 0
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
                         settings=SearchOptions(beam_size=1))
        out[f"bleu_{s}-{t}"] = round(sacrebleu.corpus_bleu(hyps, [[p[1] for p in pairs]]).score, 2)
    model.train()
    return out


# --- the run: command line, setup steps, the training loop -------------------------------------------


def parse_args(argv) -> tuple[argparse.Namespace, TrainConfig]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="small", choices=sorted(PRESETS))
    p.add_argument("--shape", default="", metavar="FIELD=N,...",
                   help="override the preset's shape, e.g. d_model=384,h=6,d_ff=1536 or n_encoder_layers=6,"
                        f"n_decoder_layers=2 (fields: {', '.join(SHAPE_FIELDS)}; a fresh run only)")
    p.add_argument("--arch", default="encoder-decoder", choices=["encoder-decoder", "decoder"],
                   help="encoder-decoder (translation, parallel data) or decoder (language model, monolingual data)")
    p.add_argument("--data", required=True, help="directory with train.tsv and dev.tsv from model.data")
    p.add_argument("--out", required=True, help="run directory (resumed if it holds checkpoint.pt)")
    p.add_argument("--init-from", default=None, metavar="PACKAGE",
                   help="start a new run from a model package's weights (e.g. models/de-en: the committed default, "
                        "to train it further on another machine), with its tokenizer; the schedule goes on from "
                        "the step the package records (Adam afresh, its rate ramped back over --rewarm steps)")
    p.add_argument("--init", default="xavier", choices=["xavier", "fairseq"],
                   help="a fresh model's initialisation: xavier (each matrix on its own, nn.Linear's biases) or "
                        "fairseq (q/k/v as one matrix, zero biases; model.transformer.fairseq_init)")
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
    if args.init_from and not args.tokenizer:
        meta = json.loads((Path(args.init_from) / "model.json").read_text(encoding="utf-8"))
        args.tokenizer = str(Path(args.init_from) / meta["tokenizer"]["source"])
    if args.cooldown and not 0 < args.cooldown <= args.max_steps:
        raise SystemExit(f"--cooldown {args.cooldown} ends the run at --max-steps: give --max-steps of at least "
                         f"{args.cooldown} (the step the rate reaches 0)")
    return args, TrainConfig(**{f: getattr(args, f) for f in asdict(TrainConfig())})


def main(argv=None, *, started: float | None = None) -> dict:
    """`started`: when the --deadline-minutes budget began (None: when this process started).
    -> {"step", "epoch", "sigterm": whether a SIGTERM stopped it}."""
    args, settings = parse_args(argv)
    started = process_start_time() if started is None else started
    with SigtermFlag() as sigterm:
        return run_training(args, settings, argv, started, sigterm)


@dataclass
class Cluster:
    """This process among the training processes (torchrun sets WORLD_SIZE, RANK and LOCAL_RANK)."""
    device: torch.device
    rank: int = 0
    world: int = 1
    distributed: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def log(self, *args, **kwargs) -> None:
        """print, on rank 0 only."""
        if self.is_main:
            print(*args, **kwargs)


def join_cluster(device_arg: str, threads: int) -> Cluster:
    """The device, and the process group when torchrun started several processes."""
    device = torch.device("cuda" if device_arg == "auto" and torch.cuda.is_available()
                          else ("cpu" if device_arg == "auto" else device_arg))
    cluster = Cluster(device, distributed=int(os.environ.get("WORLD_SIZE", "1")) > 1)
    if cluster.distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        cluster.rank, cluster.world = dist.get_rank(), dist.get_world_size()
        if device.type == "cuda":
            cluster.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(cluster.device)
    if threads:
        torch.set_num_threads(threads)
    return cluster


@dataclass
class CorpusInfo:
    """What a run trains on: the data directory's meta.json and --arch/--direction."""
    data: Path
    langs: list[str]
    lm: bool                                # monolingual text for a decoder-only language model
    directions: list[tuple[str, str]]       # (source, target) languages; none for a language model
    tagged: bool                            # several directions: a <2xx> target tag on each source

    @property
    def labels(self) -> dict:
        """What checkpoints record of the corpus (model.evaluate and model.export read it)."""
        return {"tagged": self.tagged, "directions": [f"{s}-{t}" for s, t in self.directions], "langs": self.langs}


def read_corpus_info(args: argparse.Namespace) -> CorpusInfo:
    data = Path(args.data)
    meta = json.loads((data / "meta.json").read_text()) if (data / "meta.json").exists() else {"langs": ["de", "en"]}
    langs = meta["langs"]
    lm = args.arch == "decoder"
    if lm != (meta.get("kind") == "monolingual"):
        want = "model.data --monolingual" if lm else "model.data (parallel)"
        raise SystemExit(f"--arch {args.arch} needs a corpus from {want}; {data} is "
                         f"{meta.get('kind', 'parallel')}")
    directions = [] if lm else directions_for(args.direction, langs)
    return CorpusInfo(data, langs, lm, directions, tagged=len(directions) > 1)


def prepare_tokenizer(args: argparse.Namespace, corpus: CorpusInfo, out: Path, resume: bool,
                      cluster: Cluster) -> Tokenizer:
    """The run's SentencePiece model: the one it has when resuming, else a copy of --tokenizer, else one
    trained on the training split (by rank 0, the others waiting)."""
    spm_file = out / "spm.model"
    if cluster.is_main and not (resume and spm_file.exists()):
        if args.tokenizer:
            shutil.copy(args.tokenizer, spm_file)
        else:
            langs = corpus.langs
            texts = ([t for _, t in read_texts(corpus.data / "train.tsv")] if corpus.lm else
                     [c for pair in read_pairs(corpus.data / "train.tsv", direction=f"{langs[0]}-{langs[1]}")
                      for c in pair])
            train_tokenizer(texts, out / "spm", vocab_size=args.vocab_size, languages=langs if corpus.tagged else ())
    if cluster.distributed:
        dist.barrier()
    return Tokenizer(spm_file)


def weights_of_package(package: Path, tok: Tokenizer) -> Transformer:
    """A model package's weights to train on from (--init-from): read back out of its ONNX graphs by
    model.upgrade (int8 weights dequantized, within 0.4% of the fp32 they came from); Adam starts afresh.
    The run must use the package's tokenizer, which --init-from makes the default --tokenizer, or one that appends
    pieces to it (model/vocab.py's, e.g. <bt>): their rows are added as model.vocab adds them."""
    from .upgrade import load_weights                  # onnx, only for this

    model, meta = load_weights(package)
    own = Tokenizer(package / meta["tokenizer"]["source"])
    appended = tok.vocab_size > own.vocab_size and all(tok.sp.id_to_piece(i) == own.sp.id_to_piece(i)
                                                       for i in range(own.vocab_size))
    # The new rows go at the end, so only a model with one row a piece (not one padded past its tokenizer) takes them
    if appended and model.config.vocab_size == own.vocab_size:
        # The run's tokenizer is the package's with pieces appended (model/vocab.py): rows for them, as it adds.
        from .vocab import extend_model
        return extend_model(model, tok.vocab_size - own.vocab_size).train()
    if model.config.vocab_size != tok.vocab_size:
        raise SystemExit(f"--init-from {package}: its vocabulary has {model.config.vocab_size} pieces, the run's "
                         f"tokenizer {tok.vocab_size}; pass --tokenizer {package / meta['tokenizer']['source']}, or "
                         "one that appends pieces to it (python -m model.vocab)")
    return model.train()


def build_model(args: argparse.Namespace, corpus: CorpusInfo, tok: Tokenizer, state: dict | None,
                device: torch.device) -> tuple[Transformer, torch.optim.Optimizer, Progress]:
    """The model and its optimizer, fresh or from a checkpoint's `state`, and where the run stands."""
    if not state and args.init_from:
        model = weights_of_package(Path(args.init_from), tok)
    else:
        config = (TransformerConfig(**state["config"]) if state else
                  preset(args.preset, **parse_shape(args.shape), arch=args.arch, vocab_size=tok.vocab_size,
                         pad_id=tok.special.pad, bos_id=tok.special.bos, eos_id=tok.special.eos,
                         # A zero <s> is for Marian/CTranslate2 export of translators; a language model keeps it.
                         zero_bos_embedding=not corpus.lm))
        model = Transformer(config)
        if not state and args.init == "fairseq":
            fairseq_init(model)
    model = model.to(device)
    # Fused Adam on CUDA (one kernel for all parameters); on the CPU the default for-loop Adam.
    fused = True if device.type == "cuda" else None
    optimizer = torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9, fused=fused)
    if state:
        progress = restore_training(state, model, optimizer, fused)
    elif args.init_from:
        progress = progress_of_package(Path(args.init_from))
    else:
        progress = Progress()
    return model, optimizer, progress


def progress_of_package(package: Path) -> Progress:
    """Where the run a package was exported from stood (its model.json's "training"), for --init-from to go
    on from: the step (hence the schedule), the target tokens and the last dev evaluation (hence the minutes
    and the curve). A package that records no step starts a new schedule."""
    training = json.loads((package / "model.json").read_text(encoding="utf-8")).get("training") or {}
    step = training.get("step") or 0
    last = training.get("dev_metrics") or {}
    tokens = training.get("target_tokens") or last.get("target_tokens") or 0
    return Progress(step=step, target_tokens=tokens, rewarm_from=step, history=[last] if last else [],
                    cpu_seconds=last.get("cpu_minutes", 0.0) * 60)


@dataclass
class Datasets:
    train: TokenArrays
    dev: TokenArrays
    dev_refs: dict                  # (source, target) -> dev text pairs for BLEU; empty for a language model


def load_datasets(args: argparse.Namespace, settings: TrainConfig, corpus: CorpusInfo, tok: Tokenizer, out: Path,
                  cluster: Cluster) -> tuple[Datasets, str]:
    """The training and dev examples (rank 0 tokenizes and fills the cache first); -> (them, how long
    loading took and from where)."""
    t0 = time.time()
    cache_dir = token_cache_dir(args.token_cache, corpus.data, out)
    if cluster.distributed and not cluster.is_main:
        dist.barrier()
    train, cached = load_token_arrays(corpus.data / "train.tsv", tok, corpus.directions, corpus.tagged,
                                      settings.max_positions, cache_dir, corpus.lm)
    dev, _ = load_token_arrays(corpus.data / "dev.tsv", tok, corpus.directions, corpus.tagged,
                               settings.max_positions, cache_dir, corpus.lm)
    if cluster.distributed and cluster.is_main:
        dist.barrier()
    dev_refs = {} if corpus.lm else read_refs(corpus.data / "dev.tsv", corpus.directions)
    note = f"{time.time() - t0:.0f}s to {'load from ' + str(cache_dir) if cached else 'tokenize'}"
    return Datasets(train, dev, dev_refs), note


def write_run_config(out: Path, config: TransformerConfig, settings: TrainConfig, args: argparse.Namespace,
                     corpus: CorpusInfo, argv) -> None:
    """config.json: the model, the training settings and the command, for model.export and people."""
    command = "python -m model.train " + " ".join(sys.argv[1:] if argv is None else argv)
    (out / "config.json").write_text(json.dumps({"model": config.to_dict(), "train": asdict(settings),
                                                 "preset": args.preset, "arch": args.arch,
                                                 "task": "generation" if corpus.lm else "translation",
                                                 "direction": None if corpus.lm else args.direction,
                                                 "directions": corpus.labels["directions"],
                                                 "tagged": corpus.tagged, "langs": corpus.langs,
                                                 "data": str(corpus.data), "command": command},
                                                indent=2))


def run_training(args: argparse.Namespace, settings: TrainConfig, argv, started: float,
                 sigterm: SigtermFlag) -> dict:
    """Sets the run up step by step, trains, and saves and evaluates at the end."""
    deadline = started + settings.deadline_minutes * 60 if settings.deadline_minutes else math.inf
    cluster = join_cluster(args.device, args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    corpus = read_corpus_info(args)
    ckpt_path = out / "checkpoint.pt"
    resume = ckpt_path.exists() and not args.no_resume
    tok = prepare_tokenizer(args, corpus, out, resume, cluster)

    torch.manual_seed(settings.seed)
    random.seed(settings.seed)
    state = load_training_checkpoint(ckpt_path) if resume else None
    model, optimizer, progress = build_model(args, corpus, tok, state, cluster.device)
    if state:
        cluster.log(f"resumed {ckpt_path} at step {progress.step} (epoch {progress.epoch}, "
                    f"batch {progress.batch_pos})")
    net = torch.nn.parallel.DistributedDataParallel(model) if cluster.distributed else model

    datasets, note = load_datasets(args, settings, corpus, tok, out, cluster)
    cluster.log(f"{len(datasets.train):,} training examples, {len(datasets.dev):,} dev examples ({note}); "
                f"{model.config.arch} {args.preset}: {model.num_parameters() / 1e6:.1f}M parameters; "
                f"device {cluster.device} x{cluster.world}")
    if cluster.is_main:
        write_run_config(out, model.config, settings, args, corpus, argv)

    trainer = Trainer(model, net, optimizer, progress, settings, corpus, tok, datasets, cluster, out,
                      deadline, sigterm)
    trainer.run()
    if cluster.is_main:
        trainer.finish()
    if cluster.distributed:
        # Rank 0 may still be evaluating and saving: a rank that tore its gloo group down under it
        # aborted now and then ("terminate called without an active exception", SIGABRT).
        dist.barrier()
        dist.destroy_process_group()
    return {"step": progress.step, "epoch": progress.epoch, "sigterm": sigterm.raised}


class ProgressBar:
    """A tqdm bar with the mean loss, learning rate, target tokens/s and ETA, redrawn every 2 s. The loss
    is summed on the device and read (a host sync) only when the bar is redrawn."""

    def __init__(self, total: int | None, initial: int, enabled: bool, device: torch.device):
        self.bar = tqdm(total=total, initial=initial, disable=not enabled, dynamic_ncols=True, mininterval=2.0)
        self.enabled = enabled
        self.tokens_seen, self.t_window = 0, time.time()
        self.loss_sum, self.loss_steps = torch.zeros((), device=device), 0

    def add(self, loss: torch.Tensor, tokens: int) -> None:
        self.tokens_seen += tokens
        self.loss_sum += loss.detach()
        self.loss_steps += 1

    def update(self, now: float, lr: float, epoch: int, end: float) -> None:
        """One step done; `end`: when training must stop (inf: no limit), for the ETA."""
        if self.enabled and now - self.t_window >= 2.0:
            remaining = end - now if end < math.inf else None
            self.bar.set_postfix_str(f"loss {self.loss_sum.item() / self.loss_steps:.3f} lr {lr:.2e} "
                                     f"tok/s {self.tokens_seen / (now - self.t_window):,.0f} ep {epoch}"
                                     + (f" eta {remaining / 60:.1f}m" if remaining is not None else ""))
            self.tokens_seen, self.t_window = 0, now
            self.loss_sum.zero_()
            self.loss_steps = 0
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


class Trainer:
    """The training loop in named steps: `train_step`, `evaluate`, `save`, `should_stop`; `run` loops
    over the batches, `finish` saves and evaluates at the end (rank 0)."""

    def __init__(self, model: Transformer, net: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 progress: Progress, settings: TrainConfig, corpus: CorpusInfo, tok: Tokenizer, data: Datasets,
                 cluster: Cluster, out: Path, deadline: float, sigterm: SigtermFlag):
        self.model, self.net, self.optimizer, self.progress = model, net, optimizer, progress
        self.settings, self.corpus, self.tok, self.data, self.cluster = settings, corpus, tok, data, cluster
        self.out, self.ckpt_path, self.deadline, self.sigterm = out, out / "checkpoint.pt", deadline, sigterm
        self.amp_dtype = autocast_dtype(settings.precision, cluster.device)
        self.use_amp = self.amp_dtype is not None
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp_dtype == torch.float16)
        self.save_seconds = self.eval_seconds = None     # measured: what the deadline keeps back for the end
        # This process's target tokens not yet in progress.target_tokens: with several processes they are
        # summed over all of them when they next decide whether to stop (each counts its own batches).
        self.tokens_unshared = 0
        self.elapsed_before = progress.history[-1]["minutes"] * 60 if progress.history else 0.0
        self.t_start = self.last_save = time.time()
        self.loop_deadline = self.t_start + settings.max_minutes * 60 if settings.max_minutes else math.inf
        # CPU seconds of the training steps: the process's CPU time since here, less evaluations and saves.
        # With several processes the run's is their sum, taken when they next decide whether to stop:
        # `cpu_summed` (all processes' at that sum) and `cpu_own_summed` (this one's share of it).
        self.cpu_start, self.cpu_not_training = time.process_time(), 0.0
        self.cpu_before = progress.cpu_seconds
        self.cpu_summed = self.cpu_own_summed = 0.0
        self.probe_at = self.t_start + PROBE_AT_SHARE * (deadline - self.t_start)   # inf without a deadline

    def host_batches(self, epoch: int, batch_pos: int) -> Iterator[tuple[int, int, IdBatch]]:
        """(epoch, batch number, padded ids on the host) from where the run stands on, epoch after epoch.
        Runs in the prefetch thread."""
        s, c, train = self.settings, self.cluster, self.data.train
        pin = c.device.type == "cuda"
        if pin and c.device.index is not None:
            torch.cuda.set_device(c.device)                # pinned buffers in this process's device context
        while epoch < s.epochs:
            keep = epoch_sample(train.tgt_len, s.short_pieces, s.short_weight, seed=s.seed + epoch)
            if keep is None:
                batches = batch_indices(train.src_len, train.tgt_len, s.max_tokens, seed=s.seed + epoch)
            else:
                batches = [keep[b] for b in batch_indices(train.src_len[keep], train.tgt_len[keep], s.max_tokens,
                                                          seed=s.seed + epoch)]
            batches = batches[: len(batches) - len(batches) % c.world]  # every rank takes the same number of steps
            if not batches:
                raise SystemExit(f"{len(train)} examples make fewer batches than {c.world} processes; "
                                 "lower --max-tokens")
            for bi in range(batch_pos + c.rank, len(batches), c.world):
                yield epoch, bi, collate_ids(train, batches[bi], decoder_only=self.corpus.lm, pin_memory=pin)
            epoch, batch_pos = epoch + 1, 0

    def run(self) -> None:
        """Trains until --max-steps, a time limit, a SIGTERM or the last epoch; evaluates every --eval-every
        steps and saves every --save-every-minutes on the way."""
        s, p, c = self.settings, self.progress, self.cluster
        self.net.train()
        bar = ProgressBar(s.max_steps or None, p.step, c.is_main, c.device)
        if c.is_main and p.rewarm_from and p.step == p.rewarm_from:
            self.evaluate()                        # the package's weights as read back: where the curve resumes
        batches = Prefetcher(self.host_batches(p.epoch, p.batch_pos), depth=3)   # next batches built meanwhile
        with closing(batches) as stream:
            for epoch, bi, host_batch in stream:
                p.epoch = epoch
                loss = self.train_step(host_batch.to(c.device), bi)   # one non-blocking copy; masks built there
                bar.add(loss, host_batch.n_tokens * c.world)
                self.tokens_unshared += host_batch.n_tokens
                if not c.distributed:
                    p.target_tokens, self.tokens_unshared = p.target_tokens + self.tokens_unshared, 0
                now = time.time()
                bar.update(now, self.optimizer.param_groups[0]["lr"], p.epoch, min(self.deadline, self.loop_deadline))
                stop = self.should_stop(now)
                probe = self.eval_seconds is None and now >= self.probe_at   # time an evaluation and a save early
                if c.is_main and ((s.eval_every and p.step % s.eval_every == 0) or probe) and not stop:
                    self.evaluate()
                if c.is_main and (now - self.last_save >= s.save_every_minutes * 60 or probe) and not stop:
                    self.save()
                    self.last_save = now
                if p.step % PURGE_EVERY == 0:
                    jemalloc.purge()
                if stop:
                    break
            else:
                if p.epoch < s.epochs:                     # every epoch done
                    p.epoch, p.batch_pos = s.epochs, 0
        bar.close()

    def train_step(self, b: Batch, bi: int) -> torch.Tensor:
        """One optimizer step on batch `bi` of the epoch; -> its loss (on the device, not read)."""
        s, p, c = self.settings, self.progress, self.cluster
        p.step += 1
        for g in self.optimizer.param_groups:
            g["lr"] = lr_at(p.step, s.lr, s.warmup, p.rewarm_from, s.rewarm, end=s.max_steps, cooldown=s.cooldown)
        with torch.autocast(c.device.type, dtype=self.amp_dtype or torch.float32, enabled=self.use_amp):
            logits = self.net(b.src, b.tgt_in, b.src_mask, b.tgt_mask)                     # (B, T, V)
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), b.tgt_out.view(-1),
                                   ignore_index=PAD_ID, label_smoothing=s.label_smoothing,
                                   reduction="sum") / b.n_tokens
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), s.clip_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        p.batch_pos = bi + c.world - c.rank
        return loss

    def should_stop(self, now: float) -> bool:
        """--max-steps or --max-target-tokens reached, a SIGTERM, or out of time. Several processes decide
        together every STOP_CHECK_EVERY steps (on a GPU an all-reduce that waits for the device, so not every step):
        each has its own clock, signals and batch sizes, and one that left alone would hang the others in
        the next gradient all-reduce. The step count is the same on all of them, so --max-steps is exact."""
        s, p, c = self.settings, self.progress, self.cluster
        at_max_steps = bool(s.max_steps and p.step >= s.max_steps)
        if c.distributed:
            every = STOP_CHECK_EVERY.get(c.device.type, 1)
            if p.step % every and not at_max_steps:          # all reach --max-steps together: the last sum
                return False
            # One sum: the processes that want to stop, the target tokens of all since the last check and the
            # CPU seconds each has spent in training steps. The CPU budget is checked on that exact sum, the same
            # number on every process (their estimates between sums differ, and processes that decided apart
            # would hang in the next all-reduce).
            own_cpu = self.training_cpu_seconds()
            wants = self.sigterm.raised or self.out_of_time(now, cpu=False)
            shared = torch.tensor([float(wants), self.tokens_unshared, own_cpu], dtype=torch.float64, device=c.device)
            dist.all_reduce(shared, op=dist.ReduceOp.SUM)
            wanting, tokens, self.cpu_summed = shared.tolist()
            p.target_tokens, self.tokens_unshared, self.cpu_own_summed = p.target_tokens + int(tokens), 0, own_cpu
            stop = wanting > 0 or at_max_steps or self.cpu_spent(self.cpu_before + self.cpu_summed)
        else:
            stop = at_max_steps or self.sigterm.raised or self.out_of_time(now)
        return stop or bool(s.max_target_tokens and p.target_tokens >= s.max_target_tokens)

    def out_of_time(self, now: float, cpu: bool = True) -> bool:
        """Past --max-minutes or (`cpu`) --max-cpu-minutes, or too close to the deadline for the final evaluation
        and save."""
        if now >= self.loop_deadline or (cpu and self.cpu_spent(self.run_cpu_seconds())):
            return True
        if self.deadline == math.inf or self.eval_seconds is None or self.save_seconds is None:
            return now >= self.deadline
        tail = DEADLINE_TAIL_FACTOR * (self.eval_seconds + 2 * self.save_seconds) + DEADLINE_MARGIN_S
        return now >= self.deadline - tail

    def cpu_spent(self, run_cpu_seconds: float) -> bool:
        """Whether a run at `run_cpu_seconds` has spent --max-cpu-minutes (never without one)."""
        return bool(self.settings.max_cpu_minutes) and run_cpu_seconds >= self.settings.max_cpu_minutes * 60

    def training_cpu_seconds(self) -> float:
        """This process's CPU seconds in training steps since the loop started (all threads, the batch
        prefetcher's too; evaluations and saves left out)."""
        return time.process_time() - self.cpu_start - self.cpu_not_training

    def run_cpu_seconds(self) -> float:
        """The run's CPU seconds in training steps: the resumed checkpoint's (or package's) and this run's, summed
        over its processes: exact at their last sum (should_stop), then this process's since, times their number
        (they take the same steps)."""
        since = self.training_cpu_seconds() - self.cpu_own_summed
        return self.cpu_before + self.cpu_summed + since * self.cluster.world

    def evaluate(self) -> None:
        """Dev metrics into the history, the log and train_log.jsonl; best.pt when they are the best yet."""
        t, cpu, run_cpu = time.time(), time.process_time(), self.run_cpu_seconds()
        s, p, data, device = self.settings, self.progress, self.data, self.cluster.device
        if self.corpus.lm:                  # the best language model has the lowest dev loss
            metrics = evaluate_lm_dev(self.model, data.dev, s.max_tokens, device)
            score = -metrics["dev_loss"]
        else:
            metrics = evaluate_dev(self.model, self.tok, data.dev, data.dev_refs, self.corpus.tagged, s.max_tokens,
                                   s.eval_sentences, device)
            score = sum(v for k, v in metrics.items() if k.startswith("bleu")) / max(1, len(data.dev_refs))
        minutes = round((time.time() - self.t_start + self.elapsed_before) / 60, 1)
        metrics.update(step=p.step, target_tokens=p.target_tokens, minutes=minutes, cpu_minutes=round(run_cpu / 60, 2))
        p.history.append(metrics)
        tqdm.write(json.dumps(metrics))
        if score > p.best_score:
            p.best_score = score
            save_best(self.out / "best.pt", self.model, p.step, metrics, self.corpus.labels)
        with open(self.out / "train_log.jsonl", "a") as f:
            f.write(json.dumps(metrics) + "\n")
        self.eval_seconds = max(self.eval_seconds or 0.0, time.time() - t)
        self.cpu_not_training += time.process_time() - cpu

    def save(self) -> None:
        t, cpu = time.time(), time.process_time()
        self.progress.cpu_seconds = self.run_cpu_seconds()
        save_training_checkpoint(self.ckpt_path, self.model, self.optimizer, self.progress, self.corpus.labels)
        if self.settings.keep_saves:
            keep_snap(self.out, self.model, self.progress, self.corpus.labels, self.settings.keep_saves)
        self.save_seconds = max(self.save_seconds or 0.0, time.time() - t)
        self.cpu_not_training += time.process_time() - cpu

    def finish(self) -> None:
        """The last save, then a final evaluation unless the last step had one (or a SIGTERM stopped it)."""
        p = self.progress
        self.save()                                      # first, so that a kill during the evaluation loses nothing
        if self.sigterm.raised:
            print(f"SIGTERM: stopped at step {p.step}, saved {self.ckpt_path}")
        elif not p.history or p.history[-1]["step"] != p.step:
            self.evaluate()
            self.save()
        best = (f"best dev perplexity {math.exp(-p.best_score):.2f}" if self.corpus.lm
                else f"best dev BLEU {p.best_score:.2f}")
        print(f"done: step {p.step}, epoch {p.epoch}, {best}; checkpoints in {self.out}")


if __name__ == "__main__":
    main()
