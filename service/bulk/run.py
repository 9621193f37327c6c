"""The stream: records read a chunk at a time, the chunk translated (sorted by length inside the translator,
for the engine's batches) and written back in input order, then a small sidecar state file written, so the
memory is one chunk's whatever the file's size and a stopped run can go on (--resume).

The state file (OUTPUT.transerve-state.json) says how many input records are done and how many bytes of the
output hold them; it is replaced atomically after each chunk's bytes are flushed. A run stopped anywhere
(SIGTERM, SIGKILL, a crash) leaves an output at least as long as its state says: --resume cuts the output
back to that length, skips that many records of the input and goes on. The finished run removes it."""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
from contextlib import contextmanager
from dataclasses import asdict
from itertools import chain, islice
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, Optional

from ..documents.markdown import Markdown
from ..documents.plain import refuse_empty
from ..documents.subtitles import Subtitles
from .formats import Columns, JsonLines, Lines
from .options import BulkOptions
from .progress import Progress

STATE_SUFFIX = ".transerve-state.json"
# The formats the service also takes as documents (service/documents/formats.py), whose empty file it refuses;
# tsv, csv and jsonl are data, where an empty input is an empty batch.
DOCUMENT_TEXTS = ("txt", "srt", "vtt", "md")
# What must be the same for a resumed run to go on with the earlier one's output.
JOB_FIELDS = ("input", "format", "column", "header", "field", "to_field", "source_lang", "target_lang", "search")


class ResumeError(Exception):
    pass


def streamed_format(options: BulkOptions):
    """The reader and writer of options.format (po is not streamed: po.py)."""
    if options.format == "txt":
        return Lines(options)
    if options.format in ("tsv", "csv"):
        return Columns(options, delimiter="\t" if options.format == "tsv" else ",")
    if options.format == "jsonl":
        return JsonLines(options)
    if options.format in ("srt", "vtt"):
        return Subtitles()
    if options.format == "md":
        return Markdown()
    raise ValueError(f"unknown format {options.format!r}; one of txt, tsv, csv, jsonl, po, srt, vtt, md")


def job(options: BulkOptions) -> dict:
    out = {name: value for name, value in asdict(options).items() if name in JOB_FIELDS}
    if options.glossary_entries:
        # Its entries, not the file's name (a moved file is the same glossary); only when there is one, so a state
        # written before --glossary existed still resumes.
        entries = json.dumps([[e.source, e.target] for e in options.glossary_entries], ensure_ascii=False)
        out["glossary_sha256"] = hashlib.sha256(entries.encode("utf-8")).hexdigest()
    return out


def state_path(options: BulkOptions) -> Path:
    return Path(options.output + STATE_SUFFIX)


def resume_point(options: BulkOptions) -> tuple[int, int]:
    """(records done, output bytes holding them) of a stopped run; (0, 0) for a fresh one."""
    if not options.resume:
        return 0, 0
    if options.output == "-":
        raise ResumeError("--resume needs an output file (-o): standard output cannot be continued")
    path = state_path(options)
    if not path.exists():
        if Path(options.output).exists():
            raise ResumeError(f"{options.output} exists but {path} does not: it is complete, or was not written "
                              "by transerve translate; run without --resume to start over")
        return 0, 0
    state = json.loads(path.read_text(encoding="utf-8"))
    if state["job"] != job(options):
        raise ResumeError(f"{path} is another job's ({state['job']}); run without --resume to start over")
    size = Path(options.output).stat().st_size if Path(options.output).exists() else -1
    if size < state["bytes"]:    # cut or replaced since: going on would pad it with zeros or shift it
        raise ResumeError(f"{options.output} has {max(size, 0)} bytes; the state says {state['bytes']} were "
                          "written: run without --resume to start over")
    return state["records"], state["bytes"]


def save_state(options: BulkOptions, records: int, size: int) -> None:
    path = state_path(options)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"records": records, "bytes": size, "job": job(options)}), encoding="utf-8")
    os.replace(tmp, path)    # atomic: a stop leaves the old state or the new, never half of one


def count_records(options: BulkOptions) -> Optional[int]:
    """The input's lines (cues of subtitles), for the ETA (a CSV row with a line break in a cell counts twice, a
    WebVTT header or NOTE block is not counted); None for stdin."""
    if options.input == "-" or not Path(options.input).is_file():
        return None
    n = last = 0
    if options.format == "md":       # blocks, not lines: no total, no ETA
        return None
    subtitles = options.format in ("srt", "vtt")    # their records are cues: a timing line each
    with open(options.input, "rb") as f:
        while block := f.read(1 << 20):
            n, last = n + block.count(b"-->" if subtitles else b"\n"), block[-1]
    return n + (last not in (0, 10) and not subtitles)


def not_empty(lines: Iterable[str], fmt: str) -> Iterable[str]:
    """The input's lines, after refusing one with nothing but whitespace as the service refuses it (a
    DocumentError). The blank lines read to find that out are given back first."""
    if fmt not in DOCUMENT_TEXTS:
        return lines
    head, lines = [], iter(lines)
    for line in lines:
        head.append(line)
        if line.strip():
            return chain(head, lines)
    refuse_empty("".join(head), fmt)    # raises: every line was blank
    return head


@contextmanager
def opened(options: BulkOptions, size: int) -> Iterator[tuple[Iterable[str], BinaryIO]]:
    """The input's lines (UTF-8, line endings as written), the output as bytes positioned at `size` (the
    rest of a stopped run's output cut off), so the state can count bytes. An empty input is refused before
    the output is opened: a refused run writes nothing."""
    src = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", newline="") if options.input == "-" \
        else open(options.input, encoding="utf-8", newline="")
    out: BinaryIO | None = None
    try:
        lines = not_empty(src, options.format)
        if options.output == "-":
            out = sys.stdout.buffer
        else:
            out = open(options.output, "r+b" if size else "wb")
            out.truncate(size)
            out.seek(size)
        yield lines, out
    finally:
        if options.input != "-":
            src.close()
        if options.output != "-" and out is not None:
            out.close()


def run_stream(options: BulkOptions, translator) -> int:
    """Translates a txt/tsv/csv/jsonl/srt/vtt/md stream; returns the number of records written by this run."""
    fmt = streamed_format(options)
    done, size = resume_point(options)
    if not options.resume and options.output != "-":   # a stopped run's state no longer describes the output
        state_path(options).unlink(missing_ok=True)
    progress = Progress(options.progress, count_records(options), done=done)
    with opened(options, size) as (src, out):
        records = fmt.read(src)
        skipped = sum(1 for _ in islice(records, done))   # written by the stopped run
        if skipped < done:
            raise ResumeError(f"the input has {skipped} records; the state says {done} were done")
        try:
            while chunk := list(islice(records, options.chunk)):
                translations, tokens = translator.translate([r.segment for r in chunk])
                out.write("".join(fmt.write(r, t) for r, t in zip(chunk, translations)).encode("utf-8"))
                out.flush()
                done += len(chunk)
                if options.output != "-":
                    save_state(options, done, out.tell())
                progress.update(len(chunk), tokens)
        except BaseException:
            progress.finish(f"stopped ({'--resume goes on' if options.output != '-' else 'not resumable'})")
            raise
    if options.output != "-":
        state_path(options).unlink(missing_ok=True)
    progress.finish()
    return progress.segments
