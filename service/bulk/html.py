"""HTML documents and fragments, by the parser LibreTranslate's format=html uses (shared/html_text.py): each run of
text (a paragraph's sentences whole, with its inline elements) translated, and the markup put back as written:
tags, attributes, comments, scripts, styles, code and `translate="no"` byte for byte; each inline element's tags
around the words of its own translation where those are found in the run's, else placed proportionally.

A document is read whole and written at the end (its size is bounded by the parser's limits: at most
html_text.MAX_ELEMENTS elements, nested at most MAX_DEPTH deep); --resume translates it again."""

from __future__ import annotations

import sys

from ..documents.plain import refuse_empty
from ..shared import html_text
from .document import translate_whole
from .options import BulkOptions
from .progress import Progress


def run_html(options: BulkOptions, translator) -> int:
    source = sys.stdin.read() if options.input == "-" else open(options.input, encoding="utf-8").read()
    refuse_empty(source, "html")          # refused as the service refuses it (DocumentError: command.main)
    try:
        document = html_text.parse(source)
    except html_text.MarkupError as e:
        raise ValueError(str(e)) from None
    # Each run, then each of its inline elements alone: the alone-translations say where its tags go.
    texts = html_text.texts([document], leaves=True)
    progress = Progress(options.progress, len(texts))
    translations = translate_whole(texts, options, translator, progress)
    result = html_text.render([document], translations, leaves=True)[0]
    if options.output == "-":
        sys.stdout.write(result)
    else:
        with open(options.output, "w", encoding="utf-8") as f:
            f.write(result)
    progress.finish()
    return progress.segments
