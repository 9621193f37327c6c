"""transerve translate [INPUT] [-o OUTPUT] [--format ...] [--url URL] [--resume] [--glossary FILE] [search options]"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from .formats import DOCUMENTS, SUFFIXES
from .options import BulkOptions, add_search_arguments, glossary_entries, search_fields
from .run import ResumeError


def parser() -> argparse.ArgumentParser:
    d = BulkOptions()
    p = argparse.ArgumentParser(prog="transerve translate", description="Translates a file or standard input "
                                "segment by segment, to a file or standard output (docs/bulk.md).")
    p.add_argument("input", nargs="?", default=d.input, help="a file, or - for standard input (default)")
    p.add_argument("-o", "--output", default=d.output, help="a file, or - for standard output (default)")
    p.add_argument("--format", choices=("txt", "tsv", "csv", "jsonl", "po", "srt", "vtt", "md", "html", *DOCUMENTS),
                   help="default: from the input's suffix (.tsv .csv .jsonl .po .pot .srt .vtt .md .html .docx .pptx "
                   ".odt .odp), else txt")
    p.add_argument("--column", default=d.column, help="tsv/csv: the column translated, 1-based or a header name")
    p.add_argument("--header", action="store_true", help="tsv/csv: the first row is a header (copied)")
    p.add_argument("--field", default=d.field, help="jsonl: the field translated (default: text)")
    p.add_argument("--to-field", help="jsonl: write the translation to this field, keeping the source")
    p.add_argument("--source-lang", "-s", default=d.source_lang)
    p.add_argument("--target-lang", "-t", default=d.target_lang)
    p.add_argument("--model", default=d.model, help="the model package run in this process (default: models/de-en)")
    p.add_argument("--url", help="send to a running service instead (e.g. http://127.0.0.1:8000)")
    p.add_argument("--api-key", help="--url: the service's API key")
    p.add_argument("--concurrency", type=int, default=d.concurrency, help="--url: requests in flight")
    p.add_argument("--threads", type=int, default=d.threads, help="onnxruntime's threads; 0 = all cores")
    p.add_argument("--chunk", type=int, default=d.chunk, help="segments read, sorted and written at a time")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="sentences per engine batch / request")
    p.add_argument("--batch-tokens", type=int, default=d.batch_tokens,
                   help="in-process: padded source tokens per engine batch at most (bounds the memory)")
    p.add_argument("--resume", action="store_true", help="go on where a stopped run left the output")
    p.add_argument("--progress", choices=("auto", "bar", "lines", "off"), default=d.progress,
                   help="auto: a bar on a terminal, a line every 10 s otherwise (standard error)")
    p.add_argument("--glossary", metavar="FILE", default=d.glossary,
                   help="fixed translations of terms, in DeepL's formats: a .tsv (source TAB target a line) or .csv "
                   "(source,target) file; each sentence's terms are kept by beam search (--beam-size 2 or more)")
    add_search_arguments(p)
    return p


def read_options(argv: list[str] | None) -> BulkOptions:
    p = parser()
    args = p.parse_args(argv)
    fmt = args.format or SUFFIXES.get(Path(args.input).suffix.lower(), "txt")
    if min(args.chunk, args.batch_size, args.batch_tokens, args.concurrency) < 1:
        p.error("--chunk, --batch-size, --batch-tokens and --concurrency must be at least 1")
    search = search_fields(args, p)
    return BulkOptions(input=args.input, output=args.output, format=fmt, column=args.column, header=args.header,
                       field=args.field, to_field=args.to_field, source_lang=args.source_lang,
                       target_lang=args.target_lang, model=args.model, url=args.url, api_key=args.api_key,
                       concurrency=args.concurrency, threads=args.threads, chunk=args.chunk,
                       batch_size=args.batch_size, batch_tokens=args.batch_tokens, resume=args.resume,
                       progress=args.progress, search=search, glossary=args.glossary,
                       glossary_entries=glossary_entries(args.glossary, search, p))


class Stopped(Exception):
    """SIGTERM: raised in the main thread, so the chunk being written is finished or not begun."""


def stop(signum, frame):
    raise Stopped(signal.Signals(signum).name)


def runner(fmt: str):
    """The function that translates a whole file of `fmt` (the streamed formats: run.run_stream)."""
    if fmt == "po":
        return catalog_runner()
    if fmt == "html":
        from .html import run_html
        return run_html
    if fmt in DOCUMENTS:
        return document_runner()
    from .run import run_stream
    return run_stream


def document_runner():
    """document.py's runner; python-docx, python-pptx and lxml are the files extra's, named when missing."""
    try:
        from .document import run_document
    except ModuleNotFoundError as e:
        raise ValueError(f"documents need {e.name}: pip install 'transerve[files]'") from None
    return run_document


def catalog_runner():
    """po.py's runner; polib is the files extra's, so a missing one is named (before the model loads)."""
    try:
        from .po import run_catalog
    except ModuleNotFoundError as e:
        raise ValueError(f"the po format needs {e.name}: pip install 'transerve[files]'") from None
    return run_catalog


def main(argv: list[str] | None = None) -> int:
    from .translators import translator
    from ..client import TranserveError
    from ..documents.limits import DocumentError
    from ..shared.package import PackageError

    options = read_options(argv)
    signal.signal(signal.SIGTERM, stop)
    t = None
    try:
        run = runner(options.format)
        t = translator(options)
        run(options, t)
    except (ResumeError, PackageError, DocumentError, ValueError, OSError) as e:   # a file refused: its message
        print(f"transerve translate: error: {e}", file=sys.stderr)
        return 2
    except TranserveError as e:          # --url: the service refused, or could not be reached: --resume goes on
        print(f"transerve translate: error: {options.url}: {e} (--resume goes on from here)", file=sys.stderr)
        return 2
    except (Stopped, KeyboardInterrupt) as e:
        # str(): a KeyboardInterrupt is truthy with no text, which printed "stopped by " and nothing after it
        print(f"transerve translate: stopped by {str(e) or 'SIGINT'}", file=sys.stderr)
        return 143 if isinstance(e, Stopped) else 130
    finally:
        if hasattr(t, "close"):
            t.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
