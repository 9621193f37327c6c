"""One package's weights in four forms: the two int8 forms we ship (model/quantize.py: int8-static, the
default, with calibrated constant activation scales, and int8-rows, with each row's scale at run time),
onnxruntime's per-tensor dynamic int8 (what int8 packages used to be) and fp32. Batch invariance,
agreement, BLEU, speed.

    python benchmarks/precision.py --package models/de-en --data data/de-en/test.tsv \
        --out benchmarks/results/int8-per-row.md

The fp32 package is `python -m model.upgrade PKG --precision fp32` (the weights read back out of the
graphs: an int8 package's weights keep their int8 values, so fp32 differs from int8 only in its
activations); the int8-static package is `--precision int8 --calibration TEXT` of that, the int8-rows one
`--precision int8` without. The calibration text (--calibration, a TSV as model.evaluate reads) defaults
to dev.tsv beside --data, else to --data's rows after the first --sentences, else to the measured
sentences themselves; the header names it. The per-tensor package is the fp32 graphs through
onnxruntime's `quantize_dynamic`, labelled fp32 in its model.json because the engine refuses to serve
per-tensor int8: it is run here only to show what per-row activations fixed. Columns:

    alone != batched   of the first --invariance sentences, those whose tokens differ between a search alone
                       and a search in batches of 32 (file order, then shuffled: mixed lengths and positions),
                       greedy / beam 4, both passes summed
    same as fp32       of --sentences (batches of 32, sorted by length), outputs token for token fp32's
    BLEU               sacreBLEU of the same outputs against the references, greedy / beam 4
    tok/s              beam 4, batches of 32 sorted by length, target tokens per second (best of 3 passes)
    p50 ms             beam 4, one sentence at a time, median over the first 48 sentences

Every engine runs on --threads intra-op threads. Nothing is asserted: the figures vary with the machine
and its load, so the command, machine and date are written beside them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from service.inference.engine import Engine  # noqa: E402
from service.shared.options import SearchOptions  # noqa: E402


def per_tensor_copy(fp32: Path, out: Path) -> Path:
    """fp32 package -> the same through onnxruntime's dynamic per-tensor int8 (see the docstring)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from service.shared.package import file_entries

    shutil.copytree(fp32, out)
    for graph in out.glob("*.onnx"):
        quantize_dynamic(str(fp32 / graph.name), str(graph), weight_type=QuantType.QInt8,
                         op_types_to_quantize=["MatMul", "Gemm"])
    meta = json.loads((out / "model.json").read_text())
    meta["files"] = file_entries(out, [f.name for f in sorted(out.iterdir()) if f.name != "model.json"])
    (out / "model.json").write_text(json.dumps(meta, indent=2))
    return out


CALIBRATION_MIN = 32        # fewer rows of --data after the measured ones: the measured ones calibrate


def calibration_text(args: argparse.Namespace, target: str) -> tuple[object, str]:
    """What model.upgrade's `calibration` gets for the int8-static package (a TSV path, or a list of
    (source, target language)), and how the header names it."""
    from model.calibrate import CALIBRATION_SENTENCES

    data = Path(args.data)
    dev = data.parent / "dev.tsv"
    if args.calibration:
        return Path(args.calibration), f"{args.calibration} (--calibration)"
    if dev.is_file() and dev.resolve() != data.resolve():
        return dev, f"{dev} (every direction of the package, as model.export calibrates)"
    rows = [line.rstrip("\n").split("\t") for line in open(data, encoding="utf-8") if line.strip()]
    rest = rows[args.sentences:][:CALIBRATION_SENTENCES]
    if len(rest) >= CALIBRATION_MIN:
        return [(r[0], target) for r in rest], f"{len(rest)} rows of {data} after the measured ones"
    print(f"note: int8-static is calibrated on the measured sentences: {data} has no {dev.name} beside it and "
          f"fewer than {CALIBRATION_MIN} rows after the first {args.sentences}", flush=True)
    measured = rows[:args.sentences][:CALIBRATION_SENTENCES]
    return [(r[0], target) for r in measured], f"the measured sentences themselves ({len(measured)} rows of {data})"


def decode(engine: Engine, ids: list[list[int]], beam: int, order: list[int], size: int) -> list[tuple]:
    out: list = [None] * len(ids)
    for start in range(0, len(order), size):
        chunk = order[start:start + size]
        for i, hyps in zip(chunk, engine.search([ids[i] for i in chunk], SearchOptions(beam_size=beam))):
            out[i] = tuple(hyps[0].tokens)
    return out


def variance(engine: Engine, ids: list[list[int]], beam: int) -> int:
    alone = [decode(engine, [s], beam, [0], 1)[0] for s in ids]
    shuffled = list(range(len(ids)))
    random.Random(1).shuffle(shuffled)
    return sum(a != b for order in (list(range(len(ids))), shuffled)
               for a, b in zip(alone, decode(engine, ids, beam, order, 32)))


def speed(engine: Engine, ids: list[list[int]]) -> tuple[float, float]:
    by_length = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        tokens = sum(len(t) + 1 for t in decode(engine, ids, 4, by_length, 32))
        best = min(best, time.perf_counter() - t0)
    one = []
    for s in ids[:48]:
        t0 = time.perf_counter()
        engine.search([s], SearchOptions(beam_size=4))
        one.append(time.perf_counter() - t0)
    return tokens / best, sorted(one)[len(one) // 2] * 1000


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--package", required=True, help="a translation package (its weights are used)")
    p.add_argument("--data", required=True, help="TSV: source, reference (e.g. data/de-en/test.tsv)")
    p.add_argument("--direction", default="de-en")
    p.add_argument("--sentences", type=int, default=500, help="for agreement, BLEU and speed")
    p.add_argument("--invariance", type=int, default=96, help="sentences searched alone and batched")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--calibration", help="TSV whose sources set int8-static's activation scales (default: dev.tsv "
                   "beside --data, else --data's rows after the measured ones)")
    p.add_argument("--out", help="also write the table (with the command) to this markdown file")
    args = p.parse_args(argv)
    from model.evaluate import score
    from model.upgrade import upgrade_package

    rows = [line.rstrip("\n").split("\t") for line in open(args.data, encoding="utf-8")][:args.sentences]
    srcs, refs = [r[0] for r in rows], [r[1] for r in rows]
    target = args.direction.split("-")[1]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        calibration, calibration_named = calibration_text(args, target)
        upgrade_package(args.package, tmp / "fp32", precision="fp32")
        upgrade_package(tmp / "fp32", tmp / "int8-static", precision="int8", calibration=calibration)
        upgrade_package(tmp / "fp32", tmp / "int8-rows", precision="int8")      # no calibration: int8-rows
        packages = {"int8-static (shipped default)": tmp / "int8-static", "int8-rows (shipped)": tmp / "int8-rows",
                    "int8, per-tensor (before)": per_tensor_copy(tmp / "fp32", tmp / "int8-tensor"),
                    "fp32": tmp / "fp32"}
        for name in ("int8-static (shipped default)", "int8-rows (shipped)"):   # each is the form it is named
            meta = json.loads((packages[name] / "model.json").read_text())
            assert name.startswith(meta["quantization"]), (name, meta.get("quantization"))
        engines = {name: Engine(path, device="cpu", intra_op_threads=args.threads) for name, path in packages.items()}
        ids = engines["fp32"].source_ids(srcs, target)
        by_length = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        outputs = {name: {b: decode(e, ids, b, by_length, 32) for b in (1, 4)} for name, e in engines.items()}
        lines = ["| package | alone != batched (greedy / beam 4) | same as fp32 (greedy / beam 4) "
                 "| BLEU (greedy / beam 4) | tok/s, beam 4, batch 32 | p50 ms, beam 4, batch 1 |",
                 "|---|---|---|---|---:|---:|"]
        for name, e in engines.items():
            diffs = [variance(e, ids[:args.invariance], b) for b in (1, 4)]
            same = [sum(a == b for a, b in zip(outputs[name][k], outputs["fp32"][k])) for k in (1, 4)]
            bleu = [score([e.detokenize(t) for t in outputs[name][k]], refs)["bleu"] for k in (1, 4)]
            tok_s, p50 = speed(e, ids)
            lines.append(f"| {name} | {diffs[0]} / {diffs[1]} of {2 * args.invariance} | {same[0]} / {same[1]} of "
                         f"{len(ids)} | {bleu[0]:.2f} / {bleu[1]:.2f} | {tok_s:,.0f} | {p50:.1f} |")
            print(lines[-1], flush=True)
    command = "python benchmarks/precision.py " + " ".join(argv if argv is not None else sys.argv[1:])
    head = (f"`{command}`, {datetime.date.today()}, {platform.processor() or platform.machine()}, "
            f"{args.threads} thread(s), {args.direction}; int8-static calibrated on {calibration_named}\n\n")
    print(head + "\n".join(lines))
    if args.out:
        Path(args.out).write_text(head + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
