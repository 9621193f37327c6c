"""Memory we own for the tensors that outlive one onnxruntime run: the encoder's keys/values, which
every decoder step reads, and the decoder's self-attention cache, which grows by a position a step.

Left to onnxruntime, both came from its arena, in between the tensors that live within one run. Its
free space then lay in pieces too small for the next step's larger cache, so the arena kept
extending: in a 10-minute soak the inference worker's memory rose by a third over six minutes though
no batch was larger than in the first (benchmarks/results/load-cpu.md). Bound by address instead
(`IOBinding.bind_input` / `bind_output` with a pointer), they live in blocks that one search hands
to the next, and the arena holds only what a single run needs, all of it free again when the run ends.

A translation decoder writes its cache in place (`InPlaceCache`: the graph writes each row's new column
into the memory it read, model/export.py), and rows are reordered here, between steps, only when they
change. A generation decoder's cache (`KVCache`) is written into two blocks in turn: a step reads
`past` from one and writes `present` into the other, since that graph reorders rows as it reads them.
A tensor of any shape takes the first prod(shape) elements of its stretch of the block.

On the CPU a block is a numpy array and a reorder is one numpy copy of the live columns. On CUDA the
translation cache's reorder, the encoder outputs' `select`, the running batch's cross slots and a generation
batch's cache when rows join stay on the device (`BlockPool.gather`: service/inference/row_gather.py's graph
of Gather, Slice and Pad between two blocks); only a generation batch's first rows, with nothing cached to copy,
get their zeros from the host. tests/test_row_gather.py runs the device path on the CPU provider; no GPU has
run it yet.
"""

from __future__ import annotations

import threading
import weakref
from math import prod
from typing import Sequence

import numpy as np
import onnxruntime as ort

from .onnxruntime_bridge import Binder
from .row_gather import RowGather


class Block:
    """`size` elements of `dtype` where the model runs: a numpy array on the CPU, whose pages the
    system commits only as they are first written, so a block sized for a search's longest possible
    output costs only what the search writes; on CUDA an OrtValue from onnxruntime's allocator for the
    device, reserved in full (not yet run on a GPU here)."""

    def __init__(self, size: int, dtype: np.dtype, device: str, *, host_array: bool = True):
        self.size, self.dtype, self.itemsize = size, dtype, dtype.itemsize
        if device == "cpu" and host_array:
            self.data = np.empty(size, dtype)
            self.address: int = self.data.ctypes.data
        else:
            self.data = ort.OrtValue.ortvalue_from_shape_and_type([size], dtype, device, 0)
            self.address = self.data.data_ptr()

    def at(self, offset: int) -> int:
        """The address of element `offset`."""
        return self.address + offset * self.itemsize

    def host(self, *, contents: bool = True) -> np.ndarray:
        """The block as a numpy array: itself on the CPU, a copy on a device (write it back with `commit`);
        contents=False: on a device, an uninitialised array of its size (for a block about to be overwritten)."""
        if isinstance(self.data, np.ndarray):
            return self.data
        return self.data.numpy() if contents else np.empty(self.size, self.dtype)

    def commit(self, host: np.ndarray) -> None:
        """Makes `host` (from `host()`) the block's contents: nothing to do on the CPU."""
        if not isinstance(self.data, np.ndarray):
            self.data.update_inplace(host)


class BlockPool:
    """Blocks handed back by finished searches, for the next: the smallest large enough is reused. It
    keeps at most `keep` (the largest), so what it holds is bounded by the largest searches seen, which
    the token budget per engine batch bounds in turn. Thread-safe: searches on one engine may overlap."""

    def __init__(self, dtype: type, device: str, keep: int = 3, *, host_blocks: bool = True):
        """host_blocks=False: on the CPU too, blocks are onnxruntime's and copies run as on a device (for tests
        of that path)."""
        if keep < 1:
            raise ValueError(f"keep must be at least 1 (a search hands back up to 3 blocks), got {keep}")
        self.dtype, self.device, self.keep = np.dtype(dtype), device, keep
        self.on_host = device == "cpu" and host_blocks      # blocks are numpy arrays, copies numpy's
        self.bind = Binder(device)
        self._gather: RowGather | None = None
        self._free: list[Block] = []                  # ascending size
        # Blocks taken and not given back, with the bytes their takers asked for (a block dropped unreturned
        # leaves by itself: a generator closed before its first step hands its blocks to the collector).
        self._lent: weakref.WeakKeyDictionary[Block, int] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def take(self, size: int) -> Block:
        with self._lock:
            block = next((self._free.pop(i) for i, b in enumerate(self._free) if b.size >= size), None)
        if block is None:
            block = Block(max(size, 1), self.dtype, self.device, host_array=self.on_host)
        with self._lock:
            self._lent[block] = max(size, 1) * self.dtype.itemsize
        return block

    def give(self, *blocks: Block) -> None:
        with self._lock:
            for block in blocks:
                self._lent.pop(block, None)
            self._free.extend(blocks)
            self._free.sort(key=lambda b: b.size)
            del self._free[:-self.keep]

    def gather(self, src: int, shape: tuple[int, int, int, int, int], rows: np.ndarray, width: int,
               dst: int) -> None:
        """At address `dst`: the rows `rows` (-1: any) of the (L, R, h, W, d_k) tensor at address `src`, at `width`
        columns, zero-padded; copied where the blocks are (row_gather.RowGather; for blocks that are not numpy
        arrays, `Block.at` gives the addresses)."""
        if self._gather is None:
            self._gather = RowGather(self.device, self.dtype)
        self._gather(src, shape, rows, width, dst)

    @property
    def lent_bytes(self) -> int:
        """What the searches running now asked for: the blocks taken and not given back, each counted at the
        size its taker asked for (a reused block may be larger), in bytes."""
        with self._lock:
            return sum(self._lent.values())

    @property
    def held_bytes(self) -> int:
        with self._lock:
            return sum(b.size * b.itemsize for b in self._free)


class Tensors:
    """Same-shaped tensors side by side in one block (the encoder's cross_key_i / cross_value_i)."""

    def __init__(self, pool: BlockPool, names: Sequence[str], shape: Sequence[int]):
        self.pool, self.names, self.shape = pool, list(names), [int(d) for d in shape]
        self.block: Block | None = pool.take(len(self.names) * prod(self.shape))

    @property
    def nbytes(self) -> int:
        return len(self.names) * prod(self.shape) * self.pool.dtype.itemsize if self.block is not None else 0

    def bind_outputs(self, io: ort.IOBinding) -> None:
        n, pool = prod(self.shape), self.pool
        for i, name in enumerate(self.names):
            pool.bind.output(io, name, pool.dtype, self.shape, self.block.at(i * n))

    def bind_inputs(self, io: ort.IOBinding) -> None:
        n, pool = prod(self.shape), self.pool
        for i, name in enumerate(self.names):
            pool.bind.input(io, name, pool.dtype, self.shape, self.block.at(i * n))

    def select(self, rows: np.ndarray) -> None:
        """Keeps rows `rows` (int64) of every tensor, in that order, in a block of its own."""
        n, old = prod(self.shape), self.block
        shape = [len(rows), *self.shape[1:]]
        new = self.pool.take(len(self.names) * prod(shape))
        if self.pool.on_host:
            src, dst = old.host(), new.host(contents=False)
            for i in range(len(self.names)):
                np.take(src[i * n:(i + 1) * n].reshape(self.shape), rows, axis=0, mode="clip",
                        out=dst[i * prod(shape):(i + 1) * prod(shape)].reshape(shape))
        else:                              # the tensors back to back: one (names, A, h, S, d_k) gather
            A, h, S, d_k = self.shape
            self.pool.gather(old.address, (len(self.names), A, h, S, d_k), rows, S, new.address)
        self.pool.give(old)
        self.block, self.shape = new, shape

    def close(self) -> None:
        """Hands the block back; the tensors must not be read again."""
        if self.block is not None:
            self.pool.give(self.block)
            self.block = None


class KVCache:
    """A generation decoder's self-attention cache: one (rows, h, T, d_k) tensor per past_*/present_* name, read
    from one block and written into the other, which swap after every step.

    `max_rows` and `max_positions` size the blocks for the whole search (the most rows at once, beams
    included, and the most positions); a step that needs more gets a block twice its size for what it
    writes, so an estimate that falls short costs a reallocation, never a wrong answer."""

    def __init__(self, pool: BlockPool, past_names: Sequence[str], present_names: Sequence[str],
                 rows: int, h: int, d_k: int, *, max_rows: int, max_positions: int):
        self.pool, self.past_names, self.present_names = pool, list(past_names), list(present_names)
        self.shape = [rows, h, 0, d_k]                         # of the past: nothing cached yet
        size = len(self.past_names) * max_rows * h * max_positions * d_k
        self.read: Block | None = pool.take(size)
        self.write: Block | None = pool.take(size)
        self._next = self.shape

    def bind(self, io: ort.IOBinding, rows: int, new_positions: int, *, width: int | None = None) -> None:
        """Binds the past as inputs, and room for `rows` rows of `new_positions` more as the present:
        T + new_positions columns, or `width` for a graph that writes each token at its position's
        column (None: appends)."""
        L = len(self.past_names)
        _, h, T, d_k = self.shape
        present = [rows, h, T + new_positions if width is None else width, d_k]
        if L * prod(present) > self.write.size:
            # Taken before the old one goes back: if taking fails, close() must not give it twice.
            larger = self.pool.take(2 * L * prod(present))
            self.pool.give(self.write)
            self.write = larger
        bind, dtype = self.pool.bind, self.pool.dtype
        stride = self.read.size // L
        for i, name in enumerate(self.past_names):
            bind.input(io, name, dtype, self.shape, self.read.at(i * stride))
        stride = self.write.size // L
        for i, name in enumerate(self.present_names):
            bind.output(io, name, dtype, present, self.write.at(i * stride))
        self._next = present

    def advance(self) -> None:
        """After the run: what was written is the past of the next step."""
        self.read, self.write = self.write, self.read
        self.shape = self._next

    def close(self) -> None:
        """Hands both blocks back; the decoder must not step again."""
        if self.read is not None:
            self.pool.give(self.read, self.write)
            self.read = self.write = None


def _prefixes(src: np.ndarray, dst: np.ndarray, rows: np.ndarray, filled: np.ndarray) -> None:
    """dst's row i = src's row rows[i], its first filled[i] columns only (-1: a new row, nothing), a numpy call a
    row. A running batch's rows are at different positions and its width W is the furthest one's, so one gather of
    W columns a row moved three times the bytes written (mean position 5 of W 15, issue 50's measurement); the copy
    is memory-bound, and the bytes it does not move also leave the caches to the model's weights. Measured against
    the one gather: the relayout's CPU 0.24-0.36 -> 0.13-0.23 s, the scheduler's tokens a CPU second +5-8%
    (benchmarks/results/serving-cpu.md, 2026-12-03)."""
    cols = np.minimum(np.where(rows < 0, 0, filled), min(src.shape[3], dst.shape[3]))
    for i, (r, c) in enumerate(zip(rows.tolist(), cols.tolist())):
        if c:
            dst[:, i, :, :c] = src[:, r, :, :c]


class InPlaceCache:
    """The translation decoder's self-attention cache: one (rows, h, W, d_k) tensor per past_*/present_*
    pair, bound to one address for both, so a step writes its new column where it reads (model/export.py).
    W grows by `columns` at a time, always past the next position; growing it and reordering rows (beam
    back-pointers, finished sentences dropped) copy the cache into the second block, which then becomes
    the first: once a step in beam search, once every `columns` steps and once a finished sentence in
    greedy search, where a decoder that reorders inside its graph copied it twice every step.

    `max_rows` and `max_positions` size the blocks for the whole search; more costs a larger block."""

    def __init__(self, pool: BlockPool, past_names: Sequence[str], present_names: Sequence[str],
                 rows: int, h: int, d_k: int, *, max_rows: int, max_positions: int, columns: int = 8):
        self.pool, self.names = pool, list(zip(past_names, present_names))
        self.rows, self.width, self.h, self.d_k, self.columns = rows, 0, h, d_k, columns
        size = len(self.names) * max(max_rows, rows) * h * -(-max_positions // columns) * columns * d_k
        self.blocks: list[Block] | None = [pool.take(size), pool.take(size)]
        self._bound: tuple | None = None                # what `bind` last bound: (address, rows, width)

    @property
    def read(self) -> Block:
        """The block the next step reads and writes."""
        return self.blocks[0]

    @property
    def write(self) -> Block:
        """The block the next reorder or widening copies into."""
        return self.blocks[1]

    def _tensor_size(self, rows: int, width: int) -> int:
        return rows * self.h * width * self.d_k

    @property
    def nbytes(self) -> int:
        """What its tensors hold now (the blocks may be larger)."""
        return len(self.names) * self._tensor_size(self.rows, self.width) * self.pool.dtype.itemsize

    def reserve(self, position: int) -> None:
        """Makes room for column `position` (the next step's), widening by `columns` when it is full."""
        if position >= self.width:
            self._relayout(None, -(-(position + 1) // self.columns) * self.columns)

    def select(self, rows: np.ndarray) -> None:
        """Keeps rows `rows` (int64) of every tensor, in that order; nothing is copied when they are all
        the rows in order (compared as lists: a beam step's few rows cost numpy's calls more)."""
        if rows.tolist() == list(range(self.rows)):
            return
        self._relayout(rows, self.width)

    def fit(self, rows: np.ndarray, width: int, filled: np.ndarray | None = None) -> None:
        """Keeps rows `rows` (int64) of every tensor, in that order, at `width` columns (wider or narrower);
        a row -1 is a new one, its columns left as they happen to be (its search writes each column before it
        reads it). Nothing is copied when they are all the rows in order at the same width (a running batch,
        service/inference/decoders.py: rows join and leave between its steps). `filled`: each kept row's columns
        written so far (its next position), when known: only those are copied (`_prefixes`)."""
        if width == self.width and np.array_equal(rows, np.arange(self.rows)):
            return
        self._relayout(rows, width, filled)

    def _relayout(self, rows: np.ndarray | None, width: int, filled: np.ndarray | None = None) -> None:
        """Copies the cache into the second block with rows `rows` (None: the same; -1: any) at `width`
        columns. The tensors lie back to back, so one numpy call (or one gather graph, RowGather) moves all
        of them, or one call a row for its `filled` columns only (`_prefixes`)."""
        read, write = self.blocks
        L2, M = len(self.names), self.rows if rows is None else len(rows)
        n, m = self._tensor_size(self.rows, self.width), self._tensor_size(M, width)
        if L2 * m > write.size:
            # Taken before the old one goes back: if taking fails, close() must not give it twice.
            larger = self.pool.take(2 * L2 * m)
            self.pool.give(write)
            self.blocks[1] = write = larger
        if n and m and not self.pool.on_host:
            self.pool.gather(read.address, (L2, self.rows, self.h, self.width, self.d_k),
                             np.arange(self.rows) if rows is None else rows, width, write.address)
        elif n and m:
            src = read.host()[:L2 * n].reshape(L2, self.rows, self.h, self.width, self.d_k)
            host = write.host(contents=False)
            dst = host[:L2 * m].reshape(L2, M, self.h, width, self.d_k)
            if filled is not None and rows is not None:
                _prefixes(src, dst, rows, filled)
            elif width <= self.width and rows is not None:       # the same or narrower: one gather
                np.take(src[:, :, :, :width], rows, axis=1, out=dst, mode="clip")   # "raise" would buffer; -1 -> 0
            else:
                w = min(width, self.width)
                dst[:, :, :, :w] = (src if rows is None else src[:, np.maximum(rows, 0)])[:, :, :, :w]
            write.commit(host)
        self.blocks = [write, read]
        self.rows, self.width = M, width

    def forget_binding(self) -> None:
        """The next `bind` binds again (the binding's outputs were cleared)."""
        self._bound = None

    def bind(self, io: ort.IOBinding) -> None:
        """Binds each past_* and its present_* to the tensor's one address (again only when it moved)."""
        read = self.blocks[0]
        key = (read.address, self.rows, self.width)
        if key == self._bound:
            return
        bind, dtype = self.pool.bind, self.pool.dtype
        shape = [self.rows, self.h, self.width, self.d_k]
        n = self._tensor_size(self.rows, self.width)
        for i, (past, present) in enumerate(self.names):
            bind.input(io, past, dtype, shape, read.at(i * n))
            bind.output(io, present, dtype, shape, read.at(i * n))
        self._bound = key

    def close(self) -> None:
        """Hands both blocks back; the decoder must not step again."""
        if self.blocks is not None:
            self.pool.give(*self.blocks)
            self.blocks = None

