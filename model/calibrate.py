"""Activation ranges for int8-static packages: each quantized MatMul input's smallest and largest value
over calibration text, measured on the package's own fp32 graphs with onnxruntime.

    ranges = activation_ranges(package_dir, read_calibration("data/de-en/dev.tsv", meta))

Translation: every source sentence is encoded and decoded greedily by the fp32 graphs (up to eos or
2 × its length + 10 tokens), one batch of 32 at a time, so the decoder's inputs are those of its own
outputs, as in serving. Generation: every text is read in one call per batch (its tokens are what the
model would see as a prompt and as its own continuation). Padding positions are left out of the
ranges. model/quantize.py turns each range into a scale and a zero point.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from .corpus.tsv import read_pairs
from .quantize import quantizable_weight

CALIBRATION_SENTENCES = 500     # per direction (translation) or in all (generation): enough for stable maxima
BATCH = 32
MAX_TEXT_TOKENS = 128     # a language model's calibration text is cut to this many tokens

# (source text, target language) for translation; (text, None) for a language model
Calibration = list[tuple[str, str | None]]
Ranges = dict[str, dict[str, tuple[float, float]]]     # graph name -> tensor name -> (min, max)


def read_calibration(path: str | Path, meta: dict, limit: int = CALIBRATION_SENTENCES) -> Calibration:
    """Calibration text for a package (its model.json `meta`): model.data's TSV (de, en, origin; both
    directions of a two-way model are read) or source<TAB>target; for a language model lang<TAB>text."""
    if meta["task"] == "generation":
        from .mono import read_texts
        return [(text, None) for _, text in read_texts(path)[:limit]]
    out: Calibration = []
    # A source<TAB>target file holds one direction (read as is, whatever the languages); a two-way model
    # reads its second direction's sources from the target column.
    two_columns = _columns(path) == 2
    for i, direction in enumerate(meta["directions"]):
        pairs = read_pairs(path, "de-en" if two_columns else direction)[:limit]
        out += [(tgt if two_columns and i else src, direction.split("-")[1]) for src, tgt in pairs]
    if not out:
        raise ValueError(f"{path}: no calibration sentences")
    return out


def _columns(path: str | Path) -> int:
    """Tab-separated columns of the file's first non-blank line."""
    with open(path, encoding="utf-8") as fh:
        return next((len(line.split("\t")) for line in fh if line.strip()), 0)


def quantized_inputs(model: onnx.ModelProto) -> list[str]:
    """The inputs of the MatMuls int8 quantization rewrites (by a constant 2D fp32 weight), in graph order."""
    inits = {i.name: i for i in model.graph.initializer}
    names: list[str] = []
    for node in model.graph.node:
        if quantizable_weight(node, inits) is not None and node.input[0] not in names:
            names.append(node.input[0])
    return names


class _Watched:
    """An fp32 graph whose quantized inputs are extra outputs; run() returns the graph's outputs by name
    and widens `ranges` by the watched tensors (rows where `keep` is False left out)."""

    def __init__(self, path: Path):
        model = onnx.load(str(path))
        self.watched = quantized_inputs(model)
        model.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in self.watched)
        so = ort.SessionOptions()
        so.log_severity_level = 3
        self.session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        self.names = [o.name for o in self.session.get_outputs()]
        self.ranges: dict[str, tuple[float, float]] = {}

    def run(self, feeds: dict, keep: np.ndarray | None = None) -> dict[str, np.ndarray]:
        out = dict(zip(self.names, self.session.run(None, feeds)))
        for name in self.watched:
            a = out[name]
            if keep is not None and a.ndim > keep.ndim and a.shape[:keep.ndim] == keep.shape:
                a = a[keep]
            lo, hi = self.ranges.get(name, (0.0, 0.0))          # 0 always in range: zero maps exactly
            self.ranges[name] = (min(lo, float(a.min(initial=0))), max(hi, float(a.max(initial=0))))
        return out


def activation_ranges(package: Path, calibration: Calibration) -> Ranges:
    """Runs the fp32 package at `package` over the calibration text; each graph's watched tensor ranges."""
    from service.inference.engine import Engine  # the package's own tokenization and special ids

    engine = Engine(package, device="cpu", intra_op_threads=1, verify=False)
    meta = engine.package.meta
    if meta["task"] == "generation":
        ids = [s[:MAX_TEXT_TOKENS] for s in engine.prompt_ids([text for text, _ in calibration])]
        decoder = _Watched(package / "decoder.onnx")
        for batch in _batches(ids):
            _read_texts(decoder, batch, engine)
        return {"decoder": decoder.ranges}
    ids = [s for lang in sorted({t for _, t in calibration})
           for s in engine.source_ids([text for text, t in calibration if t == lang], lang)]
    encoder, decoder = _Watched(package / "encoder.onnx"), _Watched(package / "decoder.onnx")
    for batch in _batches(ids):
        _translate(encoder, decoder, batch, engine)
    return {"encoder": encoder.ranges, "decoder": decoder.ranges}


def _batches(ids: list[list[int]]) -> list[list[list[int]]]:
    ids = sorted(ids, key=len)
    return [ids[i:i + BATCH] for i in range(0, len(ids), BATCH)]


def _padded(batch: Sequence[Sequence[int]], pad: int) -> np.ndarray:
    out = np.full((len(batch), max(map(len, batch))), pad, dtype=np.int64)
    for r, s in enumerate(batch):
        out[r, :len(s)] = s
    return out                                                              # (N, T)


def _empty_cache(engine, rows: int, width: int = 0) -> dict[str, np.ndarray]:
    return {p: np.zeros((rows, engine.h, width, engine.d_k), np.float32) for p in engine.past_names}


def _translate(encoder: _Watched, decoder: _Watched, batch: list[list[int]], engine) -> None:
    """Greedy decoding of one batch by the fp32 graphs, up to eos or 2 × the longest source + 10 tokens."""
    src = _padded(batch, engine.pad_id)                                     # (N, S)
    N = len(batch)
    feeds = {k: v for k, v in encoder.run({"src_ids": src}, keep=src != engine.pad_id).items()
             if k.startswith("cross_")}
    steps = 2 * src.shape[1] + 10
    feeds |= ({"src_mask": (src != engine.pad_id).astype(np.int32), "top_k": np.array([1], np.int64)}
              | _empty_cache(engine, N, steps))                             # the cache: (N, h, steps, d_k)
    tokens = np.full((N, 1), engine.bos_id, dtype=np.int64)
    done = np.zeros(N, dtype=bool)
    for step in range(steps):
        out = decoder.run(feeds | {"tokens": tokens, "positions": np.full(N, step, dtype=np.int32),
                                   "total": np.array([step + 1], dtype=np.int32)})
        tokens = out["top_ids"][:, :1].astype(np.int64)                     # (N, 1)
        done |= tokens[:, 0] == engine.eos_id
        if done.all():
            break
        feeds |= {p: out["present_" + p.removeprefix("past_")] for p in engine.past_names}


def _read_texts(decoder: _Watched, batch: list[list[int]], engine) -> None:
    """One call over right-padded texts, as the engine reads prompts (positions = cache columns)."""
    tokens = _padded(batch, engine.pad_id)                                  # (N, T)
    N, T = tokens.shape
    keep = np.zeros((N, T), dtype=bool)
    for r, s in enumerate(batch):
        keep[r, :len(s)] = True
    decoder.run({"tokens": tokens, "past_rows": np.arange(N, dtype=np.int64), "key_mask": keep,
                 "positions": np.broadcast_to(np.arange(T, dtype=np.int64), (N, T)).copy(),
                 "top_k": np.array([1], np.int64)} | _empty_cache(engine, N), keep=keep)
