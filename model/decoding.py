"""PyTorch reference decoding: the Transformer behind the search of `service.shared.search`.

`TorchDecoder` implements the incremental-decoder protocol (step / select) on top of
`Transformer.decode()` with its key/value cache, so `translate` runs `decode()`, the very search the
service runs over onnxruntime, with every option; only the network differs.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from service.shared.options import SearchOptions
from service.shared.search import decode, finish, max_lengths

from .batching import pad
from .tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from .transformer import KV, Transformer, padding_mask

GREEDY = SearchOptions(beam_size=1)


class TorchDecoder:
    """Incremental decoding state for one batch of encoded sources."""

    def __init__(self, model: Transformer, src: torch.Tensor | None = None):
        self.model = model
        self.past: list[KV] | None = None
        self.cross_kv: list[KV] | None = None
        self.src_mask: torch.Tensor | None = None
        if src is not None:
            self.src_mask = padding_mask(src, PAD_ID)                        # (B, 1, 1, S)
            memory = model.encode(src, self.src_mask)                        # (B, S, d_model)
            self.cross_kv = model.cross_kv(memory)

    @torch.no_grad()
    def step(self, tokens: np.ndarray) -> np.ndarray:
        tgt = torch.as_tensor(tokens, dtype=torch.long, device=self.device)[:, None]  # (N, 1)
        logits, self.past = self.model.decode(tgt, None, src_mask=self.src_mask, cross_kv=self.cross_kv,
                                              past=self.past)
        return torch.log_softmax(logits[:, -1].float(), dim=-1).cpu().numpy()  # (N, V)

    def select(self, rows: np.ndarray) -> None:
        idx = torch.as_tensor(rows, dtype=torch.long, device=self.device)
        pick = lambda kvs: None if kvs is None else [(k[idx], v[idx]) for k, v in kvs]  # noqa: E731
        self.past, self.cross_kv = pick(self.past), pick(self.cross_kv)
        if self.src_mask is not None:
            self.src_mask = self.src_mask[idx]

    @property
    def device(self) -> torch.device:
        return self.model.embed.weight.device


@torch.no_grad()
def translate(model: Transformer, tokenizer: Tokenizer, texts: Sequence[str], *, target_lang: str | None = None,
              settings: SearchOptions = GREEDY, batch_size: int = 64) -> list[str]:
    """Translates `texts` (best hypothesis each) with the served search and every one of its options, as the
    engine runs it (service.inference.engine: the same budget, the same ids never written). Sources are sorted by
    length so batches pad little."""
    model.eval()
    srcs = [tokenizer.source_ids(t, target_lang)[: model.config.max_len] for t in texts]
    # The engine's banned ids: pad, bos, and the language tags where the model is tagged.
    banned = [PAD_ID, BOS_ID, *(tokenizer.tag_ids if target_lang else ())]
    order = sorted(range(len(srcs)), key=lambda i: len(srcs[i]))
    out: list[str] = [""] * len(texts)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        src = pad([srcs[i] for i in idx]).to(model.embed.weight.device)
        limits = max_lengths([len(srcs[i]) for i in idx], a=settings.max_length_a, b=settings.max_length_b,
                             cap=min(settings.max_length, model.config.max_len))
        hyps = finish(decode(TorchDecoder(model, src), len(idx), settings, bos_id=BOS_ID, eos_id=EOS_ID,
                             max_length=limits, banned_ids=banned))
        for i, h in zip(idx, hyps):
            out[i] = tokenizer.decode(h[0].tokens)
    return out
