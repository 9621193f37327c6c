"""Memory we own for the tensors that outlive one onnxruntime run: the encoder's keys/values, which
every decoder step reads, and the decoder's self-attention cache, which grows by a position a step.

Left to onnxruntime, both came from its arena, in between the tensors that live within one run. Its
free space then lay in pieces too small for the next step's larger cache, so the arena kept
extending: in a 10-minute soak the inference worker's memory rose by a third over six minutes though
no batch was larger than in the first (benchmarks/results/load-cpu.md). Bound by address instead
(`IOBinding.bind_input` / `bind_output` with a pointer), they live in blocks that one search hands
to the next, and the arena holds only what a single run needs, all of it free again when the run ends.

The cache is written into two blocks in turn: a step reads `past` from one and writes `present` into
the other, never in place, since the graph reorders rows (beams, dropped rows) as it reads them. A
tensor of any shape takes the first prod(shape) elements of its stretch of the block.
"""

from __future__ import annotations

import threading
from math import prod
from typing import Sequence

import numpy as np
import onnxruntime as ort

from .onnxruntime_bridge import Binder


class Block:
    """`size` elements of `dtype` where the model runs: a numpy array on the CPU, whose pages the
    system commits only as they are first written, so a block sized for a search's longest possible
    output costs only what the search writes; on CUDA an OrtValue from onnxruntime's allocator for the
    device, reserved in full (not yet run on a GPU here)."""

    def __init__(self, size: int, dtype: np.dtype, device: str):
        self.size, self.itemsize = size, dtype.itemsize
        if device == "cpu":
            self.data = np.empty(size, dtype)
            self.address: int = self.data.ctypes.data
        else:
            self.data = ort.OrtValue.ortvalue_from_shape_and_type([size], dtype, device, 0)
            self.address = self.data.data_ptr()

    def at(self, offset: int) -> int:
        """The address of element `offset`."""
        return self.address + offset * self.itemsize


class BlockPool:
    """Blocks handed back by finished searches, for the next: the smallest large enough is reused. It
    keeps at most `keep` (the largest), so what it holds is bounded by the largest searches seen, which
    the token budget per engine batch bounds in turn. Thread-safe: searches on one engine may overlap."""

    def __init__(self, dtype: type, device: str, keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep must be at least 1 (a search hands back up to 3 blocks), got {keep}")
        self.dtype, self.device, self.keep = np.dtype(dtype), device, keep
        self.bind = Binder(device)
        self._free: list[Block] = []                  # ascending size
        self._lock = threading.Lock()

    def take(self, size: int) -> Block:
        with self._lock:
            for i, block in enumerate(self._free):
                if block.size >= size:
                    return self._free.pop(i)
        return Block(max(size, 1), self.dtype, self.device)

    def give(self, *blocks: Block) -> None:
        with self._lock:
            self._free.extend(blocks)
            self._free.sort(key=lambda b: b.size)
            del self._free[:-self.keep]

    @property
    def held_bytes(self) -> int:
        with self._lock:
            return sum(b.size * b.itemsize for b in self._free)


class Tensors:
    """Same-shaped tensors side by side in one block (the encoder's cross_key_i / cross_value_i)."""

    def __init__(self, pool: BlockPool, names: Sequence[str], shape: Sequence[int]):
        self.pool, self.names, self.shape = pool, list(names), [int(d) for d in shape]
        self.block: Block | None = pool.take(len(self.names) * prod(self.shape))

    def bind_outputs(self, io: ort.IOBinding) -> None:
        n, pool = prod(self.shape), self.pool
        for i, name in enumerate(self.names):
            pool.bind.output(io, name, pool.dtype, self.shape, self.block.at(i * n))

    def bind_inputs(self, io: ort.IOBinding) -> None:
        n, pool = prod(self.shape), self.pool
        for i, name in enumerate(self.names):
            pool.bind.input(io, name, pool.dtype, self.shape, self.block.at(i * n))

    def close(self) -> None:
        """Hands the block back; the tensors must not be read again."""
        if self.block is not None:
            self.pool.give(self.block)
            self.block = None


class KVCache:
    """The decoder's self-attention cache: one (rows, h, T, d_k) tensor per past_*/present_* name, read
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
