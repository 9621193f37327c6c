"""Export a trained checkpoint to a self-contained model package for the service.

    python -m model.export --checkpoint runs/small --out models/small [--quantize int8] [--fp16]

A model package is a directory:

    model.json     config, task, languages, special ids, graph signatures, metrics, sha256 of each file
    encoder.onnx   src_ids (B, S) -> cross_key_i, cross_value_i (B, h, S, d_k) for each decoder layer i
                   (translation only)
    decoder.onnx   one decoding step with a key/value cache (below)
    spm.model      the SentencePiece model (one joint vocabulary)
    MODEL_CARD.md  copied from the run directory when it has one

The decoder step (translation):

    tokens        int64 (N, 1)             the newest token of each row
    positions     int32 (N,)               each row's position: the cache column its keys and values go to
    total         int32 (1,)               max(positions) + 1, GroupQueryAttention's total_sequence_length,
                                           from the host (below)
    src_mask      int32 (A, S)             1 at real source tokens of each group's source
    past_key_i, past_value_i   float (N, h, W, d_k)   layer i's self-attention cache, W >= positions + 1
                                           columns; bound to the same memory as present_*, so the new
                                           column is written in place (onnxruntime's GroupQueryAttention)
    cross_key_i, cross_value_i float (A, h, S, d_k)   from the encoder: one source per group of N / A
                                           consecutive rows (a sentence's beams share it, never copied)
    top_k         int64 (1,)               how many best next tokens to return
  ->
    log_probs     float32 (N, V)           log-softmax computed in the graph
    top_log_probs float32 (N, k), top_ids int64 (N, k)   each row's k best next tokens, best first
    eos_log_probs float32 (N,)             each row's log-prob of eos
    present_key_i, present_value_i float (N, h, W, d_k)   the cache with column `positions` written

The graph does not reorder rows: the engine does, between steps and only when they change (beam
back-pointers, finished sentences dropped), and keeps the cross tensors to the groups still searched
(service/inference/device_memory.py). A search that needs no more than the best few tokens of each row reads
top_* and eos_log_probs, so (N, V) values never reach the host (service/shared/search.py). Older
layouts (a `past_rows` input that reordered and appended the cache in the graph, copying it twice a
step, and a `sources` input that gathered the cross tensors every step; before that a stacked cache
and no `top_k`) are refused by the engine; `python -m model.upgrade` re-exports such a package from
the weights in its graphs.

`total` is an input rather than computed in the graph from `positions`: onnxruntime reads that operator
input on the host, and computed on a GPU (ReduceMax + 1, then copied) its CUDA kernel read it wrongly: every
step's log-probs off by up to 16 on an H200 with onnxruntime 1.31.1, right to fp16's rounding when fed from
the host (benchmarks/cuda_ops.py --decoder; benchmarks/results/gpu-h200.md). Packages without it still serve
on the CPU; the engine warns on CUDA, and `python -m model.upgrade` re-exports them.

A decoder-only model (text generation, task "generation") has no encoder.onnx; its decoder step
reads a whole batch of right-padded prompts in one call, then one token per row per call:

    tokens        int64 (N, T_new)         new tokens of each row (prompts: right-padded)
    past_rows     int64 (N,)               row of the past cache each row continues
    key_mask      bool  (N, W)             True at the cache columns that hold a row's real tokens,
                                           the new ones included; W >= T is the present cache's width
    positions     int64 (N, T_new)         position of each new token in its own row's text, which is
                                           also its cache column
    past_key_i, past_value_i   float (M, h, T, d_k)
    top_k         int64 (1,)
  ->
    log_probs, top_log_probs, top_ids, eos_log_probs    after each row's last new token, as above
    present_key_i, present_value_i float (N, h, W, d_k)

Each row's keys sit at the columns of their positions, padding only after them: a row's attention
sums the same values in the same order alone or next to longer rows, which left padding (packages
whose model.json has no "cache": "by-position") does not, so int8 roundings downstream could
differ with the batch. The engine widens W in steps of 8 columns (service/inference/decoders.py says why).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import onnx
import torch
import torch.nn as nn

from .checkpoint import load_checkpoint
from service.shared.package import (CACHE_BY_POSITION, INT8_DEFAULT_WEIGHT_BITS, INT8_WEIGHT_BITS, PACKAGE_FORMAT,
                                    file_entries)

from .calibrate import Calibration, activation_ranges, read_calibration
from .fused import TRANSLATIONS, cached_attention, cross_attention
from .quantize import SCHEMES, add_weight_bits_flag, quantize_int8
from .tokenizer import Tokenizer
from .transformer import Transformer, padding_mask

OPSET = 18
TOP_K_AT_EXPORT = 2          # a placeholder: the exported graph reads k from its `top_k` input
NEXT_TOKEN_OUTPUTS = ["log_probs", "top_log_probs", "top_ids", "eos_log_probs"]


def cache_names(prefix: str, n_layers: int) -> list[str]:
    """Per-layer cache tensor names, keys and values interleaved: past_key_0, past_value_0, past_key_1, ..."""
    return [f"{prefix}_{kv}_{i}" for i in range(n_layers) for kv in ("key", "value")]


def reordered(caches: tuple[torch.Tensor, ...], rows: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Flat (key_0, value_0, key_1, ...) per-layer tensors -> [(key, value)] per layer, rows picked by `rows`."""
    picked = [t.index_select(0, rows) for t in caches]
    return list(zip(picked[0::2], picked[1::2]))


class EncoderGraph(nn.Module):
    """Runs the encoder and precomputes every decoder layer's cross-attention keys/values."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, src_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        src_mask = padding_mask(src_ids, self.model.config.pad_id)              # (B, 1, 1, S)
        memory = self.model.encode(src_ids, src_mask)                           # (B, S, d_model)
        return tuple(t for kv in self.model.cross_kv(memory) for t in kv)       # 2L x (B, h, S, d_k)


class OutputProjection(nn.Module):
    """The tied output projection with its own (d_model, V) weight: a MatMul on a plain initializer,
    which int8 quantization reaches (a transposed embedding is not quantized)."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.weight = nn.Parameter(model.embed.weight.detach().t().contiguous().clone())  # (d_model, V)
        self.bias = nn.Parameter(model.final_logits_bias.detach().clone())                  # (V,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax((x @ self.weight + self.bias).float(), dim=-1)              # (N, V)


class PackedProjection(nn.Module):
    """An attention's query, key and value projections as one (d_model, 3·d_model) MatMul and bias: one
    int8 kernel call a step instead of three. model.upgrade splits it back (`self_qkv.{i}`)."""

    def __init__(self, attention: nn.Module):
        super().__init__()
        w = [attention.w_q, attention.w_k, attention.w_v]
        self.weight = nn.Parameter(torch.cat([p.weight.detach() for p in w]).t().contiguous().clone())  # (D, 3D)
        self.bias = nn.Parameter(torch.cat([p.bias.detach() for p in w]).clone())                       # (3D,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight + self.bias                                                # (N, 1, 3·d_model)


def next_token_outputs(log_probs: torch.Tensor, eos_id: int) -> tuple[torch.Tensor, ...]:
    """What a search reads of the next-token distribution: the whole of it (for constraints that need
    it), its k best entries, sorted, and the eos column. k becomes the graph input `top_k` after
    export (see `_top_k_as_input`), so a beam search of any width reads (N, 2·beam + a few) values
    instead of (N, V)."""
    top_log_probs, top_ids = log_probs.topk(TOP_K_AT_EXPORT, dim=-1)                     # (N, k) each
    return log_probs, top_log_probs, top_ids, log_probs[:, eos_id]                       # (N,) last


class DecoderGraph(nn.Module):
    """One incremental decoding step, its attention as two fused operators (model/fused.py). The cache is
    written in place at each row's position; the engine reorders rows between steps, only when they
    change, so a step copies no cache at all (the older layout copied each layer's twice: reorder, append)."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model
        self.project = OutputProjection(model)
        self.self_qkv = nn.ModuleList(PackedProjection(layer.self_attn) for layer in model.decoder)

    def forward(self, tokens, positions, total, src_mask, *caches):
        m, c = self.model, self.model.config
        L, D, N = c.n_decoder_layers, c.d_model, tokens.size(0)
        past, cross = caches[:2 * L], caches[2 * L:]
        A = cross[0].size(0)                                                    # groups of N / A rows
        x = m.embed_tokens(tokens, positions=positions[:, None].long())         # (N, 1, d_model)
        present = []
        for i, layer in enumerate(m.decoder):
            sa, ca = layer.self_attn, layer.cross_attn
            out, k, v = cached_attention(self.self_qkv[i](x), past[2 * i], past[2 * i + 1],
                                         positions, total, c.h)                 # (N, 1, d_model), 2 x (N, h, W, d_k)
            x = layer.norm1(x + sa.w_o(out))
            # A sentence's beams share its encoder keys/values: their queries attend as one sequence.
            ctx = cross_attention(ca.w_q(x).reshape(A, -1, D), cross[2 * i], cross[2 * i + 1], src_mask, c.h)
            x = layer.norm2(x + ca.w_o(ctx.reshape(N, 1, D)))                  # (N, 1, d_model)
            x = layer.norm3(x + layer.ff(x))
            present += [k, v]
        return (*next_token_outputs(self.project(x[:, -1]), c.eos_id), *present)   # ..., 2L x (N, h, W, d_k)


class LMDecoderGraph(nn.Module):
    """Decoder-only step: prompts (several tokens per row, right-padded) or one new token per row. Each
    token's keys and values go to the cache column of its position, so a row's cache holds its own
    text at columns 0.. whatever its batch-mates' lengths (`write_cache`)."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model
        self.project = OutputProjection(model)

    def forward(self, tokens, past_rows, key_mask, positions, *caches):
        past = reordered(caches, past_rows)                                     # L x (N, h, T, d_k)
        columns = torch.arange(key_mask.size(1), device=tokens.device)          # (W,)
        causal = columns[None, None, :] <= positions[:, :, None]                # (N, T_new, W)
        mask = key_mask[:, None, None, :] & causal[:, None]                     # (N, 1, T_new, W)
        x, present = self.model.decoder_states(tokens, mask, past=past, positions=positions,
                                               cache_by_position=True)          # (N, T_new, d_model)
        return (*next_token_outputs(self.project(x[:, -1]), self.model.config.eos_id),
                *(t for kv in present for t in kv))                             # ..., 2L x (N, h, W, d_k)


def _export(module: nn.Module, args: tuple, path: Path, input_names, output_names, dynamic_shapes) -> None:
    module.eval()
    torch.onnx.export(module, args, str(path), input_names=[n for n in input_names if n != "top_k"],
                      output_names=output_names, custom_translation_table=TRANSLATIONS,
                      dynamic_shapes=dynamic_shapes, opset_version=OPSET, external_data=False, dynamo=True,
                      optimize=True, verbose=False)
    if "top_k" in input_names:
        _top_k_as_input(path)
    onnx.checker.check_model(str(path), full_check=True)


def _top_k_as_input(path: Path) -> None:
    """Rewires the graph's one TopK node to read k from a new int64 (1,) input named `top_k`."""
    m = onnx.load(str(path))
    g = m.graph
    (node,) = [n for n in g.node if n.op_type == "TopK"]
    constant = node.input[1]
    node.input[1] = "top_k"
    g.input.append(onnx.helper.make_tensor_value_info("top_k", onnx.TensorProto.INT64, [1]))
    for v in [*g.output, *g.value_info]:            # their static k from export becomes symbolic
        if v.name in node.output:
            v.type.tensor_type.shape.dim[-1].dim_param = "top_k"
    if not any(constant in n.input for n in g.node):
        keep = [i for i in g.initializer if i.name != constant]
        del g.initializer[:]
        g.initializer.extend(keep)
    onnx.save(m, str(path))


NEXT_TOKEN_SIGNATURE = {"log_probs": ["rows", "vocab"], "top_log_probs": ["rows", "top_k"],
                        "top_ids": ["rows", "top_k"], "eos_log_probs": ["rows"]}


def _kv(n: str, t: str) -> list:
    return [n, "heads", t, "d_k"]


def export_translation(model: Transformer, out: Path, dtype: torch.dtype = torch.float32) -> dict:
    """Writes encoder.onnx and decoder.onnx; returns their signatures for model.json."""
    c = model.config
    if c.d_k % 8:
        # onnxruntime's GroupQueryAttention (model/fused.py) takes head sizes in multiples of 8 only.
        raise ValueError(f"d_model / h = {c.d_k}: the decoder graph needs a head size that is a multiple of 8, "
                         f"e.g. h={c.d_model // 64 or 1} for d_model={c.d_model}")
    model = model.to(dtype).eval()
    L, B, S = c.n_decoder_layers, 3, 7
    Dim = torch.export.Dim
    batch, src_len, rows, groups, width = Dim("batch"), Dim("src_len"), Dim("rows"), Dim("groups"), Dim("width")
    cross_names, past_names, present_names = (cache_names(p, L) for p in ("cross", "past", "present"))
    src = torch.randint(4, c.vocab_size, (B, S))
    _export(EncoderGraph(model), (src,), out / "encoder.onnx", ["src_ids"], cross_names,
            {"src_ids": {0: batch, 1: src_len}})
    # 6 rows in 2 groups (G = 3), a cache 5 columns wide: example sizes that differ, so none is fixed by export.
    N, A, W = 6, 2, 5
    args = (torch.randint(4, c.vocab_size, (N, 1)), torch.full((N,), 3, dtype=torch.int32),
            torch.tensor([4], dtype=torch.int32), torch.ones(A, S, dtype=torch.int32),
            *(torch.randn(N, c.h, W, c.d_k, dtype=dtype) for _ in past_names),
            *(torch.randn(A, c.h, S, c.d_k, dtype=dtype) for _ in cross_names))
    _export(DecoderGraph(model), args, out / "decoder.onnx",
            ["tokens", "positions", "total", "src_mask", *past_names, *cross_names, "top_k"],
            [*NEXT_TOKEN_OUTPUTS, *present_names],
            ({0: rows}, {0: rows}, None, {0: groups, 1: src_len},
             (*({0: rows, 2: width} for _ in past_names), *({0: groups, 2: src_len} for _ in cross_names))))
    return {
        "encoder": {"inputs": {"src_ids": ["batch", "src_len"]},
                    "outputs": {n: _kv("batch", "src_len") for n in cross_names}},
        "decoder": {"inputs": {"tokens": ["rows", 1], "positions": ["rows"], "total": [1],
                               "src_mask": ["groups", "src_len"]}
                    | {n: _kv("rows", "width") for n in past_names}
                    | {n: _kv("groups", "src_len") for n in cross_names} | {"top_k": [1]},
                    "outputs": NEXT_TOKEN_SIGNATURE | {n: _kv("rows", "width") for n in present_names}},
    }


def export_generation(model: Transformer, out: Path, dtype: torch.dtype = torch.float32) -> dict:
    """Writes decoder.onnx of a decoder-only model; returns its signature for model.json."""
    c = model.config
    model = model.to(dtype).eval()
    L, N, M, T, T_new = c.n_decoder_layers, 3, 2, 4, 2
    Dim = torch.export.Dim
    rows, kv_rows, past_len, new_len = Dim("rows"), Dim("kv_rows"), Dim("past_len"), Dim("new_len")
    width = Dim("width")
    past_names, present_names = cache_names("past", L), cache_names("present", L)
    args = (torch.randint(4, c.vocab_size, (N, T_new)), torch.tensor([0, 1, 1]),
            torch.ones(N, T + T_new + 2, dtype=torch.bool), torch.tensor([[4, 5], [4, 5], [2, 3]]),
            *(torch.randn(M, c.h, T, c.d_k, dtype=dtype) for _ in past_names))
    _export(LMDecoderGraph(model), args, out / "decoder.onnx",
            ["tokens", "past_rows", "key_mask", "positions", *past_names, "top_k"],
            [*NEXT_TOKEN_OUTPUTS, *present_names],
            ({0: rows, 1: new_len}, {0: rows}, {0: rows, 1: width}, {0: rows, 1: new_len},
             tuple({0: kv_rows, 2: past_len} for _ in past_names)))
    return {"decoder": {"inputs": {"tokens": ["rows", "new_len"], "past_rows": ["rows"],
                                   "key_mask": ["rows", "width"], "positions": ["rows", "new_len"]}
                                  | {n: _kv("kv_rows", "past_len") for n in past_names} | {"top_k": [1]},
                        "outputs": NEXT_TOKEN_SIGNATURE | {n: _kv("rows", "width") for n in present_names}}}


def export_package(checkpoint: str | Path, out: str | Path, *, quantize: str | None = None, fp16: bool = False,
                   name: str | None = None, calibration: str | Path | None = None,
                   weight_bits: int = INT8_DEFAULT_WEIGHT_BITS) -> Path:
    """Checkpoint (run directory) -> model package directory. Returns the model.json path. int8's calibration
    text: `calibration`, else the dev split of the data the run trained on (its config.json); its weights in
    `weight_bits` (model/quantize.py: 7 for CPUs without VNNI)."""
    model, tok, info = load_checkpoint(checkpoint)
    generation = model.config.arch == "decoder"
    run = Path(checkpoint) if Path(checkpoint).is_dir() else Path(checkpoint).parent
    langs = info.get("langs") or ["de", "en"]
    directions = [] if generation else (info.get("directions") or [f"{langs[0]}-{langs[1]}"])
    tagged = bool(info.get("tagged"))
    tokenizer = Tokenizer(tok.model_file)
    config = run_config(run)
    task = {"task": "generation" if generation else "translation", "directions": directions}
    source = (calibration or dev_split(config)) if quantize == "int8" else None
    texts = read_calibration(source, task) if source else None
    return write_package(
        model, out, files={"spm.model": Path(tok.model_file)}, tokenizer={"source": "spm.model", "target": "spm.model"},
        special_ids={"pad": 0, "unk": 1, "bos": 2, "eos": 3},
        languages=sorted(langs if generation else {lang for d in directions for lang in d.split("-")}),
        directions=directions,
        target_tags={lang: tokenizer.lang_id(lang) for lang in tokenizer.languages()} if tagged else {},
        training={"step": info.get("step"),
                  # checkpoint.pt counts them; best.pt has them in the evaluation that made it the best
                  "target_tokens": info.get("target_tokens") or (info.get("metrics") or {}).get("target_tokens"),
                  "dev_metrics": info.get("metrics") or {},
                  # Where the learning rate stood, so that --init-from continues the schedule.
                  "schedule": {k: config.get("train", {}).get(k) for k in ("lr", "warmup")},
                  "checkpoint": Path(info["file"]).name,
                  # Longest training sequence: language-model perplexity is measured in such windows.
                  "max_positions": config.get("train", {}).get("max_positions"),
                  # model.average's: the steps whose weights were averaged (the step above is the newest's)
                  **({"averaged_steps": info["averaged_steps"]} if info.get("averaged_steps") else {})},
        model_card=run / "MODEL_CARD.md", quantize=quantize, calibration=texts, fp16=fp16, name=name,
        weight_bits=weight_bits)


def dev_split(config: dict) -> Path | None:
    """dev.tsv of the data directory a run's config.json (`config`, read by run_config) names, where it still
    exists: int8's default calibration text."""
    dev = Path(config["data"]) / "dev.tsv" if config.get("data") else None
    return dev if dev is not None and dev.is_file() else None


def write_package(model: Transformer, out: str | Path, *, files: dict[str, Path], tokenizer: dict,
                  special_ids: dict[str, int], languages: list[str], directions: list[str],
                  target_tags: dict[str, int], training: dict, model_card: Path | None = None,
                  quantize: str | None = None, calibration: Calibration | None = None, fp16: bool = False,
                  name: str | None = None, extra: dict | None = None,
                  weight_bits: int = INT8_DEFAULT_WEIGHT_BITS) -> Path:
    """Exports `model`'s graphs into `out`, copies `files` (tokenizer files, by their name in the package)
    and writes model.json. Shared by model.export (our checkpoints), model.import_marian and model.upgrade.
    quantize "int8" (int8-static) needs `calibration`: the package is written in fp32 first, run over it
    (model/calibrate.py), then quantized, its weights in `weight_bits`."""
    _check_quantize(quantize, calibration, weight_bits)
    if quantize and fp16:
        raise ValueError("choose one of --quantize (CPU) and --fp16 (GPU)")
    generation = model.config.arch == "decoder"
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    export = export_generation if generation else export_translation
    graphs = export(model, out, torch.float16 if fp16 else torch.float32)
    for target, source in files.items():
        shutil.copy(source, out / target)
    if model_card is not None and model_card.exists():
        shutil.copy(model_card, out / "MODEL_CARD.md")
    meta = {
        "format": PACKAGE_FORMAT,
        "name": name or out.name,
        "task": "generation" if generation else "translation",
        "directions": directions,
        "languages": languages,
        "target_tags": target_tags,
        "config": model.config.to_dict() | {"d_k": model.config.d_k},
        "special_ids": special_ids,
        "precision": "fp16" if fp16 else "fp32",
        **({"cache": CACHE_BY_POSITION} if generation else {}),
        "tokenizer": tokenizer,
        "graphs": graphs,
        "training": training,
    }
    meta |= {k: v for k, v in (extra or {}).items() if k not in meta}   # extra adds keys, never replaces
    if quantize:
        meta = quantize_package(out, quantize, calibration, meta=meta, weight_bits=weight_bits)
    meta["export_seconds"] = round(time.time() - t0, 1)
    return _write_meta(out, meta)


def _check_quantize(quantize: str | None, calibration: Calibration | None,
                    weight_bits: int = INT8_DEFAULT_WEIGHT_BITS) -> None:
    if weight_bits not in INT8_WEIGHT_BITS:
        raise ValueError(f"int8 weight bits must be one of {INT8_WEIGHT_BITS}, got {weight_bits!r}")
    if weight_bits != INT8_DEFAULT_WEIGHT_BITS and not quantize:
        raise ValueError("--int8-weight-bits applies to an int8 package: pass --quantize too")
    if quantize not in (None, *SCHEMES):
        raise ValueError(f"quantize must be None or one of {', '.join(SCHEMES)}, got {quantize!r}")
    if quantize == "int8" and not calibration:
        raise ValueError("--quantize int8 sets its activation scales from calibration text: pass --calibration "
                         "FILE (e.g. data/de-en/dev.tsv), or --quantize int8-rows, which needs none")


def quantize_package(out: Path, quantize: str, calibration: Calibration | None = None, *,
                     meta: dict | None = None, weight_bits: int = INT8_DEFAULT_WEIGHT_BITS) -> dict:
    """Quantizes the fp32 package in `out` in place ("int8": int8-static, its activation ranges measured over
    `calibration` first; "int8-rows"), its weights in `weight_bits`; returns its model.json, written. `meta`:
    the model.json to write, where the caller has it (else read from `out`)."""
    _check_quantize(quantize, calibration, weight_bits)
    if meta is None:
        meta = json.loads((out / "model.json").read_text())
    elif quantize == "int8":
        _write_meta(out, meta)                       # calibration runs the package as fp32 first
    ranges = activation_ranges(out, calibration) if quantize == "int8" else {}
    for graph in meta["graphs"]:
        quantize_int8(out / f"{graph}.onnx", ranges.get(graph), weight_bits=weight_bits)
    meta |= {"precision": "int8", "quantization": SCHEMES[quantize], "weight_bits": weight_bits}
    if ranges:
        meta["calibration"] = {"sentences": len(calibration)}
    _write_meta(out, meta)
    return meta


def _write_meta(out: Path, meta: dict) -> Path:
    meta["files"] = file_entries(out, [f.name for f in sorted(out.iterdir()) if f.name != "model.json" and f.is_file()])
    path = out / "model.json"
    path.write_text(json.dumps(meta, indent=2) + "\n")
    return path


def summary(path: Path) -> str:
    """One line on a written package (its model.json path): directory, precision, file sizes."""
    meta = json.loads(path.read_text())
    sizes = ", ".join(f"{k} {v['bytes'] / 1e6:.1f} MB" for k, v in meta["files"].items())
    return f"wrote {path.parent} ({meta['precision']}): {sizes}"


def run_config(run: Path) -> dict:
    path = run / "config.json"
    return json.loads(path.read_text()) if path.exists() else {}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Export a checkpoint to an ONNX model package.")
    p.add_argument("--checkpoint", required=True, help="run directory from model.train (best.pt is used)")
    p.add_argument("--out", required=True, help="package directory to write, e.g. models/de-en")
    p.add_argument("--quantize", choices=list(SCHEMES), default=None,
                   help="int8 weights and activations for CPU serving (model/quantize.py): int8 with activation "
                        "scales calibrated on text (--calibration), or int8-rows with each row's own scale")
    p.add_argument("--calibration", default=None,
                   help="text that sets int8's activation scales: a TSV as model.evaluate reads (default: "
                        "dev.tsv of the data the run trained on)")
    add_weight_bits_flag(p)
    p.add_argument("--fp16", action="store_true", help="half-precision graphs (GPU serving)")
    p.add_argument("--name", default=None, help="model id shown by the service (default: the directory name)")
    args = p.parse_args(argv)
    path = export_package(args.checkpoint, args.out, quantize=args.quantize, fp16=args.fp16, name=args.name,
                          calibration=args.calibration, weight_bits=args.int8_weight_bits)
    print(summary(path))


if __name__ == "__main__":
    main()
