"""gettext catalogs (.po, .pot) for `transerve translate`: the entries filled as service/documents/catalog.py
fills them (placeholders and markup kept, entries marked fuzzy), a chunk of entries at a time.

A catalog is read whole (catalogs are small); the output is saved after every chunk of entries, and
--resume reads it back instead of the input: what it filled is kept, the rest is filled."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import polib

from ..documents.catalog import Entries, parse, plurals, untranslated
from ..documents.plain import refuse_empty
from .options import BulkOptions
from .progress import Progress


def fill(entries: list[polib.POEntry], translator, nplurals: int) -> int:
    """Translates the entries' msgid (and msgid_plural) run by run; returns the output tokens."""
    cut = Entries(entries)
    translations, tokens = translator.translate(cut.texts)
    cut.fill(translations, nplurals)
    return tokens


def save(catalog: polib.POFile, path: str) -> None:
    """Written beside, then renamed over: a stop mid-save leaves the previous output whole."""
    tmp = path + ".tmp"
    catalog.save(tmp)
    os.replace(tmp, path)


def read_catalog(source: str) -> polib.POFile:
    """The catalog at `source` (-: standard input), refused as the service refuses it (an empty one, a string
    without its closing quote): read as text in the encoding polib finds in its header, then parsed as text."""
    if source == "-":
        text = sys.stdin.read()
    else:
        with open(source, encoding=polib.detect_encoding(source)) as f:
            text = f.read()
    refuse_empty(text, "po")
    return parse(text)


def run_catalog(options: BulkOptions, translator) -> int:
    """Fills the catalog's untranslated entries a chunk at a time, saving the output after each."""
    resume = options.resume and options.output != "-" and Path(options.output).exists()
    catalog = read_catalog(options.output if resume else options.input)
    todo = untranslated(catalog)
    progress = Progress(options.progress, len(todo))
    try:
        for start in range(0, len(todo), options.chunk):
            chunk = todo[start:start + options.chunk]
            progress.update(len(chunk), fill(chunk, translator, plurals(catalog)))
            if options.output != "-":
                save(catalog, options.output)
    except BaseException:
        progress.finish("stopped (--resume goes on)")
        raise
    if options.output == "-":
        sys.stdout.write(str(catalog))
    else:
        save(catalog, options.output)
    progress.finish()
    return progress.segments
