"""The running batch's cross tensors (each decoder layer's cross-attention keys and values of every live
source) and its src_mask, kept in slots so that a source joining or leaving copies one source, not all.

Each live source has a slot: the call's G rows that read it are that slot's (the batch orders its call's rows
by slot, running_batch.RunningBatch). A source keeps its slot for its life; one that leaves gives its slot to
the source in the last slot (one source's keys and values copied), a new one takes the next slot. Each tensor
has room for `cap` slots, so the first A are bound as (A, h, S, d_k) where they lie. The tensors are copied
whole only when they must widen (a wider source joins), narrow (the widest live source needs half of S) or
grow (more sources than room): before, every change of sources made them again (about 1.3 ms a step for 16
sentences of models/de-en on the 2-core EPYC, most steps, as some sentence ends at almost every step).

A source's padding columns are zero and masked; a row's outputs do not depend on S (a multiple of
COLUMNS_STEP) nor on its slot (RunningBatch's docstring says why).

On a device (blocks that are not numpy arrays) the copies run there (BlockPool.gather): a slot that moves
into a hole, or a reallocation, copies every slot into a block of its own; a new source is gathered into its
slot layer by layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from .decoders import DecoderGraph
from .device_memory import Block, Tensors


@dataclass
class Sources:
    """What a member's rows read of the cross tensors, by the member's own source numbers: the encoder
    outputs not yet placed in the batch's tensors (`pending`: a block, the number of the first of our sources
    in it, its row there, how many), each source's width in its block and length, and its slot in the batch's
    tensors once placed. A block may hold other members' sources too (RunningBatch.join: requests that
    join one pool at one step are encoded together); they are all placed at the batch's next step."""
    pending: list[tuple[Tensors, int, int, int]] = field(default_factory=list)
    widths: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    placed: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))    # -1: not placed

    def add(self, cross: Tensors, lengths: np.ndarray, row: int = 0) -> int:
        """Sources from a block of encoder outputs (padded to one width), from its row `row` on; the number
        of the first."""
        first = len(self.lengths)
        self.pending.append((cross, first, row, len(lengths)))
        self.widths = np.concatenate([self.widths, np.full(len(lengths), cross.shape[2], dtype=np.int64)])
        self.lengths = np.concatenate([self.lengths, np.asarray(lengths, dtype=np.int64)])
        self.placed = np.concatenate([self.placed, np.full(len(lengths), -1, dtype=np.int64)])
        return first

    def close(self) -> None:
        for cross, *_ in self.pending:
            cross.close()                      # a block shared with other members: the first close gives it
        self.pending = []


class CrossSlots:
    def __init__(self, graph: DecoderGraph):
        self.graph = graph
        self.block: Block | None = None
        self.cap = self.S = self.A = 0                  # slots with room, width, slots in use
        self.owner: list[tuple[Sources, int]] = []      # each slot's source: (its member's Sources, number)
        self.mask = np.zeros((0, 0), dtype=np.int32)    # (cap, S) 1 at a source's real tokens
        self._bound: tuple | None = None                # (block, A, S) as last bound

    def update(self, live: list[tuple[Sources, np.ndarray]]) -> None:
        """Slots for exactly the live sources (each member's Sources and its live source numbers): those that
        left free theirs, new ones are placed from their encoder outputs (which then go back to the pool)."""
        alive = np.zeros(self.A, dtype=bool)
        new, need = [], 0
        for sources, numbers in live:
            slots = sources.placed[numbers]
            alive[slots[slots >= 0]] = True
            if (slots < 0).any():
                new.append((sources, numbers[slots < 0]))
            need = max(need, int(sources.widths[numbers].max()))
        self._free(alive)
        A = self.A + sum(len(n) for _, n in new)
        if need > self.S or 2 * need <= self.S or A > self.cap:
            self._reallocate(self.cap if A <= self.cap else max(8, 2 * A), need)
        for sources, numbers in new:
            self._place(sources, numbers)
        for sources, _ in live:
            sources.close()                     # every pending source is placed now, or has left

    def _tensors(self, host: np.ndarray) -> np.ndarray:
        """The (L, cap, h, S, d_k) tensors in `host`, the block as a host array (Block.host: on a device, a copy
        that Block.commit writes back whole)."""
        g = self.graph
        return host[:len(g.cross_names) * self.cap * g.h * self.S * g.d_k].reshape(
            len(g.cross_names), self.cap, g.h, self.S, g.d_k)

    def _free(self, alive: np.ndarray) -> None:
        """The dead slots' sources leave; the live sources in the last slots move into the holes below."""
        holes = np.flatnonzero(~alive)
        if not len(holes):
            return
        A = self.A - len(holes)
        to = holes[holes < A]
        frm = A + np.flatnonzero(alive[A:])               # as many live slots at or past the new end
        for slot in holes:
            sources, number = self.owner[slot]
            sources.placed[number] = -1
        if len(to) and not self.graph.pool.on_host:      # on a device: into a block of its own, every slot
            rows = np.full(self.cap, -1, dtype=np.int64)
            rows[:A] = np.arange(A)
            rows[to] = frm
            self._copy_into(self.graph.pool.take(self._size(self.cap, self.S)), rows, self.S)
        elif len(to):
            host = self.block.host()
            t = self._tensors(host)
            t[:, to] = t[:, frm]
            self.block.commit(host)
        if len(to):
            self.mask[to] = self.mask[frm]
            for a, b in zip(to.tolist(), frm.tolist()):
                sources, number = self.owner[a] = self.owner[b]
                sources.placed[number] = a
        del self.owner[A:]
        self.A = A

    def _size(self, cap: int, S: int) -> int:
        g = self.graph
        return len(g.cross_names) * cap * g.h * S * g.d_k

    def _copy_into(self, block: Block, rows: np.ndarray, S: int) -> None:
        """On a device: `block` becomes the tensors, its slot i the old slot rows[i] (-1: any) at S columns
        (cut or zero-padded); len(rows) is its room."""
        g = self.graph
        g.pool.gather(self.block.address, (len(g.cross_names), self.cap, g.h, self.S, g.d_k), rows, S, block.address)
        g.pool.give(self.block)
        self.block, self.cap, self.S = block, len(rows), S

    def _reallocate(self, cap: int, S: int) -> None:
        """A block with room for `cap` slots S wide, the live slots copied into it (cut or zero-padded)."""
        g, L, A, w = self.graph, len(self.graph.cross_names), self.A, min(S, self.S)
        block = g.pool.take(self._size(cap, S))
        mask = np.zeros((cap, S), dtype=np.int32)
        mask[:A, :w] = self.mask[:A, :w]
        if A and not g.pool.on_host:
            self._copy_into(block, np.concatenate([np.arange(A), np.full(cap - A, -1)]), S)
        else:
            if A:
                host = block.host(contents=False)
                t = host[:self._size(cap, S)].reshape(L, cap, g.h, S, g.d_k)
                t[:, :A, :, :w] = self._tensors(self.block.host())[:, :A, :, :w]
                t[:, :A, :, w:] = 0
                block.commit(host)
            if self.block is not None:
                g.pool.give(self.block)
            self.block, self.cap, self.S = block, cap, S
        self.mask = mask

    def _place(self, sources: Sources, numbers: np.ndarray) -> None:
        """New sources into the next slots, from the encoder outputs they are pending in."""
        g, L = self.graph, len(self.graph.cross_names)
        slots = np.arange(self.A, self.A + len(numbers))
        on_host = g.pool.on_host
        host = self.block.host() if on_host else None
        for cross, first, row, count in sources.pending:
            A_i, _, S_i, _ = cross.shape
            sel = (numbers >= first) & (numbers < first + count)
            if not sel.any():
                continue
            if not on_host:
                self._place_on_device(cross, numbers[sel] - first + row, slots[sel])
                continue
            own = cross.block.host()[:L * A_i * g.h * S_i * g.d_k].reshape(L, A_i, g.h, S_i, g.d_k)
            t = self._tensors(host)
            t[:, slots[sel], :, :S_i] = own[:, numbers[sel] - first + row]
            t[:, slots[sel], :, S_i:] = 0                     # masked, but never NaN
        if on_host:
            self.block.commit(host)
        self.mask[slots] = np.arange(self.S)[None, :] < sources.lengths[numbers][:, None]
        sources.placed[numbers] = slots
        self.owner += [(sources, n) for n in numbers.tolist()]
        self.A += len(numbers)

    def _place_on_device(self, cross: Tensors, rows: np.ndarray, slots: np.ndarray) -> None:
        """cross's rows `rows` into `slots`, zero-padded to S: a gather per layer and run of consecutive slots,
        each into its place in the (L, cap, h, S, d_k) tensors."""
        g, L = self.graph, len(self.graph.cross_names)
        A_i, _, S_i, _ = cross.shape
        own, slot = A_i * g.h * S_i * g.d_k, g.h * self.S * g.d_k          # elements a layer, a slot
        runs = np.split(np.arange(len(slots)), np.flatnonzero(np.diff(slots) != 1) + 1)
        for layer in range(L):
            for run in runs:
                g.pool.gather(cross.block.at(layer * own), (1, A_i, g.h, S_i, g.d_k), rows[run], self.S,
                              self.block.at((layer * self.cap + int(slots[run[0]])) * slot))

    def bind(self, io: ort.IOBinding) -> None:
        """Binds the first A slots as the cross_* inputs and src_mask, when they moved since."""
        if self._bound == (self.block, self.A, self.S):
            return
        g = self.graph
        n, shape = self.cap * g.h * self.S * g.d_k, [self.A, g.h, self.S, g.d_k]
        for i, name in enumerate(g.cross_names):
            g.pool.bind.input(io, name, g.pool.dtype, shape, self.block.at(i * n))
        g.host.input(io, "src_mask", self.mask.dtype, (self.A, self.S), self.mask.ctypes.data)
        self._bound = (self.block, self.A, self.S)

    def close(self) -> None:
        if self.block is not None:
            self.graph.pool.give(self.block)
        self.block, self.owner, self.A, self._bound = None, [], 0, None
