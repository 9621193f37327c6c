"""The translate worker's running batch: the rows of many translation searches, each request with its own
sources and options, stepped together in one call of a translation package's decoder graph (OrtDecoder's
layout) a step (iteration-level batching). A request's search joins between two steps and leaves at the
step it ends, or when its caller drops it (`leave`).

Two kinds of member step their rows:
- `PooledBeams`: every beam search of one set of options, whichever step each request joined at, searched
  by one BeamPool (service/shared/beam_pool.py): one vectorised beam step a call for all of them, where
  one search per request would cost one Python step per request. A request's sentences in it are a `Ticket`.
- `Member`: any other search (greedy search, sampling), a searcher() coroutine of its own.
The scheduler holds a Ticket or a Member per request; both say `want` (None once ended), `result`, `error`,
`sentences_left()` and `live_count` (which changes when those do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generator, Sequence

import numpy as np

from .cross_slots import CrossSlots, Sources
from .decoders import DecoderGraph, SearchIds, columns_for
from .device_memory import InPlaceCache, Tensors
from ..shared.beam_pool import BeamPool
from ..shared.constraints import Terms, any_terms, check
from ..shared.options import SearchOptions
from ..shared.search import Want, searcher


# A pool takes at most this many sentences, then the next request of its options starts another (the old one
# goes on until its own end): a pool under steady load never empties, and what it keeps per sentence (budgets,
# steps, each source's width and slot: small arrays that grow by concatenation) must not grow for ever.
POOL_INPUTS = 4096


@dataclass
class Encoded:
    """Sources as the encoder left them (Engine.encode_sources), for RunningBatch.join: the decoder's cross_*
    inputs (B rows), each source's length (pieces, eos included) and its output budget."""
    cross: Tensors
    lengths: np.ndarray                   # (B,)
    limits: np.ndarray                    # (B,)


def pooled(options: SearchOptions) -> bool:
    """Whether a search of these options joins a PooledBeams (beam search), or is a Member of its own."""
    return options.strategy == "beam"


class Member:
    """One search's rows (a searcher() coroutine of its own), and the decoder its search sees: `select` only
    notes which of its rows go on, the batch moves the cache at its next step."""

    def __init__(self, search: Generator | None, cross: Tensors, lengths: np.ndarray):
        B = len(lengths)
        self.search = search
        self.sources = Sources()
        self.sources.add(cross, lengths)
        self.rows = np.full(B, -1, dtype=np.int64)         # each row's row in the cache (-1: new, nothing cached)
        self.row_source = np.arange(B, dtype=np.int64)     # each row's source
        self.positions = np.zeros(B, dtype=np.int32)       # each row's next position
        self.want: Want | None = None                      # what its search needs next; None once it ended
        self.result: list | None = None
        self.error: BaseException | None = None
        self.serial = 0                                    # its number in its batch

    @property
    def tokens(self) -> np.ndarray:
        return self.want.tokens

    @property
    def k(self) -> int | None:
        return self.want.k

    whole = False                                          # (a Member's search never asks for both: no terms)

    @property
    def live_count(self) -> int:
        """Changes when its sentences do (its rows: K per sentence in beam search, 1 otherwise)."""
        return len(self.row_source) if self.want is not None else 0

    def sentences_left(self) -> np.ndarray:
        return np.unique(self.row_source) if self.want is not None else np.zeros(0, dtype=np.int64)

    def select(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        if not len(rows) or rows.min() < 0 or rows.max() >= len(self.rows):
            raise ValueError(f"select() takes 1 or more rows among 0..{len(self.rows) - 1}, got {rows}")
        self.rows, self.row_source, self.positions = self.rows[rows], self.row_source[rows], self.positions[rows]

    def start(self) -> list:
        """Runs its search to its first Want (a beam search's rows become K per source there)."""
        self._send(None)
        return [] if self.want is not None else [self]

    def advance(self, outs: dict[str, np.ndarray], rows: slice) -> list:
        """Sends its search its rows' outputs of the call; [itself] if its search ended."""
        k = self.want.k
        self._send((outs["log_probs"][rows], None, None) if k is None else
                   (outs["top_log_probs"][rows, :k], outs["top_ids"][rows, :k], outs["eos_log_probs"][rows]))
        return [] if self.want is not None else [self]

    def _send(self, reply: tuple | None) -> None:
        try:
            out = self.search.send(reply)
            while not isinstance(out, Want):      # Steps and Nones: progress, read by no one here
                out = self.search.send(None)
            self.want = out
        except StopIteration as done:
            self.want, self.result = None, done.value
        except Exception as e:                    # this search fails alone; the batch goes on
            self.want, self.error = None, e

    def drop(self, handle: Member) -> bool:
        """Its caller drops it: True, it leaves the batch whole."""
        self.close()
        return True

    def close(self) -> None:
        """Ends the search (if it is under way) and hands its sources back."""
        if self.search is not None:
            self.search.close()
        self.sources.close()
        self.want = None


class Ticket:
    """A request's sentences in a PooledBeams: its inputs' numbers in the pool, and its answer once they end."""

    def __init__(self, numbers: np.ndarray):
        self.numbers = numbers
        self.left = len(numbers)                  # its sentences still searched
        self.want: object | None = "a step"       # None once every sentence ended or it was dropped
        self.result: list | None = None
        self.error: BaseException | None = None
        self.pool: PooledBeams | None = None

    @property
    def live_count(self) -> int:
        return self.left

    def sentences_left(self) -> np.ndarray:
        if self.want is None:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(np.isin(self.numbers, self.pool.beams.live))


class PooledBeams:
    """The beam searches of one set of options in a batch, one BeamPool for all: a source is a pool input."""

    def __init__(self, beams: BeamPool):
        self.beams = beams
        self.sources = Sources()
        self.tickets: dict[int, Ticket] = {}               # the tickets not ended, by number
        self.issued = 0                                    # tickets so far
        self.owner = np.zeros(0, dtype=np.int64)           # each input's ticket, by its number
        self.rows = np.zeros(0, dtype=np.int64)
        self.row_source = np.zeros(0, dtype=np.int64)      # each row's input (its source)
        self.positions = np.zeros(0, dtype=np.int32)
        self.serial = 0

    @property
    def tokens(self) -> np.ndarray:
        return self.beams.tokens

    @property
    def k(self) -> int | None:
        return self.beams.want()

    @property
    def whole(self) -> bool:
        return self.beams.whole

    @property
    def want(self) -> object | None:
        return "a step" if len(self.beams.live) else None

    def add(self, cross: Tensors, lengths: np.ndarray, first: np.ndarray, max_len: np.ndarray,
            row: int = 0, terms: Sequence[Terms | None] | None = None) -> Ticket:
        """A request's sentences (their encoder outputs, from row `row` of `cross`, lengths, first tokens,
        budgets and constraints): its Ticket. Their rows join at the next step, K per sentence."""
        self.sources.add(cross, lengths, row)
        ticket = Ticket(self.beams.add(first, max_len, terms))
        ticket.pool = self
        number, self.issued = self.issued, self.issued + 1
        self.owner = np.concatenate([self.owner, np.full(len(lengths), number, dtype=np.int64)])
        self.tickets[number] = ticket
        K = self.beams.K
        self.rows = np.concatenate([self.rows, np.full(len(lengths) * K, -1, dtype=np.int64)])
        self.positions = np.concatenate([self.positions, np.zeros(len(lengths) * K, dtype=np.int32)])
        self.row_source = np.repeat(self.beams.live, K)
        return ticket

    def start(self) -> list:
        return []

    def advance(self, outs: dict[str, np.ndarray], rows: slice) -> list[Ticket]:
        """One beam step of every input from its rows' outputs; the tickets whose sentences all ended."""
        k = self.k
        try:
            keep = (self.beams.step(outs["log_probs"][rows], None, None) if k is None else
                    self.beams.step(outs["top_log_probs"][rows, :k], outs["top_ids"][rows, :k],
                                    outs["eos_log_probs"][rows], outs["log_probs"][rows] if self.whole else None))
        except Exception as e:                    # its requests fail (and are retried alone); the batch goes on
            for t in self.tickets.values():
                t.want, t.error = None, e
            ended, self.tickets = list(self.tickets.values()), {}
            self.beams.drop(self.beams.live)
            self._keep(np.zeros(0, dtype=np.int64))
            return ended
        self._keep(keep)
        return self._ended()

    def _keep(self, keep: np.ndarray) -> None:
        self.rows, self.positions = self.rows[keep], self.positions[keep]
        self.row_source = np.repeat(self.beams.live, self.beams.K)

    def _ended(self) -> list[Ticket]:
        """Tickets none of whose inputs is live any more, of those whose inputs ended this step: their
        hypotheses. They leave the pool."""
        ended = []
        for i in self.owner[self.beams.ended].tolist():
            t = self.tickets[i]
            t.left -= 1
            if t.left == 0 and t.want is not None:
                t.want, t.result = None, [self.beams.done(n) for n in t.numbers.tolist()]
                ended.append(t)
                del self.tickets[i]
        return ended

    def drop(self, ticket: Ticket) -> bool:
        """A ticket's sentences leave at the next step; True when none of the pool's are left."""
        if ticket.want is not None:
            ticket.want, ticket.left = None, 0
            self._keep(self.beams.drop(ticket.numbers))
            self.tickets = {i: t for i, t in self.tickets.items() if t is not ticket}
        return self.want is None

    def close(self) -> None:
        for t in self.tickets.values():
            t.want = None
        self.tickets = {}
        self.sources.close()


class RunningBatch:
    """The members' rows, one decoder call a step for all. Per row, the graph takes its own position (the
    cache column it writes and the columns it attends to), so rows that joined at different steps share the
    call; a row's cache holds its own columns only, whatever the others' width (W: the batch's furthest row,
    in steps of COLUMNS_STEP). The cross tensors hold each live source once, in a slot (cross_slots.py), read
    by the G rows of the call in that slot's place (`group`: a beam search's K, 1 for greedy search and
    sampling): the call's rows are the members' in slot order, and its outputs go back to the members in
    theirs. Sources are padded with zeros to the tensors' width S, `src_mask` hiding the padding.

    A row's outputs do not depend on its batch-mates, their positions, W or S (tests/test_batch_invariance.py):
    GroupQueryAttention reads a row's own columns only, and the cross-attention's products sum over a row's
    source in the same order in any width that is a multiple of COLUMNS_STEP. They do depend on G, the rows
    that read one copy of a source (the cross-attention's queries per source): beam 4's rows read in groups of
    1 gave one row other log-probs at its 12th step than in groups of 4 (0.05 apart: int8 rounded the last
    bit's difference the other way), so every member of a batch has `group` rows per source (its beams:
    search.rows_per_input), as alone."""

    def __init__(self, graph: DecoderGraph, group: int, ids: SearchIds):
        self.graph, self.group, self.ids = graph, group, ids
        self.members: list[Member | PooledBeams] = []
        self.pools: dict[tuple, PooledBeams] = {}           # options.batch_key() -> its beam searches
        self.cache = InPlaceCache(graph.pool, graph.past_names, graph.present_names, 0, graph.h, graph.d_k,
                                  max_rows=64, max_positions=64)
        self.cross = CrossSlots(graph)        # the live sources' encoder outputs, one slot each
        self._cross_of: tuple | None = None   # what `cross` holds: ((member serial, sources)...)
        self._order: tuple | None = None      # (the call's row of each member row, the inverse, whether identity)
        self.joined = 0                       # members so far
        self.io = graph.session.io_binding()
        self._outputs: tuple | None = None                # ((rows, k, whole distribution), arrays bound)

    def join(self, encoded: Encoded, options: SearchOptions, sizes: Sequence[int],
             seeds: Sequence[int | None] | None = None,
             terms: Sequence[Terms | None] | None = None) -> list[Member | Ticket]:
        """The searches of requests whose sources `encoded` holds in order, `sizes[i]` of them request i's: their
        rows step with every other search's from the next step on, and once one ends (step() returns it) its
        `result` is Engine.search()'s of its sources alone (or its `error`). A beam search joins the pool of its
        options (PooledBeams: a Ticket a request), any other search is a Member of its own (one request). The
        batch owns `encoded` from here, also when this raises. `terms`: each source's constraints (constraints.py)
        or None; a beam search with terms to write joins a pool of its own, which reads the whole distribution."""
        try:
            if options.rows_per_input != self.group:
                raise ValueError(f"a batch of {self.group} rows per source takes no search of "
                                 f"{options.rows_per_input} (see RunningBatch)")
            check(terms, options.strategy)
            if pooled(options):
                return self._join_pool(encoded, options, sizes, terms)
            if len(sizes) != 1:
                raise ValueError(f"a search of strategy {options.strategy!r} joins one request at a time")
            member = Member(None, encoded.cross, encoded.lengths)
        except BaseException:
            encoded.cross.close()
            raise
        try:
            ids = self.ids
            member.search = searcher(member, len(encoded.lengths), options, bos_id=ids.bos_id, eos_id=ids.eos_id,
                                     max_length=encoded.limits, banned_ids=ids.banned_ids, seeds=seeds,
                                     top_k=ids.top_k)
        except BaseException:
            member.close()
            raise
        self._start(member)
        return [member]

    def _join_pool(self, encoded: Encoded, options: SearchOptions, sizes: Sequence[int],
                   terms: Sequence[Terms | None] | None) -> list[Ticket]:
        ids = self.ids
        key = options.batch_key() + (any_terms(terms),)       # constrained searches pool apart
        pool = self.pool(key, lambda: BeamPool(options, eos_id=ids.eos_id, banned_ids=list(ids.banned_ids),
                                               top_k=ids.top_k))
        tickets, row = [], 0
        for n in sizes:
            tickets.append(pool.add(encoded.cross, encoded.lengths[row:row + n],
                                    np.full(n, ids.bos_id, dtype=np.int64), encoded.limits[row:row + n], row,
                                    None if terms is None else terms[row:row + n]))
            row += n
        return tickets

    def _start(self, member: Member) -> None:
        """Adds a member whose search has not started: it runs to its first Want now, its rows step from the
        next step on."""
        self._add(member)
        member.start()
        if member.want is None:           # it ended before its first step: its sources go back
            self.members.remove(member)
            member.sources.close()

    def pool(self, key: tuple, make) -> PooledBeams:
        """The beam searches of options `key` (made by make() and added when there are none)."""
        pooled = self.pools.get(key)
        if pooled is None or pooled not in self.members or len(pooled.owner) >= POOL_INPUTS:
            pooled = self.pools[key] = PooledBeams(make())
            self._add(pooled)
        return pooled

    def _add(self, member: Member | PooledBeams) -> None:
        self.joined += 1
        member.serial = self.joined
        self.members.append(member)

    def leave(self, handle: Member | Ticket) -> None:
        """Drops a search before it ended (its client went away): its rows leave at the next step."""
        member = handle.pool if isinstance(handle, Ticket) else handle
        if member.drop(handle) and member in self.members:
            self.members.remove(member)
            member.close()

    @property
    def rows(self) -> int:
        return sum(len(m.rows) for m in self.members)

    def step(self) -> list[Member | Ticket]:
        """One decoder call for every member's rows, then each member's search step. Returns the searches that
        ended (result or error), which have left the batch. If the call itself raises, nothing has changed:
        the caller decides which leave. The outputs a member reads are overwritten by the next step."""
        live = self.members
        counts = [len(m.rows) for m in live]
        call_row, order, same = self._call_order(live)
        tokens = np.concatenate([m.tokens for m in live]).astype(np.int64)                        # (N,)
        positions = np.concatenate([m.positions for m in live])                                   # (N,)
        rows = np.concatenate([m.rows for m in live])
        if not same:                         # the call's rows in slot order
            tokens, positions, rows = tokens[order], positions[order], rows[order]
        total = int(positions.max()) + 1
        self.cache.fit(rows, columns_for(total), positions)
        outs = self._run(tokens, positions, total, [m.k for m in live], any(m.whole for m in live))
        if not same:                         # back in the members' order
            outs = {name: a[call_row] for name, a in outs.items()}
        offset, ended = 0, []
        for m, n in zip(live, counts):
            m.rows, m.positions = call_row[offset:offset + n], m.positions + 1
            ended += m.advance(outs, slice(offset, offset + n))
            offset += n
        self.members = [m for m in live if m.want is not None]
        for m in live:
            if m.want is None:
                m.close()                    # only its unplaced sources are left to hand back
        return ended

    def _call_order(self, live: list[Member | PooledBeams]) -> tuple[np.ndarray, np.ndarray, bool]:
        """Places the live sources in the cross tensors' slots when they changed (a request joined, a sentence
        ended), and says where each member row goes in the call (slot x G + its beam: `call_row`), its inverse
        (`order`: the member row of each call row) and whether that is the identity."""
        G = self.group
        groups = [m.row_source[::G] for m in live]                    # each member's live sources, in row order
        holds = tuple((m.serial, gr.tobytes()) for m, gr in zip(live, groups))
        if holds != self._cross_of:
            self.cross.update([(m.sources, gr) for m, gr in zip(live, groups)])
            slots = np.concatenate([m.sources.placed[gr] for m, gr in zip(live, groups)])
            call_row = (slots[:, None] * G + np.arange(G)).reshape(-1)
            order = np.empty_like(call_row)
            order[call_row] = np.arange(len(call_row))
            self._cross_of = holds
            self._order = (call_row, order, bool(np.array_equal(call_row, np.arange(len(call_row)))))
        return self._order

    def _run(self, tokens: np.ndarray, positions: np.ndarray, total: int, ks: list[int | None],
             whole: bool = False) -> dict[str, np.ndarray]:
        """One run of the graph: the top outputs at the largest k any member wants, the whole distribution
        too when one wants it (k None, or `whole`: a constrained pool's). One binding for the batch's life: the
        cross tensors, the cache and the outputs are bound again only when they change."""
        g, io, N = self.graph, self.io, len(tokens)
        if g.on_call is not None:
            g.on_call(N)
        self._tokens = np.ascontiguousarray(tokens[:, None])                      # (N, 1), alive until the run ends
        self._positions = positions
        g.host.input(io, "tokens", self._tokens.dtype, self._tokens.shape, self._tokens.ctypes.data)
        self._total = g.bind_positions(io, positions, total)
        self.cross.bind(io)
        outputs = (N, max((k for k in ks if k is not None), default=1), None in ks or whole)
        if self._outputs is None or self._outputs[0] != outputs:
            io.clear_binding_outputs()
            self.cache.forget_binding()                   # clearing unbound the cache's outputs too
            N, k, full = outputs
            self._top_k = np.array([min(k, g.vocab_size)], dtype=np.int64)
            g.host.input(io, "top_k", self._top_k.dtype, (1,), self._top_k.ctypes.data)
            names, arrays = ["top_log_probs", "top_ids", "eos_log_probs"], g.outputs(io, N, k)
            if full:
                names.append("log_probs")
                arrays += g.outputs(io, N, None)
            self._outputs = (outputs, dict(zip(names, arrays)))
        self.cache.bind(io)
        g.session.run_with_iobinding(io)
        return self._outputs[1]

    def close(self) -> None:
        """Ends every member's search and hands every block back."""
        for m in self.members:
            m.close()
        self.members, self.pools = [], {}
        self.cache.close()
        self.cross.close()
        self._cross_of = self._order = None
