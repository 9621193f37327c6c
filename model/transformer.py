"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), as our seed documents
describe it, in one file.

- scaled dot-product attention, softmax(Q Kᵀ / √d_k) V, with masked scores set to the lowest value
- multi-head attention: h heads of size d_k = d_model / h, concatenated and projected by W^O
- sinusoidal positional encoding: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)),
  PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)), added to embeddings scaled by √d_model
- every sub-layer wrapped in "add & norm": LayerNorm(x + Dropout(Sublayer(x))) (post-norm)
- position-wise feed-forward: max(0, x W1 + b1) W2 + b2
- one embedding matrix shared by the encoder input, the decoder input and the output projection

Two architectures share the blocks: `arch="encoder-decoder"` (translation) and `arch="decoder"`
(a GPT-style language model: decoder layers without cross-attention). Masks are built outside,
at collate time, by `padding_mask()` and `causal_mask()`; attention only applies what it is given.
`encode()` and `decode()` are separate because they become the two ONNX graphs of a model package;
`decode()` optionally takes and returns a key/value cache for incremental decoding.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

# A per-layer (key, value) pair, each (B, h, T, d_k).
KV = tuple[torch.Tensor, torch.Tensor]
ACTIVATIONS = {"relu": F.relu, "swish": F.silu, "gelu": F.gelu}


@dataclass
class TransformerConfig:
    arch: str = "encoder-decoder"  # "encoder-decoder" (translation) or "decoder" (language model)
    vocab_size: int = 8000         # one joint vocabulary; embeddings are tied
    d_model: int = 512             # width of every residual stream
    h: int = 8                     # attention heads; d_k = d_v = d_model / h
    d_ff: int = 2048               # inner width of the feed-forward sub-layer
    n_encoder_layers: int = 6      # N in the paper (ignored for arch="decoder")
    n_decoder_layers: int = 6
    dropout: float = 0.1           # on sub-layer outputs, embeddings+PE, and attention weights
    max_len: int = 1024            # rows of the positional-encoding table: longest sequence served
    pad_id: int = 0                # fixed by model.tokenizer
    bos_id: int = 2
    eos_id: int = 3
    # Variants used by pretrained checkpoints (Marian / OPUS-MT); ours keep the paper's choices.
    scale_embedding: bool = True   # multiply embeddings by sqrt(d_model) (paper, section 3.4)
    activation: str = "relu"       # feed-forward non-linearity: "relu" (paper), "swish" or "gelu"
    pe_layout: str = "interleaved" # "interleaved": sin at even, cos at odd dims (paper); "halves": all
                                   # sines, then all cosines (Marian)
    # The decoder starts from a zero vector (the <s> embedding row stays 0), as Marian and CTranslate2
    # do: only then does a checkpoint exported with model.export_marian run the same in CTranslate2.
    # Set by the presets (model.train turns it off for decoder-only models); checkpoints from before it
    # load with False.
    zero_bos_embedding: bool = False

    def __post_init__(self):
        if self.arch not in ("encoder-decoder", "decoder"):
            raise ValueError(f"arch must be 'encoder-decoder' or 'decoder', got {self.arch!r}")
        if self.d_model % self.h:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by h ({self.h}), e.g. h=8 for d_model=512")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        if self.pe_layout not in ("interleaved", "halves"):
            raise ValueError(f"pe_layout must be 'interleaved' or 'halves', got {self.pe_layout!r}")

    @property
    def d_k(self) -> int:
        return self.d_model // self.h

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, TransformerConfig] = {
    # For tests: trains in seconds on a CPU.
    "tiny": TransformerConfig(d_model=64, h=4, d_ff=256, n_encoder_layers=2, n_decoder_layers=2, dropout=0.0,
                              zero_bos_embedding=True),
    # The embedded default: a deep encoder and a shallow decoder keep CPU decoding fast (the decoder
    # runs once per output token, the encoder once per sentence).
    "small": TransformerConfig(d_model=256, h=4, d_ff=1024, n_encoder_layers=4, n_decoder_layers=3, dropout=0.1,
                               zero_bos_embedding=True),
    # The paper's base model, for a GPU.
    "base": TransformerConfig(d_model=512, h=8, d_ff=2048, n_encoder_layers=6, n_decoder_layers=6, dropout=0.1,
                              zero_bos_embedding=True),
}


def preset(name: str, **overrides) -> TransformerConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return replace(PRESETS[name], **overrides)


# --- masks: built at collate time, never inside attention ---------------------------------------

def padding_mask(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """True where a key position holds a real token. ids (B, T) -> (B, 1, 1, T)."""
    return (ids != pad_id)[:, None, None, :]


def causal_mask(size: int, device: torch.device | str | None = None) -> torch.Tensor:
    """True where query position i may attend to key position j (j <= i). -> (1, 1, T, T)."""
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()[None, None]


# --- building blocks -----------------------------------------------------------------------------

def sinusoidal_positional_encoding(max_len: int, d_model: int, layout: str = "interleaved") -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)); PE(pos, 2i+1) = cos(same). -> (max_len, d_model).

    layout "halves" puts the same sines in dims [0, d_model/2) and the cosines after them, as Marian does.
    """
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]           # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)            # (d_model/2,)
    angle = pos / torch.pow(10000.0, two_i / d_model)                   # (L, d_model/2)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    if layout == "halves":
        pe[:, : d_model // 2] = torch.sin(angle)
        pe[:, d_model // 2:] = torch.cos(angle)
    else:
        pe[:, 0::2] = torch.sin(angle)
        pe[:, 1::2] = torch.cos(angle)
    return pe.float()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              dropout: nn.Dropout | None = None) -> torch.Tensor:
    """Scaled dot-product attention. q (B, h, Tq, d_k), k/v (B, h, Tk, d_k), mask broadcast to (B, h, Tq, Tk)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))            # (B, h, Tq, Tk)
    if mask is not None:
        # The lowest finite value, not -inf: a fully masked row (a padded query) stays finite.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    p_attn = scores.softmax(dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return p_attn @ v                                                   # (B, h, Tq, d_k)


def write_cache(past: torch.Tensor, new: torch.Tensor, at: torch.Tensor, width: int | torch.SymInt) -> torch.Tensor:
    """The cache past (N, h, T, d_k), T <= width, widened to `width` columns, with new (N, h, n, d_k)
    written at columns `at` (N, n): each row's keys sit at their own positions. Appending at one
    column shared by all rows would shift a short prompt's keys by its batch-mates' lengths, and with
    them the order of the float sums in attention (and int8 roundings after them): the row would not
    compute alone what it computes batched. Columns not written keep the past (or zeros)."""
    N, h, T, d_k = past.shape
    widened = torch.cat([past, past.new_zeros(N, h, width - T, d_k)], dim=2)      # (N, h, W, d_k)
    hit = torch.arange(width, device=at.device)[None, None, :] == at[:, :, None]  # (N, n, W)
    source = hit.to(torch.int64).argmax(dim=1)                                     # (N, W) which new one
    placed = new.gather(2, source[:, None, :, None].expand(N, h, width, d_k))      # (N, h, W, d_k)
    return torch.where(hit.any(dim=1)[:, None, :, None], placed, widened)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, h: int, dropout: float):
        super().__init__()
        self.h, self.d_k = h, d_model // h
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.h, self.d_k).transpose(1, 2)           # (B, h, T, d_k)

    def kv(self, x: torch.Tensor) -> KV:
        """Keys and values of x (B, T, d_model), each (B, h, T, d_k); cached during decoding."""
        return self._split(self.w_k(x)), self._split(self.w_v(x))

    def attend(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Queries from x (B, Tq, d_model) attend over given keys/values. -> (B, Tq, d_model)."""
        B, Tq, _ = x.shape
        q = self._split(self.w_q(x))                                    # (B, h, Tq, d_k)
        out = attention(q, k, v, mask, self.dropout)                    # (B, h, Tq, d_k)
        out = out.transpose(1, 2).reshape(B, Tq, self.h * self.d_k)     # (B, Tq, d_model)
        return self.w_o(out)

    def forward(self, x: torch.Tensor, kv_source: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.attend(x, *self.kv(kv_source), mask)


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str = "relu"):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.act = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.dropout(self.act(self.w_1(x))))


class EncoderLayer(nn.Module):
    """Self-attention, then feed-forward; each wrapped in add & norm."""

    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(c.d_model, c.h, c.dropout)
        self.ff = PositionwiseFeedForward(c.d_model, c.d_ff, c.dropout, c.activation)
        self.norm1, self.norm2 = nn.LayerNorm(c.d_model), nn.LayerNorm(c.d_model)
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.dropout(self.self_attn(x, x, src_mask)))
        return self.norm2(x + self.dropout(self.ff(x)))


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder memory (translation only), then
    feed-forward; each wrapped in add & norm. With `past` the self-attention keys/values of earlier
    positions are reused and the new ones are returned, so each step costs O(T), not O(T²)."""

    def __init__(self, c: TransformerConfig, cross_attention: bool):
        super().__init__()
        self.self_attn = MultiHeadAttention(c.d_model, c.h, c.dropout)
        self.cross_attn = MultiHeadAttention(c.d_model, c.h, c.dropout) if cross_attention else None
        self.ff = PositionwiseFeedForward(c.d_model, c.d_ff, c.dropout, c.activation)
        self.norm1, self.norm3 = nn.LayerNorm(c.d_model), nn.LayerNorm(c.d_model)
        self.norm2 = nn.LayerNorm(c.d_model) if cross_attention else None
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor, tgt_mask: torch.Tensor | None, *, cross_kv: KV | None = None,
                src_mask: torch.Tensor | None = None, past: KV | None = None,
                write_at: torch.Tensor | None = None) -> tuple[torch.Tensor, KV]:
        k, v = self.self_attn.kv(x)                                     # (B, h, T, d_k)
        if past is not None and write_at is not None:                   # at (B, T) columns of tgt_mask's width
            width = tgt_mask.size(-1)
            k, v = write_cache(past[0], k, write_at, width), write_cache(past[1], v, write_at, width)
        elif past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)  # (B, h, T_past+T, d_k)
        x = self.norm1(x + self.dropout(self.self_attn.attend(x, k, v, tgt_mask)))
        if self.cross_attn is not None:
            # cross_kv may hold A < B sources, each shared by B / A consecutive rows (a sentence's beams):
            # those rows' queries attend together as one longer query sequence, so the encoder's keys
            # and values are never copied per beam. Training passes one source per row.
            B, T, D = x.shape
            A = cross_kv[0].size(0)
            ctx = self.cross_attn.attend(x.reshape(A, -1, D), *cross_kv, src_mask)  # (A, B/A*T, d_model)
            x = self.norm2(x + self.dropout(ctx.reshape(B, T, D)))
        x = self.norm3(x + self.dropout(self.ff(x)))
        return x, (k, v)


def fairseq_init(model: nn.Module) -> None:
    """fairseq's (and PyTorch nn.Transformer's) initialisation instead of ours: the query, key and value
    projections Xavier-initialised as one (3·d_model, d_model) matrix (gain 1/sqrt(2) each, √2 smaller than
    on their own) and every linear bias zero. Ours (Xavier per matrix, nn.Linear's uniform biases) stays
    the default for a model built from its config; model.train --init fairseq applies this to a fresh one."""
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            for projection in (module.w_q, module.w_k, module.w_v):
                nn.init.xavier_uniform_(projection.weight, gain=2 ** -0.5)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)


class Transformer(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        c = self.config = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        self.register_buffer("pe", sinusoidal_positional_encoding(c.max_len, c.d_model, c.pe_layout),
                             persistent=False)
        self.emb_dropout = nn.Dropout(c.dropout)
        self.embed_scale = math.sqrt(c.d_model) if c.scale_embedding else 1.0
        self.encoder = (nn.ModuleList(EncoderLayer(c) for _ in range(c.n_encoder_layers))
                        if c.arch == "encoder-decoder" else None)
        self.decoder = nn.ModuleList(DecoderLayer(c, cross_attention=c.arch == "encoder-decoder")
                                     for _ in range(c.n_decoder_layers))
        # Marian checkpoints carry a bias on the output projection; ours stays zero.
        self.register_buffer("final_logits_bias", torch.zeros(c.vocab_size))
        self._init_weights()

    def _init_weights(self):
        for name, p in self.named_parameters():
            if p.dim() > 1 and not name.startswith("embed"):
                nn.init.xavier_uniform_(p)
        # Scaled by sqrt(d_model) on input, the shared embedding starts at unit variance.
        nn.init.normal_(self.embed.weight, mean=0.0, std=self.config.d_model ** -0.5)
        with torch.no_grad():
            self.embed.weight[self.config.pad_id].zero_()
            if self.config.zero_bos_embedding:
                self.embed.weight[self.config.bos_id].zero_()
        if self.config.zero_bos_embedding:
            # Like padding_idx for <pad>: the row gets no gradient, so it stays 0 through training.
            bos = self.config.bos_id
            self.embed.weight.register_hook(lambda g: g.index_fill(0, torch.tensor([bos], device=g.device), 0.0))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def embed_tokens(self, ids: torch.Tensor, offset: int | torch.Tensor = 0,
               positions: torch.Tensor | None = None) -> torch.Tensor:
        T = ids.size(1)
        x = self.embed(ids) * self.embed_scale                          # (B, T, d_model)
        pe = self.pe[offset:offset + T] if positions is None else self.pe[positions]  # (T | B, T, d_model)
        return self.emb_dropout(x + pe)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """src (B, S) token ids, src_mask (B, 1, 1, S) -> memory (B, S, d_model)."""
        x = self.embed_tokens(src)
        for layer in self.encoder:
            x = layer(x, src_mask)
        return x

    def cross_kv(self, memory: torch.Tensor) -> list[KV]:
        """Each decoder layer's cross-attention keys/values: computed once per source sentence."""
        return [layer.cross_attn.kv(memory) for layer in self.decoder]

    def decode(self, tgt: torch.Tensor, tgt_mask: torch.Tensor | None, *, memory: torch.Tensor | None = None,
               src_mask: torch.Tensor | None = None, cross_kv: list[KV] | None = None,
               past: list[KV] | None = None, positions: torch.Tensor | None = None,
               cache_by_position: bool = False) -> tuple[torch.Tensor, list[KV]]:
        """tgt (B, T) -> (logits (B, T, V), present self-attention cache: one KV per layer).

        Training passes the whole shifted target with a causal tgt_mask; incremental decoding passes
        the newest token(s), `past` from the previous step and tgt_mask=None (every cached position is
        visible). Translation also needs `memory` or its precomputed `cross_kv`, and `src_mask`.
        `positions` (B, T) overrides the positions counted from the cache length: in a batch of prompts
        each row has its own. With `cache_by_position` each new token's keys and values are written at
        the cache column of its position (`write_cache`) instead of appended; tgt_mask's width is the
        cache's.
        """
        x, present = self.decoder_states(tgt, tgt_mask, memory=memory, src_mask=src_mask, cross_kv=cross_kv,
                                         past=past, positions=positions, cache_by_position=cache_by_position)
        return self.generator(x), present

    def decoder_states(self, tgt: torch.Tensor, tgt_mask: torch.Tensor | None, *, memory: torch.Tensor | None = None,
                       src_mask: torch.Tensor | None = None, cross_kv: list[KV] | None = None,
                       past: list[KV] | None = None, positions: torch.Tensor | None = None,
                       cache_by_position: bool = False) -> tuple[torch.Tensor, list[KV]]:
        """decode() without the output projection: (last layer's output (B, T, d_model), present cache)."""
        offset = 0 if past is None else past[0][0].size(2)
        if self.encoder is not None and cross_kv is None:
            cross_kv = self.cross_kv(memory)
        x = self.embed_tokens(tgt, offset, positions)
        present = []
        for i, layer in enumerate(self.decoder):
            x, kv = layer(x, tgt_mask, cross_kv=None if cross_kv is None else cross_kv[i], src_mask=src_mask,
                          past=None if past is None else past[i], write_at=positions if cache_by_position else None)
            present.append(kv)
        return x, present

    def generator(self, x: torch.Tensor) -> torch.Tensor:
        """Output projection tied to the embedding. (B, T, d_model) -> (B, T, V)."""
        return x @ self.embed.weight.t() + self.final_logits_bias

    def forward(self, src: torch.Tensor | None, tgt: torch.Tensor, src_mask: torch.Tensor | None,
                tgt_mask: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits (B, T, V) for training."""
        memory = self.encode(src, src_mask) if self.encoder is not None else None
        logits, _ = self.decode(tgt, tgt_mask, memory=memory, src_mask=src_mask)
        return logits
