"""How much a translation checkpoint uses its source: dev loss per target token with each pair's own source
against the same targets under another pair's source (a fixed shuffle).

    python benchmarks/source_gain.py --checkpoint runs/default/checkpoint.pt --data data/de-en --pairs 400

A model still at the language-model stage (it writes fluent-looking text whatever the source) scores nearly
the same both ways; one that translates loses nats per token once its source is taken away. The first
--pairs dev examples are the first direction's (de-en for a model of both directions).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from model.batching import collate_ids  # noqa: E402
from model.tokenizer import PAD_ID, Tokenizer  # noqa: E402
from model.train import directions_for, load_token_arrays  # noqa: E402
from model.transformer import Transformer, TransformerConfig  # noqa: E402


def loss_per_token(model: Transformer, dev, src_rows: np.ndarray, tgt_rows: np.ndarray) -> float:
    """Cross-entropy of the targets of `tgt_rows` given the sources of `src_rows` (row for row)."""
    tgt, src = collate_ids(dev, tgt_rows).to("cpu"), collate_ids(dev, src_rows).to("cpu")
    with torch.no_grad():
        logits = model(src.src, tgt.tgt_in, src.src_mask, tgt.tgt_mask)                  # (B, T, V)
        total = F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.tgt_out.view(-1), ignore_index=PAD_ID,
                                reduction="sum")
    return total.item() / tgt.n_tokens


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="checkpoint.pt or best.pt from model.train")
    p.add_argument("--data", default="data/de-en")
    p.add_argument("--tokenizer", default=None, help="its SentencePiece model (default: spm.model beside it)")
    p.add_argument("--pairs", type=int, default=400)
    p.add_argument("--batch", type=int, default=100)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    state = torch.load(args.checkpoint, weights_only=False, map_location="cpu")
    model = Transformer(TransformerConfig(**state["config"]))
    model.load_state_dict(state["model"])
    model.eval()
    tok = Tokenizer(args.tokenizer or Path(args.checkpoint).parent / "spm.model")
    directions = [tuple(d.split("-")) for d in state.get("directions") or []] or directions_for("both", ["de", "en"])
    dev, _ = load_token_arrays(Path(args.data) / "dev.tsv", tok, directions, len(directions) > 1, 1024, None)
    rows = np.arange(min(args.pairs, len(dev)))
    shuffled = np.random.default_rng(0).permutation(rows)
    own = other = 0.0
    for start in range(0, len(rows), args.batch):
        part = slice(start, start + args.batch)
        own += loss_per_token(model, dev, rows[part], rows[part]) * len(rows[part])
        other += loss_per_token(model, dev, shuffled[part], rows[part]) * len(rows[part])
    own, other = own / len(rows), other / len(rows)
    print(f"step {state['step']}: dev loss {own:.3f} with the own source, {other:.3f} with another pair's: "
          f"the source is worth {other - own:.3f} nats per target token ({len(rows)} pairs, {directions[0]})")


if __name__ == "__main__":
    main()
