"""int8 packages for the CPU whose answers never depend on the batch: int8 weights (one scale per output
column), int8 activations with scales that are each row's own or constants. Two forms, model.json's
"quantization":

int8-static (`--quantize int8`, the default): each quantized input x gets one scale and zero point,
constants set from its range over calibration text (model/calibrate.py), so each MatMul by a constant
(K, N) weight W becomes two operators:

    q = QuantizeLinear(x, s, z)                                  round(x / s) + z, uint8, saturating
    y = MatMulIntegerToFloat(q, W_q, s, w_scale, z, bias)        W_q = round(W / w_scale) int8 (K, N)

int8-rows (`--quantize int8-rows`): each row's scale is computed at run time from its own values:

    s = max(max|x| / 127, tiny) of each row (..., 1)      Abs, ReduceMax, Mul, Max
    q = QuantizeLinear(x, s, 128; block_size=K)           one block per row: round(x / s) + 128, uint8
    y = MatMulIntegerToFloat(q, W_q, 1, w_scale, 128) * s + bias

onnxruntime's own `quantize_dynamic` computes one scale per tensor at run time, so a sentence's numbers
depend on its batch-mates' largest values (padding rows included): models/de-en translated 11 of 96
test sentences differently alone and in batches of 32. A constant scale, or a scale per row with an
exact integer product, makes a row's result depend on that row alone (benchmarks/results/int8-per-row.md).
Rows sharing an input (the self-attention's query, key and value projections) share its quantization.

Why two: at one sentence a decoder step is a few hundred small operators, each a dispatch and a pass over
memory. The static form is 176 operators a step of the small model's decoder against 313 for per-row scales
(onnxruntime's optimisations applied, SkipLayerNormFusion off as the engine runs it), and measured 1.11-1.17x
as fast on one thread (benchmarks/results/int8-graph.md, run 3); per-row scales need no calibration text and
stay a little closer to fp32 (int8-graph.md run 3: 52 of 64 beam-4 outputs equal to fp32's against 50; BLEU on
the default's Ding test split, beam 4, de->en 5.82 against 5.81 static, its model card). A value outside its
calibrated range saturates. In the per-row form QuantizeLinear's blocked form (opset 21) divides, rounds,
shifts and casts in one pass; MatMulIntegerToFloat takes the weight's per-column scale inside its kernel (its
activation scale must be one number, so the row scale follows as a Mul); inputs whose rows have the same shape
share one tensor of zero points. Signed activations (int8 without a zero point) would need no zero points at
all, but onnxruntime 1.31 multiplies int8 by int8 4-38x slower than uint8 by int8 on x86.

Weights take 8 bits (|W_q| <= 127) or, with `--int8-weight-bits 7`, 7 (|W_q| <= 63). On x86 CPUs without VNNI
onnxruntime multiplies uint8 by int8 with VPMADDUBSW, whose pairs of products are summed in 16 bits and
saturate (2 x 255 x 127 = 64,770 > 32,767), so the engine widens such products first
(`session.x64quantprecision`, service/inference/device.py); without it int8 ran 13-23% faster on an AVX2-only
EPYC (benchmarks/results/vs-ctranslate2-cpu.md, runs 25-26). With 7-bit weights a pair stays below it (2 x 255
x 63 = 32,130): the fast instruction is exact and the engine skips the widening for a package whose model.json
says "weight_bits": 7. One bit less per weight moves BLEU either way by up to a few tenths (docs/training.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from service.shared.package import INT8_DEFAULT_WEIGHT_BITS, INT8_ROWS, INT8_STATIC, INT8_WEIGHT_BITS

# --quantize values -> model.json "quantization"
SCHEMES = {"int8": INT8_STATIC, "int8-rows": INT8_ROWS}
OPSET = 21                  # QuantizeLinear's block_size; the ops our graphs use mean the same since 18
_ZERO = 128                 # uint8 zero point of the symmetric activations: q - 128 is in [-127, 127]


def add_weight_bits_flag(p: argparse.ArgumentParser) -> None:
    """--int8-weight-bits, as model.export and model.import_marian take it."""
    p.add_argument("--int8-weight-bits", type=int, choices=INT8_WEIGHT_BITS, default=INT8_DEFAULT_WEIGHT_BITS,
                   help="bits of each int8 weight: 7 lets x86 CPUs without VNNI (AVX2 only) use their fast uint8 x "
                        "int8 instruction exactly (13-23%% faster on an AVX2-only EPYC; model/quantize.py), for up "
                        "to a few tenths of BLEU either way (default %(default)s)")


def quantize_weight(w: np.ndarray, bits: int = INT8_DEFAULT_WEIGHT_BITS) -> tuple[np.ndarray, np.ndarray]:
    """(K, N) float -> (int8 (K, N), scale (N,)): symmetric, one scale per output column, in [-127, 127] for 8
    bits, [-63, 63] for 7."""
    if bits not in INT8_WEIGHT_BITS:
        raise ValueError(f"int8 weight bits must be one of {INT8_WEIGHT_BITS}, got {bits!r}")
    levels = 2 ** (bits - 1) - 1
    largest = np.abs(w).max(axis=0)
    scale = np.where(largest > 0, largest / levels, 1.0).astype(np.float32)
    return np.clip(np.round(w / scale), -levels, levels).astype(np.int8), scale


def row_scale(x: str) -> list[onnx.NodeProto]:
    """Nodes computing f"{x}/rows_int8/scale" = max(max|x| / 127, tiny) of each row of x (..., K): (..., 1)."""
    p = f"{x}/rows_int8"
    return [helper.make_node("Abs", [x], [f"{p}/abs"]),
            helper.make_node("ReduceMax", [f"{p}/abs", "int8/last_axis"], [f"{p}/largest"], keepdims=1),
            helper.make_node("Mul", [f"{p}/largest", "int8/one_127th"], [f"{p}/scale0"]),
            helper.make_node("Max", [f"{p}/scale0", "int8/tiny"], [f"{p}/scale"])]   # an all-zero row


def _row_quantizer(x: str, k: int, zero_points: str | None) -> tuple[list[onnx.NodeProto], str, str, str]:
    """Nodes that quantize x (..., K) per row: (nodes, uint8 tensor name, per-row scale name (..., 1),
    zero points name). `zero_points`: a tensor of 128s shaped like this input's scale, made by an earlier
    input of the same row shape; None makes one (QuantizeLinear's blocked form wants the scale's shape)."""
    p = f"{x}/rows_int8"
    nodes = row_scale(x)
    if zero_points is None:
        zero_points = f"{p}/zero_points"
        nodes += [helper.make_node("Shape", [f"{p}/scale"], [f"{p}/scale_shape"]),
                  helper.make_node("Expand", ["int8/zero_point", f"{p}/scale_shape"], [zero_points])]
    nodes.append(helper.make_node("QuantizeLinear", [x, f"{p}/scale", zero_points], [f"{p}/q"], axis=-1, block_size=k))
    return nodes, f"{p}/q", f"{p}/scale", zero_points


def _row_shapes(model: onnx.ModelProto) -> dict[str, tuple]:
    """Each tensor's dims but the last, where shape inference names them all (symbols or numbers): inputs
    with equal such dims have equal row shapes at run time, so they can share one zero-point tensor."""
    inferred = onnx.shape_inference.infer_shapes(model).graph
    out = {}
    for v in [*inferred.value_info, *inferred.input]:
        dims = [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        if dims and all(dims[:-1]):
            out[v.name] = tuple(dims[:-1])
    return out


def _constants() -> list[onnx.TensorProto]:
    return [numpy_helper.from_array(np.array([-1], np.int64), "int8/last_axis"),
            numpy_helper.from_array(np.array(1 / 127, np.float32), "int8/one_127th"),
            numpy_helper.from_array(np.array(1e-30, np.float32), "int8/tiny"),
            numpy_helper.from_array(np.array(1, np.float32), "int8/one"),
            numpy_helper.from_array(np.array(_ZERO, np.uint8), "int8/zero_point")]


def use_opset(model: onnx.ModelProto) -> None:
    """The default domain at OPSET (18 -> 21 adds types, not meanings, for the ops our exports use) and
    onnxruntime's com.microsoft domain for MatMulIntegerToFloat."""
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = max(entry.version, OPSET)
    if not any(entry.domain == "com.microsoft" for entry in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    model.ir_version = max(model.ir_version, 10)          # the IR that carries opset 21


def replace_nodes(model: onnx.ModelProto, path: Path, nodes: list[onnx.NodeProto],
                  new_inits: list[onnx.TensorProto]) -> None:
    """The graph's nodes replaced by `nodes`, initializers no node reads dropped, checked, saved to path."""
    graph = model.graph
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for n in graph.node for name in n.input}
    kept = [i for i in [*graph.initializer, *new_inits] if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    use_opset(model)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))


def _rows_quantizer(model: onnx.ModelProto):
    """quantize(x, K) -> (nodes, uint8 name, scale name) for this graph; inputs with equal row shapes share
    their zero points."""
    row_shape, zero_points = _row_shapes(model), {}    # input name -> its rows' dims; those dims -> zero points

    def quantize(x: str, k: int) -> tuple[list[onnx.NodeProto], str, str]:
        shape = row_shape.get(x)
        chain, q, scale, zps = _row_quantizer(x, k, zero_points.get(shape))
        if shape is not None:
            zero_points.setdefault(shape, zps)
        return chain, q, scale
    return quantize


def _scaled_product(q: str, scale: str, weight: str, y: str) -> list[onnx.NodeProto]:
    """y = (q - 128) . W_q * w_scale (one kernel), times the row scale."""
    return [helper.make_node("MatMulIntegerToFloat", [q, f"{weight}_quantized", "int8/one", f"{weight}_scale",
                                                      "int8/zero_point"], [f"{y}/columns"], domain="com.microsoft"),
            helper.make_node("Mul", [f"{y}/columns", scale], [y])]


def quantizable_weight(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> onnx.TensorProto | None:
    """The constant 2D fp32 weight of a MatMul that int8 rewrites (model.calibrate watches its input), else None."""
    weight = inits.get(node.input[1]) if node.op_type == "MatMul" else None
    if weight is None or len(weight.dims) != 2 or weight.data_type != TensorProto.FLOAT:
        return None
    return weight


def rewrite_matmuls(path: Path, *, quantizer, product, constants: list[onnx.TensorProto],
                    fold_bias: bool = False, weight_bits: int = INT8_DEFAULT_WEIGHT_BITS) -> int:
    """Rewrites an fp32 graph file in place: each MatMul by a constant 2D fp32 weight gets its input quantized
    once (`quantizer(model)(x, K)` -> nodes, uint8 name, scale name), its weight quantized per column
    (`<weight>_quantized`, `<weight>_scale`) and `product(q, scale, weight, y)`'s nodes. Returns the MatMuls
    rewritten. fold_bias: each product's bias Add joins the product (fold_biases). weight_bits: quantize_weight's.
    quantize_int8 is this with either current form; benchmarks/int8_graph.py passes the previous one."""
    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    quantize = quantizer(model)
    nodes: list[onnx.NodeProto] = []
    quantized: dict[str, tuple[str, str]] = {}      # input name -> (uint8 name, scale name)
    new_inits, weights, done = list(constants), set(), 0
    for node in model.graph.node:
        weight = quantizable_weight(node, inits)
        if weight is None:
            nodes.append(node)
            continue
        x, y = node.input[0], node.output[0]
        if x not in quantized:
            chain, q, scale = quantize(x, weight.dims[0])
            nodes += chain
            quantized[x] = (q, scale)
        if weight.name not in weights:
            w_q, w_scale = quantize_weight(numpy_helper.to_array(weight), weight_bits)
            new_inits += [numpy_helper.from_array(w_q, f"{weight.name}_quantized"),
                          numpy_helper.from_array(w_scale, f"{weight.name}_scale")]
            weights.add(weight.name)
        nodes += product(*quantized[x], weight.name, y)
        done += 1
    if fold_bias:
        nodes = fold_biases(nodes, inits, {o.name for o in model.graph.output})
    replace_nodes(model, path, nodes, new_inits)
    return done


def static_constants(ranges: dict[str, tuple[float, float]]) -> list[onnx.TensorProto]:
    """Each input's scale and uint8 zero point from its (min, max): the range widened to hold 0 (padding,
    ReLU's zeros and the zero point map exactly), 255 steps over it."""
    out = []
    for x, (lo, hi) in ranges.items():
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        scale = max((hi - lo) / 255, 1e-12)
        zero = int(np.clip(round(-lo / scale), 0, 255))
        out += [numpy_helper.from_array(np.array(scale, np.float32), f"{x}/static_int8/scale"),
                numpy_helper.from_array(np.array(zero, np.uint8), f"{x}/static_int8/zero_point")]
    return out


def _static_quantizer(model: onnx.ModelProto):
    def quantize(x: str, k: int) -> tuple[list[onnx.NodeProto], str, str]:
        p = f"{x}/static_int8"
        return ([helper.make_node("QuantizeLinear", [x, f"{p}/scale", f"{p}/zero_point"], [f"{p}/q"])],
                f"{p}/q", f"{p}/scale")
    return quantize


def _static_product(q: str, scale: str, weight: str, y: str) -> list[onnx.NodeProto]:
    """y = (q - z) . W_q * s * w_scale in one kernel (the bias joins it: fold_biases)."""
    zero_point = scale.removesuffix("scale") + "zero_point"
    return [helper.make_node("MatMulIntegerToFloat", [q, f"{weight}_quantized", scale, f"{weight}_scale",
                                                      zero_point], [y], domain="com.microsoft")]


def fold_biases(nodes: list[onnx.NodeProto], inits: dict[str, onnx.TensorProto],
                outputs: set[str]) -> list[onnx.NodeProto]:
    """`nodes` with each `Add(MatMulIntegerToFloat(...), bias)` (a 1D constant bias, the product read by that
    Add alone) made the MatMulIntegerToFloat's own bias input, its seventh. Only for the static form: per-row
    scales come after the kernel, and the bias after them."""
    products = {n.output[0]: n for n in nodes if n.op_type == "MatMulIntegerToFloat"}
    readers: dict[str, int] = {}
    for n in nodes:
        for name in n.input:
            readers[name] = readers.get(name, 0) + 1
    kept = []
    for n in nodes:
        if n.op_type == "Add":
            y, bias = n.input if n.input[0] in products else list(reversed(n.input))
            if y in products and bias in inits and len(inits[bias].dims) == 1 and readers[y] == 1 and y not in outputs:
                product = products[y]
                product.input.extend([""] * (7 - len(product.input)))
                product.input[6], product.output[0] = bias, n.output[0]
                continue
        kept.append(n)
    return kept


def quantize_int8(path: Path, ranges: dict[str, tuple[float, float]] | None = None, *,
                  weight_bits: int = INT8_DEFAULT_WEIGHT_BITS) -> int:
    """Rewrites an fp32 graph file in place (see the module docstring): int8-static with `ranges` (each
    quantized input's (min, max) from model.calibrate), int8-rows without; weights in `weight_bits` (8 or 7).
    Returns the MatMuls quantized."""
    if ranges is None:
        return rewrite_matmuls(path, quantizer=_rows_quantizer, product=_scaled_product, constants=_constants(),
                               weight_bits=weight_bits)
    return rewrite_matmuls(path, quantizer=_static_quantizer, product=_static_product,
                           constants=static_constants(ranges), fold_bias=True, weight_bits=weight_bits)
