"""One command from a corpus to an evaluated CPU package and GPU package, inside a wall-clock budget.

    python -m model.recipe --data data/de-en --out runs/recipe --minutes 9 [-- model.train options]

Every stage fits in --minutes, counted from the process's start (a job's own `timeout` counts the same):

1. train: model.train with --deadline-minutes = the budget less --after-training-minutes (tokenizer,
   loading, the final evaluation and the save included); re-running with the same --out resumes;
2. export the final checkpoint (run/checkpoint.pt, so that its weights re-export to the same packages
   anywhere): int8 for CPU serving, fp16 for GPU serving (model.export);
3. evaluate each with `model.evaluate --package` on the test split, greedy and beam 4, right after its
   export; the fp16 package only where onnxruntime has a CUDA provider (the reason is written where it is
   skipped);
4. write MODEL_CARD.md (a draft: command, hardware, wall time per stage, data counts, BLEU/chrF) and
   results.json;
5. cut the files it produced into pieces of at most --piece-mb MB (an xz tar, `outputs.tar.xz.part-NNN`) with
   JOIN.sh, the one command that joins, checks (sha256) and unpacks them: `sh JOIN.sh`.

A SIGTERM stops training with a saved checkpoint (model.train) and, later, the stage under way; the
card and the pieces are written either way.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import platform
import signal
import sys
import lzma
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from . import evaluate, train
from .checkpoint import load_training_checkpoint
from .corpus.tsv import read_pairs
from .export import export_package


@dataclass
class RecipeConfig:
    minutes: float = 9.0                 # the whole command's wall clock, from the process's start
    after_training_minutes: float = 2.5  # kept back from training for export, evaluation and the pieces
    direction: str = "both"              # model.train's --direction; the first one is evaluated
    device: str = "auto"                 # training and fp16 evaluation device: cpu, cuda or auto
    beam: int = 4                        # beam size of the evaluation (greedy runs too)
    bundle: str = "all"                  # what goes into the pieces: all, or spot (what resumes and re-exports)
    piece_mb: float = 15.0               # largest piece, in MB (10^6 bytes)


# The files of a spot job's bundle: the training state (which resumes training and re-exports both
# packages with model.export), the card and the results: 59 MB for the small preset, under a spot
# job's 64 MiB of outputs (packages and best.pt are left out: 60 MB more).
SPOT_FILES = ("run/checkpoint.pt", "run/spm.model", "run/config.json", "run/train_log.jsonl",
              "MODEL_CARD.md", "results.json")


class Terminated(Exception):
    """A SIGTERM between stages."""


def raise_terminated(signum, frame):
    raise Terminated()


def hardware(device: str) -> str:
    cpu = platform.processor() or platform.machine()
    if Path("/proc/cpuinfo").exists():
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), cpu)
    gpu = torch.cuda.get_device_name(0) if device != "cpu" and torch.cuda.is_available() else None
    return f"{gpu + ', ' if gpu else 'no GPU, '}{cpu} ({os.cpu_count()} logical CPUs); torch {torch.__version__}"


def cuda_onnxruntime() -> str | None:
    """None where onnxruntime can run the fp16 package on a GPU, else the reason it cannot."""
    try:
        import onnxruntime
    except ImportError:
        return "onnxruntime is not installed"
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        return (f"onnxruntime {onnxruntime.__version__} has no CUDAExecutionProvider here (providers: "
                f"{', '.join(onnxruntime.get_available_providers())}; install the gpu extra on a GPU machine)")
    return None


def evaluate_package(package: Path, test: Path, direction: str, beam: int, device: str) -> dict:
    """`python -m model.evaluate --package ... --json`, in this process; its JSON."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        evaluate.main(["--package", str(package), "--data", str(test), "--direction", direction,
                       "--beam", str(beam), "--device", device, "--json"])
    return json.loads(buffer.getvalue())


# --- pieces -------------------------------------------------------------------------------------------

class PieceWriter(io.RawIOBase):
    """A write-only stream cut into files `<stem>.part-000`, `-001`, … of at most `piece_bytes`,
    hashing what passes through."""

    def __init__(self, dest: Path, stem: str, piece_bytes: int):
        self.dest, self.stem, self.piece_bytes = dest, stem, piece_bytes
        self.sha256, self.pieces = hashlib.sha256(), []
        self._file, self._left = None, 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        data = memoryview(data).cast("B")
        size = len(data)
        self.sha256.update(data)
        while data:
            if self._left == 0:
                self._roll()
            n = min(self._left, len(data))
            self._file.write(data[:n])
            data, self._left = data[n:], self._left - n
        return size

    def _roll(self) -> None:
        if self._file:
            self._file.close()
        path = self.dest / f"{self.stem}.part-{len(self.pieces):03d}"
        self.pieces.append(path)
        self._file, self._left = open(path, "wb"), self.piece_bytes

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None
        super().close()


PIECES_STEM = "outputs.tar.xz"
JOIN_SCRIPT = """#!/bin/sh
# Joins the pieces written by model.recipe, checks them and unpacks the files beside this script:
#     sh JOIN.sh
set -e
cd "$(dirname "$0")"
cat {stem}.part-* > {stem}
echo "{sha256}  {stem}" | sha256sum -c -
tar -xJf {stem}
rm {stem}
"""


def cut_into_pieces(root: Path, files: list[Path], dest: Path, piece_bytes: int) -> list[Path]:
    """`files` (under `root`) as one xz-compressed tar cut into `dest`/outputs.tar.xz.part-NNN, and
    dest/JOIN.sh. -> the pieces.

    xz at its fastest preset: a small checkpoint goes from 58.9 to 49.6 MB in 6 s on two busy cores (fp32
    weights and fp8/bf16 moments keep little redundancy, so higher presets gain 0.1 MB for 3x the time),
    which brings a resume job's carry-in (checkpoint, corpus, code) under 64 MB."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("outputs.tar*.part-*"):          # a re-run's fewer pieces must not join stale ones
        old.unlink()
    writer = PieceWriter(dest, PIECES_STEM, piece_bytes)
    with lzma.LZMAFile(writer, "w", preset=0) as packed, tarfile.open(fileobj=packed, mode="w|") as tar:
        for f in files:
            tar.add(f, arcname=str(f.relative_to(root)))
    writer.close()
    (dest / "JOIN.sh").write_text(JOIN_SCRIPT.format(stem=PIECES_STEM, sha256=writer.sha256.hexdigest()))
    return writer.pieces


def produced_files(out: Path, bundle: str, pieces: Path) -> list[Path]:
    if bundle == "spot":
        return [out / f for f in SPOT_FILES if (out / f).exists()]
    return sorted(f for f in out.rglob("*") if f.is_file() and pieces not in f.parents
                  and "token-cache" not in f.relative_to(out).parts)      # a cache, rebuilt where needed


# --- the model card -------------------------------------------------------------------------------------

def score_cells(result: dict | None, beam: int) -> str:
    if not result:
        return "– | – | – | –"
    g, b = result["greedy"], result.get(f"beam{beam}", {})
    return f"{g['bleu']:.2f} | {g['chrf']:.2f} | {b.get('bleu', float('nan')):.2f} | {b.get('chrf', float('nan')):.2f}"


def model_card(report: dict) -> str:
    """The card's draft from the recipe's report (results.json)."""
    rc, train_info, results = report["recipe"], report.get("training") or {}, report["evaluation"]
    lines = [f"# Model card (draft written by model.recipe): {train_info.get('preset', '?')} Transformer, "
             f"{', '.join(train_info.get('directions') or [])}", "",
             f"- command: `{report['command']}`",
             f"- hardware: {report['hardware']}",
             f"- wall time: {report['wall_minutes']:.1f} of {rc['minutes']} minutes (from the process's start); "
             + ", ".join(f"{k} {v:.0f} s" for k, v in report["stage_seconds"].items()),
             f"- data ({report['data']}): " + ", ".join(f"{k} {v:,} pairs" for k, v in report["pairs"].items()),
             f"- training: step {train_info.get('step')}, epoch {train_info.get('epoch')}, last dev evaluation "
             f"{json.dumps(train_info.get('last_dev') or {})}",
             ""]
    lines += [f"## Test split, {report['eval_direction']} "
              f"(`python -m model.evaluate --package ... --beam {rc['beam']}`)", "",
              f"| package | precision | BLEU greedy | chrF greedy | BLEU beam {rc['beam']} | chrF beam {rc['beam']} |",
              "|---|---|---:|---:|---:|---:|"]
    for name, r in results.items():
        lines.append(f"| {name} | {name.split('-')[-1]} | {score_cells(r.get('scores'), rc['beam'])} |")
    lines.append("")
    lines += [f"- {name}: not evaluated: {r['skipped']}" for name, r in results.items() if r.get("skipped")]
    if report.get("stopped"):
        lines.append(f"- stopped early: {report['stopped']}")
    if "no GPU" in report["hardware"]:
        lines.append("- GPU figures (training tokens/s, fp16 scores) are left for the first run on a GPU.")
    return "\n".join(lines) + "\n"


# --- the command -------------------------------------------------------------------------------------------

CHOICES = {"bundle": ["all", "spot"], "device": ["auto", "cpu", "cuda"]}


def parse(argv) -> tuple[argparse.Namespace, RecipeConfig, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="corpus directory from model.data (train.tsv, dev.tsv, test.tsv)")
    p.add_argument("--out", required=True, help="output directory; a re-run with the same one resumes its training")
    p.add_argument("--pieces", default=None, help="where the pieces and JOIN.sh go (default: <out>/pieces)")
    for f, default in asdict(RecipeConfig()).items():
        p.add_argument("--" + f.replace("_", "-"), type=type(default), default=default, choices=CHOICES.get(f))
    p.add_argument("train_args", nargs=argparse.REMAINDER,
                   help="after --: model.train options as they are, e.g. -- --preset tiny --tokenizer spm.model")
    args = p.parse_args(argv)
    rc = RecipeConfig(**{f: getattr(args, f) for f in asdict(RecipeConfig())})
    return args, rc, [a for a in args.train_args if a != "--"]


def training_summary(run: Path) -> dict:
    config = json.loads((run / "config.json").read_text())
    state = load_training_checkpoint(run / "checkpoint.pt")
    return {"preset": config["preset"], "directions": config["directions"], "step": state["step"],
            "epoch": state["epoch"], "last_dev": (state["history"] or [None])[-1]}


def run_stages(report: dict, rc: RecipeConfig, data: Path, out: Path, train_args: list[str], started: float,
               deadline: float) -> None:
    """Trains into <out>/run, exports the int8 and fp16 packages and evaluates them, each stage's time in
    report["stage_seconds"]; raises Terminated when a SIGTERM stopped the training."""
    run = out / "run"

    def stage(name: str, fn):
        t = time.time()
        try:
            return fn()
        finally:
            report["stage_seconds"][name] = round(time.time() - t, 1)

    train_minutes = (deadline - rc.after_training_minutes * 60 - started) / 60
    ended = stage("train", lambda: train.main(
        ["--data", str(data), "--out", str(run), "--direction", rc.direction, "--device", rc.device,
         *train_args, "--deadline-minutes", f"{train_minutes:.3f}"], started=started))
    if ended["sigterm"]:
        raise Terminated()
    report["training"] = training_summary(run)
    direction = report["training"]["directions"][0]
    report["eval_direction"] = direction
    int8 = {"quantize": "int8", "calibration": data / "dev.tsv"}
    fp16_reason = cuda_onnxruntime() or ("--device cpu" if rc.device == "cpu" else None)
    # Each package is evaluated right after its export, so that a budget spent by the fp16 export (as long
    # as the int8 one on a CPU) never leaves the int8 package, the one a CPU serves, without its scores.
    for precision, options, device, reason in (("int8", int8, "cpu", None),
                                               ("fp16", {"fp16": True}, "cuda", fp16_reason)):
        name = f"package-{precision}"
        stage(f"export {precision}", lambda: export_package(run / "checkpoint.pt", out / name, **options))
        if reason is None and time.time() > deadline:
            reason = "the budget was spent"
        if reason:
            report["evaluation"][name] = {"skipped": reason}
            continue
        scores = stage(f"evaluate {precision}", lambda: evaluate_package(out / name, data / "test.tsv", direction,
                                                                         rc.beam, device))
        report["evaluation"][name] = {"scores": scores}


def main(argv=None, *, started: float | None = None) -> dict:
    """`started`: when the --minutes budget began (None: when this process started). -> the report."""
    args, rc, train_args = parse(argv)
    started = train.process_start_time() if started is None else started
    deadline = started + rc.minutes * 60
    out, data = Path(args.out), Path(args.data)
    run, pieces = out / "run", Path(args.pieces) if args.pieces else out / "pieces"
    out.mkdir(parents=True, exist_ok=True)
    report = {"command": "python -m model.recipe " + " ".join(sys.argv[1:] if argv is None else argv),
              "recipe": asdict(rc), "hardware": hardware(rc.device), "data": str(data),
              "pairs": {s: len(read_pairs(data / f"{s}.tsv")) for s in ("train", "dev", "test")},
              "stage_seconds": {}, "evaluation": {}}

    try:
        previous = signal.signal(signal.SIGTERM, raise_terminated)
    except ValueError:                                   # not the main thread: no signals to handle
        previous = None
    try:
        run_stages(report, rc, data, out, train_args, started, deadline)
    except Terminated:
        report["stopped"] = "SIGTERM; the checkpoint in run/ is saved, the stages after it did not run"
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    report.setdefault("training", training_summary(run) if (run / "checkpoint.pt").exists() else {})
    report.setdefault("eval_direction", rc.direction)
    report["wall_minutes"] = (time.time() - started) / 60
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "MODEL_CARD.md").write_text(model_card(report))
    written = cut_into_pieces(out, produced_files(out, rc.bundle, pieces), pieces, int(rc.piece_mb * 1e6))
    print(f"{len(written)} pieces of at most {rc.piece_mb} MB in {pieces}; join them with: sh {pieces / 'JOIN.sh'}")
    print(model_card(report))
    return report


if __name__ == "__main__":
    main()
