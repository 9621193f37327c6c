"""The decoder graphs' layouts, one class each: the incremental-decoder protocol of service.shared.search
(step, step_top, select) over a translation package's decoder graph (`OrtDecoder`) and over a decoder-only
package's (`OrtLmDecoder`), each with the check that refuses a graph of another layout. model/export.py
writes the graphs; service/inference/device_memory.py holds their caches.

The key/value cache stays where the model runs between steps (IO binding: on the GPU it never leaves the
device), in blocks the engine owns and reuses from search to search rather than in onnxruntime's arena
(service/inference/device_memory.py says why). A translation decoder writes each step's keys and values into the
cache in place; rows are reordered between steps, only when they change (beam back-pointers, finished
sentences dropped), and the encoder's keys/values are kept to the sentences still searched, one copy per
sentence that its beams share. Searches read each row's best few tokens, selected in the graph (`top_k`),
rather than the whole (N, V) distribution. Packages exported before that layout (a cache the graph reorders
and appends every step, a stacked cache, no `top_k`) are refused with the command that re-exports them from
their own weights (`python -m model.upgrade`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import onnxruntime as ort

from .device_memory import BlockPool, InPlaceCache, KVCache, Tensors
from .onnxruntime_bridge import Binder
from ..shared.package import CACHE_BY_POSITION, INT8_SCHEMES, ModelPackage, PackageError

COLUMNS_STEP = 8              # sources are padded, and generation caches widened, to multiples of this
ONNX_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}


@dataclass(frozen=True)
class SearchIds:
    """What every search of one package needs of it: its special ids, and whether a search reads the k best of
    each step (the graph's top_k outputs) rather than the whole distribution."""
    bos_id: int
    eos_id: int
    banned_ids: tuple[int, ...]
    top_k: bool = True


@dataclass
class DecoderGraph:
    """A package's decoder session and what its graph fixes, read once (`read`) and shared by every decoder
    of the engine."""
    session: ort.InferenceSession
    pool: BlockPool                       # the caches' memory (and the encoder outputs')
    host: Binder                          # binds what the searches read on the host
    past_names: list[str]                 # the cache, one tensor per layer and keys/values (rows, h, T, d_k)
    present_names: list[str]
    cross_names: list[str]                # translation: the encoder's outputs, in its order; generation: none
    h: int
    d_k: int
    vocab_size: int
    output_dtypes: dict[str, type]
    pad_id: int
    # The graph reads GroupQueryAttention's total_sequence_length (max(positions) + 1) from an input `total`
    # fed from the host; older translation graphs compute it themselves, which CUDA reads wrongly (model/export.py).
    host_total: bool = False
    # Called with the rows of every decoder call, before it runs (the worker's scheduler counts them for
    # its metrics: service/worker/watch.py); None: nothing is told.
    on_call: Callable[[int], None] | None = None

    @classmethod
    def read(cls, package: ModelPackage, session: ort.InferenceSession, encoder: ort.InferenceSession | None,
             pool: BlockPool, host: Binder) -> DecoderGraph:
        """The decoder's inputs and outputs, checked: cache names, h and d_k, the cross tensors, output types
        (the layout itself: OrtDecoder.check_layout, OrtLmDecoder.check_layout)."""
        inputs = [i.name for i in session.get_inputs()]
        past_names = [n for n in inputs if n.startswith("past_") and n != "past_rows"]   # one per layer
        cross_names = [o.name for o in encoder.get_outputs()] if encoder else []
        past = next(i for i in session.get_inputs() if i.name == past_names[0])
        h, d_k = past.shape[1], past.shape[3]
        fixed = isinstance(h, int) and isinstance(d_k, int)
        if not fixed or sorted(cross_names) != sorted(n for n in inputs if n.startswith("cross_")):
            raise PackageError(f"{package.path}: the graphs' cache tensors are not (rows, h, T, d_k) with "
                               f"fixed h and d_k, or the encoder's outputs are not the decoder's cross_* inputs")
        outputs = session.get_outputs()
        return cls(session, pool, host, past_names, [o.name for o in outputs if o.name.startswith("present_")],
                   cross_names, h, d_k, package.config["vocab_size"],
                   {o.name: ONNX_TYPES[o.type] for o in outputs if o.type in ONNX_TYPES},
                   package.meta["special_ids"]["pad"], "total" in inputs)

    def bind_positions(self, io: ort.IOBinding, positions: np.ndarray, total: int) -> np.ndarray | None:
        """Binds a step's `positions` (int32 (N,), kept alive by the caller) and, where the graph takes it, `total`
        (max(positions) + 1, which the caller knows); returns the `total` array, which the caller keeps alive until
        the run ends too."""
        self.host.input(io, "positions", positions.dtype, positions.shape, positions.ctypes.data)
        if not self.host_total:
            return None
        held = np.array([total], dtype=np.int32)
        self.host.input(io, "total", held.dtype, (1,), held.ctypes.data)
        return held

    def outputs(self, io: ort.IOBinding, rows: int, top_k: int | None) -> list[np.ndarray]:
        """New host arrays bound as a step's outputs: [log_probs (N, V)], or with top_k [top_log_probs (N, k),
        top_ids (N, k), eos_log_probs (N,)]: then the (N, V) distribution stays where it was computed and only
        (N, k) values reach the host, written straight into these arrays."""
        k = min(top_k or 1, self.vocab_size)
        shapes = ({"log_probs": (rows, self.vocab_size)} if top_k is None else
                  {"top_log_probs": (rows, k), "top_ids": (rows, k), "eos_log_probs": (rows,)})
        out = [np.empty(shape, self.output_dtypes[name]) for name, shape in shapes.items()]
        for name, a in zip(shapes, out):
            self.host.output(io, name, a.dtype, a.shape, a.ctypes.data)
        return out


def columns_for(n: int) -> int:
    """Room for n positions, rounded up to a multiple of COLUMNS_STEP (see OrtLmDecoder)."""
    return -(-n // COLUMNS_STEP) * COLUMNS_STEP


def source_groups(row_source: np.ndarray) -> np.ndarray:
    """The source of each group of G consecutive rows when every run of rows with one source has the same
    length G (a beam search's K beams of each sentence: G = K), else one source per row (G = 1, always
    right): the rows of the cross tensors a step needs (model/export.py)."""
    N = len(row_source)
    runs = int(np.count_nonzero(row_source[1:] != row_source[:-1])) + 1      # runs of one source
    G = N // runs
    if G > 1 and N == G * runs:
        groups = row_source.reshape(runs, G)                                  # (A, G)
        if (groups == groups[:, :1]).all():
            return np.ascontiguousarray(groups[:, 0])
    return row_source


def _refuse(package: ModelPackage, problem: str | None) -> None:
    """PackageError naming the command that re-exports the package from its own weights, when there is a problem."""
    if problem is None:
        return
    path = package.path
    raise PackageError(f"{path / 'decoder.onnx'}: {problem}; re-export it from its own weights with the "
                       f"training side (pip install -e '.[train]'; not in the serving image): "
                       f"python -m model.upgrade {path} --out NEW_DIR")


def _missing(inputs: list[str], need: list[str]) -> list[str]:
    """What an older graph lacks: inputs, or one cache per layer (a stacked `past_kv`)."""
    return [n for n in need if n not in inputs] + (["one cache per layer"] if "past_kv" in inputs else [])


def _int8_problem(meta: dict) -> str | None:
    """int8 graphs that quantize activations per tensor at run time: a sentence's answer would depend on its
    batch-mates."""
    if meta["precision"] == "int8" and meta.get("quantization") not in INT8_SCHEMES:
        return ("int8 with activations quantized per tensor at run time, so a sentence's answer would depend "
                f"on its batch-mates (this engine serves int8 as {' or '.join(map(repr, INT8_SCHEMES))}: "
                "calibrated or per-row activation scales)")
    return None


class OrtDecoder:
    """The incremental-decoder protocol of service.shared.search over a translation package's decoder graph.

    The graph reorders nothing: `select` reorders the self-attention cache (only when the rows change)
    and keeps the cross tensors to the sources still searched (only when one is dropped). `max_rows` and
    `max_positions` size the cache's blocks (service.inference.device_memory) for the whole search; without them
    the first steps reallocate until the blocks fit. `close()` hands the blocks back. top_k=False: no
    step_top, so searches read the whole distribution (for comparisons).

    The arrays a step returns are overwritten by the next step (the searches read them at once)."""

    @staticmethod
    def check_layout(package: ModelPackage, inputs: list[str]) -> None:
        """Refuses decoder graphs without per-layer caches or `top_k` (a slower second search path), and graphs
        that reorder and append the cache every step (`past_rows`)."""
        missing = _missing(inputs, ["tokens", "positions", "top_k", "src_mask"])
        if "past_rows" in inputs:
            missing.append("a cache written in place (its graph reorders and appends the cache every step)")
        _refuse(package, f"an older graph layout, without {', '.join(missing)}" if missing
                else _int8_problem(package.meta))

    def __init__(self, graph: DecoderGraph, cross: Tensors, src_mask: np.ndarray, *,
                 max_rows: int | None = None, max_positions: int = 16, top_k: bool = True):
        self.graph = graph
        B = src_mask.shape[0]
        self.row_source = np.arange(B, dtype=np.int64)    # source sentence of each current row
        self.group_source = self.row_source               # source of each row of the cross tensors
        self.cross = cross                                # from Engine.encode
        self.src_mask = src_mask.astype(np.int32)         # (A, S) of the cross tensors' rows
        self.cache = InPlaceCache(graph.pool, graph.past_names, graph.present_names, B, graph.h, graph.d_k,
                                  max_rows=max_rows or B, max_positions=max_positions)
        self.position = 0                                 # every row's next position (one step for all)
        # The k best next tokens, computed in the graph (see service.shared.search).
        self.step_top = self._step_top if top_k else None
        # One binding for the whole search: what does not change between steps stays bound.
        self.io = graph.session.io_binding()
        self._bind_sources()
        self._outputs: tuple | None = None                # (rows, k, whole, arrays) bound as outputs

    def _bind_sources(self) -> None:
        self.graph.host.input(self.io, "src_mask", self.src_mask.dtype, self.src_mask.shape,
                              self.src_mask.ctypes.data)
        self.cross.bind_inputs(self.io)

    def _run(self, tokens: np.ndarray, top_k: int | None, whole: bool = False) -> list[np.ndarray]:
        g, io, N = self.graph, self.io, len(tokens)
        if g.on_call is not None:
            g.on_call(N)
        self.cache.reserve(self.position)
        self._tokens = np.ascontiguousarray(tokens, dtype=np.int64)       # kept alive until the run ends
        self._positions = np.full(N, self.position, dtype=np.int32)
        g.host.input(io, "tokens", self._tokens.dtype, (N, 1), self._tokens.ctypes.data)
        self._total = g.bind_positions(io, self._positions, self.position + 1)
        out = self._bind_outputs(N, top_k, whole)
        self.cache.bind(io)
        g.session.run_with_iobinding(io)
        self.position += 1
        return out

    def _bind_outputs(self, N: int, top_k: int | None, whole: bool = False) -> list[np.ndarray]:
        """Arrays for this step's outputs (with `whole`, the top k's and the whole distribution's), bound again
        only when their shapes change."""
        if self._outputs is not None and self._outputs[:3] == (N, top_k, whole):
            return self._outputs[3]
        g, io = self.graph, self.io
        self._k = np.array([min(top_k or 1, g.vocab_size)], dtype=np.int64)
        g.host.input(io, "top_k", self._k.dtype, (1,), self._k.ctypes.data)
        io.clear_binding_outputs()
        self.cache.forget_binding()                       # clearing unbound the cache's outputs too
        out = g.outputs(io, N, top_k) + (g.outputs(io, N, None) if whole else [])
        self._outputs = (N, top_k, whole, out)
        return out

    def step(self, tokens: np.ndarray) -> np.ndarray:
        return self._run(tokens, None)[0]

    def _step_top(self, tokens: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return tuple(self._run(tokens, k))

    def step_whole(self, tokens: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """step_top's triple and the whole distribution (N, V), from one run (a constrained search's)."""
        return tuple(self._run(tokens, k, whole=True))

    def select(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        # Checked and compared as lists: a step's few rows cost numpy's calls several µs each (a beam step's).
        order = rows.tolist()
        if not order or min(order) < 0 or max(order) >= len(self.row_source):
            raise ValueError(f"select() takes 1 or more rows among 0..{len(self.row_source) - 1}, got {rows}")
        self.cache.select(rows)
        row_source = self.row_source[rows]
        if row_source.tolist() == self.row_source.tolist():
            return                                        # beams reordered within their sentences
        self.row_source = row_source
        groups = source_groups(self.row_source)
        if not np.array_equal(groups, self.group_source):
            where = np.zeros(int(self.group_source.max()) + 1, dtype=np.int64)
            where[self.group_source] = np.arange(len(self.group_source))
            keep = where[groups]                          # rows of the cross tensors to keep
            if not np.array_equal(keep, np.arange(len(self.group_source))):
                self.cross.select(keep)
                self.src_mask = np.ascontiguousarray(self.src_mask[keep])
                self._bind_sources()
            self.group_source = groups

    def close(self) -> None:
        self.cache.close()
        self.cross.close()


class OrtLmDecoder:
    """The incremental-decoder protocol over a decoder-only package's graph.

    Each row's tokens sit at the cache columns of their positions: prompts are right-padded, and a
    row's next token goes to its own next column, `key_mask` hiding the columns a row has not filled.
    Everything but each prompt's last token is read in one call here; the search then starts from those
    last tokens (`start_tokens`). The cache is widened by COLUMNS_STEP columns at a time, so a row
    attends over a width that is a multiple of it alone or batched: onnxruntime's CPU kernels then sum
    a row's scores and values in the same order whatever the width (measured: a one-row MatMul over an
    odd number of columns rounds differently from the same values over an even one).
    """

    @staticmethod
    def check_layout(package: ModelPackage, inputs: list[str]) -> None:
        """Refuses decoder graphs without per-layer caches or `top_k`, and graphs that append all rows' tokens
        at one cache column (left-padded prompts: a prompt's continuation could depend on its batch-mates')."""
        missing = _missing(inputs, ["tokens", "positions", "top_k", "past_rows", "key_mask"])
        if missing:
            problem = f"an older graph layout, without {', '.join(missing)}"
        elif package.meta.get("cache") != CACHE_BY_POSITION:
            problem = ("a cache that appends every row's tokens at one column (left-padded prompts), so a "
                       "prompt's continuation could depend on its batch-mates' lengths")
        else:
            problem = _int8_problem(package.meta)
        _refuse(package, problem)

    def __init__(self, graph: DecoderGraph, prompts: Sequence[Sequence[int]], *, max_rows: int | None = None,
                 max_new_positions: int = 16, top_k: bool = True):
        self.graph = graph
        N = len(prompts)
        heads = [list(p[:-1]) for p in prompts]
        T = max(len(h) for h in heads)
        self.rows = np.arange(N, dtype=np.int64)
        self.next_pos = np.array([len(h) for h in heads], dtype=np.int64)   # each row's next column
        self.key_mask = np.zeros((N, columns_for(T + 1)), dtype=bool)       # (N, W) True at filled columns
        self.cache = KVCache(graph.pool, graph.past_names, graph.present_names, N, graph.h, graph.d_k,
                             max_rows=max_rows or N, max_positions=columns_for(T + max_new_positions))
        self.start_tokens = np.array([p[-1] for p in prompts], dtype=np.int64)
        self.step_top = self._step_top if top_k else None                  # as in OrtDecoder
        if T:
            tokens = np.full((N, T), graph.pad_id, dtype=np.int64)
            for r, h in enumerate(heads):
                tokens[r, :len(h)] = h
                self.key_mask[r, :len(h)] = True
            positions = np.broadcast_to(np.arange(T, dtype=np.int64), (N, T))
            self._run(tokens, positions)

    def _run(self, tokens: np.ndarray, positions: np.ndarray, top_k: int | None = None) -> list[np.ndarray]:
        """One call for `rows` rows of `new_positions` tokens each; the cache moves on a step, to the key mask's
        width (the graph writes each token at its position's column)."""
        g = self.graph
        rows, new_positions = tokens.shape
        if g.on_call is not None:
            g.on_call(rows)
        io = g.session.io_binding()
        io.bind_cpu_input("tokens", np.ascontiguousarray(tokens, dtype=np.int64))
        io.bind_cpu_input("past_rows", self.rows)
        io.bind_cpu_input("key_mask", np.ascontiguousarray(self.key_mask))
        io.bind_cpu_input("positions", np.ascontiguousarray(positions, dtype=np.int64))
        self.cache.bind(io, rows, new_positions, width=self.key_mask.shape[1])
        io.bind_cpu_input("top_k", np.array([min(top_k or 1, g.vocab_size)], dtype=np.int64))
        out = g.outputs(io, rows, top_k)
        g.session.run_with_iobinding(io)
        self.cache.advance()
        self.rows = np.arange(rows, dtype=np.int64)
        return out

    def _next(self, tokens: np.ndarray, top_k: int | None) -> list[np.ndarray]:
        N, W = self.key_mask.shape
        if self.next_pos.max(initial=0) >= W:
            self.key_mask = np.concatenate([self.key_mask, np.zeros((N, COLUMNS_STEP), dtype=bool)], axis=1)
        self.key_mask[np.arange(N), self.next_pos] = True
        out = self._run(np.asarray(tokens, dtype=np.int64)[:, None], self.next_pos[:, None], top_k)
        self.next_pos = self.next_pos + 1
        return out

    def step(self, tokens: np.ndarray) -> np.ndarray:
        return self._next(tokens, None)[0]

    def _step_top(self, tokens: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return tuple(self._next(tokens, k))

    def select(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        self.rows = self.rows[rows]
        self.key_mask = self.key_mask[rows]
        self.next_pos = self.next_pos[rows]

    def close(self) -> None:
        self.cache.close()
