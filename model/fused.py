"""The decoder step's attention as two onnxruntime operators, for export only.

Written out in ONNX, a decoder layer's attention is a dozen operators (reshape and transpose the heads,
gather the cache's rows, append the new keys, two MatMuls, a mask, a softmax, merge the heads), and each
step copied the whole self-attention cache twice (gather, append) and the encoder's keys and values once.
Here each attention is one operator of onnxruntime's `com.microsoft` domain, traced as a torch custom op
whose reference implementation is the plain attention of model.transformer:

- `cached_attention` -> GroupQueryAttention (as many key/value heads as query heads), reading the query,
  key and value projections packed side by side (one MatMul instead of three): the cache is a
  fixed-width (N, h, W, d_k) buffer; row r's new keys and values go to column `seqlens[r]` and its query
  attends over columns 0..seqlens[r]. Bound as both `past_*` and `present_*` (one address), onnxruntime
  writes the new column in place and copies nothing; the engine reorders rows between steps only when
  they change (service/inference/device_memory.py).
- `cross_attention` -> MultiHeadAttention with keys and values already split into heads, (A, h, S, d_k),
  read where the encoder left them, and a key padding mask.

Scratch timings of the single operators (AMD EPYC, onnxruntime 1.31.1, one thread, d_model 256, 4 heads):
self-attention over 16 cached positions, as the graph had it (reshape, transpose, append, two MatMuls,
softmax; the row gather not counted) 22.0 us at batch 1 and 127.1 us at batch 32, GroupQueryAttention in
place 6.8 and 55.6 us; cross-attention over 24 source positions with the per-step gather of the encoder's
keys/values 32.1 and 196.5 us, MultiHeadAttention 19.2 and 132.7 us. Each gave the same values alone and
batched, and the same as the operators it replaces to within float rounding. The whole-search effect is
in benchmarks/results/vs-ctranslate2-cpu.md.
"""

from __future__ import annotations

import math

import torch
from onnx.defs import OpSchema
from onnxscript.values import Op, Opset

MSFT = Opset("com.microsoft", 1)


def _schema(name: str, inputs: list[tuple[str, str, bool]], outputs: list[tuple[str, str]],
            attributes: list[str]) -> Op:
    """An onnxscript operator of onnxruntime's com.microsoft domain. The exporter builds nodes from an ONNX
    schema, and onnx's registry holds none for onnxruntime's own operators: this declares the part we use
    (inputs as (name, type, optional), T any float type, M int32)."""
    param = OpSchema.FormalParameter
    schema = OpSchema(
        name, MSFT.domain, 1,
        inputs=[param(n, t, param_option=OpSchema.FormalParameterOption.Optional if optional
                      else OpSchema.FormalParameterOption.Single) for n, t, optional in inputs],
        outputs=[param(n, t) for n, t in outputs],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)"], ""), ("M", ["tensor(int32)"], "")],
        attributes=[OpSchema.Attribute(a, OpSchema.AttrType.INT, "") for a in attributes])
    return Op(MSFT, name, schema)


GROUP_QUERY_ATTENTION = _schema(
    "GroupQueryAttention",
    [("query", "T", False), ("key", "T", True), ("value", "T", True), ("past_key", "T", False),
     ("past_value", "T", False), ("seqlens_k", "M", False), ("total_sequence_length", "M", False)],
    [("output", "T"), ("present_key", "T"), ("present_value", "T")], ["num_heads", "kv_num_heads"])
MULTI_HEAD_ATTENTION = _schema(
    "MultiHeadAttention",
    [("query", "T", False), ("key", "T", False), ("value", "T", False), ("bias", "T", True),
     ("key_padding_mask", "M", True)],
    [("output", "T")], ["num_heads"])


@torch.library.custom_op("mt::cached_attention", mutates_args=())
def cached_attention(qkv: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor, seqlens: torch.Tensor,
                     total: torch.Tensor, h: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv (N, 1, 3·d_model) the query, key and value projections of one new token per row, side by side
    (one MatMul makes them); past_k/v (N, h, W, d_k) the cache; seqlens (N,) int32 the column each row
    writes (its position); total (1,) int32 max(seqlens) + 1.
    -> (out (N, 1, d_model), present_k, present_v (N, h, W, d_k) with the new column written)."""
    N, _, D3 = qkv.shape
    D = D3 // 3
    W, d_k = past_k.size(2), D // h
    q, k, v = qkv.split(D, dim=-1)                                                    # (N, 1, d_model) each
    col = seqlens.to(torch.int64)                                                     # (N,)
    hit = (torch.arange(W, device=qkv.device)[None, :] == col[:, None])[:, None, :, None]  # (N, 1, W, 1)
    present_k = torch.where(hit, k.reshape(N, 1, h, d_k).transpose(1, 2), past_k)    # (N, h, W, d_k)
    present_v = torch.where(hit, v.reshape(N, 1, h, d_k).transpose(1, 2), past_v)
    seen = torch.arange(W, device=qkv.device)[None, :] <= col[:, None]               # (N, W)
    qh = q.reshape(N, 1, h, d_k).transpose(1, 2)                                      # (N, h, 1, d_k)
    scores = qh @ present_k.transpose(-2, -1) / math.sqrt(d_k)                        # (N, h, 1, W)
    scores = scores.masked_fill(~seen[:, None, None, :], float("-inf"))
    out = scores.softmax(dim=-1) @ present_v                                          # (N, h, 1, d_k)
    return out.transpose(1, 2).reshape(N, 1, D), present_k, present_v


@cached_attention.register_fake
def _(qkv, past_k, past_v, seqlens, total, h):
    N, T, D3 = qkv.shape
    return qkv.new_empty(N, T, D3 // 3), torch.empty_like(past_k), torch.empty_like(past_v)


@torch.library.custom_op("mt::cross_attention", mutates_args=())
def cross_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor, h: int) -> torch.Tensor:
    """q (A, G, d_model) the queries of the G rows that share a source; k, v (A, h, S, d_k) the source's
    keys and values; key_mask (A, S) int32, 1 at real source tokens. -> (A, G, d_model)."""
    A, G, D = q.shape
    d_k = D // h
    qh = q.view(A, G, h, d_k).transpose(1, 2)                                         # (A, h, G, d_k)
    scores = qh @ k.transpose(-2, -1) / math.sqrt(d_k)                                # (A, h, G, S)
    scores = scores.masked_fill(key_mask[:, None, None, :] == 0, float("-inf"))
    out = scores.softmax(dim=-1) @ v                                                  # (A, h, G, d_k)
    return out.transpose(1, 2).reshape(A, G, D)


@cross_attention.register_fake
def _(q, k, v, key_mask, h):
    return torch.empty_like(q)


def _cached_attention_onnx(qkv, past_k, past_v, seqlens, total, h: int):
    # Key and value omitted: the query input is the packed projection (onnxruntime splits it).
    return GROUP_QUERY_ATTENTION(qkv, None, None, past_k, past_v, seqlens, total, num_heads=h, kv_num_heads=h)


def _cross_attention_onnx(q, k, v, key_mask, h: int):
    return MULTI_HEAD_ATTENTION(q, k, v, None, key_mask, num_heads=h)


# torch.onnx.export(..., custom_translation_table=TRANSLATIONS)
TRANSLATIONS = {torch.ops.mt.cached_attention.default: _cached_attention_onnx,
                torch.ops.mt.cross_attention.default: _cross_attention_onnx}
