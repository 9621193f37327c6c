"""gettext catalogs (.po, .pot): each untranslated entry's msgstr filled (msgstr[n] for plural entries) and the
entry marked fuzzy, so a translator reviews it before it is used (gettext skips fuzzy entries); entries that
have a translation, obsolete ones and the header are left as they are.

Placeholders and markup are kept by not translating them: a msgid is cut at each (printf's %s %d %(name)s
%1$s, Python's {x}, tags, entities, line breaks), the text between is translated run by run, and the pieces
are put back in order. The model never sees a placeholder, so it cannot drop, translate or reorder one; the
price is that a sentence cut by one is translated in parts. polib reads and writes the catalog: it is the
one library that does both, already the training side's (model/corpus/), small and pure Python.

A catalog is read whole (catalogs are small); the output is saved after every chunk of entries, and
--resume reads it back instead of the input: what it filled is kept, the rest is filled."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import polib

from .options import BulkOptions
from .progress import Progress

PROTECTED = re.compile(r"""
    %(?:\d+\$)?(?:\([^)]*\))?[-+ #0]*(?:\d+|\*)?(?:\.\d+)?[hlLqjzt]*[diouxXeEfFgGcrsa%]   # %s %d %(n)s %1$s %%
  | \{[^{}\s]*\}                                  # {x} {0} {name!r}: str.format and brace-format
  | <[^<>]+>                                      # markup tags
  | &(?:[A-Za-z]+|\#\d+|\#x[0-9A-Fa-f]+);         # entities
  | \n                                            # line breaks: the layout
""", re.VERBOSE)


def pieces(text: str) -> list[tuple[str, bool]]:
    """text -> [(piece, translate it?)]; concatenated, the pieces are text. A run is translated without the
    spaces around it and the punctuation before it (kept as they were), and only when it has a letter."""
    out, pos = [], 0
    for m in PROTECTED.finditer(text):
        out += _run(text[pos:m.start()])
        out.append((m.group(), False))
        pos = m.end()
    return out + _run(text[pos:])


# Not translated around a run: spaces, and the punctuation that joins it to a placeholder before it ("%s: Text").
LEAD = re.compile(r"^[\s:;,.)\]\-–—]*")


def _run(run: str) -> list[tuple[str, bool]]:
    if not any(c.isalpha() for c in run):
        return [(run, False)] if run else []
    lead = LEAD.match(run).group()
    core = run[len(lead):].rstrip()
    return [(lead, False), (core, True), (run[len(lead) + len(core):], False)]


def untranslated(catalog: polib.POFile) -> list[polib.POEntry]:
    return [e for e in catalog if e.msgid and not e.obsolete and not e.msgstr
            and not any(e.msgstr_plural.values())]


def plurals(catalog: polib.POFile) -> int:
    """nplurals of the catalog's Plural-Forms header (2, English's and German's, when it has none)."""
    m = re.search(r"nplurals\s*=\s*(\d+)", catalog.metadata.get("Plural-Forms", ""))
    return int(m.group(1)) if m else 2


def fill(entries: list[polib.POEntry], translator, nplurals: int) -> int:
    """Translates the entries' msgid (and msgid_plural) run by run; returns the output tokens."""
    texts = [[e.msgid, e.msgid_plural] if e.msgid_plural else [e.msgid] for e in entries]
    cut = [[pieces(t) for t in ts] for ts in texts]
    segments = [p for ts in cut for t in ts for p, translate in t if translate]
    translations, tokens = translator.translate(segments)
    it = iter(translations)
    for entry, ts in zip(entries, cut):
        out = ["".join(next(it) if translate else p for p, translate in t) for t in ts]
        if entry.msgid_plural:
            entry.msgstr_plural = {n: out[0] if n == 0 else out[1] for n in range(nplurals)}
        else:
            entry.msgstr = out[0]
        if "fuzzy" not in entry.flags:
            entry.flags.append("fuzzy")
    return tokens


def save(catalog: polib.POFile, path: str) -> None:
    """Written beside, then renamed over: a stop mid-save leaves the previous output whole."""
    tmp = path + ".tmp"
    catalog.save(tmp)
    os.replace(tmp, path)


def run_catalog(options: BulkOptions, translator) -> int:
    """Fills the catalog's untranslated entries a chunk at a time, saving the output after each."""
    resume = options.resume and options.output != "-" and Path(options.output).exists()
    source = options.output if resume else options.input
    catalog = polib.pofile(sys.stdin.read() if source == "-" else source, wrapwidth=0)
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
