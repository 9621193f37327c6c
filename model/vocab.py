"""A package's vocabulary extended by appended pieces, for a tag the committed model has no row for (back-translation's
``<bt>``, model/back_translate.py):

    python -m model.vocab models/de-en --add '<bt>' --out runs/bt-base

The SentencePiece model gets each piece appended after the last one, through sentencepiece's own protobuf module,
so every old piece keeps its id and text is cut exactly as before. The pieces are CONTROL symbols, not user-defined
ones: SentencePiece never matches a control symbol in text, so a client's "<bt>" stays ordinary pieces and the
service (which encodes client text with this same model) can never be steered by it, and decoding drops it, so no
translation can show it; the trainer places it by id. The embedding (tied to the output projection) gets one row
each, the mean of the ordinary pieces' rows: its logit is then the mean of theirs, below their largest, so greedy
search writes what it wrote before (tests/test_back_translation.py), and training moves it from a sensible start.

The package is re-exported by model/export.py's write_package (the graphs take their vocabulary size from the
weights) in fp32 by default: --init-from reads its weights back exactly, where an int8 copy would quantize the
committed int8 weights a second time. Its model.json keeps the committed package's `training` (step, tokens,
schedule), so a run from it goes on where the committed one stood.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Sequence

import torch
from sentencepiece import sentencepiece_model_pb2 as spm_pb

from service.shared.package import INT8_DEFAULT_WEIGHT_BITS, ModelPackage, weight_bits

from .export import summary, write_package
from .tokenizer import EOS_ID, Tokenizer
from .transformer import Transformer, TransformerConfig


def extend_tokenizer(model_file: Path, pieces: Sequence[str], out_file: Path) -> Tokenizer:
    """`model_file` with `pieces` appended as control symbols, written to `out_file`; a piece it has already is
    refused (ValueError)."""
    proto = spm_pb.ModelProto()
    proto.ParseFromString(Path(model_file).read_bytes())
    have = {p.piece for p in proto.pieces}
    if clash := [p for p in pieces if p in have]:
        raise ValueError(f"{model_file} has {', '.join(clash)} already")
    for piece in pieces:
        proto.pieces.add(piece=piece, score=0.0, type=spm_pb.ModelProto.SentencePiece.CONTROL)
    proto.trainer_spec.vocab_size = len(proto.pieces)
    Path(out_file).parent.mkdir(parents=True, exist_ok=True)
    Path(out_file).write_bytes(proto.SerializeToString())
    return Tokenizer(out_file)


def extend_model(model: Transformer, new_rows: int) -> Transformer:
    """A copy of `model` whose vocabulary is `new_rows` larger: every old weight as it was, each new embedding
    row the mean of the ordinary pieces' rows (ids after the four specials), each new output bias 0."""
    config = TransformerConfig(**(model.config.to_dict() | {"vocab_size": model.config.vocab_size + new_rows}))
    bigger = Transformer(config)
    state = model.state_dict()
    embed = state["embed.weight"]
    mean = embed[EOS_ID + 1:].mean(dim=0, keepdim=True)
    state["embed.weight"] = torch.cat([embed, mean.expand(new_rows, -1)])
    bias = state["final_logits_bias"]
    state["final_logits_bias"] = torch.cat([bias, bias.new_zeros(new_rows)])
    bigger.load_state_dict(state)
    return bigger.train(model.training)


def extend_package(package: Path, pieces: Sequence[str], out: Path, *, precision: str = "fp32",
                   calibration: Path | None = None) -> Path:
    """`package` re-exported into `out` with `pieces` appended to its vocabulary; returns the new model.json."""
    from .calibrate import read_calibration
    from .upgrade import load_weights

    package, out = Path(package), Path(out)
    if out.resolve() == package.resolve():
        raise ValueError("--out must differ from the package: its files are read while the new ones are written")
    model, meta = load_weights(package)
    if meta["tokenizer"].get("target", meta["tokenizer"]["source"]) != meta["tokenizer"]["source"]:
        raise ValueError(f"{package} has separate source and target tokenizers; this extends a joint one")
    spm_name = meta["tokenizer"]["source"]
    if (pieces_now := Tokenizer(package / spm_name).vocab_size) != model.config.vocab_size:
        # the new rows go at the end: a model padded past its tokenizer would put them at other ids than the pieces
        raise ValueError(f"{package}: {model.config.vocab_size} embedding rows for {pieces_now} pieces; this "
                         "extends a model with one row a piece")
    bigger = extend_model(model, len(pieces)).eval()
    quantize = "int8" if precision == "int8" else None
    texts = read_calibration(calibration, meta) if quantize and calibration else None
    with tempfile.TemporaryDirectory() as tmp:          # write_package lists every file of `out` in model.json
        tok = extend_tokenizer(package / spm_name, pieces, Path(tmp) / spm_name)
        return write_package(
            bigger, out, files={spm_name: tok.model_file}, tokenizer=meta["tokenizer"],
            special_ids=meta["special_ids"], languages=meta["languages"], directions=meta["directions"],
            target_tags=meta.get("target_tags", {}), training=meta.get("training", {}), quantize=quantize,
            calibration=texts, name=meta.get("name"),
            weight_bits=weight_bits(ModelPackage(package, meta)) if quantize else INT8_DEFAULT_WEIGHT_BITS,
            extra={"vocabulary_extended": {"from": str(package), "pieces": list(pieces),
                                           "ids": [tok.sp.piece_to_id(p) for p in pieces], "rows": "mean"}})


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m model.vocab",
                                description="Append pieces to a model package's vocabulary (a new embedding row "
                                "each, the mean of the others'), for --init-from.")
    p.add_argument("package", type=Path, help="the package, e.g. models/de-en")
    p.add_argument("--add", action="append", required=True, metavar="PIECE", help="a piece to append, e.g. '<bt>'")
    p.add_argument("--out", type=Path, required=True, help="the new package's directory (e.g. runs/bt-base)")
    p.add_argument("--precision", choices=("fp32", "int8"), default="fp32",
                   help="fp32 (default): the weights exactly as read back, for --init-from; int8 (int8-static, "
                   "needs --calibration) to serve it")
    p.add_argument("--calibration", type=Path, help="int8: text that sets the activation scales (a TSV)")
    args = p.parse_args(argv)
    if args.precision == "int8" and not args.calibration:
        p.error("--precision int8 needs --calibration FILE (e.g. data/de-en/dev.tsv)")
    print(summary(extend_package(args.package, args.add, args.out, precision=args.precision,
                                 calibration=args.calibration)))


if __name__ == "__main__":
    main()
