"""Token-budget batches from length buckets, and the collate step that builds padded tensors and masks.

Sorting examples by length before cutting batches keeps padding small; a token budget (rows ×
longest row) rather than a fixed row count keeps every batch about the same cost, so short
sentences travel in big batches and long ones in small ones.

The training input pipeline works on flat arrays, never on one Python list per example:

- `TokenArrays`: every example's source and target ids in two flat arrays with offsets, built once
  per corpus and tokenizer and cached on disk (`cached_token_arrays`, keyed by the corpus's and the
  tokenizer's contents and the settings that shape the examples);
- `batch_indices`: the token-budget batches from the length arrays with numpy (the same batches, in
  the same order, as `token_batches` (tests/oracles.py) on the same examples and seed);
- `collate_ids`: one batch's padded (B, S) / (B, T) ids by numpy fancy indexing, straight into one
  (pinned, on CUDA) buffer; `IdBatch.to(device)` copies it in one non-blocking transfer and builds
  the masks there with `padding_mask` / `causal_mask`;
- `Prefetcher`: a background thread that prepares the next batches while the current one trains.
"""

from __future__ import annotations

import hashlib
import os
import queue
import random
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from .tokenizer import BOS_ID, EOS_ID, PAD_ID
from .transformer import causal_mask, padding_mask


@dataclass
class Example:
    src: list[int]   # encoder input, eos included (and a <2xx> tag first for multi-direction models)
    tgt: list[int]   # target pieces, no bos/eos


@dataclass
class Batch:
    src: torch.Tensor | None       # (B, S) padded; None for a decoder-only model
    src_mask: torch.Tensor | None  # (B, 1, 1, S)
    tgt_in: torch.Tensor           # (B, T) <s> y1 … y_{T-1}
    tgt_out: torch.Tensor          # (B, T) y1 … y_{T-1} </s>, pad elsewhere
    tgt_mask: torch.Tensor         # (B, 1, T, T) padding & causal
    n_tokens: int                  # real target tokens (the loss denominator)

    def to(self, device: torch.device | str) -> "Batch":
        move = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return Batch(move(self.src), move(self.src_mask), move(self.tgt_in), move(self.tgt_out),
                     move(self.tgt_mask), self.n_tokens)


def pad(seqs: Sequence[Sequence[int]], pad_id: int = PAD_ID) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out


# --- examples as flat arrays ------------------------------------------------------------------------

def _id_dtype(max_id: int) -> np.dtype:
    return np.dtype(np.uint16) if max_id < 2 ** 16 else np.dtype(np.int32)


def flatten(seqs: Sequence[Sequence[int]], dtype: np.dtype | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Lists of ids -> (flat ids, offsets (n+1,) int64): row i is flat[off[i]:off[i+1]]."""
    lens = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    off = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(lens, out=off[1:])
    flat = np.fromiter((i for s in seqs for i in s), dtype=np.int64, count=int(off[-1]))
    if dtype is None:
        dtype = _id_dtype(int(flat.max()) if flat.size else 0)
    return flat.astype(dtype, copy=False), off


def concat_ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenation of arange(starts[i], starts[i] + lens[i]) over i, without a Python loop."""
    lens = lens.astype(np.int64, copy=False)
    total = int(lens.sum())
    before = np.cumsum(lens) - lens                     # where each row begins in the output
    return np.repeat(starts.astype(np.int64, copy=False) - before, lens) + np.arange(total, dtype=np.int64)


def select_rows(flat: np.ndarray, off: np.ndarray, rows: np.ndarray, prefix: Sequence[int] = (),
                suffix: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Rows `rows` of a flat array, each with `prefix` before and `suffix` after it -> (flat, offsets)."""
    rows = np.asarray(rows, dtype=np.int64)
    lens = off[rows + 1] - off[rows]
    p, s = len(prefix), len(suffix)
    new_off = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lens + p + s, out=new_off[1:])
    out = np.empty(int(new_off[-1]), dtype=flat.dtype)
    dest = concat_ranges(new_off[:-1] + p, lens)
    out[dest] = flat[concat_ranges(off[rows], lens)]
    for k, t in enumerate(prefix):
        out[new_off[:-1] + k] = t
    for k, t in enumerate(suffix):
        out[new_off[1:] - s + k] = t
    return out, new_off


@dataclass
class TokenArrays:
    """Examples as flat arrays: example i's source is src[src_off[i]:src_off[i+1]] (eos and any
    <2xx> tag included, as `Example.src`), its target tgt[tgt_off[i]:tgt_off[i+1]] (no bos/eos).
    A decoder-only corpus has empty sources."""
    src: np.ndarray
    src_off: np.ndarray
    tgt: np.ndarray
    tgt_off: np.ndarray

    def __post_init__(self):
        self.src_len = np.diff(self.src_off)
        self.tgt_len = np.diff(self.tgt_off)

    def __len__(self) -> int:
        return len(self.tgt_off) - 1

    @classmethod
    def from_examples(cls, examples: Sequence[Example]) -> "TokenArrays":
        max_id = max((max(e.src + e.tgt, default=0) for e in examples), default=0)
        dtype = _id_dtype(max_id)
        src, src_off = flatten([e.src for e in examples], dtype)
        tgt, tgt_off = flatten([e.tgt for e in examples], dtype)
        return cls(src, src_off, tgt, tgt_off)

    @classmethod
    def concat(cls, parts: Sequence["TokenArrays"]) -> "TokenArrays":
        def join(flats, offs):
            dtype = np.result_type(*[f.dtype for f in flats])
            shifts = np.cumsum([0] + [int(o[-1]) for o in offs[:-1]])
            off = np.concatenate([offs[0][:1]] + [o[1:] + sh for o, sh in zip(offs, shifts)])
            return np.concatenate([f.astype(dtype, copy=False) for f in flats]), off
        if not parts:
            empty = np.zeros(0, dtype=np.uint16)
            return cls(empty, np.zeros(1, np.int64), empty, np.zeros(1, np.int64))
        return cls(*join([p.src for p in parts], [p.src_off for p in parts]),
                   *join([p.tgt for p in parts], [p.tgt_off for p in parts]))

    def example(self, i: int) -> Example:
        return Example(self.src[self.src_off[i]:self.src_off[i + 1]].tolist(),
                       self.tgt[self.tgt_off[i]:self.tgt_off[i + 1]].tolist())

    def examples(self) -> list[Example]:
        return [self.example(i) for i in range(len(self))]

    def save(self, path: Path) -> None:
        """Atomically (a reader never sees half a file; concurrent writers of one key both succeed)."""
        path = Path(path)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with open(tmp, "wb") as f:
            np.savez(f, src=self.src, src_off=self.src_off, tgt=self.tgt, tgt_off=self.tgt_off)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> "TokenArrays":
        with np.load(path) as z:
            return cls(z["src"], z["src_off"], z["tgt"], z["tgt_off"])


# --- the tokenized-corpus cache ----------------------------------------------------------------------

CACHE_FORMAT = 1


def file_digest(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_key(corpus: Path, tokenizer_model: Path, **settings) -> str:
    """Hash of the corpus's and the tokenizer's contents and of every setting that shapes the examples."""
    parts = [f"format={CACHE_FORMAT}", f"corpus={file_digest(corpus)}", f"tokenizer={file_digest(tokenizer_model)}"]
    parts += [f"{k}={settings[k]!r}" for k in sorted(settings)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def cached_token_arrays(cache_dir: Path | None, corpus: Path, tokenizer_model: Path,
                        build: Callable[[], TokenArrays], **settings) -> tuple[TokenArrays, bool]:
    """`build()`'s arrays, from `cache_dir` when an entry for the same corpus, tokenizer and settings is
    there, else built and stored. -> (arrays, whether they came from the cache). No cache_dir: built."""
    if cache_dir is None:
        return build(), False
    path = Path(cache_dir) / f"{Path(corpus).stem}-{cache_key(corpus, tokenizer_model, **settings)[:24]}.npz"
    if path.exists():
        try:
            return TokenArrays.load(path), True
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            pass                                         # a damaged entry is rebuilt
    arrays = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays.save(path)
    except OSError:
        pass                                             # a read-only place: no cache, same arrays
    return arrays, False


# --- token-budget batches ------------------------------------------------------------------------------

def batch_indices(src_len: np.ndarray, tgt_len: np.ndarray, max_tokens: int, *, shuffle: bool = True,
                  seed: int = 0, bucket_size: int = 100_000) -> list[np.ndarray]:
    """Indices of the examples grouped into batches of at most `max_tokens` padded tokens
    (rows × max(source, target+1) length). Buckets of `bucket_size` examples are sorted by length,
    cut into batches, and the batches shuffled, so each epoch sees a different order.

    The same batches in the same order as `token_batches` for the same lengths and seed: the example
    order and the batch order come from the same `random.Random(seed)` shuffles, the sort within a
    bucket is the same stable sort by (target, source) length, and the greedy cut the same rule."""
    src_len = np.asarray(src_len, dtype=np.int64)
    tgt_len = np.asarray(tgt_len, dtype=np.int64)
    n = len(tgt_len)
    rng = random.Random(seed)
    if shuffle:
        order_list = list(range(n))
        rng.shuffle(order_list)
        order = np.array(order_list, dtype=np.int64)
    else:
        order = np.arange(n, dtype=np.int64)
    width = np.maximum(src_len, tgt_len + 1)
    batches: list[np.ndarray] = []
    for start in range(0, n, bucket_size):
        bucket = order[start:start + bucket_size]
        bucket = bucket[np.lexsort((src_len[bucket], tgt_len[bucket]))]    # stable: ties keep shuffle order
        w = width[bucket]
        m, i = len(bucket), 0
        while i < m:
            # A batch that starts at i is at least w[i] wide, so it has at most max_tokens // w[i] rows;
            # row j (0-based) fits while max(w[i..i+j]) * (j + 1) <= max_tokens, which only grows with j.
            window = w[i:i + max(1, max_tokens // max(int(w[i]), 1)) + 1]
            cost = np.maximum.accumulate(window) * np.arange(1, len(window) + 1)
            rows = max(1, int(np.searchsorted(cost > max_tokens, True)))   # first row that does not fit
            batches.append(bucket[i:i + rows])
            i += rows
    if shuffle:
        rng.shuffle(batches)
    return batches


# --- collate ----------------------------------------------------------------------------------------------

@dataclass
class IdBatch:
    """One batch's padded ids on the host, in a single buffer (pinned when built for CUDA) so that it
    crosses to the device in one copy; `to(device)` builds the masks there."""
    buffer: torch.Tensor            # int64: src (B*S), then tgt_in (B*T), then tgt_out (B*T)
    rows: int
    src_width: int                  # 0 for a decoder-only batch
    tgt_width: int
    n_tokens: int                   # real target tokens, eos included (the loss denominator)

    def views(self, buffer: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        b, s, t = self.rows, self.src_width, self.tgt_width
        src = buffer[:b * s].view(b, s) if s else None
        return src, buffer[b * s:b * (s + t)].view(b, t), buffer[b * (s + t):].view(b, t)

    def to(self, device: torch.device | str) -> Batch:
        """The batch on `device` (one non-blocking copy from pinned memory on CUDA), masks built there."""
        buffer = self.buffer.to(device, non_blocking=True)
        src, tgt_in, tgt_out = self.views(buffer)
        tgt_mask = padding_mask(tgt_in, PAD_ID) & causal_mask(tgt_in.size(1), device=tgt_in.device)
        src_mask = None if src is None else padding_mask(src, PAD_ID)
        return Batch(src, src_mask, tgt_in, tgt_out, tgt_mask, self.n_tokens)


def collate_ids(data: TokenArrays, idx: Sequence[int] | np.ndarray, decoder_only: bool = False,
                pin_memory: bool = False) -> IdBatch:
    """The padded ids of examples `idx` of `data`: what `collate` builds, without a per-example
    Python loop and without the masks (`IdBatch.to` builds them on the device)."""
    idx = np.asarray(idx, dtype=np.int64)
    b = len(idx)
    t_len = data.tgt_len[idx]
    t_start = data.tgt_off[idx]
    t = int(t_len.max()) + 1                              # <s> + target, or target + </s>
    s_len = None if decoder_only else data.src_len[idx]
    s = 0 if decoder_only else int(s_len.max())
    buffer = torch.empty(b * (s + 2 * t), dtype=torch.long, pin_memory=pin_memory)
    flat = buffer.numpy()
    flat.fill(PAD_ID)
    rows = np.arange(b, dtype=np.int64)
    if not decoder_only:
        flat[concat_ranges(rows * s, s_len)] = data.src[concat_ranges(data.src_off[idx], s_len)]
    tgt = data.tgt[concat_ranges(t_start, t_len)]
    out_at = concat_ranges(b * (s + t) + rows * t, t_len)   # tgt_out: y1 … at columns 0 …
    flat[out_at - b * t + 1] = tgt                          # tgt_in: <s> y1 … at columns 1 …
    flat[out_at] = tgt
    flat[b * s + rows * t] = BOS_ID                         # tgt_in column 0
    flat[b * (s + t) + rows * t + t_len] = EOS_ID           # tgt_out after the target
    return IdBatch(buffer, b, s, t, int(t_len.sum()) + b)


def collate(examples: Sequence[Example], decoder_only: bool = False) -> Batch:
    """Pads a list of examples and builds both masks on the host, one example at a time: for a few
    sequences (model.evaluate), and the reference `collate_ids` is tested against. A decoder-only
    model reads `tgt` alone."""
    tgt_in = pad([[BOS_ID] + e.tgt for e in examples])                          # (B, T)
    tgt_out = pad([e.tgt + [EOS_ID] for e in examples])                         # (B, T)
    tgt_mask = padding_mask(tgt_in, PAD_ID) & causal_mask(tgt_in.size(1))       # (B, 1, T, T)
    n_tokens = int((tgt_out != PAD_ID).sum())
    if decoder_only:
        return Batch(None, None, tgt_in, tgt_out, tgt_mask, n_tokens)
    src = pad([e.src for e in examples])                                        # (B, S)
    return Batch(src, padding_mask(src, PAD_ID), tgt_in, tgt_out, tgt_mask, n_tokens)


# --- the next batches, prepared in the background --------------------------------------------------

_DONE = object()


class Prefetcher:
    """Runs an iterator in a background thread, `depth` items ahead of its consumer. An exception
    in the producer (SystemExit included) is raised in the consumer at the item where it happened.
    `close()` stops the producer (`with contextlib.closing(Prefetcher(...)) as stream:`)."""

    def __init__(self, items: Iterable, depth: int = 2):
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(target=self._run, args=(iter(items),), name="batch-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, items: Iterator) -> None:
        try:
            for item in items:
                if not self._put((item, None)):
                    return
        except BaseException as e:                       # noqa: BLE001 - handed to the consumer
            self._put((_DONE, e))
            return
        self._put((_DONE, None))

    def __iter__(self):
        return self

    def __next__(self):
        if self._finished:
            raise StopIteration
        item, error = self._queue.get()
        if error is not None:
            self.close()
            raise error
        if item is _DONE:
            self.close()
            raise StopIteration
        return item

    def close(self) -> None:
        self._finished = True
        self._stop.set()
        self._thread.join()
