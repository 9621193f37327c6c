"""The GPU goals in one run: fp16 against fp32, batch invariance, and speed side by side with CTranslate2.

    python benchmarks/gpu.py --package models/de-en --data data/de-en/test.tsv --quick     # a few minutes
    python benchmarks/gpu.py --package models/de-en --data data/de-en/test.tsv --out benchmarks/results/gpu.md
    python benchmarks/gpu.py --package models/de-en --device cuda     # exits 2 where CUDA is not running

From the one package given (any precision), in a temporary directory: its fp32 and fp16 copies
(`model.upgrade --precision`; int8 in place of fp16 on a CPU), and its Marian export (model.export_marian,
with the zero <s> embedding CTranslate2 assumes) converted by ct2-transformers-converter with
--quantization float16 (int8 on a CPU): both engines run the same weights. Then, in order:

    device       --device cuda (or auto where onnxruntime has a CUDA provider): every onnxruntime
                 session's own get_providers() must start with CUDAExecutionProvider, and the server's /info
                 must say cuda; otherwise it stops with exit status 2 and the reason. onnxruntime falls back
                 to CPU with a log line only, which would make every figure a CPU one.
    CTranslate2  the comparison where it runs on that device; where it does not (not installed, or no GPU
                 for it: its 4.8 wheels link CUDA 12's cuBLAS, and a spot machine with CUDA 13 and 64 MiB
                 carried in has neither), every CTranslate2 figure is reported SKIPPED with the reason and
                 ours still run.
    agreement    fp16 (int8 on a CPU) against fp32, beam 4 and greedy, batches of 32 sorted by length: the
                 sentences whose tokens are the same (goal: at least 98 %), and over those the largest
                 difference in mean log-prob per token (goal: at most 0.05). On a CPU int8 stands in, and
                 its figures are printed as information: the goals are fp16's.
    invariance   each of the first --invariance sentences searched alone against the same in batches of 8
                 in file order and of 32 shuffled, beam 4 and greedy, in both precisions: the searches whose
                 tokens differ (goal: 0).
    speed        beam 4 at batches 1, 8, 32 and 64, ours in fp16 against CTranslate2 in fp16 (int8 on a
                 CPU), the engines taking turns, each the best of --repeat passes: tok/s (target tokens,
                 eos included, per second) and p50 ms of a batch.
    served       `python -m service` on 127.0.0.1 with the fp16 package (int8 on a CPU), 32 concurrent
                 clients, one sentence per request, beam 4: tok/s against our engine's offline batch 64
                 (the line `served_vs_engine`) and CTranslate2's.

The last line is `ratio_vs_ctranslate2_gpu engine_fp16=R served=R` (ours over CTranslate2, beam 4 batch 64;
served over CTranslate2 offline at batch 64), or says why CTranslate2 was skipped. Without CUDA every part
that needs it is reported as
SKIPPED with the reason, the CPU figures come with a line `ratio_vs_ctranslate2_cpu engine_int8=R
served=R`, and the last line says the GPU ratio was skipped. Exit status: 0, 1 when a goal that was
measured failed (agreement and invariance on a GPU, invariance on a CPU), 2 when CUDA was asked for and is
not what runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import common  # noqa: E402

SIZES = (1, 8, 32, 64)
LARGE = 64
# Goals of the issue: fp16's tokens as fp32's on nearly every sentence, its scores close where they are.
MIN_SAME = 0.98
MAX_LOGPROB_DIFF = 0.05          # nats per token


class DeviceProblem(SystemExit):
    """CUDA asked for and not what runs: exit status 2, with the reason on stderr."""

    def __init__(self, message: str):
        print(f"error: {message}", file=sys.stderr, flush=True)
        super().__init__(2)


def cuda_problems() -> list[str]:
    """Why onnxruntime cannot run the GPU parts here; [] when it has its CUDA provider."""
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        return []
    return [f"onnxruntime {onnxruntime.__version__} has no CUDAExecutionProvider (providers: "
            f"{', '.join(onnxruntime.get_available_providers())}; pip install -e '.[gpu]')"]


def ctranslate2_problem(device: str, wanted: bool = True) -> str | None:
    """Why CTranslate2 is not compared with on `device` (its parts are then skipped); None when it is."""
    import importlib.util

    if not wanted:
        return "--no-ctranslate2"
    missing = [name for name in ("ctranslate2", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (the bench and marian extras)"
    import ctranslate2

    if device == "cuda" and not ctranslate2.get_cuda_device_count():
        return f"CTranslate2 {ctranslate2.__version__} sees no CUDA device"
    return None


def require_cuda(engine, label: str) -> None:
    sessions = {"encoder": engine.encoder, "decoder": engine.decoder}
    for name, session in sessions.items():
        if session is not None and session.get_providers()[0] != "CUDAExecutionProvider":
            raise DeviceProblem(f"the {label} package's {name} session runs on {session.get_providers()}, not "
                                "CUDAExecutionProvider: onnxruntime fell back to the CPU (its log above says why); "
                                "no GPU figure would be one")


def load_engine(package: Path, device: str, label: str, threads: int = 0):
    from service.inference.engine import Engine

    try:
        engine = Engine(package, device=device, intra_op_threads=threads)
    except Exception as e:  # the engine's own device check, or onnxruntime's
        if device == "cuda":
            raise DeviceProblem(f"the {label} package does not load on CUDA: {e}") from None
        raise
    if device == "cuda":
        require_cuda(engine, label)
    return engine


def build(package: Path, work: Path, device: str, with_ct2: bool) -> tuple[dict[str, Path], Path | None, Path | None]:
    """{precision: package} for fp32 and the low precision, and with_ct2: the Marian export and CTranslate2's
    model (else None, None)."""
    from model.export_marian import export_package_marian
    from model.upgrade import upgrade_package

    own = json.loads((package / "model.json").read_text(encoding="utf-8"))["precision"]
    packages = {}
    for precision in ("fp32", low_precision(device)):
        if own == precision:
            packages[precision] = package
        else:
            upgrade_package(package, work / precision, precision=precision)
            packages[precision] = work / precision
    if not with_ct2:
        return packages, None, None
    marian = export_package_marian(package, work / "marian", zero_bos=True)
    ct2 = work / "ct2"
    converter = Path(sys.executable).parent / "ct2-transformers-converter"
    quantization = "float16" if device == "cuda" else "int8"
    r = subprocess.run([str(converter), "--model", str(marian), "--output_dir", str(ct2), "--quantization",
                        quantization], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"ct2-transformers-converter failed: {r.stderr[-3000:]}")
    return packages, marian, ct2


def low_precision(device: str) -> str:
    return "fp16" if device == "cuda" else "int8"


def search_all(engine, ids: list[list[int]], beam: int, order: list[int], size: int, max_length: int) -> list:
    """Each sentence's best hypothesis, searched in batches of `size` taken in `order`."""
    from service.shared.options import SearchOptions

    options = SearchOptions(beam_size=beam, max_length_a=0, max_length_b=max_length, max_length=max_length)
    out: list = [None] * len(ids)
    for start in range(0, len(order), size):
        chunk = order[start:start + size]
        for i, hyps in zip(chunk, engine.search([ids[i] for i in chunk], options)):
            out[i] = hyps[0]
    return out


def agreement(engines: dict, ids: list[list[int]], low: str, max_length: int,
              device: str) -> tuple[list[str], list[str]]:
    """Lines saying how often `low` writes fp32's tokens, and how close their scores are; failures marked."""
    by_length = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    lines, failed = [], []
    for beam, name in ((4, "beam 4"), (1, "greedy")):
        ref = search_all(engines["fp32"], ids, beam, by_length, 32, max_length)
        got = search_all(engines[low], ids, beam, by_length, 32, max_length)
        same = [i for i in range(len(ids)) if ref[i].tokens == got[i].tokens]
        # Mean log-prob per token, eos included: comparable across lengths and searches.
        diffs = [abs(ref[i].log_prob - got[i].log_prob) / (len(ref[i].tokens) + 1) for i in same]
        share = len(same) / len(ids)
        worst = max(diffs, default=0.0)
        ok = share >= MIN_SAME and worst <= MAX_LOGPROB_DIFF
        verdict = ("PASS" if ok else "FAIL") if device == "cuda" else (
            "information only: int8 stands in for fp16 on a CPU, the goal is fp16's")
        lines.append(f"agreement {low} vs fp32, {name}: same tokens on {len(same)} of {len(ids)} sentences "
                     f"({share:.1%}, goal >= {MIN_SAME:.0%}); |mean log-prob per token difference| over those: "
                     f"max {worst:.4f}, mean {sum(diffs) / max(1, len(diffs)):.4f} (goal <= {MAX_LOGPROB_DIFF}); "
                     f"{verdict}")
        if device == "cuda" and not ok:
            failed.append(lines[-1])
    return lines, failed


def invariance(engine, ids: list[list[int]], label: str, max_length: int) -> tuple[list[str], list[str]]:
    """Each sentence alone against batches of 8 in file order and of 32 shuffled: differing searches."""
    n = len(ids)
    shuffled = list(range(n))
    random.Random(1).shuffle(shuffled)
    lines, failed = [], []
    for beam, name in ((4, "beam 4"), (1, "greedy")):
        alone = search_all(engine, ids, beam, list(range(n)), 1, max_length)
        differ = 0
        for order, size in ((list(range(n)), 8), (shuffled, 32)):
            batched = search_all(engine, ids, beam, order, size, max_length)
            differ += sum(a.tokens != b.tokens for a, b in zip(alone, batched))
        lines.append(f"invariance {label}, {name}: {differ} of {2 * n} searches differ alone vs batched "
                     f"({n} sentences, batches of 8 in order and of 32 shuffled; goal 0): "
                     + ("PASS" if differ == 0 else "FAIL"))
        if differ:
            failed.append(lines[-1])
    return lines, failed


def ours_runner(engine, beam: int, max_length: int):
    from service.shared.options import SearchOptions

    options = SearchOptions(beam_size=beam, max_length_a=0, max_length_b=max_length, max_length=max_length)

    def run(batch: list[list[int]]) -> int:
        return sum(len(h[0].tokens) + 1 for h in engine.search(batch, options))   # + eos, as CTranslate2 counts
    return run


def speed(packages: dict, ct2: Path | None, ids: list[list[int]], pieces: list[list[str]], *, low: str, device: str,
          max_length: int, repeat: int, facts: dict) -> list[dict]:
    """Beam 4 at each of SIZES: ours in `low` and CTranslate2, taking turns, best of `repeat` passes. On a
    CPU each engine first gets its best thread count for the size (as vs_ctranslate2.py chooses them).
    Without `ct2` ours alone, and each row's "ct2" and "ratio" are None."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    ids = [ids[i] for i in order]
    pieces = [pieces[i] for i in order] if ct2 else []
    engines: dict[int, object] = {}

    def make(engine: str, intra: int, inter: int):
        if engine == "ctranslate2":
            return common.ct2_runner(ct2, beam=4, max_length=max_length, threads=intra, inter=inter, device=device)
        if intra not in engines:
            engines[intra] = load_engine(packages[low], device, low, intra)
        return ours_runner(engines[intra], 4, max_length)

    rows = []
    for size in SIZES:
        runs, settings = {}, {}
        contenders = [("ctranslate2", pieces), ("ours", ids)] if ct2 else [("ours", ids)]
        for engine, items in contenders:
            groups = common.batches(items, size)
            if size == 1:
                groups = groups[:16]                     # batch 1 is slow; a sample is enough
            candidates = common.thread_candidates(facts, size, engine) if device == "cpu" else [(1, 1)]
            pick = candidates[0] if len(candidates) == 1 else common.choose_threads(
                lambda i, n: make(engine, i, n), groups[:8 if size == 1 else 2], candidates)[0]
            runs[engine], settings[engine] = (make(engine, *pick), groups), common.describe_threads(engine, *pick)
        best: dict[str, dict] = {}
        for _ in range(repeat):
            for engine, (run, groups) in runs.items():
                r = common.measure(run, groups)
                if engine not in best or r["tok_s"] > best[engine]["tok_s"]:
                    best[engine] = r
        theirs = best.get("ctranslate2")
        row = {"batch": size, "ours": best["ours"], "ct2": theirs,
               "ratio": best["ours"]["tok_s"] / theirs["tok_s"] if theirs else None, "settings": settings}
        rows.append(row)
        where = "" if device == "cuda" else " (threads: " + ", ".join(
            f"{'ours' if e == 'ours' else 'CTranslate2'} {s}" for e, s in settings.items()) + ")"
        compared = (f"CTranslate2 {low} {theirs['tok_s']:9,.0f} tok/s p50 {theirs['p50_ms']:8.1f} ms | "
                    f"ratio {row['ratio']:.2f}" if theirs else "CTranslate2 skipped")
        print(f"speed beam 4 batch {size:2}: ours {low} {row['ours']['tok_s']:9,.0f} tok/s p50 "
              f"{row['ours']['p50_ms']:8.1f} ms | {compared}{where}", flush=True)
    return rows


def read_sentences(data: Path | None, n: int) -> list[str]:
    """The first n sources of --data (or of the tests' 64 sentences), each once: agreement over repeated
    sentences would count them twice."""
    if data is None:
        everything = [de for de, _ in common.pairs64()]
    else:
        everything = [line.split("\t")[0] for line in data.read_text(encoding="utf-8").splitlines() if line.strip()]
    return everything[:n]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--package", type=Path, required=True, help="a translation package of ours, any precision "
                   "(fp16 and fp32 copies are made from its weights)")
    p.add_argument("--data", type=Path, help="TSV whose first column is the source (default: the tests' 64 sentences)")
    p.add_argument("--direction", help="source-target, one of the package's (default: its first)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto", help="cuda: stop with exit "
                   "status 2 unless onnxruntime really runs on the GPU; auto: cuda where onnxruntime has it "
                   "(and the same check), else the CPU parts; cpu: the CPU parts only")
    p.add_argument("--sentences", type=int, help="test sentences for agreement and speed (default 1,000; "
                   "--quick: 256 on a GPU, 64 on a CPU)")
    p.add_argument("--invariance", type=int, help="sentences searched alone and batched (default 128; --quick: "
                   "64 on a GPU, 24 on a CPU)")
    p.add_argument("--max-length", type=int, default=64, help="output budget in tokens, eos included (--quick "
                   "on a CPU: 24)")
    p.add_argument("--repeat", type=int, help="passes per speed figure, engines taking turns (default 3, --quick 1)")
    p.add_argument("--quick", action="store_true", help="fewer sentences and passes")
    p.add_argument("--no-http", action="store_true", help="skip the served measurement")
    p.add_argument("--no-ctranslate2", action="store_true", help="skip CTranslate2 even where it runs (it is "
                   "skipped anyway, with the reason, where it is not installed or sees no GPU)")
    p.add_argument("--out", type=Path, help="also write the report as Markdown here")
    return p.parse_args(argv)


@dataclass
class Setup:
    """What every part reads: the device that runs (and why not CUDA), its low precision, this CPU, and the
    package's model.json, direction and target language."""

    device: str
    problems: list[str]
    facts: dict
    meta: dict
    direction: str
    target: str
    ct2_skipped: str | None        # why CTranslate2 is not compared with; None when it is

    @property
    def gpu(self) -> bool:
        return self.device == "cuda"

    @property
    def low(self) -> str:
        return low_precision(self.device)


def prepare(args: argparse.Namespace) -> Setup:
    """The device (exit status 2 where CUDA is asked for and missing), and the sizes --quick and the device
    imply for the options left unset."""
    problems = cuda_problems()
    if args.device == "cuda" and problems:
        raise DeviceProblem("--device cuda, but " + "; ".join(problems))
    device = "cuda" if args.device == "cuda" or (args.device == "auto" and not problems) else "cpu"
    gpu = device == "cuda"
    if args.sentences is None:
        args.sentences = (256 if gpu else 64) if args.quick else 1000
    if args.invariance is None:
        args.invariance = (64 if gpu else 24) if args.quick else 128
    if args.quick and not gpu and args.max_length == 64:
        args.max_length = 24
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    meta = json.loads((args.package / "model.json").read_text(encoding="utf-8"))
    direction = args.direction or meta["directions"][0]
    source, target = direction.split("-")
    return Setup(device, problems, common.cpu_facts(), meta, direction, target,
                 ctranslate2_problem(device, wanted=not args.no_ctranslate2))


def opening_lines(setup: Setup) -> tuple[list[str], list[str]]:
    """The device line (the report's first) and, without CUDA, the SKIPPED line; both printed."""
    facts = setup.facts
    device = common.gpu_name() if setup.gpu else common.describe_cpu(facts)
    report = [f"device: {setup.device} ({device})"]
    skipped = []
    if not setup.gpu:
        why = "; ".join(setup.problems) if setup.problems else "--device cpu"
        skipped = [f"SKIPPED fp16 vs fp32 agreement, fp16 invariance, fp16 speed against CTranslate2 fp16, served "
                   f"fp16 on CUDA, the CUDA provider check: no CUDA here ({why}); int8 on the CPU stands in"]
    if setup.ct2_skipped:
        skipped.append(f"SKIPPED every CTranslate2 figure: {setup.ct2_skipped}; ours are measured alone")
    for line in report + skipped:
        print(line, flush=True)
    return report, skipped


def lap(took: dict[str, float], name: str, since: float) -> float:
    """Records the seconds since `since` as part `name`; -> now, the next part's start."""
    now = time.perf_counter()
    took[name] = now - since
    return now


def record(result: tuple[list[str], list[str]], report: list[str], failed: list[str]) -> None:
    """A check's (lines, failed lines) added to the report and the failures, and printed."""
    lines, bad = result
    report += lines
    failed += bad
    print("\n".join(lines), flush=True)


def run_checks(args: argparse.Namespace, setup: Setup, packages: dict, marian: Path, report: list[str],
               failed: list[str]) -> tuple[list[str], list[list[int]], list[list[str]]]:
    """The CUDA provider check, agreement and invariance (lines added to `report`, failed goals to `failed`).
    -> the sentences, our ids and CTranslate2's pieces for them ([] without CTranslate2). The engines loaded
    here are dropped on return: the speed part loads its own, with its thread counts."""
    low = setup.low
    engines = {precision: load_engine(path, setup.device, precision) for precision, path in packages.items()}
    if setup.gpu:
        report.append("CUDA provider check: every session of the fp32 and fp16 packages runs on "
                      "CUDAExecutionProvider: PASS")
        print(report[-1], flush=True)
    texts = read_sentences(args.data, args.sentences)
    ids = engines["fp32"].source_ids(texts, setup.target)
    pieces = []
    if marian is not None:
        from transformers import MarianTokenizer

        tok = MarianTokenizer.from_pretrained(str(marian))
        tag = common.target_tag(args.package, tok, setup.target)
        pieces = [tok.convert_ids_to_tokens(tag + tok(t).input_ids) for t in texts]

    record(agreement(engines, ids, low, args.max_length, setup.device), report, failed)
    for precision in (low, "fp32"):
        record(invariance(engines[precision], ids[:args.invariance], precision, args.max_length), report, failed)
    engines.clear()
    return texts, ids, pieces


def serve(args: argparse.Namespace, setup: Setup, package: Path, texts: list[str]) -> dict:
    """The HTTP service on the low-precision package (common.served); exit status 2 if its /info is not cuda
    where CUDA runs."""
    gpu = setup.gpu
    workers = 1 if gpu else max(1, setup.facts["cores"])
    clients = 32 if gpu or not args.quick else 8
    http = common.served(package, texts * (4 if gpu or not args.quick else 1), workers=workers, threads=1,
                     max_length=args.max_length, clients=clients, repeat=args.repeat, device=setup.device,
                     max_batch=LARGE)
    if gpu and http["device"] != "cuda":
        raise DeviceProblem(f"the server started with --device cuda reports device {http['device']!r} "
                            "in /info, not cuda")
    return http


def run_parts(args: argparse.Namespace, setup: Setup, report: list[str], failed: list[str],
              took: dict[str, float]) -> tuple[list[str], list[dict], dict | None]:
    """Build, checks, speed and served, in a temporary directory, each part's wall time in `took`.
    -> the sentences, the speed rows and the served figures (None with --no-http)."""
    work = Path(tempfile.mkdtemp(prefix="gpu-bench-"))
    t0 = time.perf_counter()
    try:
        packages, marian, ct2 = build(args.package, work, setup.device, with_ct2=not setup.ct2_skipped)
        t0 = lap(took, "build", t0)
        texts, ids, pieces = run_checks(args, setup, packages, marian, report, failed)
        t0 = lap(took, "checks", t0)

        rows = speed(packages, ct2, ids, pieces, low=setup.low, device=setup.device, max_length=args.max_length,
                     repeat=args.repeat, facts=setup.facts)
        t0 = lap(took, "speed", t0)
        http = None
        if not args.no_http:
            try:
                http = serve(args, setup, packages[setup.low], texts)
            except RuntimeError as e:    # the server did not start or answer: the figures before it still stand
                http = {"error": str(e)}
            lap(took, "served", t0)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return texts, rows, http


def speed_table(rows: list[dict]) -> list[str]:
    table = ["| beam 4, batch | ours tok/s | CTranslate2 tok/s | ratio | ours p50 ms | CTranslate2 p50 ms |",
             "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ours, theirs = r["ours"], r["ct2"]
        compared = (f"{theirs['tok_s']:,.0f} | {r['ratio']:.2f} | {ours['p50_ms']:,.1f} | {theirs['p50_ms']:,.1f}"
                    if theirs else f"skipped | – | {ours['p50_ms']:,.1f} | skipped")
        table.append(f"| {r['batch']} | {ours['tok_s']:,.0f} | {compared} |")
    return table


def served_line(setup: Setup, http: dict | None, large: dict) -> str:
    if not http:
        return "served: SKIPPED (--no-http)"
    if "error" in http:
        return f"served: FAILED: {http['error']}"
    low = setup.low
    theirs = (f"{http['tok_s'] / large['ct2']['tok_s']:.2f}x CTranslate2 {low} offline batch {LARGE}"
              if large["ct2"] else "CTranslate2 skipped")
    return (f"served ({low}, server --device {setup.device}, /info says {http['device']}): {http['tok_s']:,.0f} "
            f"tok/s under load ({http['tok_s'] / large['ours']['tok_s']:.2f}x our engine {low} offline batch "
            f"{LARGE}; {theirs}), request p50 {http['p50_ms']:,.1f} ms; one sentence alone p50 "
            f"{http['alone_p50_ms']:,.1f} ms")


def summary_lines(setup: Setup, large: dict, http: dict | None) -> list[str]:
    """The ratio lines the report ends with: served over our engine offline, then the GPU's ratio against
    CTranslate2, or the CPU's and why the GPU's was skipped."""
    def served(over: dict | None) -> str:
        return "n/a" if http is None or over is None else f"{http['tok_s'] / over['tok_s']:.2f}"
    lines = [f"served_vs_engine_{setup.device} {setup.low}={served(large['ours'])}"]
    if setup.ct2_skipped:
        return lines + [f"ratio_vs_ctranslate2_{setup.device} skipped: {setup.ct2_skipped}"]
    if setup.gpu:
        return lines + [f"ratio_vs_ctranslate2_gpu engine_fp16={large['ratio']:.2f} served={served(large['ct2'])}"]
    return lines + [f"ratio_vs_ctranslate2_cpu engine_int8={large['ratio']:.2f} served={served(large['ct2'])}",
                    "ratio_vs_ctranslate2_gpu skipped: no CUDA here (" + ("; ".join(setup.problems) or "--device cpu")
                    + "), so no GPU ratio was measured"]


def header_lines(args: argparse.Namespace, argv, setup: Setup, texts: list[str], took: dict[str, float]) -> list[str]:
    import onnxruntime

    ct2_version = "not compared"
    if not setup.ct2_skipped:
        import ctranslate2

        ct2_version = ctranslate2.__version__
    command = "python benchmarks/gpu.py " + " ".join(argv if argv is not None else sys.argv[1:])
    return [f"- command: `{command.strip()}`", f"- date: {datetime.date.today()}",
            f"- machine: {common.describe_cpu(setup.facts)}; {platform.system()} {platform.release()}"
            + (f"; GPU: {common.gpu_name()}" if setup.gpu else ""),
            f"- versions: ctranslate2 {ct2_version}, onnxruntime {onnxruntime.__version__}",
            f"- package: {args.package} ({setup.meta['precision']}), {setup.direction}; {len(texts)} sentences "
            f"({args.data or 'the tests’ 64 Ding sentences'}); output budget {args.max_length} tokens",
            f"- speed: the best of {args.repeat} passes, the engines taking turns",
            "- wall time: " + ", ".join(f"{name} {s:.0f} s" for name, s in took.items())]


def main(argv=None) -> int:
    args = parse_args(argv)
    setup = prepare(args)
    report, skipped = opening_lines(setup)
    failed: list[str] = []
    took: dict[str, float] = {}
    texts, rows, http = run_parts(args, setup, report, failed, took)

    large = next(r for r in rows if r["batch"] == LARGE)
    table = speed_table(rows)
    report.append(served_line(setup, http, large))
    print(report[-1], flush=True)
    if http and "error" in http:
        failed.append(report[-1])
        http = None
    summary = summary_lines(setup, large, http)
    header = header_lines(args, argv, setup, texts, took)
    print()
    print("\n".join(header))
    print()
    print("\n".join(table))
    print()
    if failed:
        print(f"{len(failed)} goal(s) failed:\n" + "\n".join(failed), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(f"# GPU benchmark ({setup.device.upper()})\n\n" + "\n".join(header) + "\n\n"
                            + "\n".join(f"- {line}" for line in skipped + report) + "\n\n" + "\n".join(table)
                            + "\n\n" + "\n".join(f"`{line}`" for line in summary) + "\n", encoding="utf-8")
    print("\n".join(summary), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
