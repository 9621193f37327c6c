"""Re-export a model package in the current graph layout, from the weights in its own ONNX files.

    python -m model.upgrade models/de-en --out /tmp/de-en-new [--calibration data/de-en/dev.tsv]

For a package whose checkpoint is gone. Packages in the older layout have a stacked
(L, 2, N, h, T, d_k) cache, one cross-attention source per row (`cross_rows`) and no `top_k` input;
the service refuses them rather than keep a slower search path for them (model/export.py says what
each change saves). This reads the weights back out of encoder.onnx and decoder.onnx, loads them
into our Transformer and exports the package again with the same precision, tokenizer files,
metadata and model card. Packages imported by model.import_marian are re-imported from their Marian
directory instead.

How a weight is found: every named parameter the exporter kept by name (embeddings, layer norms, biases) is
read directly. A linear layer's weight is an anonymous initializer (`val_58`, transposed, or
`val_58_quantized` with its scale, and a zero point in older int8 packages); it is the constant input of a
MatMul whose result has that layer's named bias added: in int8-static graphs the bias is the
MatMulIntegerToFloat's own (its seventh input); in int8-rows graphs it is added after the rescaling Mul, in
older int8 packages after MatMulInteger, Cast and Muls. int8 weights are dequantized, (q - zero_point) ·
scale, and quantized again on export one scale per output column (model/quantize.py). A package quantized
that way gets the same int8 values back, since a column's largest magnitude, hence its scale, is unchanged.

int8 with --calibration becomes int8-static (its activation scales come from running the re-exported
fp32 graphs over that text); without, int8-rows stays int8-rows and int8-static refuses (it needs the text
again). An older int8 package, quantized per tensor with per-tensor activations (onnxruntime's
quantize_dynamic, whose answers depended on the batch), becomes int8-rows without --calibration; it gets
new int8 values, so its outputs change a little; so does one whose output projection the old exporter left
in fp32.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from service.shared.package import INT8_DEFAULT_WEIGHT_BITS, INT8_STATIC, ModelPackage, weight_bits

from .calibrate import Calibration, read_calibration
from .export import summary, write_package
from .transformer import Transformer, TransformerConfig


def graph_weights(path: Path) -> dict[str, np.ndarray]:
    """The named parameters in one ONNX graph, in PyTorch's names and layout (Linear: (out, in))."""
    graph = onnx.load(str(path)).graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    consumers = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)

    def only_consumer(node):
        nxt = consumers[node.output[0]]
        return nxt[0] if len(nxt) == 1 else None

    def bias_after(node) -> str | None:
        """The name of the bias initializer added to this MatMul's output: an int8-static
        MatMulIntegerToFloat's own bias input, or an Add right after it, or after the rescaling Muls of an
        int8-rows MatMulIntegerToFloat (the row scale: model/quantize.py) or of an older package's
        MatMulInteger and Cast (one Mul per tensor, two per row). None for anything else (the weight is
        not a layer's own)."""
        if node.op_type == "MatMulIntegerToFloat" and len(node.input) > 6 and node.input[6]:
            own = node.input[6]
            return own if own.endswith(".bias") and own in inits else None
        if node.op_type == "MatMulInteger":
            node = only_consumer(node)
            if node is None or node.op_type != "Cast":
                return None
        if node.op_type in ("Cast", "MatMulIntegerToFloat"):
            while (nxt := only_consumer(node)) is not None and nxt.op_type == "Mul":
                node = nxt
        add = only_consumer(node)
        if add is None or add.op_type != "Add":
            return None
        named = [i for i in add.input if i.endswith(".bias") and i in inits]
        return named[0] if named else None

    # Named parameters; an fp16 package's are read as fp32 (the export casts them back).
    weights = {name.removeprefix("model."): array.astype(np.float32) for name, array in inits.items()
               if name.startswith("model.") and np.issubdtype(array.dtype, np.floating)}
    if "project.bias" in inits:       # the output projection's own bias (packages in the current layout)
        weights["final_logits_bias"] = inits["project.bias"].astype(np.float32)
    for node in graph.node:
        if node.op_type not in ("MatMul", "MatMulInteger", "MatMulIntegerToFloat") or node.input[1] not in inits:
            continue
        bias = bias_after(node)
        if bias is None or not bias.startswith(("model.", "self_qkv.")):
            continue                  # the output projection: the tied embedding, read by its name
        w = inits[node.input[1]].astype(np.float32)                     # (in, out)
        if node.op_type in ("MatMulInteger", "MatMulIntegerToFloat"):
            base = node.input[1].removesuffix("_quantized")
            b_zero = 3 if node.op_type == "MatMulInteger" else 5          # MatMulIntegerToFloat: A, B, scales, zps
            zero_point = (inits[node.input[b_zero]].astype(np.float32)
                          if len(node.input) > b_zero and node.input[b_zero] else np.float32(0))
            w = (w - zero_point) * inits[f"{base}_scale"]               # per tensor, or per column (out,)
        weights |= linear_weights(bias, w.T, inits)
    return weights


def linear_weights(bias: str, w: np.ndarray, inits: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A linear layer's weight w (out, in) under its PyTorch name, found by its bias's; a decoder layer's
    packed query, key and value projections (model.export's `self_qkv.{i}`) as the three, biases included."""
    if not bias.startswith("self_qkv."):
        return {bias.removeprefix("model.").removesuffix(".bias") + ".weight": w.copy()}
    layer, out = bias.split(".")[1], {}
    for part, w_part, b_part in zip("qkv", np.split(w, 3), np.split(inits[bias].astype(np.float32), 3)):
        out[f"decoder.{layer}.self_attn.w_{part}.weight"] = w_part.copy()
        out[f"decoder.{layer}.self_attn.w_{part}.bias"] = b_part
    return out


def load_weights(package: Path) -> tuple[Transformer, dict]:
    """Our Transformer with the package's weights, and its model.json."""
    meta = json.loads((package / "model.json").read_text(encoding="utf-8"))
    if meta.get("tokenizer", {}).get("vocab"):
        raise ValueError(f"{package} was imported by model.import_marian (Marian's id space): import its Marian "
                         "directory again instead (python -m model.import_marian DIR --out NEW_DIR)")
    config = {k: v for k, v in meta["config"].items() if k != "d_k"}
    model = Transformer(TransformerConfig(**config))
    weights = {}
    for graph in ("encoder.onnx", "decoder.onnx"):
        if (package / graph).exists():
            weights |= graph_weights(package / graph)
    state = model.state_dict()
    missing = sorted(set(state) - set(weights))
    if missing:
        raise ValueError(f"{package}: no weight found for {', '.join(missing[:5])}"
                         f"{' and more' if len(missing) > 5 else ''} (was it exported by model.export?)")
    for name, tensor in state.items():
        if tuple(weights[name].shape) != tuple(tensor.shape):
            raise ValueError(f"{package}: {name} has shape {weights[name].shape}, "
                             f"the config needs {tuple(tensor.shape)}")
    model.load_state_dict({name: torch.tensor(weights[name]) for name in state})
    return model.eval(), meta


def upgrade_package(package: str | Path, out: str | Path, *, precision: str | None = None,
                    calibration: str | Path | Calibration | None = None) -> Path:
    """Re-exports `package` into `out` (a new directory), in its own precision unless `precision` ("fp32",
    "int8" or "fp16") names another; returns the new model.json path. `calibration` (a TSV path, or
    model.calibrate's list) sets int8-static's activation scales (see the module docstring)."""
    package, out = Path(package), Path(out)
    if out.resolve() == package.resolve():
        raise ValueError("--out must differ from the package: the old graphs are read while the new ones are written")
    model, meta = load_weights(package)
    keep = {f.name: f for f in package.iterdir()
            if f.is_file() and f.suffix != ".onnx" and f.name not in ("model.json", "MODEL_CARD.md")}
    precision = precision or meta.get("precision", "fp32")
    if precision not in ("fp32", "int8", "fp16"):
        raise ValueError(f"precision must be fp32, int8 or fp16, got {precision!r}")
    quantize = int8_form(package, meta, calibration) if precision == "int8" else None
    if calibration is not None and quantize != "int8":
        raise ValueError("--calibration sets int8-static's activation scales: this package is re-exported "
                         f"as {precision}, which has none")
    if isinstance(calibration, (str, Path)):
        calibration = read_calibration(calibration, meta)
    return write_package(
        model, out, files=keep, tokenizer=meta["tokenizer"], special_ids=meta["special_ids"],
        languages=meta["languages"], directions=meta["directions"], target_tags=meta.get("target_tags", {}),
        training=meta.get("training", {}), model_card=package / "MODEL_CARD.md",
        quantize=quantize, calibration=calibration, fp16=precision == "fp16", name=meta.get("name"),
        weight_bits=weight_bits(ModelPackage(package, meta)) if quantize else INT8_DEFAULT_WEIGHT_BITS,  # 7 stays 7
        # Keys write_package does not write itself (an importer's note) are kept; how int8 was made is its own.
        extra={k: v for k, v in meta.items() if k not in ("quantization", "calibration", "weight_bits")})


def int8_form(package: Path, meta: dict, calibration) -> str:
    """write_package's `quantize` for an int8 re-export: int8-static with calibration text; without,
    the package's own form (int8-static needs calibration text again) or, for older packages, int8-rows."""
    if calibration is not None:
        return "int8"
    if meta.get("precision") == "int8" and meta.get("quantization") == INT8_STATIC:
        raise ValueError(f"{package} is int8-static: its activation scales are set again from calibration text, "
                         "so pass --calibration FILE (a TSV as model.evaluate reads, e.g. data/de-en/dev.tsv)")
    return "int8-rows"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        description="Re-export a model package in the current graph layout from its own weights.")
    p.add_argument("package", help="model package directory, e.g. models/de-en")
    p.add_argument("--out", required=True, help="directory to write the new package to")
    p.add_argument("--precision", choices=["fp32", "int8", "fp16"], default=None,
                   help="re-export in this precision (default: the package's own; int8 weights read back "
                        "as fp32 keep their int8 values, so an fp32 copy of an int8 package shows what int8 "
                        "activations cost)")
    p.add_argument("--calibration", default=None,
                   help="text that sets int8-static's activation scales, a TSV as model.evaluate reads (e.g. "
                        "data/de-en/dev.tsv): an int8 package re-exported with it is int8-static (an int8-static "
                        "one needs it), without it int8-rows")
    args = p.parse_args(argv)
    print(summary(upgrade_package(args.package, args.out, precision=args.precision, calibration=args.calibration)))


if __name__ == "__main__":
    main()
