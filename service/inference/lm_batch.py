"""The rows of many generation searches in one decoder call a step: iteration-level ("continuous") batching
over a decoder-only package's graph (OrtLmDecoder's layout, model/export.py's LMDecoderGraph).

A search joins the running batch between two steps (`LmBatch.join`): at the next step its prompts are read
(every token but the last, in a call of their own, as OrtLmDecoder reads them), their cache is put beside
the running rows', and its first token is chosen in a second call of its own (`_decode_first`); the running rows
wait for the next step, so a stream's first token does not wait for everyone's step (alone, a search's
first token is chosen in the step's one call). It leaves at the step it ends, or at once when its
caller drops it (`leave`: a client gone, every sequence stopped). Each member's search is
service.shared.search's searcher(), answered here: one graph call a step for every row, each member's outputs
handed to its own search.

What lets rows that joined at different steps share a call: the graph writes each row's token at the cache
column of its own position and reads, per row, the columns `key_mask` shows (columns 0..position), so a row's
cache holds its own text at columns 0.. whatever its batch-mates' lengths; `past_rows` picks each row's
cache row. Widths are multiples of COLUMNS_STEP alone or batched, so a row's attention sums the same values
in the same order (OrtLmDecoder says why): a seeded request's output is the same alone or joined at any step
(tests/test_batch_invariance.py).

The cache lives in two blocks of the engine's pool, as KVCache's does: a call reads `past` from one and writes
`present` into the other, which then swap. Joining copies the running rows' cache once into a new block with
room for the new rows (the prompts' call writes straight into that room, the first tokens' call into rows after
it, whose present is copied back there), as narrowing it does when the longest rows have left; the graph writes a
whole present every step anyway, so neither adds more than a step's copy.
"""

from __future__ import annotations

from math import prod
from typing import Generator, Sequence

import numpy as np

from .decoders import DecoderGraph, SearchIds, columns_for
from .device_memory import Block
from ..shared.options import SearchOptions
from ..shared.search import Step, Want, continuation_budgets, searcher


class LmMember:
    """One request's rows in an LmBatch, and the decoder its search (searcher()) sees: `select` only notes
    which of its rows go on, in which order; the batch reads them at its next call."""

    def __init__(self, prompts: Sequence[Sequence[int]]):
        self.prompts = [list(p) for p in prompts]
        self.search: Generator | None = None
        self.rows = np.full(len(prompts), -1, dtype=np.int64)     # each row's row in the batch's cache; -1: unread
        self.next_pos = np.zeros(len(prompts), dtype=np.int64)    # each row's next column (its next position)
        self.want: Want | None = None         # what its search needs from the next call
        self.step: Step | None = None         # what its search chose at the last call (greedy search, sampling)
        self.stepped = False                  # its search is paused after a call's answer (at a Step or a None)
        self.started = False                  # its prompts are read and its search runs
        self.result: list | None = None       # its hypotheses, once its search returned
        self.error: BaseException | None = None   # what its search raised, if it did

    @property
    def over(self) -> bool:
        return self.result is not None or self.error is not None

    def select(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        if not len(rows) or rows.min() < 0 or rows.max() >= len(self.rows):
            raise ValueError(f"select() takes 1 or more rows among 0..{len(self.rows) - 1}, got {rows}")
        self.rows, self.next_pos = self.rows[rows], self.next_pos[rows]

    def send(self, reply: tuple | None) -> None:
        """Runs the search on with `reply` (a call's outputs for its rows, or None): to the Step or None it
        yields after a call's answer, to its next Want, or to its end."""
        self.want, self.stepped = None, False
        try:
            out = self.search.send(reply)
        except StopIteration as done:
            self.result = done.value
            return
        except Exception as e:                 # this search fails alone; its batch-mates go on
            self.error = e
            return
        if isinstance(out, Want):
            self.want = out
        else:
            self.step, self.stepped = out, True

    def close(self) -> None:
        if self.search is not None:
            self.search.close()
        self.want, self.stepped = None, False


class LmBatch:
    """The running rows of one generation package (see the module docstring). `step()` once a step; `rows`,
    `bytes` and `call_rows` say what it holds and what its last call computed."""

    def __init__(self, graph: DecoderGraph, ids: SearchIds, *, max_positions: int):
        self.graph, self.ids, self.max_positions = graph, ids, max_positions
        self.members: list[LmMember] = []
        self.read: Block | None = None        # the cache the next call reads: L x (rows, h, width, d_k)
        self.write: Block | None = None       # where the next call writes its present
        self.cached = (0, 0)                  # (rows, width) of the cache in `read`
        self.call_rows: list[int] = []        # rows of each decoder call of the last step (prompts' call first)

    # --- members -------------------------------------------------------------------------------------------
    def join(self, prompts: Sequence[Sequence[int]], options: SearchOptions, *,
             seeds: Sequence[int | None] | None = None, cancel: set[int] | None = None) -> LmMember:
        """A search over `prompts` (Engine.prompt_ids: bos first) that joins at the next step: the same hypotheses
        as Engine.generate_steps of these prompts alone, each continuing for options.max_length tokens at most
        (fewer where the package's positions run out). Raises what searcher() raises (bad options)."""
        ids = self.ids
        budget = continuation_budgets(prompts, max_length=options.max_length, max_positions=self.max_positions)
        member = LmMember(prompts)
        member.search = searcher(member, len(prompts), options, bos_id=ids.bos_id, eos_id=ids.eos_id,
                                 max_length=budget, banned_ids=ids.banned_ids,
                                 start_tokens=np.array([p[-1] for p in prompts]), seeds=seeds, cancel=cancel,
                                 top_k=ids.top_k)
        self.members.append(member)
        return member

    def leave(self, member: LmMember) -> None:
        """Drops a member now, ended or not: its rows are in no later call."""
        if member in self.members:
            self.members.remove(member)
        member.close()

    @property
    def rows(self) -> int:
        """Rows of the members that run (sequences, beams)."""
        return sum(len(m.rows) for m in self.members if m.started)

    @property
    def bytes(self) -> int:
        """The memory of the cache as it is now: the tensors read and written by a call."""
        (rows, width), g = self.cached, self.graph
        return 2 * len(g.past_names) * rows * g.h * width * g.d_k * g.pool.dtype.itemsize

    # --- a step --------------------------------------------------------------------------------------------
    def step(self) -> list[LmMember]:
        """One step: paused searches go on to their next Want (rows a caller cancelled since, or that ended,
        leave there), new members' prompts are read and their searches start, then one decoder call for every
        row. Returns the members whose search ended or failed in the step, which have left. A decoder call
        that raises leaves the batch as it was before it: the caller decides who leaves."""
        self.call_rows = []
        for m in self.members:
            m.step = None
            if m.stepped:
                m.send(None)
        new = [m for m in self.members if not m.started and not m.over]
        # New members' first tokens in a call apart while others run (on a device too: the copy back stays there).
        apart = any(m.want is not None for m in self.members)
        first_at = self._start(new, first_apart=apart) if new else 0
        first = [m for m in new if m.want is not None]
        live = [m for m in self.members if m.want is not None]
        if first and apart:
            self._decode_first(first, first_at)    # the running rows wait at their Want for the next step
        elif live:
            self._decode(live)
        ended = [m for m in self.members if m.over]
        for m in ended:
            self.leave(m)
        return ended

    def _start(self, new: list[LmMember], first_apart: bool = False) -> int:
        """Reads the new members' prompts into the cache beside the running rows; their searches start. With
        `first_apart`, the cache also gets room for the rows of their first call (_decode_first), after the
        prompts' rows: a prompt's row can be read by several (beams, sequences), each of which writes its own.
        Returns the cache row where that room begins."""
        heads: dict[tuple, int] = {}      # each distinct prompt but its last token -> its row among the new
        for m in new:
            for p in m.prompts:
                heads.setdefault(tuple(p[:-1]), len(heads))
        for m in new:                         # rows among the new ones until the cache has room for them
            m.rows = np.array([heads[tuple(p[:-1])] for p in m.prompts], dtype=np.int64)
            m.next_pos = np.array([len(p) - 1 for p in m.prompts], dtype=np.int64)
            m.started = True
            m.send(None)                      # to its first Want (a beam search makes its K rows a prompt there)
        first_rows = sum(len(m.rows) for m in new if m.want is not None) if first_apart else 0
        longest = max(len(h) for h in heads)
        offset = self._relayout(columns_for(longest + 1), len(heads) + first_rows,
                                [m for m in self.members if m.started and not m.over and m not in new])
        self._read_prompts(list(heads), offset)
        for m in new:
            m.rows = m.rows + offset
        return offset + len(heads)

    def _relayout(self, width: int, extra: int, running: list[LmMember] | None = None) -> int:
        """Copies the rows the running members read into a new block, at max(width, the cache's width)
        columns, with room for `extra` new rows after them; the members' rows follow. Returns where the new
        rows go. Columns no call wrote are zeros: masked, but never NaN."""
        if running is None:
            running = [m for m in self.members if m.started and not m.over]
        rows, old_width = self.cached
        keep, inverse = np.unique(np.concatenate([m.rows for m in running] or [np.zeros(0, np.int64)]),
                                  return_inverse=True)
        width = max(width, old_width) if extra else width
        g, L = self.graph, len(self.graph.past_names)
        shape = [len(keep) + extra, g.h, width, g.d_k]
        block = g.pool.take(L * prod(shape))
        if len(keep) and not g.pool.on_host:
            # On a device, gathered there; the new rows a copy of a kept one: finite, and the prompts' call
            # writes their columns before any is read unmasked.
            g.pool.gather(self.read.address, (L, rows, g.h, old_width, g.d_k),
                          np.concatenate([keep, np.full(extra, -1, dtype=np.int64)]), width, block.address)
        else:
            host = block.host(contents=False)
            dst = host[:L * prod(shape)].reshape(L, *shape)                     # (L, R', h, W', d_k)
            dst[:, len(keep):] = 0
            if len(keep):
                src = self.read.host()[:L * rows * g.h * old_width * g.d_k].reshape(L, rows, g.h, old_width, g.d_k)
                w = min(width, old_width)
                dst[:, :len(keep), :, :w] = src[:, keep, :, :w]
                dst[:, :len(keep), :, w:] = 0
            block.commit(host)
        if self.read is not None:
            g.pool.give(self.read)
        self.read, self.cached = block, (shape[0], width)
        start = 0
        for m in running:
            m.rows = inverse[start:start + len(m.rows)].astype(np.int64)
            start += len(m.rows)
        return len(keep)

    def _read_prompts(self, heads: list[tuple], offset: int) -> None:
        """One call over the new prompts' tokens but their last (right-padded, each at its own positions),
        its present written into the cache's rows offset.. (nothing to read for prompts of one token)."""
        T = max(len(h) for h in heads)
        if T == 0:
            return
        g, n = self.graph, len(heads)
        tokens = np.full((n, T), g.pad_id, dtype=np.int64)                 # (n, T)
        for r, h in enumerate(heads):
            tokens[r, :len(h)] = h
        lengths = np.array([len(h) for h in heads], dtype=np.int64)
        rows, width = self.cached
        key_mask = np.arange(width)[None, :] < lengths[:, None]            # (n, W) its prompt's columns
        positions = np.ascontiguousarray(np.broadcast_to(np.arange(T, dtype=np.int64), (n, T)))   # (n, T)
        io = g.session.io_binding()
        arrays = self._bind_inputs(io, tokens, np.arange(n, dtype=np.int64), key_mask, positions, 1)
        for name in g.past_names:                    # nothing cached yet: (n, h, 0, d_k)
            g.pool.bind.input(io, name, g.pool.dtype, [n, g.h, 0, g.d_k], self.read.address)
        stride = rows * g.h * width * g.d_k
        for i, name in enumerate(g.present_names):
            g.pool.bind.output(io, name, g.pool.dtype, [n, g.h, width, g.d_k],
                               self.read.at(i * stride + offset * g.h * width * g.d_k))
        # Read by no one (the first token is the next step's), but bound by address: alive until the run ends, or
        # onnxruntime writes into freed memory (a heap corrupted this way aborted the test suite later, at random).
        outputs = g.outputs(io, n, 1)
        if g.on_call is not None:
            g.on_call(n)
        g.session.run_with_iobinding(io)
        self.call_rows.append(n)
        del arrays, outputs

    def _decode(self, live: list[LmMember]) -> None:
        """One call for every row of the members at a Want; each member's search is sent its rows' outputs."""
        counts = [len(m.rows) for m in live]
        next_pos = np.concatenate([m.next_pos for m in live])                 # (N,)
        width = columns_for(int(next_pos.max()) + 1)
        if width < self.cached[1]:                # the longest rows have left: attend over fewer columns
            self._relayout(width, 0)
        ks = [m.want.k for m in live]
        outs = self._run(np.concatenate([m.want.tokens for m in live]), np.concatenate([m.rows for m in live]),
                         next_pos, width, ks)
        offset = 0
        for m, n in zip(live, counts):
            m.rows, m.next_pos = np.arange(offset, offset + n, dtype=np.int64), m.next_pos + 1
            m.send(self._outputs_for(outs, slice(offset, offset + n), m.want.k))
            offset += n

    def _decode_first(self, first: list[LmMember], at: int) -> None:
        """New members' first tokens in a call of their own, so that a stream's first token does not wait for the
        running rows' step (TTFT, as vLLM runs a new request's prefill before the running decodes); their present
        goes back into their own rows of the cache, which keeps everyone's. The width is the cache's, a multiple of
        COLUMNS_STEP: a row's outputs are the same as in a call with the others. `at`: the cache row their
        present goes to (_start made room there)."""
        rows = np.concatenate([m.rows for m in first])
        next_pos = np.concatenate([m.next_pos for m in first])                  # (N,)
        outs = self._run(np.concatenate([m.want.tokens for m in first]), rows, next_pos, self.cached[1],
                         [m.want.k for m in first], into_rows=at)
        offset = 0
        for m in first:
            n = len(m.rows)
            m.rows, m.next_pos = np.arange(at + offset, at + offset + n, dtype=np.int64), m.next_pos + 1
            m.send(self._outputs_for(outs, slice(offset, offset + n), m.want.k))
            offset += n

    @staticmethod
    def _outputs_for(outs: dict[str, np.ndarray], rows: slice, k: int | None) -> tuple:
        return ((outs["log_probs"][rows], None, None) if k is None else
                (outs["top_log_probs"][rows, :k], outs["top_ids"][rows, :k], outs["eos_log_probs"][rows]))

    def _run(self, tokens: np.ndarray, past_rows: np.ndarray, next_pos: np.ndarray, width: int,
             ks: list[int | None], into_rows: int | None = None) -> dict[str, np.ndarray]:
        """One call of the graph, N rows of one token each: the top outputs at the largest k any member wants,
        the whole distribution as well when one wants it. The present goes to the other block, which
        becomes the cache; with `into_rows` (a row of the cache, `width` its width) it is copied into the cache's
        rows from there on instead, and the cache keeps every other row."""
        g, N, L = self.graph, len(tokens), len(self.graph.past_names)
        rows, old_width = self.cached
        key_mask = np.arange(width)[None, :] <= next_pos[:, None]              # (N, W) columns 0..position
        k = max((k for k in ks if k is not None), default=1)
        io = g.session.io_binding()
        arrays = self._bind_inputs(io, tokens.astype(np.int64)[:, None], past_rows, key_mask, next_pos[:, None], k)
        present = [N, g.h, width, g.d_k]
        if self.write is None or L * prod(present) > self.write.size:
            larger = g.pool.take(2 * L * prod(present))     # taken before the old one goes back
            if self.write is not None:
                g.pool.give(self.write)
            self.write = larger
        past_stride = rows * g.h * old_width * g.d_k
        for i, name in enumerate(g.past_names):
            g.pool.bind.input(io, name, g.pool.dtype, [rows, g.h, old_width, g.d_k], self.read.at(i * past_stride))
        for i, name in enumerate(g.present_names):
            g.pool.bind.output(io, name, g.pool.dtype, present, self.write.at(i * prod(present)))
        names, outs = ["top_log_probs", "top_ids", "eos_log_probs"], g.outputs(io, N, k)
        if None in ks:
            names, outs = names + ["log_probs"], outs + g.outputs(io, N, None)
        if g.on_call is not None:
            g.on_call(N)
        g.session.run_with_iobinding(io)
        del arrays
        if into_rows is None:
            self.read, self.write, self.cached = self.write, self.read, (N, width)
        else:
            self._copy_back(into_rows, N, width)
        self.call_rows.append(N)
        return dict(zip(names, outs))

    def _copy_back(self, at: int, N: int, width: int) -> None:
        """The present of a call (in `write`, N rows at the cache's width) into the cache's rows at..at + N."""
        g, L = self.graph, len(self.graph.past_names)
        R = self.cached[0]
        if not g.pool.on_host:                   # on a device: each layer's N rows gathered into place there
            layer, row = N * g.h * width * g.d_k, g.h * width * g.d_k
            for i in range(L):
                g.pool.gather(self.write.at(i * layer), (1, N, g.h, width, g.d_k), np.arange(N), width,
                              self.read.at((i * R + at) * row))
            return
        host = self.read.host()
        cache = host[:L * R * g.h * width * g.d_k].reshape(L, R, g.h, width, g.d_k)      # (L, R, h, W, d_k)
        cache[:, at:at + N] = self.write.host()[:L * N * g.h * width * g.d_k].reshape(L, N, g.h, width, g.d_k)
        self.read.commit(host)

    def _bind_inputs(self, io, tokens: np.ndarray, past_rows: np.ndarray, key_mask: np.ndarray,
                     positions: np.ndarray, k: int) -> list[np.ndarray]:
        """Binds a call's host inputs; returns the arrays, to be kept alive until the run ends."""
        g = self.graph
        arrays = [np.ascontiguousarray(tokens, dtype=np.int64), np.ascontiguousarray(past_rows, dtype=np.int64),
                  np.ascontiguousarray(key_mask, dtype=bool), np.ascontiguousarray(positions, dtype=np.int64),
                  np.array([min(k, g.vocab_size)], dtype=np.int64)]
        for name, a in zip(("tokens", "past_rows", "key_mask", "positions", "top_k"), arrays):
            g.host.input(io, name, a.dtype, a.shape, a.ctypes.data)
        return arrays

    def close(self) -> None:
        """Ends every member's search and hands the blocks back."""
        for m in self.members:
            m.close()
        self.members = []
        blocks = [b for b in (self.read, self.write) if b is not None]
        if blocks:
            self.graph.pool.give(*blocks)
        self.read = self.write = None
        self.cached = (0, 0)

