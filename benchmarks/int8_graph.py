"""int8 graph forms for our CPU engine side by side, on the very same weights, in one run.

    python benchmarks/int8_graph.py --quick                           # ~2 min on a quiet 2-core CPU
    python benchmarks/int8_graph.py --out benchmarks/results/int8-graph.md
    python benchmarks/int8_graph.py --work /tmp/int8-graph            # keep the model and packages, reuse them

The weights are a Marian model built here with the `small` preset's shape over the SentencePiece vocabulary
of models/de-en, randomly initialised (vs_ctranslate2.build_marian), imported as our fp32 package
(model.import_marian). Each int8 candidate is written from that fp32 package, a valid package of its own
(model.json precision int8, quantization int8-static for `static`, int8-rows for the others so that the
engine serves them; refreshed file hashes):

    rows-before   the form int8 packages had before model/quantize.py's QuantizeLinear form: per-row scale
                  (Abs, ReduceMax, Mul, Max), then Div, Round, Add, Cast to uint8, MatMulInteger, Cast and
                  two Muls (kept here, OLD_*, as it was)
    rows          int8-rows, model/quantize.py's quantize_int8(path, None): the same scale, QuantizeLinear
                  (blocked, one block per row), com.microsoft MatMulIntegerToFloat and one Mul
    static        int8-static, `--quantize int8`'s default form: quantize_int8(path, ranges) with ranges
                  from model.calibrate.activation_ranges on the fp32 package over calibration text (German
                  sentences none of which is measured, by vs_ctranslate2.calibration_sentences: the German
                  side of tests/fixtures/langid-heldout.tsv, or with 32 or fewer sentences measured the
                  tests' other Ding sentences; the header names them): QuantizeLinear with a constant scale
                  and zero point, MatMulIntegerToFloat with the bias folded in
    nbits8-b32    com.microsoft MatMulNBits, 8 bits, blocks of 32 (64) along K, accuracy_level 4: onnxruntime
    nbits8-b64    quantizes the activations per block inside its kernel

Every engine is service.inference.engine.Engine on --threads intra-op threads; searches end as CTranslate2's do
(SearchOptions(length_rule="ctranslate2"), an output budget of 32 tokens, as vs_ctranslate2.py). A random
model rarely writes </s>, so outputs run to that budget: equal work per sentence. Figures:

    alone != batched   of --sentences (the tests' Ding sentences, file order, so batches mix lengths), those
                       whose best hypothesis (tokens or score, bit for bit) differs between a search alone and
                       one in batches of 32, and of 7 (other batch-mates, other rows); greedy and beam 4
    = fp32 (beam 4)    of the same sentences in batches of 32, outputs token for token fp32's
    encoder error      sum |x - x_fp32| / sum |x_fp32| over the encoder's outputs (the cross-attention keys
                       and values) at real (unpadded) positions, all sentences in one batch
    = rows-before      searches (both beams, alone and both batchings) whose tokens and score are bit for bit
                       rows-before's: rows computes the same numbers; static and nbits8 do not (other scales)
    decoder nodes      the decoder graph after onnxruntime's optimisation (optimized_model_filepath), without
                       and with its SkipLayerNormFusion
    tok/s              target tokens (eos included) per second of wall time at beam 4 and greedy, batch 1
                       (--one-sample sentences spread over the lengths) and 32, --speed-sentences (the same
                       sentences repeated) sorted by length; the best of --repeat passes, all engines taking
                       turns. Each package twice: with onnxruntime's SkipLayerNormFusion (what the engine did
                       before) and without (what service/inference/device.py's open_session does on the CPU now)
    p50 ms             the median time of one batch, fusion off

Last, SkipLayerNormalization alone: the fused kernel against the Add, Add and LayerNormalization it
replaces, microseconds per call (best of --repeat) at a decoder step's rows (4: beam 4 at one sentence;
32; 128: beam 4 at batch 32) and at an encoder's 32 sentences of 20 positions.

The header names the command, date, CPU, onnxruntime version and the load average. Nothing is asserted:
the figures depend on the machine and its load, written beside them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import common                  # benchmarks/ is this script's directory; it puts the repository on sys.path

from model.quantize import quantize_int8, replace_nodes, rewrite_matmuls, row_scale
from service.inference.device import session_options
from service.inference.engine import Engine
from service.shared.options import SearchOptions
from service.shared.package import INT8_ROWS, INT8_STATIC, file_entries

MAX_LENGTH = 32                     # output budget, eos included (vs_ctranslate2.py's default)
LARGE = 32                          # the large batch
OTHER_SPLIT = 7                     # a second batching: other batch-mates, other rows
FUSION = "SkipLayerNormFusion"


# --- The form int8 packages had before (model/quantize.py until the QuantizeLinear form), as it was. ---
# quantize_weight is unchanged, so it is imported; the activations went through Div, Round, Add and Cast, and
# each product through MatMulInteger, Cast and two Muls (the weight's scale first: see that version's notes).

def OLD_row_quantizer(x: str) -> tuple[list[onnx.NodeProto], str, str]:
    """Nodes that quantize x (..., K) per row: (nodes, uint8 tensor name, per-row scale name)."""
    p = f"{x}/rows_int8"
    nodes = row_scale(x) + [
        helper.make_node("Div", [x, f"{p}/scale"], [f"{p}/scaled"]),
        helper.make_node("Round", [f"{p}/scaled"], [f"{p}/rounded"]),
        helper.make_node("Add", [f"{p}/rounded", "int8/zero_point_f"], [f"{p}/shifted"]),
        helper.make_node("Cast", [f"{p}/shifted"], [f"{p}/q"], to=TensorProto.UINT8),
    ]
    return nodes, f"{p}/q", f"{p}/scale"


def OLD_constants() -> list[onnx.TensorProto]:
    return [numpy_helper.from_array(np.array([-1], np.int64), "int8/last_axis"),
            numpy_helper.from_array(np.array(1 / 127, np.float32), "int8/one_127th"),
            numpy_helper.from_array(np.array(1e-30, np.float32), "int8/tiny"),
            numpy_helper.from_array(np.array(128, np.float32), "int8/zero_point_f"),
            numpy_helper.from_array(np.array(128, np.uint8), "int8/zero_point")]


def OLD_product(q: str, scale: str, weight: str, y: str) -> list[onnx.NodeProto]:
    return [helper.make_node("MatMulInteger", [q, f"{weight}_quantized", "int8/zero_point"], [f"{y}/int32"]),
            helper.make_node("Cast", [f"{y}/int32"], [f"{y}/float"], to=TensorProto.FLOAT),
            helper.make_node("Mul", [f"{y}/float", f"{weight}_scale"], [f"{y}/columns"]),
            helper.make_node("Mul", [f"{y}/columns", scale], [y])]


def OLD_quantize_int8(path: Path) -> int:
    """Rewrites an fp32 graph file in place into the previous form; returns the MatMuls quantized."""
    return rewrite_matmuls(path, quantizer=lambda model: lambda x, k: OLD_row_quantizer(x),
                           product=OLD_product, constants=OLD_constants())


# --- MatMulNBits: onnxruntime's blockwise int8 weights; its kernel quantizes activations per block. ---

def nbits_quantizer(block: int):
    """rewrite(path) for MatMulNBits, 8 bits, blocks of `block` along K, accuracy_level 4 (int8 activations)."""
    from onnxruntime.capi._pybind_state import quantize_matmul_8bits

    def rewrite(path: Path) -> int:
        model = onnx.load(str(path))
        inits = {i.name: i for i in model.graph.initializer}
        nodes, new_inits, done = [], [], 0
        for node in model.graph.node:
            weight = inits.get(node.input[1]) if node.op_type == "MatMul" else None
            if weight is None or len(weight.dims) != 2 or weight.data_type != TensorProto.FLOAT:
                nodes.append(node)
                continue
            w = np.ascontiguousarray(numpy_helper.to_array(weight), dtype=np.float32)
            K, N = w.shape
            blocks = (K + block - 1) // block
            packed = np.zeros((N, blocks, block), np.uint8)
            scales = np.zeros((N * blocks,), np.float32)
            zero_points = np.zeros((N * blocks,), np.uint8)     # symmetric: unused, the kernel's default 128
            quantize_matmul_8bits(packed, w, scales, zero_points, block, N, K, True)
            new_inits += [numpy_helper.from_array(packed, f"{weight.name}_q8"),
                          numpy_helper.from_array(scales.reshape(N, blocks), f"{weight.name}_q8_scale")]
            inputs = [node.input[0], f"{weight.name}_q8", f"{weight.name}_q8_scale"]
            nodes.append(helper.make_node("MatMulNBits", inputs, list(node.output), domain="com.microsoft",
                                          K=K, N=N, bits=8, block_size=block, accuracy_level=4))
            done += 1
        replace_nodes(model, path, nodes, new_inits)
        return done
    return rewrite


def rows(path: Path) -> int:
    """int8-rows: each row's scale at run time."""
    return quantize_int8(path, None)


def static(ranges: dict[str, dict[str, tuple[float, float]]]):
    """rewrite(path) for int8-static with model.calibrate's `ranges` of the fp32 package (by graph name)."""
    return lambda path: quantize_int8(path, ranges[path.stem])


# name -> (rewrite, or None for `static`, whose rewrite needs the fp32 package's ranges; model.json quantization)
CANDIDATES = {"rows-before": (OLD_quantize_int8, INT8_ROWS), "rows": (rows, INT8_ROWS),
              "static": (None, INT8_STATIC),
              "nbits8-b32": (nbits_quantizer(32), INT8_ROWS), "nbits8-b64": (nbits_quantizer(64), INT8_ROWS)}


def write_candidate(fp32: Path, out: Path, rewrite, scheme: str, extra: dict | None = None) -> Path:
    """A copy of the fp32 package with each graph rewritten, labelled int8 (`scheme`) as the engine expects."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(fp32, out)
    for graph in ("encoder.onnx", "decoder.onnx"):
        rewrite(out / graph)
    meta = json.loads((out / "model.json").read_text(encoding="utf-8"))
    meta.update(name=out.name, precision="int8", quantization=scheme, **(extra or {}))
    meta["files"] = file_entries(out, list(meta["files"]))
    (out / "model.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out


def build_packages(work: Path, calibration: list[str]) -> dict[str, Path]:
    """fp32 and every candidate in work/, the Marian model and fp32 package reused where already there;
    `static` calibrated on the `calibration` sentences."""
    from model.calibrate import activation_ranges
    from model.import_marian import import_marian

    marian = work / "marian"
    if not (marian / "config.json").is_file():
        common.build_marian(marian, common.ROOT / "models" / "de-en" / "spm.model")
    fp32 = work / "fp32"
    if not (fp32 / "model.json").is_file():
        shutil.rmtree(fp32, ignore_errors=True)
        import_marian(marian, fp32, source_lang="de", target_lang="en")
    # Always rewritten (and calibrated): a reused one would hide a change to model/quantize.py or model/calibrate.py.
    ranges = activation_ranges(fp32, [(s, "en") for s in calibration])
    packages = {"fp32": fp32}
    for name, (rewrite, scheme) in CANDIDATES.items():
        extra = {"calibration": {"sentences": len(calibration)}} if rewrite is None else None
        packages[name] = write_candidate(fp32, work / name, rewrite or static(ranges), scheme, extra)
    return packages


def fused_session(path: str, options: ort.SessionOptions, providers: list[str]) -> ort.InferenceSession:
    """A session factory for Engine(open_session=...) that keeps onnxruntime's SkipLayerNormFusion, as every
    CPU engine did before (service/inference/device.py's open_session disables it on the CPU now)."""
    return ort.InferenceSession(path, options, providers=providers)


def open_engines(packages: dict[str, Path], threads: int) -> dict[tuple[str, bool], Engine]:
    """(name, fused) -> Engine: each package as the engine opens it now (False) and as before (True)."""
    engines = {}
    for name, path in packages.items():
        engines[name, False] = Engine(path, device="cpu", intra_op_threads=threads)
        engines[name, True] = Engine(path, device="cpu", intra_op_threads=threads, open_session=fused_session)
    return engines


def options(beam: int) -> SearchOptions:
    return SearchOptions(beam_size=beam, max_length_a=0, max_length_b=MAX_LENGTH, max_length=MAX_LENGTH,
                         length_rule="ctranslate2")


def best_outputs(engine: Engine, ids: list[list[int]], beam: int, size: int) -> list[tuple[tuple, float]]:
    """(tokens, score) of each sentence's best hypothesis, searched in batches of `size` (1: alone)."""
    return [(tuple(h[0].tokens), h[0].score)
            for g in common.batches(ids, size) for h in engine.search(g, options(beam))]


def encoder_error(engine: Engine, reference: Engine, ids: list[list[int]]) -> float:
    """sum |x - x_fp32| / sum |x_fp32| over the encoder's outputs at real positions (one padded batch)."""
    src = np.full((len(ids), max(map(len, ids))), engine.pad_id, np.int64)
    for i, s in enumerate(ids):
        src[i, :len(s)] = s
    real = (src != engine.pad_id)[:, None, :, None]        # (B, 1, S, 1) against (B, h, S, d_k)
    ours, theirs = engine.encoder.run(None, {"src_ids": src}), reference.encoder.run(None, {"src_ids": src})
    diff = sum(float((np.abs(a - b) * real).sum()) for a, b in zip(ours, theirs))
    return diff / sum(float((np.abs(b) * real).sum()) for b in theirs)


def answers(engines: dict, names: list[str], ids: list[list[int]]) -> dict[str, dict]:
    """Per package: its outputs alone and batched (both beams), agreement with fp32 and with rows-before."""
    out: dict[str, dict] = {}
    for name in names:
        engine = engines[name, False]
        found = {(beam, size): best_outputs(engine, ids, beam, size)
                 for beam in (1, 4) for size in (1, LARGE, OTHER_SPLIT)}
        out[name] = {"found": found, "encoder_error": encoder_error(engine, engines["fp32", False], ids)}
        print(f"{name}: searched", flush=True)
    for name, r in out.items():
        found, fp32 = r["found"], out["fp32"]["found"]
        r["differ"] = {(beam, size): count_differ(found[beam, 1], found[beam, size])
                       for beam in (1, 4) for size in (LARGE, OTHER_SPLIT)}
        r["same_as_fp32"] = sum(a[0] == b[0] for a, b in zip(found[4, LARGE], fp32[4, LARGE]))
        before = out["rows-before"]["found"]
        r["same_as_before"] = (sum(a == b for key in found for a, b in zip(found[key], before[key])),
                               sum(len(x) for x in found.values()))
    return out


def count_differ(alone: list, batched: list) -> tuple[int, int]:
    """(sentences whose tokens or score differ, those whose tokens differ)."""
    return sum(a != b for a, b in zip(alone, batched)), sum(a[0] != b[0] for a, b in zip(alone, batched))


def decoder_nodes(package: Path, fused: bool) -> int:
    """Nodes of the decoder after onnxruntime's optimisation, with the engine's session options."""
    with tempfile.TemporaryDirectory() as tmp:
        so = session_options(1)
        so.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        ort.InferenceSession(str(package / "decoder.onnx"), so, providers=["CPUExecutionProvider"],
                             disabled_optimizers=[] if fused else [FUSION])
        return len(onnx.load(so.optimized_model_filepath).graph.node)


def runner(engine: Engine, beam: int):
    """run(batch) -> target tokens, eos counted where there is one (as vs_ctranslate2.ours_runner counts;
    that one opens an engine of its own per call, these are opened once and shared)."""
    def run(batch: list[list[int]]) -> int:
        return sum(len(h[0].tokens) + h[0].finished for h in engine.search(batch, options(beam)))
    return run


def measure_speed(engines: dict, ids: list[list[int]], repeat: int, one_sample: int) -> dict:
    """(name, fused, beam, batch) -> vs_ctranslate2.measure()'s figures, the best of `repeat` passes."""
    by_length = sorted(ids, key=len)
    rows = {}
    for beam in (4, 1):
        for size in (1, LARGE):
            groups = common.batches(by_length, size)
            if size == 1:         # one sentence at a time is slow; a sample, spread over the lengths
                groups = groups[::max(1, len(groups) // one_sample)][:one_sample]
            runs = {key: (runner(engine, beam), groups) for key, engine in engines.items()}
            for (name, fused), r in common.best_passes(runs, repeat).items():
                rows[name, fused, beam, size] = r
            print(f"speed: beam {beam} batch {size} done", flush=True)
    return rows


def layer_norm_micro(calls: int, repeat: int) -> list[tuple]:
    """(shape, µs unfused with the fusion off, µs the same graph with it on, µs a SkipLayerNormalization node)."""
    n = helper.make_node
    unfused = [n("Add", ["x", "bias"], ["xb"]), n("Add", ["xb", "r"], ["s"]),
               n("LayerNormalization", ["s", "g", "b"], ["y"], axis=-1, epsilon=1e-5)]
    skip = [n("SkipLayerNormalization", ["x", "r", "g", "b", "bias"], ["y"], domain="com.microsoft", epsilon=1e-5)]
    variants = [(unfused, [FUSION]), (unfused, []), (skip, [])]
    rng, rows = np.random.default_rng(0), []
    for shape in [(4, 1, 256), (32, 1, 256), (128, 1, 256), (32, 20, 256)]:
        feed = {"x": rng.standard_normal(shape, np.float32), "r": rng.standard_normal(shape, np.float32)}
        times = []
        for nodes, disabled in variants:
            session = micro_session(nodes, disabled)
            session.run(None, feed)
            best = float("inf")
            for _ in range(repeat):
                t = time.perf_counter()
                for _ in range(calls):
                    session.run(None, feed)
                best = min(best, (time.perf_counter() - t) / calls * 1e6)
            times.append(best)
        rows.append((shape, *times))
    return rows


def micro_session(nodes: list, disabled: list[str]) -> ort.InferenceSession:
    """y = nodes(x, r) over (B, S, 256) with the engine's session options (1 thread)."""
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, ["B", "S", 256])  # noqa: E731
    consts = [numpy_helper.from_array(np.full(256, value, np.float32), name)
              for name, value in (("g", 1.0), ("b", 0.0), ("bias", 0.1))]
    graph = helper.make_graph(nodes, "layer_norm", [value("x"), value("r")], [value("y")], consts)
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 18),
                                                                   helper.make_opsetid("com.microsoft", 1)])
    return ort.InferenceSession(model.SerializeToString(), session_options(1), providers=["CPUExecutionProvider"],
                                disabled_optimizers=disabled)


def answers_table(names: list[str], found: dict, nodes: dict, n: int) -> list[str]:
    def differ(r, beam):
        parts = [f"{d} of {n}" + (f" ({t} in tokens)" if t else "") for d, t in (r["differ"][beam, s]
                                                                          for s in (LARGE, OTHER_SPLIT))]
        return " / ".join(parts)
    lines = [f"| package | alone != batched, greedy (batches of {LARGE} / {OTHER_SPLIT}) | alone != batched, beam 4 "
             f"(batches of {LARGE} / {OTHER_SPLIT}) | = fp32 (beam 4) | encoder error vs fp32 | = rows-before "
             "(tokens and score) | decoder nodes (fusion off / on) |", "|---|---|---|---:|---:|---:|---:|"]
    for name in names:
        r = found[name]
        same = "(itself)" if name == "rows-before" else "{} of {}".format(*r["same_as_before"])
        lines.append(f"| {name} | {differ(r, 1)} | {differ(r, 4)} | {r['same_as_fp32']} of {n} | "
                     f"{r['encoder_error']:.2%} | {same} | {nodes[name, False]} / {nodes[name, True]} |")
    return lines


def speed_table(names: list[str], speed: dict) -> list[str]:
    lines = ["| search | batch | package | tok/s, fusion on (before) | tok/s, fusion off (now) | off / on | "
             "p50 ms off |", "|---|---:|---|---:|---:|---:|---:|"]
    for beam in (4, 1):
        for size in (1, LARGE):
            for name in names:
                on, off = speed[name, True, beam, size], speed[name, False, beam, size]
                lines.append(f"| {'beam 4' if beam > 1 else 'greedy'} | {size} | {name} | {on['tok_s']:,.0f} | "
                             f"{off['tok_s']:,.0f} | {off['tok_s'] / on['tok_s']:.2f} | {off['p50_ms']:,.1f} |")
    return lines


def micro_table(rows: list[tuple]) -> list[str]:
    lines = ["| shape (B, S, 256) | Add, Add, LayerNormalization (fusion off) µs | same graph, fusion on µs | "
             "SkipLayerNormalization node µs | fused / unfused |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {shape} | {off:,.1f} | {on:,.1f} | {node:,.1f} | {on / off:.2f} |" for shape, off, on, node in rows]
    return lines


def header(args: argparse.Namespace, argv, load_start: tuple, n: int, calibration: str) -> list[str]:
    facts, load_end = common.cpu_facts(), os.getloadavg()
    command = "python benchmarks/int8_graph.py " + " ".join(argv if argv is not None else sys.argv[1:])
    busy = max(load_start[0], load_end[0]) > 0.5 * facts["usable"]
    return [f"- command: `{command.strip()}`", f"- date: {datetime.datetime.now():%Y-%m-%d %H:%M}",
            f"- machine: {common.describe_cpu(facts)}; {platform.system()} {platform.release()}",
            f"- load average (1 min) at the start and the end: {load_start[0]:.2f}, {load_end[0]:.2f} on "
            f"{facts['usable']} CPUs" + (" (other processes shared the CPUs: expect noise)" if busy else ""),
            f"- versions: onnxruntime {ort.__version__}, onnx {onnx.__version__}, numpy {np.__version__}",
            f"- weights: a random Marian model (the `small` preset's shape, models/de-en's vocabulary); "
            f"{n} sentences (the tests' Ding sentences) for the answers; output budget {MAX_LENGTH} tokens",
            f"- static (int8-static): activation scales calibrated on {calibration}",
            f"- every engine: {args.threads} intra-op thread{'s' * (args.threads > 1)}; speed: the best of "
            f"{args.repeat} pass{'es' * (args.repeat > 1)}, the "
            f"engines taking turns; batch {LARGE}: {args.speed_sentences} sentences; batch 1: {args.one_sample} "
            "of them spread over the lengths"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer sentences and passes for speed (~2 min on a quiet "
                   "2-core CPU)")
    p.add_argument("--sentences", type=int, default=64, help="sentences for the answers' figures (default 64)")
    p.add_argument("--speed-sentences", type=int, default=None, help="sentences for batch 32 speed (default 128; "
                   "quick 64)")
    p.add_argument("--repeat", type=int, default=None, help="speed passes, the best kept (default 3; quick 2)")
    p.add_argument("--one-sample", type=int, default=None, help="sentences searched one at a time for batch 1 "
                   "speed (default 16; quick 8)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of every engine (default 1)")
    p.add_argument("--work", type=Path, help="keep the model and packages here (reused when present)")
    p.add_argument("--out", type=Path, help="also write the report here (Markdown)")
    return p


def main(argv=None) -> None:
    from transformers import MarianTokenizer

    args = build_parser().parse_args(argv)
    defaults = {"speed_sentences": (128, 64), "repeat": (3, 2), "one_sample": (16, 8)}
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    load_start, started = os.getloadavg(), time.perf_counter()
    work = args.work or Path(tempfile.mkdtemp(prefix="int8-graph-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        measured = common.read_sentences(None, max(args.sentences, args.speed_sentences))
        calibration, calibration_named = common.calibration_sentences(None, measured)
        packages = build_packages(work, calibration)
        tok = MarianTokenizer.from_pretrained(str(work / "marian"))
        tag = common.target_tag(None, tok)               # [] for this model: no language tags
        ids = [tag + tok(s).input_ids for s in common.read_sentences(None, args.sentences)]
        names = list(packages)
        engines = open_engines(packages, args.threads)
        found = answers(engines, names, ids)
        nodes = {(name, fused): decoder_nodes(packages[name], fused) for name in names for fused in (False, True)}
        speed_ids = [tag + tok(s).input_ids for s in common.read_sentences(None, args.speed_sentences)]
        speed = measure_speed(engines, speed_ids, args.repeat, args.one_sample)
        micro = layer_norm_micro(calls=100 if args.quick else 300, repeat=args.repeat)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    publish(args, argv, load_start, time.perf_counter() - started, calibration_named, [
        "## Answers (the engine's sessions as now: fusion off)", "", *answers_table(names, found, nodes, len(ids)),
        "", "## Speed", "", *speed_table(names, speed), "", "## SkipLayerNormalization alone", "",
        *micro_table(micro)])


def publish(args: argparse.Namespace, argv, load_start: tuple, seconds: float, calibration: str,
            body: list[str]) -> None:
    """Prints the header and tables; with --out, writes them as Markdown too."""
    lines = header(args, argv, load_start, args.sentences, calibration) + [
        f"- run time: {seconds / 60:.1f} min", "", *body]
    text = "\n".join(lines)
    print()
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("# int8 graph forms on the CPU (same weights)\n\n" + text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
