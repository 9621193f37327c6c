"""The decoding engine: a model package run by onnxruntime, without torch.

    engine = Engine("models/de-en")                       # CUDA when there is a GPU, else CPU
    engine.translate(["Das geht zu weit."], source_lang="de", target_lang="en", beam_size=4)
    lm = Engine("models/lm-small")                         # a package with task "generation"
    lm.generate(["Die Datei wird"], max_new_tokens=20, temperature=0.8, seed=1)

Layers, so the HTTP service can split the work across LitServe's hooks:

- `load_package()` reads `model.json`, checks every file against its sha256, and says which file
  is missing or corrupt;
- `Engine.source_ids()` / `Engine.detokenize()` (tokenizer, host side);
- `Engine.search(src_ids, options)` (arrays only: encoder once per batch, then the decoder step
  by step under `service.shared.search`).

The key/value cache stays where the model runs between steps (IO binding: on the GPU it never
leaves the device), in blocks the engine owns and reuses from search to search rather than in
onnxruntime's arena (service/device_memory.py says why). A translation decoder writes each step's keys
and values into the cache in place; the engine reorders rows between steps, only when they change (beam
back-pointers, finished sentences dropped), and keeps the encoder's keys/values to the sentences still
searched, one copy per sentence that its beams share. Searches read each row's best few tokens,
selected in the graph (`top_k`), rather than the whole (N, V) distribution. Packages exported before
that layout (a cache the graph reorders and appends every step, a stacked cache, no `top_k`) are
refused with the command that re-exports them from their own weights (`python -m model.upgrade`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generator, Sequence

import numpy as np
import onnxruntime as ort
import sentencepiece as spm

from .device_memory import BlockPool, InPlaceCache, KVCache, Tensors
from .onnxruntime_bridge import Binder
from .shared.package import CACHE_BY_POSITION, INT8_SCHEMES, ModelPackage, PackageError, load_package
from .shared.options import SearchOptions
from .shared.search import Hypothesis, Search, Step, decode, finish, max_lengths

# Engine.generate_steps: a Step per decoder call, then one Hypothesis per prompt (or a list: beam search).
Steps = Generator[Step, None, list]

__all__ = ["Engine", "SearchOptions", "PackageError", "DeviceError", "ModelPackage", "load_package", "probe_device",
           "Translation", "Generation", "OrtDecoder", "OrtLmDecoder", "session_options", "COLUMNS_STEP"]

COLUMNS_STEP = 8              # sources are padded, and generation caches widened, to multiples of this
log = logging.getLogger(__name__)
ONNX_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}


class DeviceError(RuntimeError):
    """device=cuda was asked for and onnxruntime's CUDA provider is not the one running."""


@dataclass
class Translation:
    text: str
    score: float
    tokens: int                                   # output pieces, eos excluded
    alternatives: list[tuple[str, float]] = field(default_factory=list)


@dataclass
class Generation:
    text: str                                     # the continuation only, as streamed
    tokens: int                                   # generated pieces, eos excluded
    finish_reason: str                            # "stop" (eos or a stop sequence), "length" or "cancelled"
    score: float = 0.0                            # sum of log-probs of the generated pieces


def session_options(intra_op_threads: int = 0, inter_op_threads: int = 1, *, spin_wait: bool = False
                    ) -> ort.SessionOptions:
    """`spin_wait=False` (the default) makes idle intra-op threads sleep instead of busy-waiting for the
    next operator. Spinning took the cores the HTTP process needed, and even alone it did not pay: on 2
    threads, one sentence at beam 4 took 19.2 ms spinning against 17.0 ms not, and batch 32 ran at the
    same speed (benchmarks/results/vs-ctranslate2-cpu.md)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = intra_op_threads       # 0 = one per physical core
    so.inter_op_num_threads = inter_op_threads
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if not spin_wait:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


def pick_providers(device: str) -> list[str]:
    """"auto": CUDA when onnxruntime has it and a GPU answers, else CPU. "cpu" or "cuda" force one.
    What the wheel was built with is only a wish: Engine checks what its sessions really run on."""
    available = ort.get_available_providers()
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {device!r}")
    if device == "cuda" and "CUDAExecutionProvider" not in available:
        raise DeviceError(f"device=cuda but onnxruntime {ort.__version__} has no CUDAExecutionProvider, only "
                          f"{available}: install onnxruntime-gpu (pip install -e '.[gpu]')")
    if device in ("auto", "cuda") and "CUDAExecutionProvider" in available:
        preload_cuda_libraries()
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def preload_cuda_libraries() -> None:
    """Loads CUDA and cuDNN from the nvidia-* pip packages (PyTorch's) where they are installed, so the
    CUDA provider finds them without LD_LIBRARY_PATH; where they are not, the system's are used."""
    try:
        ort.preload_dlls()
    except Exception as e:  # older onnxruntime, or no nvidia-* packages: the loader's paths decide
        log.debug("onnxruntime.preload_dlls(): %s", e)


def missing_cuda_libraries() -> list[str]:
    """The libraries onnxruntime's CUDA provider links that the loader cannot find (ldd's "not found"), the
    nvidia-* wheels' folders included, where preload_cuda_libraries found them (ldd runs in a process of its
    own, which sees only LD_LIBRARY_PATH)."""
    provider = Path(ort.__file__).parent / "capi" / "libonnxruntime_providers_cuda.so"
    if not provider.exists() or shutil.which("ldd") is None:
        return []
    wheels = sorted(str(d) for d in (Path(ort.__file__).parent.parent / "nvidia").glob("*/lib"))
    path = ":".join(wheels + [p for p in [os.environ.get("LD_LIBRARY_PATH", "")] if p])
    out = subprocess.run(["ldd", str(provider)], capture_output=True, text=True, timeout=30,
                         env=dict(os.environ, LD_LIBRARY_PATH=path)).stdout
    return [line.split()[0] for line in out.splitlines() if "not found" in line]


def running_device(session: ort.InferenceSession, device: str, wanted: list[str]) -> str:
    """"cuda" or "cpu": the provider the session really runs on. onnxruntime falls back to CPU with only a
    log line when the CUDA provider cannot load (CUDA or cuDNN missing or of another major version, no
    GPU); for device="cuda" that is an error, for "auto" a warning."""
    if session.get_providers()[0] == "CUDAExecutionProvider":
        return "cuda"
    if "CUDAExecutionProvider" not in wanted:
        return "cpu"
    if device == "cuda":
        missing = missing_cuda_libraries()
        why = (f"the loader cannot find {', '.join(missing)}" if missing
               else "its libraries load, so no GPU answered (check nvidia-smi) or ldd is missing")
        raise DeviceError(f"device=cuda but onnxruntime {ort.__version__}'s CUDA provider did not load ({why}); "
                          f"the session runs on {session.get_providers()}. onnxruntime's error above names the "
                          "CUDA and cuDNN major versions it needs (deploy/README.md: the GPU image)")
    log.warning("onnxruntime's CUDA provider did not load; serving on CPU (onnxruntime's error above says why)")
    return "cpu"


def probe_device(package: str | Path, device: str) -> str:
    """"cuda" or "cpu": where `package`'s engines will run, found by loading its decoder graph once (the
    HTTP process asks before it starts workers, so device=cuda without a working CUDA provider stops the
    server with DeviceError's message rather than with workers that fail to start)."""
    providers = pick_providers(device)
    if providers[0] != "CUDAExecutionProvider":
        return "cpu"
    session = ort.InferenceSession(str(load_package(package).file("decoder.onnx")), providers=providers)
    return running_device(session, device, providers)


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


class OrtDecoder:
    """The incremental-decoder protocol of service.shared.search over the decoder graph.

    The graph reorders nothing: `select` reorders the self-attention cache (only when the rows change)
    and keeps the cross tensors to the sources still searched (only when one is dropped). `max_rows` and
    `max_positions` size the cache's blocks (service.device_memory) for the whole search; without them
    the first steps reallocate until the blocks fit. `close()` hands the blocks back.

    The arrays a step returns are overwritten by the next step (the searches read them at once)."""

    def __init__(self, engine: "Engine", cross: Tensors, src_mask: np.ndarray, *,
                 max_rows: int | None = None, max_positions: int = 16):
        self.engine = engine
        B = src_mask.shape[0]
        self.row_source = np.arange(B, dtype=np.int64)    # source sentence of each current row
        self.group_source = self.row_source               # source of each row of the cross tensors
        self.cross = cross                                # from Engine.encode
        self.src_mask = src_mask.astype(np.int32)         # (A, S) of the cross tensors' rows
        self.cache = engine.new_cache(B, max_rows=max_rows or B, max_positions=max_positions)
        self.position = 0                                 # every row's next position (one step for all)
        # The k best next tokens, computed in the graph (see service.shared.search).
        self.step_top = self._step_top if engine.search_top_k else None
        # One binding for the whole search: what does not change between steps stays bound.
        self.io = engine.decoder.io_binding()
        self._bind_sources()
        self._outputs: tuple | None = None                # (rows, k, arrays) bound as outputs

    def _bind_sources(self) -> None:
        self.engine.host.input(self.io, "src_mask", self.src_mask.dtype, self.src_mask.shape,
                               self.src_mask.ctypes.data)
        self.cross.bind_inputs(self.io)

    def _run(self, tokens: np.ndarray, top_k: int | None) -> list[np.ndarray]:
        e, io, N = self.engine, self.io, len(tokens)
        self.cache.reserve(self.position)
        self._tokens = np.ascontiguousarray(tokens, dtype=np.int64)       # kept alive until the run ends
        self._positions = np.full(N, self.position, dtype=np.int32)
        e.host.input(io, "tokens", self._tokens.dtype, (N, 1), self._tokens.ctypes.data)
        e.host.input(io, "positions", self._positions.dtype, (N,), self._positions.ctypes.data)
        out = self._bind_outputs(N, top_k)
        self.cache.bind(io)
        e.decoder.run_with_iobinding(io)
        self.position += 1
        return out

    def _bind_outputs(self, N: int, top_k: int | None) -> list[np.ndarray]:
        """Arrays for this step's outputs, bound again only when their shapes change."""
        if self._outputs is not None and self._outputs[:2] == (N, top_k):
            return self._outputs[2]
        e, io = self.engine, self.io
        k = min(top_k or 1, e.vocab_size)
        self._k = np.array([k], dtype=np.int64)
        e.host.input(io, "top_k", self._k.dtype, (1,), self._k.ctypes.data)
        shapes = ({"log_probs": (N, e.vocab_size)} if top_k is None else
                  {"top_log_probs": (N, k), "top_ids": (N, k), "eos_log_probs": (N,)})
        io.clear_binding_outputs()
        self.cache.forget_binding()                       # clearing unbound the cache's outputs too
        out = [np.empty(shape, e.output_dtypes[name]) for name, shape in shapes.items()]
        for name, a in zip(shapes, out):
            e.host.output(io, name, a.dtype, a.shape, a.ctypes.data)
        self._outputs = (N, top_k, out)
        return out

    def step(self, tokens: np.ndarray) -> np.ndarray:
        return self._run(tokens, None)[0]

    def _step_top(self, tokens: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return tuple(self._run(tokens, k))

    def select(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        if not len(rows) or rows.min() < 0 or rows.max() >= len(self.row_source):
            raise ValueError(f"select() takes 1 or more rows among 0..{len(self.row_source) - 1}, got {rows}")
        self.cache.select(rows)
        row_source = self.row_source[rows]
        if np.array_equal(row_source, self.row_source):
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

    def __init__(self, engine: "Engine", prompts: Sequence[Sequence[int]], *, max_rows: int | None = None,
                 max_new_positions: int = 16):
        self.engine = engine
        N = len(prompts)
        heads = [list(p[:-1]) for p in prompts]
        T = max(len(h) for h in heads)
        self.rows = np.arange(N, dtype=np.int64)
        self.next_pos = np.array([len(h) for h in heads], dtype=np.int64)   # each row's next column
        self.key_mask = np.zeros((N, columns_for(T + 1)), dtype=bool)       # (N, W) True at filled columns
        self.cache = engine.new_cache(N, max_rows=max_rows or N, max_positions=columns_for(T + max_new_positions))
        self.start_tokens = np.array([p[-1] for p in prompts], dtype=np.int64)
        self.step_top = self._step_top if engine.search_top_k else None   # as in OrtDecoder
        if T:
            tokens = np.full((N, T), engine.pad_id, dtype=np.int64)
            for r, h in enumerate(heads):
                tokens[r, :len(h)] = h
                self.key_mask[r, :len(h)] = True
            positions = np.broadcast_to(np.arange(T, dtype=np.int64), (N, T))
            self._run(tokens, positions)

    def _run(self, tokens: np.ndarray, positions: np.ndarray, top_k: int | None = None) -> list[np.ndarray]:
        e = self.engine
        io = e.decoder.io_binding()
        io.bind_cpu_input("tokens", np.ascontiguousarray(tokens, dtype=np.int64))
        io.bind_cpu_input("past_rows", self.rows)
        io.bind_cpu_input("key_mask", np.ascontiguousarray(self.key_mask))
        io.bind_cpu_input("positions", np.ascontiguousarray(positions, dtype=np.int64))
        out = e.run_decoder(io, self.cache, len(tokens), tokens.shape[1], top_k, width=self.key_mask.shape[1])
        self.rows = np.arange(len(tokens), dtype=np.int64)
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


def columns_for(n: int) -> int:
    """Room for n positions, rounded up to a multiple of COLUMNS_STEP (see OrtLmDecoder)."""
    return -(-n // COLUMNS_STEP) * COLUMNS_STEP


class Engine:
    """A loaded model package: tokenizer and onnxruntime sessions (encoder and decoder for
    translation, the decoder alone for generation)."""

    def __init__(self, package: str | Path | ModelPackage, *, device: str = "auto", intra_op_threads: int = 0,
                 inter_op_threads: int = 1, spin_wait: bool = False, verify: bool = True):
        self.package = package if isinstance(package, ModelPackage) else load_package(package, verify=verify)
        meta = self.package.meta
        self.task: str = meta.get("task", "translation")
        if self.task not in ("translation", "generation"):
            raise PackageError(f"{self.package.path / 'model.json'}: task {self.task!r}; "
                               "this engine serves translation and generation packages")
        self._open_sessions(device, session_options(intra_op_threads, inter_op_threads, spin_wait=spin_wait))
        self._read_graphs()
        if self.device_type == "cuda" and self.task == "translation" and self.float_dtype == np.float32:
            log.warning("%s is fp32: onnxruntime's GroupQueryAttention has CUDA kernels for fp16 only, so the "
                        "decoder's self-attention runs on the CPU and its cache crosses to the host every step; "
                        "export with --fp16 for the GPU", self.package.path)
        self.pool = BlockPool(self.float_dtype, self.device_type)   # the cache's and the encoder outputs' memory
        self.host = Binder("cpu")                                    # for what the searches read on the host
        self.search_top_k = True               # False: searches read the whole distribution (for comparisons)
        self._load_tokenizers(meta["tokenizer"])
        ids = meta["special_ids"]
        self.pad_id, self.bos_id, self.eos_id = ids["pad"], ids["bos"], ids["eos"]
        self.unk_id = ids.get("unk", 1)
        self.target_tags: dict[str, int] = meta.get("target_tags", {})
        # Never shown in a translation (as skip_special_tokens does): special ids and language tags.
        self.hidden_ids = {self.pad_id, self.bos_id, self.eos_id, self.unk_id, *self.target_tags.values()}
        self.directions: list[str] = meta["directions"]
        self.max_positions: int = self.package.config["max_len"]
        # Tags never appear in output: a model that wrote one would be writing nonsense.
        self.banned_ids = [self.pad_id, self.bos_id, *self.target_tags.values()]
        self.languages: list[str] = meta.get("languages", [])
        # What each piece adds to a generated text, so streamed pieces concatenate to the full text.
        self.piece_texts = [("" if self.sp.is_control(i) else " ⁇ " if self.sp.is_unknown(i)
                             else self.sp.id_to_piece(i).replace("▁", " "))
                            for i in range(self.sp.get_piece_size())]

    def _open_sessions(self, device: str, so: ort.SessionOptions) -> None:
        self.providers = pick_providers(device)
        # On the CPU, onnxruntime's SkipLayerNormalization kernel (what its fusion makes of residual Add, bias
        # Add and LayerNormalization) took 5x as long as the three operators unfused, e.g. 170 against 34 us
        # for a (128, 1, 256) beam-4 step; without the fusion int8 beam 4 batch 32 ran 14% faster, greedy
        # 18% (onnxruntime 1.31, benchmarks/results/int8-graph.md). CUDA keeps it.
        keep_fused = self.providers[0] == "CUDAExecutionProvider"
        disabled = [] if keep_fused else ["SkipLayerNormFusion"]
        try:
            self.encoder = (ort.InferenceSession(str(self.package.file("encoder.onnx")), so, providers=self.providers,
                                                 disabled_optimizers=disabled)
                            if self.task == "translation" else None)
            self.decoder = ort.InferenceSession(str(self.package.file("decoder.onnx")), so, providers=self.providers,
                                                disabled_optimizers=disabled)
        except Exception as e:  # onnxruntime raises several types for unreadable graphs
            raise PackageError(f"{self.package.path}: onnxruntime cannot load the graphs ({e})") from None
        self.device_type = running_device(self.decoder, device, self.providers)
        self.providers = self.decoder.get_providers()

    def _read_graphs(self) -> None:
        """The decoder's inputs and outputs, checked: cache names, h and d_k, output types."""
        meta = self.package.meta
        self.float_dtype = np.float16 if meta["precision"] == "fp16" else np.float32
        inputs = [i.name for i in self.decoder.get_inputs()]
        self._check_layout(inputs)
        self.past_names = [n for n in inputs if n.startswith("past_") and n != "past_rows"]   # one per layer
        self.cross_names = [n for n in inputs if n.startswith("cross_")]
        self.present_names = [o.name for o in self.decoder.get_outputs() if o.name.startswith("present_")]
        self.encoder_outputs = [o.name for o in self.encoder.get_outputs()] if self.encoder else []
        # Every cache tensor is (rows, h, T, d_k) with h and d_k fixed by the graph (model/export.py).
        past = next(i for i in self.decoder.get_inputs() if i.name == self.past_names[0])
        self.h, self.d_k = past.shape[1], past.shape[3]
        fixed = isinstance(self.h, int) and isinstance(self.d_k, int)
        if not fixed or sorted(self.encoder_outputs) != sorted(self.cross_names):
            raise PackageError(f"{self.package.path}: the graphs' cache tensors are not (rows, h, T, d_k) with "
                               f"fixed h and d_k, or the encoder's outputs are not the decoder's cross_* inputs")
        self.vocab_size: int = self.package.config["vocab_size"]
        self.output_dtypes = {o.name: ONNX_TYPES[o.type] for o in self.decoder.get_outputs() if o.type in ONNX_TYPES}

    def _load_tokenizers(self, tk: dict) -> None:
        self.sp = spm.SentencePieceProcessor(model_file=str(self.package.file(tk["source"])))
        self.sp_target = (self.sp if tk.get("target", tk["source"]) == tk["source"]
                          else spm.SentencePieceProcessor(model_file=str(self.package.file(tk["target"]))))
        # Our packages use SentencePiece ids as model ids. Imported Marian packages have their own id
        # space (vocab.json: piece -> id, shared by separate source and target SentencePiece models).
        self.vocab: dict[str, int] | None = None
        if tk.get("vocab"):
            try:
                self.vocab = json.loads(self.package.file(tk["vocab"]).read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise PackageError(f"{self.package.file(tk['vocab'])}: not a readable vocabulary ({e})") from None
            self.id_pieces = [""] * (max(self.vocab.values()) + 1)
            for piece, i in self.vocab.items():
                self.id_pieces[i] = piece

    def _check_layout(self, inputs: list[str]) -> None:
        """Refuses packages the engine no longer serves, naming the command that re-exports them from their
        own weights: decoder graphs without per-layer caches or `top_k` (a slower second search path),
        translation graphs that reorder and append the cache every step (`past_rows`), generation graphs
        that append all rows' tokens at one cache column, and int8 graphs that quantize activations per
        tensor (in both of the last two a sentence's answer could depend on its batch-mates)."""
        need = ["tokens", "positions", "top_k"] + (["src_mask"] if self.task == "translation"
                                                    else ["past_rows", "key_mask"])
        missing = [n for n in need if n not in inputs] + (["one cache per layer"] if "past_kv" in inputs else [])
        if self.task == "translation" and "past_rows" in inputs:
            missing.append("a cache written in place (its graph reorders and appends the cache every step)")
        meta = self.package.meta
        if missing:
            problem = f"an older graph layout, without {', '.join(missing)}"
        elif self.task == "generation" and meta.get("cache") != CACHE_BY_POSITION:
            problem = ("a cache that appends every row's tokens at one column (left-padded prompts), so a "
                       "prompt's continuation could depend on its batch-mates' lengths")
        elif meta["precision"] == "int8" and meta.get("quantization") not in INT8_SCHEMES:
            problem = ("int8 with activations quantized per tensor at run time, so a sentence's answer would depend "
                       f"on its batch-mates (this engine serves int8 as {' or '.join(map(repr, INT8_SCHEMES))}: "
                       "calibrated or per-row activation scales)")
        else:
            return
        path = self.package.path
        raise PackageError(f"{path / 'decoder.onnx'}: {problem}; re-export it from its own weights with the "
                           f"training side (pip install -e '.[train]'; not in the serving image): "
                           f"python -m model.upgrade {path} --out NEW_DIR")

    # --- host side: text <-> ids -------------------------------------------------------------------
    def check_direction(self, source_lang: str, target_lang: str) -> None:
        if f"{source_lang}-{target_lang}" not in self.directions:
            raise ValueError(f"{self.package.name} translates {', '.join(self.directions)}, "
                             f"not {source_lang}-{target_lang}")

    def source_ids(self, texts: Sequence[str], target_lang: str) -> list[list[int]]:
        """Encoder inputs: the target tag when the model is multi-directional, pieces, eos."""
        tag = [self.target_tags[target_lang]] if self.target_tags else []
        if self.vocab is not None:
            unk, vocab = self.unk_id, self.vocab
            return [tag + [vocab.get(p, unk) for p in pieces] + [self.eos_id]
                    for pieces in self.sp.encode(list(texts), out_type=str)]
        return [tag + ids + [self.eos_id] for ids in self.sp.encode(list(texts), out_type=int)]

    def detokenize(self, ids: Sequence[int]) -> str:
        """Target ids -> text; special ids and language tags are dropped (as skip_special_tokens does)."""
        ids = [i for i in ids if i not in self.hidden_ids]
        if self.vocab is not None:
            # As MarianTokenizer does: pieces the target model lacks keep their "▁", which becomes a space.
            return self.sp_target.decode_pieces([self.id_pieces[i] for i in ids]).replace("▁", " ").strip()
        return self.sp_target.decode(ids)

    # --- device side: arrays only ---------------------------------------------------------------------
    def new_cache(self, rows: int, *, max_rows: int, max_positions: int) -> InPlaceCache | KVCache:
        """A search's self-attention cache: written in place by a translation decoder, in two blocks by turns
        by a generation decoder (service.device_memory)."""
        cache = InPlaceCache if self.task == "translation" else KVCache
        return cache(self.pool, self.past_names, self.present_names, rows, self.h, self.d_k,
                     max_rows=max_rows, max_positions=max_positions)

    def run_decoder(self, io: ort.IOBinding, cache: KVCache, rows: int, new_positions: int,
                    top_k: int | None, *, width: int | None = None) -> list[np.ndarray]:
        """Runs a decoder step for `rows` rows of `new_positions` tokens, whose other inputs are bound;
        the cache moves on a step (to `width` columns where the graph writes by position; None: appended).
        Returns [log_probs (N, V)], or with top_k [top_log_probs (N, k),
        top_ids (N, k), eos_log_probs (N,)]: then the (N, V) distribution stays where it was computed
        and only (N, k) values reach the host, written straight into new arrays."""
        io.clear_binding_outputs()    # a binding reused across steps must not write into last step's arrays
        cache.bind(io, rows, new_positions, width=width)
        k = min(top_k or 1, self.vocab_size)
        io.bind_cpu_input("top_k", np.array([k], dtype=np.int64))
        if top_k is None:
            shapes = {"log_probs": (rows, self.vocab_size)}
        else:
            shapes = {"top_log_probs": (rows, k), "top_ids": (rows, k), "eos_log_probs": (rows,)}
        out = [np.empty(shape, self.output_dtypes[name]) for name, shape in shapes.items()]
        for name, a in zip(shapes, out):
            self.host.output(io, name, a.dtype, a.shape, a.ctypes.data)
        self.decoder.run_with_iobinding(io)
        cache.advance()
        return out

    def encode(self, src: np.ndarray) -> Tensors:
        """src (B, S) int64 padded -> the decoder's cross_* inputs (each layer's cross-attention keys and
        values, (B, h, S, d_k) each), left where the model runs. `close()` the result when done."""
        io = self.encoder.io_binding()
        io.bind_cpu_input("src_ids", src)
        cross = Tensors(self.pool, self.encoder_outputs, [src.shape[0], self.h, src.shape[1], self.d_k])
        cross.bind_outputs(io)
        self.encoder.run_with_iobinding(io)
        return cross

    def search(self, src_ids: Sequence[Sequence[int]], options: SearchOptions,
               seeds: Sequence[int | None] | None = None) -> list[list[Hypothesis]]:
        """Decodes one padded batch; for each source its hypotheses, best first."""
        return finish(self.search_steps(src_ids, options, seeds))

    def search_steps(self, src_ids: Sequence[Sequence[int]], options: SearchOptions,
                     seeds: Sequence[int | None] | None = None) -> Generator[object, None, list[list[Hypothesis]]]:
        """search() one decoder call at a time: the encoder runs at the first next(), then each next()
        runs one decoder step; the return value is search()'s. The caller may run other searches between
        the steps (the translate worker does, so a small request need not wait for a large one's batch):
        each search has its own cache, so its answer is the same. Closing it early hands its blocks back."""
        B = len(src_ids)
        width = columns_for(max(len(s) for s in src_ids))    # as OrtLmDecoder's cache, for the same reason
        src = np.full((B, width), self.pad_id, dtype=np.int64)
        for i, s in enumerate(src_ids):
            src[i, :len(s)] = s
        limits = max_lengths([len(s) for s in src_ids], a=options.max_length_a, b=options.max_length_b,
                             cap=min(options.max_length, self.max_positions))
        decoder = OrtDecoder(self, self.encode(src), src != self.pad_id, max_positions=int(max(limits)) + 1,
                             max_rows=B * (1 if options.sampling else options.beam_size))
        try:
            # Greedy search and sampling yield their Steps too: the caller ignores them.
            return (yield from decode(decoder, B, options, bos_id=self.bos_id, eos_id=self.eos_id, max_length=limits,
                                      banned_ids=self.banned_ids, seeds=seeds))
        finally:
            decoder.close()

    # --- generation (decoder-only packages) -------------------------------------------------------------
    def prompt_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Decoder inputs: bos, then the prompt's pieces (an empty prompt is bos alone)."""
        return [[self.bos_id] + ids for ids in self.sp.encode(list(texts), out_type=int)]

    def piece_text(self, ids: Sequence[int]) -> str:
        return "".join(self.piece_texts[i] for i in ids)

    def generate_steps(self, prompts: Sequence[Sequence[int]], options: SearchOptions, *,
                       seeds: Sequence[int | None] | None = None, cancel: set[int] | None = None) -> Steps:
        """Continues each prompt (ids from prompt_ids); yields a Step per decoder call and returns the
        hypotheses (one per prompt, or num_hypotheses with beam search, which yields no steps).
        options.max_length counts generated tokens, eos included."""
        if self.task != "generation":
            raise ValueError(f"{self.package.name} is a {self.task} package; generation needs a decoder-only one")
        N = len(prompts)
        budget = [min(options.max_length, self.max_positions - len(p)) for p in prompts]
        decoder = OrtLmDecoder(self, prompts, max_rows=N * (1 if options.sampling else options.beam_size),
                               max_new_positions=max(budget) + 1)
        search = decode(decoder, N, options, bos_id=self.bos_id, eos_id=self.eos_id, max_length=budget,
                        banned_ids=self.banned_ids, start_tokens=decoder.start_tokens, seeds=seeds, cancel=cancel)
        if options.sampling or options.beam_size == 1:
            return _closing(decoder, _one_each(search))
        try:
            return _no_steps(finish(search))
        finally:
            decoder.close()

    def generate(self, texts: Sequence[str], *, max_new_tokens: int = 64, **options) -> list[Generation]:
        """Continues each text (best hypothesis). Options: see SearchOptions; e.g. sampling=True, seed=1.
        min_length defaults to 0 here, as the generation API's min_new_tokens: a continuation may stop at once."""
        opts = SearchOptions(**{"min_length": 0} | options | {"max_length": max_new_tokens + 1})
        prompts = self.prompt_ids(texts)
        hyps = finish(self.generate_steps(prompts, opts))
        out = []
        for h in hyps:
            best = h[0] if isinstance(h, list) else h
            reason = "length" if len(best.tokens) >= max_new_tokens else "stop"
            out.append(Generation(self.piece_text(best.tokens), len(best.tokens), reason, best.log_prob))
        return out

    # --- convenience: text in, text out ---------------------------------------------------------------
    def translate(self, texts: Sequence[str], *, source_lang: str, target_lang: str,
                  batch_size: int = 32, **options) -> list[Translation]:
        """Translates texts in length-sorted batches. Options: see SearchOptions."""
        self.check_direction(source_lang, target_lang)
        opts = SearchOptions(**options)
        ids = [s[: self.max_positions] for s in self.source_ids(texts, target_lang)]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out: list[Translation | None] = [None] * len(ids)
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            for i, hyps in zip(idx, self.search([ids[i] for i in idx], opts)):
                best = hyps[0]
                out[i] = Translation(self.detokenize(best.tokens), best.score, len(best.tokens),
                                     [(self.detokenize(h.tokens), h.score) for h in hyps[1:]])
        return out  # type: ignore[return-value]


def _closing(decoder: OrtLmDecoder, steps: Steps) -> Steps:
    """`steps`, then the decoder's blocks handed back, also when the caller stops early (close(), or
    dropping the generator, runs this finally). A generator closed before its first step never
    entered the try: its blocks go to the garbage collector rather than back to the pool."""
    try:
        return (yield from steps)
    finally:
        decoder.close()


def _one_each(search: Search) -> Steps:
    """A greedy search's or sampling's Steps, returning each prompt's one Hypothesis (as the API streams them)."""
    return [hyps[0] for hyps in (yield from search)]


def _no_steps(result):
    """A Steps generator that yields nothing and returns `result` (beam search does not stream)."""
    return result
    yield  # unreachable: its presence makes this a generator
