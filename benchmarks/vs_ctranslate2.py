"""Our engine side by side with CTranslate2, on the very same weights and inputs, in one run.

    python benchmarks/vs_ctranslate2.py --quick                       # < 10 min on a 2-core CPU
    python benchmarks/vs_ctranslate2.py --checkpoint runs/small --data data/de-en/test.tsv \
        --out benchmarks/results/vs-ctranslate2-cpu.md
    python benchmarks/vs_ctranslate2.py --marian path/to/opus-mt-de-en ...   # any Marian checkpoint
    python benchmarks/vs_ctranslate2.py --package models/de-en --data data/de-en/test.tsv   # + BLEU

The weights come in Marian format: our checkpoint or model package through model.export_marian
(--checkpoint, --package: its weights read back out of its graphs), a Marian directory (--marian), or,
by default, a Marian model built here with the `small` preset's shape
(d_model 256, 4 heads, d_ff 1024, 4+3 layers, relu) over the SentencePiece vocabulary of
models/de-en, randomly initialised. From it:

    CTranslate2   ct2-transformers-converter, fp32 and --quantization int8
    ours          model.import_marian: the fp32 package for service.inference.engine.Engine; its int8 package is the
                  default form, int8-static (model/quantize.py), made from a copy of that fp32 package
                  by model.export.quantize_package, as write_package makes one (after a multi-directional
                  package's target tag is in place, so the calibration sentences carry it as the measured
                  ones do)

The calibration text (--calibration, else the first of these with at least 32 sentences that are not
measured: --data's other rows, dev.tsv beside --data, the German side of the tests' held-out
language-identification file: Ding sentences, none of the 64 measured by default; else the measured
sentences themselves) is named in the report's header with the int8 form.

Every configuration translates the same sentences (the German side of --data, or the tests' 64 Ding
sentences), sorted by length and cut into the same batches; both engines get the same beam size, length
penalty (1.0) and output budget (--max-length target tokens, eos included). Our engine ends a search at that
budget as CTranslate2 does (SearchOptions(length_rule="ctranslate2"), not the service's default), so the
agreement figures compare the same search. Each engine gets its own best settings on this CPU, chosen by short
passes before the measured ones and printed with every result: CTranslate2's process-wide environment (its
defaults, CT2_USE_MKL flipped, OMP_WAIT_POLICY=PASSIVE; each tried in a child process), then for each
precision and batch size both engines' thread counts (intra_threads 1, the usable physical cores, the usable
logical CPUs where hyperthreads add some; and sub-batches in parallel: CTranslate2's inter_threads, our
engines from a thread pool). `--threads N` gives both engines N threads instead. A random model rarely writes
</s>, so its outputs run to that budget in both engines: equal work per sentence, which is what a speed
comparison needs (its translations mean nothing).

    tok/s      target tokens produced (eos included) per second of wall time, tokenisation excluded
    p50 ms     latency of one batch

The header names the CPU (/proc/cpuinfo), its logical CPUs, those this process may use, their physical
cores, a cgroup CPU quota, the load average, and the ISA and GEMM backends CTranslate2 reports
(CT2_VERBOSE=1). Why it matters: CTranslate2 runs its threads under OpenMP, whose threads meet at a
barrier after each operator; with as many threads as CPUs, a core taken by any other process (a
neighbour on a shared machine, a hyperthread sibling, a CPU quota below the CPU count) stalls every
operator until the preempted thread runs again: one sentence took 2-3x as long on 2 threads as on 1
while other jobs shared a 2-core machine, 5-12x with OMP_WAIT_POLICY=ACTIVE (vs-ctranslate2-cpu.md,
"CTranslate2's settings"). onnxruntime's threads here sleep between operators.

When the weights are a model's (--checkpoint, --package, --marian, not the random default) and --data
has references (a second column), another table gives each engine's sacreBLEU and chrF at beam 4,
batch 32 (64 on a GPU), in each precision, and how many translations the engines agree on word for
word: the "BLEU within 0.3" goal. A line `bleu_minus_ctranslate2 fp32=D int8=D` comes before the last.

Then the HTTP service (`python -m service`, int8 package; by default one single-threaded worker per
thread of --threads) at 32 concurrent clients, one sentence per request, each client one keep-alive
connection on a plain socket (common.KeepAlive: a fifth of httpx's CPU a request): served tok/s against
CTranslate2 int8's offline beam-4 batch-32 figure. The last line is

    ratio_vs_ctranslate2 engine_fp32=R engine_int8=R served=R

(our tokens/s over CTranslate2's: beam 4, batch 32; served over CTranslate2 int8 offline). With
`--device cuda` the same comparison runs on the first GPU in fp32 and fp16 at batches 1 and 64
(served: the fp16 package against CTranslate2 fp16 at batch 64) and the line ends with the GPU's
one-sentence goal, ours at beam 4 batch 1 in fp16:

    ratio_vs_ctranslate2 engine_fp32=R engine_fp16=R served=R batch1_ms_per_token=MS
Nothing is asserted: the figures depend on the machine and its load, written beside them.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from common import (ROOT, batches, best_passes, build_marian, calibration_sentences, choose_threads, cpu_facts,
                    ct2_runner, describe_cpu, describe_threads, gpu_name, measure, read_sentences, served,
                    target_tag, thread_candidates)

from model.quantize import add_weight_bits_flag
from service.shared.package import INT8_DEFAULT_WEIGHT_BITS


def int8_static_copy(fp32: Path, out: Path, calibration: list[tuple[str, str | None]],
                     weight_bits: int = INT8_DEFAULT_WEIGHT_BITS) -> Path:
    """The fp32 package at `fp32` copied to `out` and quantized there as model.export.write_package quantizes
    one (model.export.quantize_package: int8-static, calibrated on `calibration`, weights in `weight_bits`)."""
    from model.export import quantize_package

    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(fp32, out)
    meta_file = out / "model.json"
    meta_file.write_text(json.dumps(json.loads(meta_file.read_text(encoding="utf-8")) | {"name": out.name}, indent=2)
                         + "\n", encoding="utf-8")
    quantize_package(out, "int8", calibration, weight_bits=weight_bits)
    return out


# Per precision: CTranslate2's converter flags, and ours (model.import_marian keywords; int8 is made from
# the fp32 package instead: convert_models).
CT2_CONVERT = {"fp32": [], "int8": ["--quantization", "int8"], "fp16": ["--quantization", "float16"]}
OURS_IMPORT = {"fp32": {}, "fp16": {"fp16": True}}
# What each device compares: precisions, and the large batch of the headline ratios.
DEVICE_PLAN = {"cpu": (("fp32", "int8"), 32), "cuda": (("fp32", "fp16"), 64)}


def ours_runner(package: Path, *, beam: int, max_length: int, threads: int, device: str = "cpu", outputs=None,
                inter: int = 1, shared: bool = False):
    """run(batch of id lists) -> target tokens; with `outputs` (a list) each best hypothesis's ids are
    appended to it. inter > 1: as CTranslate2's inter_threads, the batch is cut into `inter` sub-batches
    that `inter` engines (one session each, `threads` threads) search at once from a thread pool
    (onnxruntime releases the GIL while a graph runs); the server does the same with --workers. shared:
    one engine (one session, one copy of the weights) searches them all at once instead, as CTranslate2's
    workers share one copy of the model."""
    from service.inference.engine import Engine
    from service.shared.options import SearchOptions

    engines = [Engine(package, device=device, intra_op_threads=threads) for _ in range(1 if shared else inter)]
    engines *= inter // len(engines)
    pool = cf.ThreadPoolExecutor(inter) if inter > 1 else None
    options = SearchOptions(beam_size=beam, max_length_a=0, max_length_b=max_length, max_length=max_length,
                            length_rule="ctranslate2")

    def run(batch: list[list[int]]) -> int:
        if pool is None:
            found = engines[0].search(batch, options)
        else:
            size = math.ceil(len(batch) / inter)
            parts = [batch[i:i + size] for i in range(0, len(batch), size)]
            found = [h for part in pool.map(lambda e, b: e.search(b, options), engines, parts) for h in part]
        hyps = [h[0] for h in found]
        if outputs is not None:
            outputs.extend(h.tokens for h in hyps)
        # + eos where there is one, as CTranslate2 counts: under its rule a cut output has none
        return sum(len(h.tokens) + h.finished for h in hyps)
    return run


# Process-wide settings choose_ct2_env tries; "defaults" means none of them set.
CT2_ENV = ("CT2_USE_MKL", "CT2_FORCE_CPU_ISA", "OMP_WAIT_POLICY")


def ct2_defaults() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in CT2_ENV}


def ct2_report(model: Path, env: dict[str, str], device: str = "cpu") -> dict[str, str]:
    """What CTranslate2 says it runs with under `env` (CT2_VERBOSE=1, in a child process: these settings
    are read once per process): ISA, MKL, GEMM backends, compute type; {"error": ...} if it refuses."""
    code = ("import sys, ctranslate2; t = ctranslate2.Translator(sys.argv[1], device=sys.argv[2], intra_threads=1); "
            "t.translate_batch([['</s>']], max_decoding_length=2)")
    r = subprocess.run([sys.executable, "-c", code, str(model), device], capture_output=True, text=True, timeout=300,
                       env=ct2_defaults() | env | {"CT2_VERBOSE": "1"})
    if r.returncode:
        return {"error": (r.stderr.strip().splitlines() or ["exit status %d" % r.returncode])[-1]}
    out = {}
    for key, pattern in (("ISA", r"Selected ISA: (\S+)"), ("MKL", r"Use Intel MKL: (\S+)"),
                         ("GEMM_S8", r"GEMM_S8 backend: ([^(\n]+)"), ("SGEMM", r"SGEMM backend: ([^(\n]+)"),
                         ("compute type", r"Selected compute type: (\S+)")):
        m = re.search(pattern, r.stderr)
        if m:
            out[key] = m.group(1).strip()
    return out


def probe_env(args_file: Path) -> None:
    """Child side of choose_ct2_env: times one environment, prints JSON."""
    spec = json.loads(args_file.read_text(encoding="utf-8"))
    pieces, best = spec["pieces"], {}
    for intra in spec["threads"]:
        for size in (1, spec["batch"]):
            groups = batches(pieces, size)[: 8 if size == 1 else 2]
            run = ct2_runner(Path(spec["model"]), beam=4, max_length=spec["max_length"], threads=intra)
            r = max((measure(run, groups) for _ in range(2)), key=lambda r: r["tok_s"])
            if r["tok_s"] > best.get(size, {}).get("tok_s", 0):
                best[size] = r | {"intra": intra}
    print(json.dumps({str(k): v for k, v in best.items()}))


def choose_ct2_env(model: Path, pieces: list[list[str]], *, batch: int, max_length: int, facts: dict,
                   work: Path) -> tuple[dict[str, str], list[dict]]:
    """CTranslate2's process-wide settings: its defaults, the other GEMM backend (MKL is its default on
    Intel CPUs only, so CT2_USE_MKL=0 changes nothing on AMD, where =1 is the one to try), and OpenMP
    threads that sleep at once instead of spinning (OMP_WAIT_POLICY=PASSIVE). Each is timed in a child
    process at beam 4, batch 1 and `batch`; the best geometric mean of the two tok/s wins."""
    default = ct2_report(model, {})
    candidates = [{}, {"CT2_USE_MKL": "0" if default.get("MKL") == "true" else "1"}, {"OMP_WAIT_POLICY": "PASSIVE"}]
    spec = work / "probe.json"
    spec.write_text(json.dumps({"model": str(model), "pieces": pieces, "batch": batch, "max_length": max_length,
                                "threads": sorted({facts["cores"], 1})}), encoding="utf-8")
    rows = []
    for env in candidates:
        label = " ".join(f"{k}={v}" for k, v in env.items()) or "defaults"
        report = default if not env else ct2_report(model, env)
        if "error" in report:
            rows.append({"env": env, "label": label, "report": report, "score": 0.0})
            print(f"CTranslate2 with {label}: refused ({report['error']})", flush=True)
            continue
        r = subprocess.run([sys.executable, __file__, "--probe-env", str(spec)], capture_output=True, text=True,
                           env=ct2_defaults() | env, timeout=600, cwd=ROOT)
        if r.returncode:
            raise RuntimeError(f"probing CTranslate2 with {label} failed: {r.stderr[-2000:]}")
        best = json.loads(r.stdout.strip().splitlines()[-1])
        one, many = best["1"], best[str(batch)]
        rows.append({"env": env, "label": label, "report": report, "one": one, "many": many,
                     "score": math.sqrt(one["tok_s"] * many["tok_s"])})
        print(f"CTranslate2 with {label} ({', '.join(f'{k} {v}' for k, v in report.items())}): beam 4 batch 1 "
              f"p50 {one['p50_ms']:.1f} ms (intra {one['intra']}), batch {batch} {many['tok_s']:,.0f} tok/s "
              f"(intra {many['intra']})", flush=True)
    return max(rows, key=lambda r: r["score"])["env"], rows


def read_references(data: Path | None, n: int) -> list[str] | None:
    """The second column of --data for the first n sentences; None (and why) without one."""
    if data is None:
        return None
    rows = [line.split("\t") for line in data.read_text(encoding="utf-8").splitlines() if line.strip()]
    if len(rows) < n or any(len(r) < 2 for r in rows[:n]):
        print(f"no BLEU: {data} has {len(rows)} rows (--sentences {n} would repeat them) or lacks references",
              flush=True)
        return None
    return [r[1] for r in rows[:n]]


def quality(work: Path, *, ids: list[list[int]], pieces: list[list[str]], references: list[str], tok,
            precisions: tuple[str, ...], batch: int, args) -> list[dict]:
    """Each precision's beam-4 translations by both engines at `batch`: sacreBLEU, chrF, and how many
    outputs are the same piece for piece."""
    import sacrebleu

    out = []
    for precision in precisions:
        ct2_out, ours_out = [], []
        common = dict(beam=4, max_length=args.max_length, threads=args.threads, device=args.device)
        run = ct2_runner(work / f"ct2-{precision}", outputs=ct2_out, **common)
        for g in batches(pieces, batch):
            run(g)
        run = ours_runner(work / f"ours-{precision}", outputs=ours_out, **common)
        for g in batches(ids, batch):
            run(g)
        ours_pieces = [tok.convert_ids_to_tokens(t) for t in ours_out]
        ct2_text = [tok.convert_tokens_to_string(p) for p in ct2_out]
        ours_text = [tok.convert_tokens_to_string(p) for p in ours_pieces]
        ct2, ours = sacrebleu.corpus_bleu(ct2_text, [references]), sacrebleu.corpus_bleu(ours_text, [references])
        out.append({"precision": precision, "n": len(references), "ct2": ct2, "ours": ours,
                    "ct2_chrf": sacrebleu.corpus_chrf(ct2_text, [references]),
                    "ours_chrf": sacrebleu.corpus_chrf(ours_text, [references]),
                    "same": sum(a == b for a, b in zip(ct2_out, ours_pieces)),
                    # rounded first, so a difference too small to show reads +0.00, not -0.00
                    "difference": round(ours.score - ct2.score, 2) + 0.0})
        print(f"BLEU {precision}: CTranslate2 {ct2.score:.2f}, ours {ours.score:.2f}; "
              f"same translation {out[-1]['same']} of {len(references)}", flush=True)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--checkpoint", help="our run directory, exported with model.export_marian")
    src.add_argument("--marian", help="a Marian (save_pretrained) directory")
    src.add_argument("--package", type=Path, help="a translation package of ours (weights read from its graphs)")
    p.add_argument("--data", type=Path, help="TSV whose first column is the source (default: the tests' 64 sentences)")
    p.add_argument("--sentences", type=int, default=256, help="sentences per configuration")
    p.add_argument("--calibration", type=Path, help="TSV whose first column sets our int8 package's activation "
                   "scales (default: sentences not measured: --data's other rows, dev.tsv beside --data, or the "
                   "German side of tests/fixtures/langid-heldout.tsv)")
    add_weight_bits_flag(p)                 # our int8 package's, as model.export takes it
    p.add_argument("--max-length", type=int, default=48, help="output budget in tokens, eos included")
    p.add_argument("--device", choices=sorted(DEVICE_PLAN), default="cpu", help="cpu: fp32 and int8 at batch 32; "
                   "cuda: fp32 and fp16 at batch 64 (CTranslate2 and onnxruntime-gpu on the first GPU)")
    p.add_argument("--threads", type=int, help="intra-op threads for both engines, no choosing (default: each "
                   "engine's best of 1, the physical cores and the logical CPUs this process may use, chosen "
                   "per precision and batch size; CTranslate2's inter_threads and environment too)")
    p.add_argument("--served-workers", type=int, help="the server's inference workers (default: usable cores over "
                   "--served-threads, so one worker per core: while one runs Python between steps, another runs "
                   "the model)")
    p.add_argument("--served-threads", type=int, default=1, help="onnxruntime threads per server worker")
    p.add_argument("--quick", action="store_true", help="64 sentences, budget 32, 5 passes (about 4 minutes on "
                   "2 cores)")
    p.add_argument("--repeat", type=int, help="passes per configuration, engines taking turns; the best pass of "
                   "each is reported (default 3, or 5 with --quick: short passes are the noisiest)")
    p.add_argument("--no-http", action="store_true", help="skip the served measurement")
    p.add_argument("--out", type=Path, help="also write the results as Markdown here")
    p.add_argument("--probe-env", type=Path, help=argparse.SUPPRESS)     # choose_ct2_env's child processes
    return p


@dataclass
class Plan:
    """What the options and this machine decide: whether each engine's settings are chosen by short passes
    (`tune`), the precisions compared, the large batch of the headline ratios, and the CPU's facts."""

    facts: dict
    tune: bool
    precisions: tuple[str, ...]
    large: int

    @property
    def low(self) -> str:
        """int8 on CPU, fp16 on a GPU: what is served."""
        return self.precisions[-1]


def settle_options(p: argparse.ArgumentParser, args: argparse.Namespace, facts: dict) -> Plan:
    """The defaults that depend on the machine and --quick, and the checks argparse cannot make."""
    tune = args.threads is None and args.device == "cpu"
    if args.threads is None:
        args.threads = 1 if args.device == "cuda" else facts["cores"]
    if args.quick:
        args.sentences, args.max_length = 64, 32
    if args.repeat is None:
        args.repeat = 5 if args.quick else 3
    for name in ("repeat", "served_threads", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.served_workers is None:
        args.served_workers = 1 if args.device == "cuda" else max(1, facts["cores"] // args.served_threads)
    if args.device == "cuda":
        import ctranslate2
        import onnxruntime
        if (not ctranslate2.get_cuda_device_count()
                or "CUDAExecutionProvider" not in onnxruntime.get_available_providers()):
            p.error("--device cuda needs a GPU that CTranslate2 sees and onnxruntime-gpu "
                    "(pip install -e '.[gpu,bench]'); this machine has "
                    f"{ctranslate2.get_cuda_device_count()} CUDA devices for CTranslate2 and onnxruntime providers "
                    f"{onnxruntime.get_available_providers()}")
    precisions, large = DEVICE_PLAN[args.device]
    return Plan(facts, tune, precisions, large)


def marian_weights(args: argparse.Namespace, work: Path) -> tuple[Path, str]:
    """The Marian directory both engines are built from, and how the report names its weights."""
    if args.checkpoint:
        from model.export_marian import export_marian
        return export_marian(args.checkpoint, work / "marian"), f"{args.checkpoint}, via model.export_marian"
    if args.package:
        from model.export_marian import export_package_marian
        # zero_bos: a learned <s> embedding (packages trained before zero_bos_embedding) would run in
        # ours but not in CTranslate2, which starts decoders from zeros; both get zeros instead.
        marian = export_package_marian(args.package, work / "marian", zero_bos=True)
        return marian, (f"{args.package}, read back out of its graphs by model.upgrade and written by "
                        "model.export_marian with a zero <s> embedding (CTranslate2 starts decoders from zeros; "
                        "models trained before zero_bos_embedding learned one)")
    if args.marian:
        return Path(args.marian), args.marian
    marian = build_marian(work / "marian", ROOT / "models" / "de-en" / "spm.model")
    return marian, "a Marian model built offline: small preset shape over models/de-en's vocabulary, random weights"


def convert_models(marian: Path, work: Path, precisions: tuple[str, ...], tag: list[int],
                   calibration: list[str] | None = None, weight_bits: int = INT8_DEFAULT_WEIGHT_BITS) -> None:
    """work/ct2-{precision} (ct2-transformers-converter) and work/ours-{precision}: model.import_marian, and
    for int8 the fp32 package made int8-static over the `calibration` sentences (int8_static_copy), its weights
    in `weight_bits`."""
    from model.import_marian import import_marian

    def ours(precision: str) -> Path:
        out = work / f"ours-{precision}"
        meta_file = Path(import_marian(marian, out, source_lang="de", target_lang="en", **OURS_IMPORT[precision]))
        if tag:
            meta = json.loads(meta_file.read_text())
            meta_file.write_text(json.dumps(meta | {"target_tags": {"en": tag[0]}}, indent=2) + "\n")
        return out

    converter = Path(sys.executable).parent / "ct2-transformers-converter"
    for precision in precisions:
        subprocess.run([str(converter), "--model", str(marian), "--output_dir", str(work / f"ct2-{precision}"),
                        *CT2_CONVERT[precision]], check=True, capture_output=True)
        if precision != "int8":
            ours(precision)
            continue
        if not calibration:
            raise ValueError("int8 needs calibration sentences")
        fp32 = work / "ours-fp32" if (work / "ours-fp32" / "model.json").is_file() else ours("fp32")
        int8_static_copy(fp32, work / "ours-int8", [(s, "en") for s in calibration], weight_bits)


@dataclass
class Inputs:
    """The sentences in --data's order, and sorted by length (`order`) as both engines read them: our ids
    and CTranslate2's pieces."""

    sentences: list[str]
    order: list[int]
    ids: list[list[int]]
    pieces: list[list[str]]


def encode_inputs(args: argparse.Namespace, tok, tag: list[int]) -> Inputs:
    sentences = read_sentences(args.data, args.sentences)
    encoded = [tag + tok(s).input_ids for s in sentences]
    order = sorted(range(len(sentences)), key=lambda i: len(encoded[i]))
    ids = [encoded[i] for i in order]
    return Inputs(sentences, order, ids, [tok.convert_ids_to_tokens(i) for i in ids])


def make_runner(work: Path, args: argparse.Namespace, engine: str, precision: str, beam: int, intra: int,
                inter: int, shared: bool = False):
    if engine == "ctranslate2":
        return ct2_runner(work / f"ct2-{precision}", beam=beam, max_length=args.max_length, threads=intra,
                          inter=inter, device=args.device)
    return ours_runner(work / f"ours-{precision}", beam=beam, max_length=args.max_length, threads=intra,
                       inter=inter, device=args.device, shared=shared)


def pick_threads(args: argparse.Namespace, plan: Plan, work: Path, engine: str, precision: str, beam: int,
                 size: int, groups: list[list]) -> tuple[tuple[int, int], dict]:
    """The engine's (intra, inter[, shared]) threads for this search, precision and batch size, and each
    candidate's tok/s (printed when there was a choice); --threads N leaves none. Ours also tries its
    sub-batches on one shared engine (ours_runner's `shared`)."""
    candidates = thread_candidates(plan.facts, size, engine) if plan.tune else [(args.threads, 1)]
    candidates += [(1, n, True) for i, n in candidates if engine == "ours" and i == 1 and n > 1]
    if len(candidates) == 1:
        return candidates[0], {}
    pick = choose_threads(lambda *c: make_runner(work, args, engine, precision, beam, *c),
                          groups[:8 if size == 1 else 2], candidates)
    print(f"{engine:12} {precision} beam {beam} batch {size:2} threads: " + ", ".join(
        f"{describe_threads(engine, *c)} {t:,.0f} tok/s" for c, t in pick[1].items())
        + f" -> {describe_threads(engine, *pick[0])}", flush=True)
    return pick


def measure_speed(args: argparse.Namespace, plan: Plan, work: Path, inputs: Inputs) -> list[dict]:
    """Both engines in each precision at beam 4 and greedy, batch 1 and the large batch: one row each."""
    rows, chosen = [], {}
    for beam in (4, 1):
        for size in (1, plan.large):
            runs = {}
            for engine, precision in [(e, p) for p in plan.precisions for e in ("ctranslate2", "ours")]:
                groups = batches(inputs.pieces if engine == "ctranslate2" else inputs.ids, size)
                if size == 1:
                    groups = groups[: max(16, len(groups) // 4)]   # batch 1 is slow; a sample is enough
                key = engine, precision, size, beam
                if key not in chosen:
                    chosen[key] = pick_threads(args, plan, work, engine, precision, beam, size, groups)
                runs[engine, precision] = make_runner(work, args, engine, precision, beam, *chosen[key][0]), groups
            for (engine, precision), r in best_passes(runs, args.repeat).items():
                settings = describe_threads(engine, *chosen[engine, precision, size, beam][0])
                rows.append({"engine": engine, "precision": precision, "beam": beam, "batch": size,
                             "settings": settings} | r)
                print(f"{engine:12} {precision} beam {beam} batch {size:2}: {r['tok_s']:8.0f} tok/s  "
                      f"p50 {r['p50_ms']:8.1f} ms  ({settings})", flush=True)
    return rows


@dataclass
class Measured:
    """Everything the report is made of, from one run in a temporary directory."""

    what: str
    sentences: list[str]
    env: dict[str, str]
    env_rows: list[dict]
    ct2_in_use: dict[str, str]
    rows: list[dict]
    bleu: list[dict]
    http: dict | None
    int8: str | None = None         # our int8 package's form and calibration text, for the header


def run_all(args: argparse.Namespace, plan: Plan) -> Measured:
    """The weights, both engines' models in every precision, the inputs, CTranslate2's environment, then
    speed, quality (where there are references) and the served figures."""
    from transformers import MarianTokenizer

    work = Path(tempfile.mkdtemp(prefix="vs-ct2-"))
    try:
        marian, what = marian_weights(args, work)
        tok = MarianTokenizer.from_pretrained(str(marian))
        # A multi-directional model of ours reads its target tag (<2en>) first: both engines get it, and
        # the imported packages name it, so the served engine adds it to each request as ours does.
        tag = target_tag(args.package, tok)
        calibration, int8 = None, None
        if "int8" in plan.precisions:
            calibration, named = calibration_sentences(args.data, read_sentences(args.data, args.sentences),
                                                       args.calibration)
            int8 = (f"int8-static (constant activation scales, model/quantize.py), {args.int8_weight_bits}-bit "
                    f"weights, calibrated on {named}")
            print(f"our int8: {int8}", flush=True)
        convert_models(marian, work, plan.precisions, tag, calibration, args.int8_weight_bits)
        inputs = encode_inputs(args, tok, tag)
        env, env_rows = {}, []
        if plan.tune:
            # Read once when CTranslate2's library loads, so they must be in place before this process's
            # first `import ctranslate2`.
            assert "ctranslate2" not in sys.modules
            env, env_rows = choose_ct2_env(work / f"ct2-{plan.low}", inputs.pieces, batch=plan.large,
                                           max_length=args.max_length, facts=plan.facts, work=work)
            os.environ.update(env)
        ct2_in_use = ct2_report(work / f"ct2-{plan.low}", env, args.device)
        rows = measure_speed(args, plan, work, inputs)
        references = None if not (args.checkpoint or args.package or args.marian) else read_references(
            args.data, args.sentences)
        bleu = []
        if references is not None:
            bleu = quality(work, ids=inputs.ids, pieces=inputs.pieces,
                           references=[references[i] for i in inputs.order], tok=tok, precisions=plan.precisions,
                           batch=plan.large, args=args)
        # 4x the sentences: 32 clients with two requests each would measure mostly ramp-up and tail.
        http = None if args.no_http else served(
            work / f"ours-{plan.low}", inputs.sentences * 4, workers=args.served_workers, threads=args.served_threads,
            max_length=args.max_length, repeat=args.repeat, device=args.device, max_batch=plan.large)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Measured(what, inputs.sentences, env, env_rows, ct2_in_use, rows, bleu, http, int8)


def speed_table(by: dict, plan: Plan) -> list[str]:
    lines = ["| search | batch | precision | CTranslate2 tok/s | ours tok/s | ratio | CTranslate2 p50 ms | ours p50 ms "
             "| CTranslate2 threads | our threads |", "|---|---:|---|---:|---:|---:|---:|---:|---|---|"]
    for beam in (4, 1):
        for size in (1, plan.large):
            for precision in plan.precisions:
                c, o = by["ctranslate2", precision, beam, size], by["ours", precision, beam, size]
                lines.append(f"| {'beam 4' if beam > 1 else 'greedy'} | {size} | {precision} | {c['tok_s']:,.0f} | "
                             f"{o['tok_s']:,.0f} | {o['tok_s'] / c['tok_s']:.2f} | {c['p50_ms']:,.1f} | "
                             f"{o['p50_ms']:,.1f} | {c['settings']} | {o['settings']} |")
    return lines


def served_tables(http: dict, served_ratio: float, ct2_one: float, args: argparse.Namespace, plan: Plan,
                  n_sentences: int) -> list[str]:
    """The served figures against CTranslate2's offline ones, and where a request's time goes."""
    low, large = plan.low, plan.large
    lines = ["", f"| served (HTTP, {low}, beam 4, 32 concurrent clients on keep-alive sockets, "
             f"{4 * n_sentences} requests, server --device {args.device} --workers {args.served_workers} "
             f"--threads {args.served_threads}) | value |", "|---|---:|",
             f"| tok/s | {http['tok_s']:,.0f} |",
             f"| over CTranslate2 {low} offline beam 4 batch {large} | {served_ratio:.2f} |",
             f"| request p50 ms under load | {http['p50_ms']:,.1f} |",
             f"| single sentence alone, p50 ms (CTranslate2 {low} batch 1: {ct2_one:,.1f}) | "
             f"{http['alone_p50_ms']:,.1f} |"]
    st, lone = http["stages"], http["alone_stages"]
    own = (st["response"] + st["HTTP"]) / st["end to end"]
    lines += ["", "| served, per request | under load: mean ms | share | alone: mean ms | share |",
              "|---|---:|---:|---:|---:|"]
    lines += [f"| {name} | {ms:,.1f} | {ms / st['end to end']:.0%} | {lone[name]:,.1f} | "
              f"{lone[name] / lone['end to end']:.0%} |" for name, ms in st.items()]
    lone_own = lone["response"] + lone["HTTP"]
    lines += [f"| the service's own overhead (response + HTTP) | {st['response'] + st['HTTP']:,.1f} | {own:.0%} | "
              f"{lone_own:,.1f} | {lone_own / lone['end to end']:.0%} |"]
    return lines


def bleu_table(bleu: list[dict], large: int) -> list[str]:
    lines = ["", f"| beam 4, batch {large} | CTranslate2 BLEU / chrF | ours BLEU / chrF | BLEU difference | "
             "same translation |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {b['precision']} | {b['ct2'].score:.2f} / {b['ct2_chrf'].score:.2f} | {b['ours'].score:.2f} / "
              f"{b['ours_chrf'].score:.2f} | {b['difference']:+.2f} | "
              f"{b['same']} of {b['n']} |" for b in bleu]
    return lines


def env_table(env_rows: list[dict], env: dict[str, str], plan: Plan) -> list[str]:
    lines = ["", f"| CTranslate2 environment ({plan.low}, beam 4, best of threads 1 and {plan.facts['cores']}) | "
             f"as CTranslate2 reports it | batch 1 p50 ms | batch {plan.large} tok/s | chosen |",
             "|---|---|---:|---:|---|"]
    lines += [f"| {r['label']} | {', '.join(f'{k} {v}' for k, v in r['report'].items())} | "
              + (f"{r['one']['p50_ms']:,.1f} (intra {r['one']['intra']}) | {r['many']['tok_s']:,.0f} "
                 f"(intra {r['many']['intra']}) | " if "one" in r else "refused | refused | ")
              + ("yes" if r["env"] == env else "") + " |" for r in env_rows]
    return lines


def header_lines(args: argparse.Namespace, argv, plan: Plan, load_start: tuple, m: Measured) -> list[str]:
    """The command, date, machine, load, versions and settings the figures were measured with."""
    import ctranslate2
    import onnxruntime

    facts = plan.facts
    command = "python benchmarks/vs_ctranslate2.py " + " ".join(argv if argv is not None else sys.argv[1:])
    load_end = os.getloadavg()
    in_use = ", ".join(f"{k} {v}" for k, v in m.ct2_in_use.items())
    return [f"- command: `{command.strip()}`", f"- date: {datetime.date.today()}",
            f"- machine: {describe_cpu(facts)}; {platform.system()} {platform.release()}"
            + (f"; GPU: {gpu_name()}" if args.device == "cuda" else ""),
            f"- load average (1 min) at the start and the end: {load_start[0]:.2f}, {load_end[0]:.2f} on "
            f"{facts['usable']} CPUs" + (" (other processes shared the CPUs: expect noise)"
                                        if max(load_start[0], load_end[0]) > 0.5 * facts["usable"] else ""),
            f"- versions: ctranslate2 {ctranslate2.__version__}, onnxruntime {onnxruntime.__version__}",
            f"- CTranslate2 as measured: {' '.join(f'{k}={v}' for k, v in m.env.items()) or 'its default environment'}"
            f" ({in_use}); supported compute types on {args.device}: "
            f"{', '.join(sorted(ctranslate2.get_supported_compute_types(args.device)))}",
            "- threads: " + (f"chosen for each search (beam 4, greedy), engine, precision and batch size, "
                             f"the most tok/s of 2 short passes each over 1 thread, the {facts['cores']} usable "
                             f"physical cores and the {facts['logical_usable']} usable logical CPUs "
                             f"and 1 thread × {facts['cores']} sub-batches at once (CTranslate2's workers, our "
                             "engines in a thread pool: one session each, or one shared as CTranslate2's workers "
                             "share the model); ours sleep between operators (the engine's default)"
                             if plan.tune
                             else f"{args.threads} intra-op threads for each engine (--threads)"),
            f"- weights: {m.what}",
            *([f"- our int8 package: {m.int8}"] if m.int8 else []),
            f"- inputs: {len(m.sentences)} sentences ({args.data or 'the tests’ 64 Ding sentences, repeated'}), "
            f"sorted by length; output budget {args.max_length} tokens; length penalty 1.0",
            f"- each engine figure: the best of {args.repeat} passes, the engines taking turns"
            + ("" if args.no_http else f"; served: the best of {args.repeat} passes on one server")]


def report(args: argparse.Namespace, argv, plan: Plan, load_start: tuple, m: Measured) -> None:
    """Prints the header, the tables and the ratio lines; with --out, writes them as Markdown too."""
    by = {(r["engine"], r["precision"], r["beam"], r["batch"]): r for r in m.rows}

    def tok_s(engine, precision, beam=4, batch=plan.large):
        return by[engine, precision, beam, batch]["tok_s"]

    ratio = {p: tok_s("ours", p) / tok_s("ctranslate2", p) for p in plan.precisions}
    lines = speed_table(by, plan)
    served_ratio = None
    if m.http:
        served_ratio = m.http["tok_s"] / tok_s("ctranslate2", plan.low)
        lines += served_tables(m.http, served_ratio, by["ctranslate2", plan.low, 4, 1]["p50_ms"], args, plan,
                               len(m.sentences))
    if m.bleu:
        lines += bleu_table(m.bleu, plan.large)
    if m.env_rows:
        lines += env_table(m.env_rows, m.env, plan)
    table = "\n".join(lines)
    header = header_lines(args, argv, plan, load_start, m)
    print()
    print("\n".join(header))
    print()
    print(table)
    bleu_line = ("bleu_minus_ctranslate2 " + " ".join(f"{b['precision']}={b['difference']:+.2f}" for b in m.bleu)
                 if m.bleu else None)
    if bleu_line:
        print(bleu_line)
    final = ("ratio_vs_ctranslate2 " + " ".join(f"engine_{p}={ratio[p]:.2f}" for p in plan.precisions)
             + f" served={'n/a' if served_ratio is None else f'{served_ratio:.2f}'}")
    if args.device == "cuda":   # the GPU goal for one sentence: ms per decoded token, beam 4, batch 1
        final += f" batch1_ms_per_token={1000 / tok_s('ours', plan.low, batch=1):.2f}"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(f"# Our engine against CTranslate2 ({args.device.upper()})\n\n" + "\n".join(header)
                            + "\n\n" + table + (f"\n\n`{bleu_line}`" if bleu_line else "") + f"\n\n`{final}`\n",
                            encoding="utf-8")
    print(final)


def main(argv=None) -> None:
    p = build_parser()
    args = p.parse_args(argv)
    if args.probe_env:
        return probe_env(args.probe_env)
    facts, load_start = cpu_facts(), os.getloadavg()
    plan = settle_options(p, args, facts)
    measured = run_all(args, plan)
    report(args, argv, plan, load_start, measured)


if __name__ == "__main__":
    main()
