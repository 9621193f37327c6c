"""Documents for `transerve translate` (docx, pptx, odt, odp): read whole (their size bounded by the server's
document limits, service/config.py's defaults, so a file the command translates is one the service takes),
their texts translated a chunk at a time with progress, written at the end; --resume translates again."""

from __future__ import annotations

import sys

from ..config import Settings
from ..documents.formats import load
from ..documents.limits import DocumentError, Limits
from .options import BulkOptions
from .progress import Progress


def run_document(options: BulkOptions, translator) -> int:
    data = sys.stdin.buffer.read() if options.input == "-" else open(options.input, "rb").read()
    try:
        document = load(options.format, data, Limits(**Settings().document_limits()))
    except DocumentError as e:
        raise ValueError(str(e)) from None
    progress = Progress(options.progress, len(document.texts))
    result = document.render(translate_whole(document.texts, options, translator, progress))
    if options.output == "-":
        sys.stdout.buffer.write(result)
    else:
        with open(options.output, "wb") as f:
            f.write(result)
    progress.finish()
    return progress.segments


def translate_whole(texts: list[str], options: BulkOptions, translator, progress: Progress) -> list[str]:
    """A document's texts, a chunk at a time with progress; nothing is written before they all are, so a stop
    leaves no half-translated document (--resume translates it again)."""
    translations: list[str] = []
    try:
        for start in range(0, len(texts), options.chunk):
            out, tokens = translator.translate(texts[start:start + options.chunk])
            translations += out
            progress.update(len(out), tokens)
    except BaseException:
        progress.finish("stopped (nothing written: --resume translates the document again)")
        raise
    return translations
