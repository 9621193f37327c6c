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
thread of --threads) at 32 concurrent clients, one sentence per request: served tok/s against
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
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def build_marian(out: Path, spm_file: Path) -> Path:
    """A randomly initialised Marian model with the `small` preset's shape over an existing vocabulary."""
    from model.export_marian import write_marian_vocabulary
    from model.tokenizer import Tokenizer
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    from model.transformer import preset

    c = preset("small")
    out.mkdir(parents=True, exist_ok=True)
    pieces = write_marian_vocabulary(Tokenizer(spm_file), out)
    V = len(pieces)
    config = MarianConfig(vocab_size=V, d_model=c.d_model, encoder_layers=c.n_encoder_layers,
                          decoder_layers=c.n_decoder_layers, encoder_attention_heads=c.h, decoder_attention_heads=c.h,
                          encoder_ffn_dim=c.d_ff, decoder_ffn_dim=c.d_ff, max_position_embeddings=512,
                          activation_function="relu", scale_embedding=True, pad_token_id=V - 1,
                          decoder_start_token_id=V - 1, eos_token_id=0, forced_eos_token_id=0, bad_words_ids=[[V - 1]])
    torch.manual_seed(0)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        model.model.shared.weight[V - 1].zero_()   # the decoder starts from a zero vector, as CTranslate2 assumes
    model.save_pretrained(out)
    MarianTokenizer(str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json"),
                    source_lang="de", target_lang="en").save_pretrained(out)
    return out


def read_sentences(data: Path | None, n: int) -> list[str]:
    if data is None:
        sys.path.insert(0, str(ROOT / "tests"))
        from conftest import pairs64
        base = [de for de, _ in pairs64()]
    else:
        base = [line.split("\t")[0] for line in data.read_text(encoding="utf-8").splitlines() if line.strip()]
    return (base * (n // len(base) + 1))[:n]


CALIBRATION_MIN = 32        # fewer unmeasured sentences than this in a source: the next source is tried
HELD_OUT = ROOT / "tests" / "fixtures" / "langid-heldout.tsv"   # lang<TAB>text, 200 German Ding sentences


def first_column(path: Path) -> list[str]:
    return [line.split("\t")[0] for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")]


def calibration_sentences(data: Path | None, measured: list[str], explicit: Path | None = None,
                          limit: int | None = None) -> tuple[list[str], str]:
    """German sentences that set our int8-static package's activation scales (model.calibrate), at most
    `limit` (model.calibrate's CALIBRATION_SENTENCES), and how the report names them: `explicit`'s first
    column, else the first source with at least CALIBRATION_MIN sentences not among `measured` (--data's
    other rows, dev.tsv beside --data, the German side of the tests' held-out language-identification
    file), else the measured sentences themselves."""
    from model.calibrate import CALIBRATION_SENTENCES

    limit = limit or CALIBRATION_SENTENCES
    seen = set(measured)
    if explicit is not None:
        texts = first_column(explicit)[:limit]
        overlap = sum(t in seen for t in texts)
        return texts, (f"{len(texts)} sentences of {explicit} (--calibration), "
                       + (f"{overlap} of them among the measured ones" if overlap else "none of them measured"))
    sources: list[tuple[str, list[str]]] = []
    if data is not None:
        sources.append((f"rows of {data} other than the measured ones", first_column(data)))
        dev = data.parent / "dev.tsv"
        if dev.is_file() and dev.resolve() != data.resolve():
            sources.append((str(dev), first_column(dev)))
    else:
        sources.append(("the tests' Ding sentences beyond the measured ones", read_sentences(None, 64)))
    sources.append((f"the German side of {HELD_OUT.relative_to(ROOT)} (Ding sentences)",
                    [line.split("\t", 1)[1] for line in HELD_OUT.read_text(encoding="utf-8").splitlines()
                     if line.startswith("de\t")]))
    for name, texts in sources:
        unmeasured = [t for t in texts if t not in seen][:limit]
        if len(unmeasured) >= CALIBRATION_MIN:
            return unmeasured, f"{len(unmeasured)} sentences not measured here: {name}"
    texts = list(dict.fromkeys(measured))[:limit]
    print(f"note: int8 is calibrated on the measured sentences themselves ({len(texts)}): no other source has "
          f"{CALIBRATION_MIN}", flush=True)
    return texts, f"the measured sentences themselves ({len(texts)}; no other source had {CALIBRATION_MIN})"


def int8_static_copy(fp32: Path, out: Path, calibration: list[tuple[str, str | None]]) -> Path:
    """The fp32 package at `fp32` copied to `out` and quantized there as model.export.write_package quantizes
    one (model.export.quantize_package: int8-static, calibrated on `calibration`)."""
    from model.export import quantize_package

    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(fp32, out)
    meta_file = out / "model.json"
    meta_file.write_text(json.dumps(json.loads(meta_file.read_text(encoding="utf-8")) | {"name": out.name}, indent=2)
                         + "\n", encoding="utf-8")
    quantize_package(out, "int8", calibration)
    return out


def batches(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def measure(run, groups: list[list]) -> dict:
    run(groups[0])                                         # warm-up: first-call allocations
    latencies, tokens = [], 0
    t0 = time.perf_counter()
    for g in groups:
        s = time.perf_counter()
        tokens += run(g)
        latencies.append(time.perf_counter() - s)
    wall = time.perf_counter() - t0
    return {"tok_s": tokens / wall, "p50_ms": statistics.median(latencies) * 1000, "tokens": tokens}


# Per precision: CTranslate2's converter flags, and ours (model.import_marian keywords; int8 is made from
# the fp32 package instead: convert_models).
CT2_CONVERT = {"fp32": [], "int8": ["--quantization", "int8"], "fp16": ["--quantization", "float16"]}
OURS_IMPORT = {"fp32": {}, "fp16": {"fp16": True}}
# What each device compares: precisions, and the large batch of the headline ratios.
DEVICE_PLAN = {"cpu": (("fp32", "int8"), 32), "cuda": (("fp32", "fp16"), 64)}


def ct2_runner(path: Path, *, beam: int, max_length: int, threads: int, device: str = "cpu", outputs=None,
               inter: int = 1):
    """run(batch of piece lists) -> target tokens; with `outputs` (a list) each best hypothesis's pieces
    are appended to it. inter > 1: the batch is cut into `inter` sub-batches that CTranslate2's workers
    translate in parallel, each on `threads` threads."""
    import ctranslate2

    translator = ctranslate2.Translator(str(path), device=device, intra_threads=threads, inter_threads=inter)

    def run(batch: list[list[str]]) -> int:
        # min_decoding_length=1: CTranslate2's default and ours (SearchOptions.min_length), no empty translation.
        results = translator.translate_batch(batch, beam_size=beam, max_decoding_length=max_length,
                                             min_decoding_length=1, length_penalty=1.0, return_end_token=True,
                                             max_batch_size=math.ceil(len(batch) / inter) if inter > 1 else 0)
        if outputs is not None:
            outputs.extend([p for p in r.hypotheses[0] if p != "</s>"] for r in results)
        return sum(len(r.hypotheses[0]) for r in results)
    return run


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


def cpu_facts() -> dict:
    """The CPU as this process sees it. `cores`: the physical cores among the CPUs it may use (hyperthread
    siblings counted once), capped by a cgroup quota: os.cpu_count() counts the host's logical CPUs, which
    in a container or on an SMT machine is more threads than can run at once."""
    try:
        info = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        info = ""
    field = lambda name: next((line.split(":", 1)[1].strip() for line in info.splitlines()   # noqa: E731
                               if line.split(":", 1)[0].strip() == name), "")
    usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    siblings = set()
    for cpu in usable:
        f = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        siblings.add(f.read_text().strip() if f.exists() else str(cpu))
    quota = None
    try:
        limit, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        quota = None if limit == "max" else int(limit) / int(period)
    except (OSError, ValueError):
        pass
    cores = max(1, min(len(siblings), math.floor(quota) if quota else len(siblings)))
    flags = set(field("flags").split())
    return {"model": field("model name") or field("Hardware") or platform.processor() or platform.machine(),
            "logical": os.cpu_count() or 1, "usable": len(usable), "physical": len(siblings), "quota": quota,
            "cores": cores, "logical_usable": max(cores, min(len(usable), math.floor(quota) if quota else len(usable))),
            "isa": [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8") if f in flags]}


def describe_cpu(facts: dict) -> str:
    quota = f", cgroup quota {facts['quota']:g} CPUs" if facts["quota"] else ", no cgroup CPU quota"
    return (f"{facts['model']}; {facts['logical']} logical CPUs, {facts['usable']} usable by this process, "
            f"{facts['physical']} physical cores among them{quota}; flags {' '.join(facts['isa']) or 'none of note'}")


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


def thread_candidates(facts: dict, batch: int, engine: str) -> list[tuple[int, int]]:
    """(intra, inter) pairs worth trying: 1 thread (no barrier to stall), all physical cores, all logical
    CPUs where hyperthreads add some, and sub-batches in parallel, one thread each."""
    out = [(1, 1)]
    for n in (facts["cores"], facts["logical_usable"]):
        if (n, 1) not in out:
            out.append((n, 1))
    if batch > 1 and facts["cores"] > 1:
        out.append((1, facts["cores"]))
    return out


def describe_threads(engine: str, intra: int, inter: int, shared: bool = False) -> str:
    if engine == "ctranslate2" or inter > 1:
        return f"intra {intra} × inter {inter}" + (", one session" if shared else "")
    return f"intra {intra}"


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


def choose_threads(make, groups: list[list], candidates: list[tuple[int, int]]) -> tuple[tuple[int, int], dict]:
    """The candidate (intra, inter[, shared]) with the most tok/s over a sample of `groups`, best of 2 short
    passes each; make(*candidate) -> run. Returns it and every candidate's tok/s."""
    tried = {}
    for c in candidates:
        run = make(*c)
        tried[c] = max(measure(run, groups)["tok_s"] for _ in range(2))
    return max(tried, key=tried.get), tried


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


def target_tag(package: Path | None, tok, target: str = "en") -> list[int]:
    """[the Marian id of the package's <2en> tag] for a multi-directional package of ours, else []."""
    if package is None:
        return []
    meta = json.loads((package / "model.json").read_text(encoding="utf-8"))
    tags = meta.get("target_tags") or {}
    if not tags:
        return []
    if target not in tags:
        raise SystemExit(f"{package} has target tags for {sorted(tags)}, not {target!r}")
    import sentencepiece as spm
    piece = spm.SentencePieceProcessor(model_file=str(package / meta["tokenizer"]["source"])).id_to_piece(tags[target])
    tag = tok.convert_tokens_to_ids(piece)
    if tag == tok.unk_token_id:
        raise SystemExit(f"the Marian vocabulary has no {piece!r}")
    return [tag]


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


def gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    return out.splitlines()[0] if out else "unknown (nvidia-smi did not answer)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def served(package: Path, sentences: list[str], *, workers: int, threads: int, max_length: int,
           clients: int = 32, repeat: int = 1, device: str = "cpu", max_batch: int = 32) -> dict:
    """The HTTP service at `clients` concurrent clients, one sentence per request, beam 4: the best of
    `repeat` passes over the sentences, on one server (each pass's figures come from that pass), and
    the lowest p50 of `repeat` runs of 16 sentences sent one at a time, with that run's stages."""
    import httpx

    port = free_port()
    cmd = [sys.executable, "-m", "service", "--model", str(package), "--port", str(port),
           "--workers", str(workers), "--threads", str(threads), "--device", device,
           "--max-batch-size", str(max_batch), "--max-output-tokens", str(max_length)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        else:
            raise RuntimeError("the service did not become ready")
        info = httpx.get(url + "/info", timeout=10)
        device_used = info.json().get("device", "unknown") if info.status_code == 200 else "unknown"
        body = {"source_lang": "de", "target_lang": "en", "beam_size": 4, "max_length": max_length}
        with httpx.Client(timeout=120, limits=httpx.Limits(max_connections=clients)) as client:
            def one(text: str) -> tuple[int, float, dict]:
                s = time.perf_counter()
                r = client.post(url + "/translate", json=body | {"text": text})
                r.raise_for_status()
                out = r.json()
                return out["translations"][0]["output_tokens"] + 1, time.perf_counter() - s, out["timings"]
            one(sentences[0])
            best: dict = {}
            alone_p50, alone_stages = float("inf"), {}
            for _ in range(repeat):
                # Single-sentence latency with nothing else in flight, then throughput under load.
                alone = [one(t) for t in sentences[:16]]
                p50 = statistics.median(r[1] for r in alone) * 1000
                if p50 < alone_p50:
                    alone_p50, alone_stages = p50, stages(alone)
                t0 = time.perf_counter()
                with cf.ThreadPoolExecutor(clients) as pool:
                    results = list(pool.map(one, sentences))
                wall = time.perf_counter() - t0
                tok_s = sum(r[0] for r in results) / wall
                if tok_s > best.get("tok_s", 0):
                    best = {"tok_s": tok_s, "p50_ms": statistics.median(r[1] for r in results) * 1000,
                            "stages": stages(results)}
        return best | {"alone_p50_ms": alone_p50, "alone_stages": alone_stages, "device": device_used}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def stages(results: list[tuple[int, float, dict]]) -> dict[str, float]:
    """Mean ms per request in each stage, from the client's clock and the response's `timings`:
    queue (received -> its batch starts: tokenisation, hand-over to the worker, waiting for the
    engine), inference (its batch's engine time), response (detokenisation, hand-back) and HTTP
    (everything outside the handler: parsing, validation, JSON, the network)."""
    n = len(results)
    e2e = sum(r[1] for r in results) * 1000 / n
    queue = sum(r[2]["queue_ms"] for r in results) / n
    inference = sum(r[2]["inference_ms"] for r in results) / n
    handler = sum(r[2]["total_ms"] for r in results) / n
    return {"end to end": e2e, "queue": queue, "inference": inference, "response": handler - queue - inference,
            "HTTP": e2e - handler}


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
                   calibration: list[str] | None = None) -> None:
    """work/ct2-{precision} (ct2-transformers-converter) and work/ours-{precision}: model.import_marian, and
    for int8 the fp32 package made int8-static over the `calibration` sentences (int8_static_copy)."""
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
        int8_static_copy(fp32, work / "ours-int8", [(s, "en") for s in calibration])


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


def best_passes(runs: dict, repeat: int) -> dict:
    """measure() of each (run, groups) in `runs`, the best of `repeat` passes each."""
    # The engines take turns, and each keeps its best pass: a noisy neighbour on a shared
    # machine slows a pass down, never speeds one up.
    best: dict[tuple, dict] = {}
    for _ in range(repeat):
        for key, (run, groups) in runs.items():
            r = measure(run, groups)
            if key not in best or r["tok_s"] > best[key]["tok_s"]:
                best[key] = r
    return best


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
            int8 = f"int8-static (constant activation scales, model/quantize.py), calibrated on {named}"
            print(f"our int8: {int8}", flush=True)
        convert_models(marian, work, plan.precisions, tag, calibration)
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
    lines = ["", f"| served (HTTP, {low}, beam 4, 32 concurrent clients, {4 * n_sentences} requests, "
             f"server --device {args.device} --workers {args.served_workers} --threads {args.served_threads}) "
             "| value |", "|---|---:|",
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
