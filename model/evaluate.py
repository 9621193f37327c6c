"""Evaluate a trained model: sacreBLEU and chrF, greedy and beam search; perplexity for a language model.

    python -m model.evaluate --checkpoint runs/small --data data/de-en/test.tsv [--beam 4] [--direction de-en]
    python -m model.evaluate --package models/de-en --data data/de-en/test.tsv [--beam 4]
    python -m model.evaluate --checkpoint runs/lm-small --data data/mono/test.tsv      # perplexity
    python -m model.evaluate --package models/lm-small --data data/mono/test.tsv

Perplexity is exp(mean negative log-likelihood per SentencePiece piece), the closing </s> included,
over every held-out paragraph (cut into the training windows), overall and per language.

`--checkpoint` decodes in PyTorch: the reference the ONNX engine must match. `--package` decodes
an exported model package through `service.inference.engine.Engine`, exactly as the service does, so the
score of what is deployed (int8 or fp16 included) is measured rather than assumed. Both run the
same search code (`service.shared.search`) and are scored and printed by the same functions.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import sacrebleu
import torch

from service.shared.options import DEFAULTS, SearchOptions

from .checkpoint import load_checkpoint
from .corpus.tsv import read_pairs
from .decoding import translate
from .transformer import Transformer


def score(hyps: list[str], refs: list[str]) -> dict:
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    b, c = bleu.corpus_score(hyps, [refs]), chrf.corpus_score(hyps, [refs])
    return {"bleu": round(b.score, 2), "chrf": round(c.score, 2),
            "bleu_signature": str(bleu.get_signature()), "chrf_signature": str(chrf.get_signature())}


# (sources, beam size) -> one translation per source
TranslateFn = Callable[[Sequence[str], int], list[str]]


@dataclass
class Subject:
    """What is evaluated, whichever runtime decodes it."""
    info: dict                   # identifies the model in the results: checkpoint or package path, step, ...
    label: str                   # first line of the text report
    directions: list[str]
    translate: Callable[[str], TranslateFn]   # direction -> translate function


def checkpoint_subject(path: str, device: str, length_penalty: float, batch_size: int) -> Subject:
    """The PyTorch reference."""
    model, tok, info = load_checkpoint(path, device)

    def for_direction(direction: str) -> TranslateFn:
        target_lang = direction.split("-")[1] if info.get("tagged") else None
        return lambda srcs, beam: translate(model, tok, srcs, target_lang=target_lang, batch_size=batch_size,
                                            settings=SearchOptions(beam_size=beam, length_penalty=length_penalty))

    return Subject({"checkpoint": info["file"], "step": info.get("step")},
                   f"{info['file']} (step {info.get('step')})", info.get("directions") or ["de-en"], for_direction)


def package_subject(path: str, device: str, length_penalty: float, batch_size: int) -> Subject:
    """A model package decoded by the serving engine (onnxruntime; imported here so that the
    PyTorch path does not need it)."""
    from service.inference.engine import Engine
    from service.shared.package import PackageError

    try:
        engine = Engine(path, device=_engine_device(device))
    except PackageError as e:
        raise SystemExit(f"--package: {e}") from None
    meta = engine.package.meta
    step = (meta.get("training") or {}).get("step")

    def for_direction(direction: str) -> TranslateFn:
        src_lang, tgt_lang = direction.split("-")
        return lambda srcs, beam: [t.text for t in engine.translate(
            srcs, source_lang=src_lang, target_lang=tgt_lang, batch_size=batch_size, beam_size=beam,
            length_penalty=length_penalty)]

    return Subject({"package": str(path), "precision": meta["precision"], "step": step},
                   f"{path} ({meta['precision']}, step {step}, onnxruntime {engine.device_type})",
                   engine.directions, for_direction)


def _engine_device(device: str) -> str:
    """torch-style device names ("cuda:0") to the engine's ("cuda")."""
    return "cuda" if device.startswith("cuda") else device


def evaluate(fn: TranslateFn, srcs: list[str], refs: list[str], beams: Sequence[int]) -> dict:
    """Scores each beam size (1 = greedy) and times its decoding."""
    out = {}
    for beam in beams:
        t0 = time.time()
        hyps = fn(srcs, beam)
        out["greedy" if beam == 1 else f"beam{beam}"] = score(hyps, refs) | {"seconds": round(time.time() - t0, 1)}
    return out


def print_report(results: dict, label: str) -> None:
    print(f"{label}, {results['direction']}, {results['sentences']} sentences from {results['data']}")
    for name, r in results.items():
        if isinstance(r, dict) and "bleu" in r:
            print(f"{name:>8}: BLEU {r['bleu']:5.2f}  chrF {r['chrf']:5.2f}  ({r['seconds']}s)")
    r = results["greedy"]
    print(f"signatures: {r['bleu_signature']} | {r['chrf_signature']}")


# --- language models: perplexity ------------------------------------------------------------------

def _windows(ids: list[int], width: int) -> list[list[int]]:
    return [ids[i:i + width] for i in range(0, len(ids), width) if ids[i:i + width]]


@torch.no_grad()
def checkpoint_nll(model: Transformer, seqs: list[list[int]], batch_size: int) -> list[float]:
    """Summed negative log-likelihood of each sequence's pieces and its </s>, teacher-forced in PyTorch."""
    from .batching import Example, collate

    out = []
    for start in range(0, len(seqs), batch_size):
        b = collate([Example([], s) for s in seqs[start:start + batch_size]], decoder_only=True)
        logits = model(None, b.tgt_in, None, b.tgt_mask)                       # (B, T, V)
        nll = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), b.tgt_out, ignore_index=0,
                                                reduction="none")              # (B, T)
        out.extend(nll.sum(dim=1).tolist())
    return out


def package_nll(engine, seqs: list[list[int]], batch_size: int) -> list[float]:
    """The same through the serving engine's decoder graph, one position per call with its cache."""
    import numpy as np

    from service.inference.decoders import OrtLmDecoder

    out = []
    for start in range(0, len(seqs), batch_size):
        batch = [s + [engine.eos_id] for s in seqs[start:start + batch_size]]
        decoder = OrtLmDecoder(engine.graph, [[engine.bos_id]] * len(batch))
        alive = np.arange(len(batch))
        tokens = np.full(len(batch), engine.bos_id, dtype=np.int64)
        nll = np.zeros(len(batch))
        t = 0
        while len(alive):
            logp = decoder.step(tokens)                                          # (A, V)
            target = np.array([batch[r][t] for r in alive])
            nll[alive] -= logp[np.arange(len(alive)), target]
            keep = np.array([i for i, r in enumerate(alive) if t + 1 < len(batch[r])], dtype=np.int64)
            tokens = target[keep] if len(keep) else target[:0]
            alive = alive[keep]
            if len(keep):
                decoder.select(keep)
            t += 1
        out.extend(nll.tolist())
    return out


def perplexity(args) -> None:
    from .mono import read_texts

    rows = read_texts(args.data)
    if args.limit:
        rows = rows[: args.limit]
    if args.package:
        from service.inference.engine import Engine

        engine = Engine(args.package, device=_engine_device(args.device))
        trained = (engine.package.meta.get("training") or {}).get("max_positions") or engine.max_positions
        encode, width = (lambda texts: engine.sp.encode(texts, out_type=int)), trained - 1
        nll_fn = lambda seqs: package_nll(engine, seqs, args.batch_size)  # noqa: E731
        label = f"{args.package} ({engine.package.meta['precision']}, onnxruntime {engine.device_type})"
    else:
        model, tok, info = load_checkpoint(args.checkpoint, args.device)
        train_cfg = json.loads((Path(info["file"]).parent / "config.json").read_text()).get("train", {}) \
            if (Path(info["file"]).parent / "config.json").exists() else {}
        encode, width = tok.encode_batch, train_cfg.get("max_positions", model.config.max_len) - 1
        nll_fn = lambda seqs: checkpoint_nll(model, seqs, args.batch_size)  # noqa: E731
        label = f"{info['file']} (step {info.get('step')}, PyTorch)"
    t0 = time.time()
    langs, seqs = [], []
    for (lang, _), ids in zip(rows, encode([t for _, t in rows])):
        for w in _windows(ids, width):
            langs.append(lang)
            seqs.append(w)
    nll = nll_fn(seqs)
    results = {"model": label, "data": str(args.data), "paragraphs": len(rows), "windows": len(seqs)}
    for lang in ["all", *sorted(set(langs))]:
        idx = [i for i, g in enumerate(langs) if lang == "all" or g == lang]
        tokens = sum(len(seqs[i]) + 1 for i in idx)
        results[lang] = {"tokens": tokens, "perplexity": round(math.exp(sum(nll[i] for i in idx) / max(tokens, 1)), 2)}
    results["seconds"] = round(time.time() - t0, 1)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{label}, {results['paragraphs']} paragraphs ({results['windows']} windows) from {args.data}")
    for lang in ["all", *sorted(set(langs))]:
        r = results[lang]
        print(f"{lang:>4}: perplexity {r['perplexity']:8.2f} over {r['tokens']} pieces")


def _is_language_model(args) -> bool:
    if args.package:
        meta_file = Path(args.package) / "model.json"
        meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
        return meta.get("task") == "generation"
    run = Path(args.checkpoint)
    run = run if run.is_dir() else run.parent
    cfg = json.loads((run / "config.json").read_text()) if (run / "config.json").exists() else {}
    return cfg.get("arch") == "decoder" or cfg.get("model", {}).get("arch") == "decoder"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="sacreBLEU and chrF of a checkpoint or model package, "
                                            "greedy and beam search.")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--checkpoint", help="run directory from model.train, or a .pt file (decoded in PyTorch)")
    what.add_argument("--package", help="model package from model.export (decoded by the service's onnxruntime engine)")
    p.add_argument("--data", required=True, help="TSV: de<TAB>en[<TAB>origin] from model.data, or source<TAB>target; "
                   "for a language model lang<TAB>text[<TAB>origin] from model.data --monolingual")
    p.add_argument("--direction", default=None, help="e.g. de-en or en-de (default: the model's first direction)")
    p.add_argument("--beam", type=int, default=DEFAULTS.beam_size,
                   help="beam size for the beam-search pass (greedy always runs)")
    p.add_argument("--length-penalty", type=float, default=DEFAULTS.length_penalty)
    p.add_argument("--limit", type=int, default=0, help="evaluate only the first N pairs (0 = all)")
    p.add_argument("--batch-size", type=int, default=64, help="sentences decoded together")
    p.add_argument("--device", default="cpu", help="cpu or cuda (a package also accepts auto)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = p.parse_args(argv)
    if not Path(args.data).is_file():
        raise SystemExit(f"--data {args.data}: no such file (expected a TSV such as data/de-en/test.tsv "
                         f"written by model.data)")

    if _is_language_model(args):
        return perplexity(args)
    make = package_subject if args.package else checkpoint_subject
    subject = make(args.package or args.checkpoint, args.device, args.length_penalty, args.batch_size)
    direction = args.direction or subject.directions[0]
    if direction not in subject.directions:
        raise SystemExit(f"--direction {direction}: this model translates {', '.join(subject.directions)}")
    pairs = read_pairs(args.data, direction=direction)
    if args.limit:
        pairs = pairs[: args.limit]
    srcs, refs = [s for s, _ in pairs], [t for _, t in pairs]
    results = subject.info | {"direction": direction, "data": str(args.data), "sentences": len(pairs)}
    results |= evaluate(subject.translate(direction), srcs, refs, [1] if args.beam == 1 else [1, args.beam])
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_report(results, subject.label)


if __name__ == "__main__":
    main()
