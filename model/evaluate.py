"""Evaluate a trained checkpoint: sacreBLEU and chrF, greedy and beam search, in PyTorch.

    python -m model.evaluate --checkpoint runs/small --data data/de-en/test.tsv [--beam 4] [--direction de-en]

This decoding is the reference the ONNX engine must match: it runs the same search code
(`service.search`) over the PyTorch network.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import sacrebleu
import torch

from .data import read_pairs
from .decoding import DecodeSettings, translate
from .tokenizer import Tokenizer
from .transformer import Transformer, TransformerConfig


def load_checkpoint(path: str | Path, device: str = "cpu") -> tuple[Transformer, Tokenizer, dict]:
    """A run directory (best.pt preferred, else checkpoint.pt) or a .pt file -> (model, tokenizer, info)."""
    path = Path(path)
    run = path if path.is_dir() else path.parent
    if path.is_dir():
        path = run / "best.pt" if (run / "best.pt").exists() else run / "checkpoint.pt"
    if not path.exists():
        raise SystemExit(f"no checkpoint at {path}: pass a run directory from model.train (holding best.pt)")
    state = torch.load(path, map_location=device, weights_only=False)
    model = Transformer(TransformerConfig(**state["config"])).to(device)
    model.load_state_dict(state["model"])
    model.eval()
    info = {k: state.get(k) for k in ("step", "tagged", "directions", "langs", "metrics")}
    info["file"] = str(path)
    return model, Tokenizer(run / "spm.model"), info


def score(hyps: list[str], refs: list[str]) -> dict:
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    b, c = bleu.corpus_score(hyps, [refs]), chrf.corpus_score(hyps, [refs])
    return {"bleu": round(b.score, 2), "chrf": round(c.score, 2),
            "bleu_signature": str(bleu.get_signature()), "chrf_signature": str(chrf.get_signature())}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="sacreBLEU and chrF of a checkpoint, greedy and beam search.")
    p.add_argument("--checkpoint", required=True, help="run directory from model.train, or a .pt file")
    p.add_argument("--data", required=True, help="TSV: de<TAB>en[<TAB>origin] from model.data, or source<TAB>target")
    p.add_argument("--direction", default=None, help="e.g. de-en or en-de (default: the model's first direction)")
    p.add_argument("--beam", type=int, default=4, help="beam size for the beam-search pass (greedy always runs)")
    p.add_argument("--length-penalty", type=float, default=1.0)
    p.add_argument("--limit", type=int, default=0, help="evaluate only the first N pairs (0 = all)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = p.parse_args(argv)

    model, tok, info = load_checkpoint(args.checkpoint, args.device)
    directions = info.get("directions") or ["de-en"]
    direction = args.direction or directions[0]
    if direction not in directions:
        raise SystemExit(f"--direction {direction}: this model translates {', '.join(directions)}")
    pairs = read_pairs(args.data, direction=direction)
    if args.limit:
        pairs = pairs[: args.limit]
    srcs, refs = [s for s, _ in pairs], [t for _, t in pairs]
    target_lang = direction.split("-")[1] if info.get("tagged") else None
    results = {"checkpoint": info["file"], "step": info.get("step"), "direction": direction,
               "data": str(args.data), "sentences": len(pairs)}
    for name, beam in (("greedy", 1), (f"beam{args.beam}", args.beam)):
        t0 = time.time()
        hyps = translate(model, tok, srcs, target_lang=target_lang,
                         settings=DecodeSettings(beam_size=beam, length_penalty=args.length_penalty))
        results[name] = score(hyps, refs) | {"seconds": round(time.time() - t0, 1)}
        if beam == 1 and args.beam == 1:
            break
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{info['file']} (step {info.get('step')}), {direction}, {len(pairs)} sentences from {args.data}")
    for name in ("greedy", f"beam{args.beam}"):
        if name in results:
            r = results[name]
            print(f"{name:>8}: BLEU {r['bleu']:5.2f}  chrF {r['chrf']:5.2f}  ({r['seconds']}s)")
    r = results["greedy"]
    print(f"signatures: {r['bleu_signature']} | {r['chrf_signature']}")


if __name__ == "__main__":
    main()
