"""Each attention operator of our decoder alone, on the CPU and on CUDA, against a numpy reference.

    python benchmarks/cuda_ops.py [--decoder /tmp/de-en-fp16/decoder.onnx]    # on a GPU; on a CPU, the CPU rows

benchmarks/cuda_agreement.py found whole searches on CUDA parting from the CPU's while the encoder agrees
(benchmarks/results/gpu-h200.md). The decoder step has two operators of onnxruntime's own (model/fused.py):
GroupQueryAttention over the self-attention cache and MultiHeadAttention over the source. This builds each as a
one-node graph with the decoder's shapes (d_model 256, 4 heads), feeds both providers the same random inputs and
prints the largest difference from the reference, row by row where rows differ, for the cases the engine makes:
cross-attention with G queries a source (1 greedy or beam alone, 4 beams folded), padded sources, its key mask as
ours (2-D int32) and as the other forms the operator takes (none, key lengths, an additive bias); the cache's
step at position 0 (a first token), at mixed positions and all at one, with past and present as separate
buffers and as one buffer (IO binding, as the engine binds them). A row whose CUDA figure is far above its CPU
figure names the kernel to fix.

With --decoder, a whole translation decoder step after step too (decoder_steps). On an H200 on 2026-12-04 every
operator agreed alone while the decoder as then exported did not, from its first step; fed `total` from the host
it agreed (benchmarks/results/gpu-h200.md): model/export.py has made `total` an input since.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

D_MODEL, H = 256, 4
D_K = D_MODEL // H
DTYPES = {"fp32": (np.float32, TensorProto.FLOAT), "fp16": (np.float16, TensorProto.FLOAT16)}


def graph(node: onnx.NodeProto, inputs: list[tuple[str, int, list]], outputs: list[str], onnx_t: int) -> bytes:
    g = helper.make_graph([node], "op", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, onnx_t, None) for n in outputs])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 9
    return model.SerializeToString()


def softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


# ----- MultiHeadAttention: the cross-attention -----

def cross_reference(q, k, v, lengths):                     # q (A, G, D); k, v (A, h, S, d_k); lengths (A,)
    A, G, _ = q.shape
    S = k.shape[2]
    qh = q.astype(np.float64).reshape(A, G, H, D_K).transpose(0, 2, 1, 3)                  # (A, h, G, d_k)
    scores = qh @ k.astype(np.float64).transpose(0, 1, 3, 2) / math.sqrt(D_K)            # (A, h, G, S)
    padded = np.arange(S)[None, None, None, :] >= lengths[:, None, None, None]                # (A, 1, 1, S)
    scores = np.where(padded, -np.inf, scores)
    return (softmax(scores) @ v.astype(np.float64)).transpose(0, 2, 1, 3).reshape(A, G, D_MODEL)


def cross_case(A: int, G: int, S: int, lengths: np.ndarray, mask_form: str, dtype: str, rng):
    np_t, onnx_t = DTYPES[dtype]
    q = rng.standard_normal((A, G, D_MODEL)).astype(np_t)
    k = rng.standard_normal((A, H, S, D_K)).astype(np_t)
    v = rng.standard_normal((A, H, S, D_K)).astype(np_t)
    feeds = {"q": q, "k": k, "v": v}
    inputs = [("q", onnx_t, [A, G, D_MODEL]), ("k", onnx_t, [A, H, S, D_K]), ("v", onnx_t, [A, H, S, D_K])]
    names = ["q", "k", "v", "", "", ""]
    if mask_form == "2-D int32 (ours)":
        feeds["mask"] = (np.arange(S)[None, :] < lengths[:, None]).astype(np.int32)
        inputs.append(("mask", TensorProto.INT32, [A, S]))
        names[4] = "mask"
    elif mask_form == "key lengths":
        feeds["mask"] = lengths.astype(np.int32)
        inputs.append(("mask", TensorProto.INT32, [A]))
        names[4] = "mask"
    elif mask_form == "additive bias":
        bias = np.where(np.arange(S)[None, :] < lengths[:, None], 0, -10000).astype(np_t)
        feeds["bias"] = np.ascontiguousarray(np.broadcast_to(bias[:, None, None, :], (A, 1, G, S)))
        inputs.append(("bias", onnx_t, [A, 1, G, S]))
        names[5] = "bias"
    node = helper.make_node("MultiHeadAttention", names, ["out"], domain="com.microsoft", num_heads=H)
    while names and names[-1] == "":
        names.pop()
    node.ClearField("input")
    node.input.extend(names)
    return graph(node, inputs, ["out"], onnx_t), feeds, cross_reference(q, k, v, lengths)


# ----- GroupQueryAttention: the self-attention cache's step -----

def cached_reference(qkv, past_k, past_v, seqlens):      # qkv (N, 1, 3D); past (N, h, W, d_k); seqlens (N,)
    N = qkv.shape[0]
    q, k, v = np.split(qkv.astype(np.float64), 3, axis=-1)
    present_k, present_v = past_k.astype(np.float64), past_v.astype(np.float64)
    out = np.zeros((N, 1, D_MODEL))
    for r, col in enumerate(seqlens):
        present_k[r, :, col] = k[r, 0].reshape(H, D_K)
        present_v[r, :, col] = v[r, 0].reshape(H, D_K)
        qh = q[r, 0].reshape(H, 1, D_K)
        scores = qh @ present_k[r, :, :col + 1].transpose(0, 2, 1) / math.sqrt(D_K)          # (h, 1, col+1)
        out[r, 0] = (softmax(scores) @ present_v[r, :, :col + 1]).reshape(D_MODEL)
    return out


def cached_case(seqlens: np.ndarray, W: int, dtype: str, rng):
    np_t, onnx_t = DTYPES[dtype]
    N = len(seqlens)
    qkv = rng.standard_normal((N, 1, 3 * D_MODEL)).astype(np_t)
    past_k = rng.standard_normal((N, H, W, D_K)).astype(np_t)
    past_v = rng.standard_normal((N, H, W, D_K)).astype(np_t)
    feeds = {"qkv": qkv, "past_k": past_k, "past_v": past_v, "seqlens": seqlens.astype(np.int32),
             "total": np.array([seqlens.max() + 1], dtype=np.int32)}
    inputs = [("qkv", onnx_t, [N, 1, 3 * D_MODEL]), ("past_k", onnx_t, [N, H, W, D_K]),
              ("past_v", onnx_t, [N, H, W, D_K]), ("seqlens", TensorProto.INT32, [N]),
              ("total", TensorProto.INT32, [1])]
    node = helper.make_node("GroupQueryAttention", ["qkv", "", "", "past_k", "past_v", "seqlens", "total"],
                            ["out", "present_k", "present_v"], domain="com.microsoft", num_heads=H, kv_num_heads=H)
    reference = cached_reference(qkv, past_k, past_v, seqlens)
    return graph(node, inputs, ["out", "present_k", "present_v"], onnx_t), feeds, reference


def run(model: bytes, feeds: dict, provider: str, shared_cache: bool = False) -> np.ndarray:
    session = ort.InferenceSession(model, providers=[provider])
    if not shared_cache:
        return session.run(["out"], feeds)[0]
    # As the engine binds the cache: past and present at one address, on the provider's device.
    device = "cuda" if provider == "CUDAExecutionProvider" else "cpu"
    binding = session.io_binding()
    values = {name: ort.OrtValue.ortvalue_from_numpy(array, device, 0) for name, array in feeds.items()}
    for name, value in values.items():
        binding.bind_ortvalue_input(name, value)
    binding.bind_output("out", device)                  # first: copy_outputs_to_cpu keeps the binding's order
    binding.bind_ortvalue_output("present_k", values["past_k"])
    binding.bind_ortvalue_output("present_v", values["past_v"])
    session.run_with_iobinding(binding)
    return binding.copy_outputs_to_cpu()[0]


def report(label: str, model: bytes, feeds: dict, reference: np.ndarray, providers: list[str], shared=False) -> None:
    cells = []
    for provider in providers:
        try:
            got = run(model, feeds, provider, shared).astype(np.float64)
        except Exception as e:                          # noqa: BLE001 - a kernel refusing the case is a finding
            cells.append(f"{provider[:4]}: refused ({str(e).splitlines()[0][:120]})")
            continue
        rows = np.abs(got - reference).reshape(len(got), -1).max(axis=1)
        worst = ", rows " + " ".join(f"{x:.1e}" for x in rows) if rows.max() > 0.05 else ""
        cells.append(f"{provider[:4]}: {rows.max():.2e}{worst}")
    print(f"{label:64} " + " | ".join(cells), flush=True)


# ----- A whole decoder graph, step after step, fed alike on both providers -----

def with_total_input(decoder: onnx.ModelProto) -> bytes:
    """The decoder with each GroupQueryAttention's total_sequence_length read from a graph input `total`
    (int32 (1,), fed from the host) instead of computed in the graph from `positions` (ReduceMax + 1)."""
    model = onnx.ModelProto()
    model.CopyFrom(decoder)
    for node in model.graph.node:
        if node.op_type == "GroupQueryAttention":
            node.input[6] = "total"
    model.graph.input.append(helper.make_tensor_value_info("total", TensorProto.INT32, [1]))
    return model.SerializeToString()


def step_one_buffer(session: ort.InferenceSession, feeds: dict, past: dict) -> np.ndarray:
    """One step with each present_* bound to its past_* OrtValue (written in place), log_probs to the host."""
    binding = session.io_binding()
    for name in ("log_probs", "top_log_probs", "top_ids", "eos_log_probs"):   # first: get_outputs keeps this order
        binding.bind_output(name, "cpu")
    for name, value in feeds.items():
        if name in past:
            binding.bind_ortvalue_input(name, past[name])
            binding.bind_ortvalue_output(name.replace("past", "present"), past[name])
        else:
            binding.bind_cpu_input(name, np.ascontiguousarray(value))
    session.run_with_iobinding(binding)
    return binding.get_outputs()[0].numpy()


def decoder_steps(path: str, providers: list[str], rng, steps: int = 12, width: int = 16) -> None:
    """Greedy-shaped steps of 4 rows (one a source), random tokens, the same position in every row (as the
    engine's searches have it) and then mixed positions (the running batch's); each provider's log_probs against
    the CPU's, step by step, with past and present apart (plain runs) and at one address (IO binding, as the
    engine binds the cache). A graph that computes `total` itself (exported before 2026-12-04) runs as it is and
    with `total` fed from the host."""
    decoder = onnx.load(path)
    inputs = {i.name: i.type.tensor_type for i in decoder.graph.input}
    np_t = np.float16 if any(t.elem_type == TensorProto.FLOAT16 for t in inputs.values()) else np.float32
    past_names = [n for n in inputs if n.startswith("past_")]
    h, d_k = (inputs[past_names[0]].shape.dim[i].dim_value for i in (1, 3))
    vocab = next(o.type.tensor_type.shape.dim[1].dim_value for o in decoder.graph.output if o.name == "log_probs")
    N, S, lengths = 4, 12, np.array([12, 7, 12, 3])
    cross = {n: (0.5 * rng.standard_normal((N, h, S, d_k))).astype(np_t) for n in inputs if n.startswith("cross_")}
    fixed = {"src_mask": (np.arange(S)[None, :] < lengths[:, None]).astype(np.int32),
             "top_k": np.array([4], dtype=np.int64), **cross}
    tokens = rng.integers(4, vocab, size=(steps, N, 1))
    graphs = {"total from the host": decoder.SerializeToString() if "total" in inputs else with_total_input(decoder)}
    if "total" not in inputs:
        graphs = {"total computed in the graph": decoder.SerializeToString(), **graphs}
    for mixed in (False, True):
        print(f"decoder {path}, {'mixed positions' if mixed else 'one position a step'}: largest |log_probs "
              f"difference| from the CPU's, steps 0-{steps - 1}", flush=True)
        results = {}
        for (label, model), one_buffer in ((g, b) for g in graphs.items() for b in (False, True)):
            for provider in providers:
                session = ort.InferenceSession(model, providers=[provider])
                past = {n: np.zeros((N, h, width, d_k), np_t) for n in past_names}
                if one_buffer:                                 # as the engine binds the cache: on the device
                    device = "cuda" if provider == "CUDAExecutionProvider" else "cpu"
                    past = {n: ort.OrtValue.ortvalue_from_numpy(v, device, 0) for n, v in past.items()}
                out = []
                for t in range(steps):
                    at = [t, max(t - 3, 0), t, max(t - 1, 0)] if mixed else [t] * N
                    positions = np.array(at, dtype=np.int32)
                    feeds = {"tokens": tokens[t], "positions": positions, **fixed, **past}
                    if label == "total from the host":
                        feeds["total"] = np.array([positions.max() + 1], dtype=np.int32)
                    if one_buffer:
                        out.append(step_one_buffer(session, feeds, past).astype(np.float32))
                        continue
                    names = ["log_probs"] + [n.replace("past", "present") for n in past_names]
                    got = session.run(names, feeds)
                    out.append(got[0].astype(np.float32))
                    past = {n.replace("present", "past"): v for n, v in zip(names[1:], got[1:])}
                results[f"{label}, {'one address' if one_buffer else 'apart'}", provider] = out
        reference = next(iter(results.values()))              # the first graph, apart, on the CPU
        for (name, provider), out in results.items():
            diffs = " ".join(f"{float(np.abs(a - b).max()):.1e}" for a, b in zip(out, reference))
            print(f"  {name:42} {provider[:4]}: {diffs}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--decoder", help="also run this decoder.onnx step after step on each provider")
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    providers = ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        providers.append("CUDAExecutionProvider")
    else:
        print(f"onnxruntime {ort.__version__}: no CUDAExecutionProvider here, the CPU rows alone")
    if args.decoder:
        decoder_steps(args.decoder, providers, rng)
    print(f"onnxruntime {ort.__version__}; largest |difference| from a float64 reference, by provider")
    for dtype in ("fp32", "fp16"):
        for A, G, lengths in ((1, 1, [16]), (1, 4, [16]), (8, 1, [16, 9, 12, 16, 3, 16, 7, 11]),
                              (8, 4, [16, 9, 12, 16, 3, 16, 7, 11]), (2, 1, [5, 5])):
            for form in ("2-D int32 (ours)", "none", "key lengths", "additive bias"):
                if form == "none" and min(lengths) < 16:
                    continue
                model, feeds, ref = cross_case(A, G, 16, np.array(lengths), form, dtype, rng)
                report(f"MHA {dtype} A={A} G={G} S=16 lengths {min(lengths)}-{max(lengths)}, mask {form}",
                       model, feeds, ref, providers)
        for positions, W in (([0, 0, 0, 0], 16), ([0, 3, 7, 2], 16), ([5, 5, 5, 5], 16), ([9, 1, 30, 4], 32)):
            for shared in (False, True):
                model, feeds, ref = cached_case(np.array(positions), W, dtype, rng)
                report(f"GQA {dtype} positions {positions} W={W}, past/present {'one buffer' if shared else 'apart'}",
                       model, feeds, ref, providers, shared)


if __name__ == "__main__":
    main()
