"""gettext catalogs (.po, .pot) by polib: each untranslated entry's msgstr filled (msgstr[n] for plural
entries) and the entry marked fuzzy, so a translator reviews it before it is used (gettext skips fuzzy
entries); entries that have a translation, obsolete ones and the header are left as they are.

Placeholders and markup are kept by not translating them: a msgid is cut at each (printf's %s %d %(name)s
%1$s, Python's {x}, tags, entities, line breaks), the text between is translated run by run, and the pieces
are put back in order. The model never sees a placeholder, so it cannot drop, translate or reorder one; the
price is that a sentence cut by one is translated in parts. polib reads and writes the catalog: it is the
one library that does both, already the training side's (model/corpus/), small and pure Python."""

from __future__ import annotations

import os
import re

import polib

from .limits import DocumentError

# printf's conversions: %s %d %(n)s %1$s %%. {FLAGS}: the flag characters; {AFTER}: what may not follow.
PRINTF = r"%(?:\d+\$)?(?:\([^)]*\))?[{FLAGS}]*(?:\d+|\*)?(?:\.\d+)?[hlLqjzt]*[diouxXeEfFgGcrsa%]{AFTER}"
OTHERS = r"""
  | \{[^{}\s]*\}                                  # {x} {0} {name!r}: str.format and brace-format
  | <[^<>]+>                                      # markup tags
  | &(?:[A-Za-z]+|\#\d+|\#x[0-9A-Fa-f]+);         # entities
  | \n                                            # line breaks: the layout
"""
# In an entry flagged as a format string (c-format, python-format, ...), every conversion is one. In any other, a
# `%` followed by a space, or a conversion followed by a letter, is text: "zu 100% sicher", "50% aller", "100%ig".
PROTECTED = re.compile(PRINTF.format(FLAGS="-+ #0", AFTER="") + OTHERS, re.VERBOSE)
PROTECTED_IN_TEXT = re.compile(PRINTF.format(FLAGS="-+#0", AFTER=r"(?![^\W\d_])") + OTHERS, re.VERBOSE)


def format_string(entry: polib.POEntry) -> bool:
    """Whether the entry is flagged as a format string of some language (xgettext's c-format, python-format...)."""
    return any(f.endswith("-format") and not f.startswith("no-") for f in entry.flags)


def pieces(text: str, protected: re.Pattern = PROTECTED) -> list[tuple[str, bool]]:
    """text -> [(piece, translate it?)]; concatenated, the pieces are text. A run is translated without the
    spaces around it and the punctuation before it (kept as they were), and only when it has a letter."""
    out, pos = [], 0
    for m in protected.finditer(text):
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


# A line with a string: a keyword's (msgctxt, msgid, msgid_plural, msgstr, msgstr[n]; also an obsolete entry's
# `#~ ` and a previous msgid's `#| `) or a continuation line, and the string from its opening quote.
STRING_LINE = re.compile(r'(?:#[~|]\s*)?(msgctxt|msgid_plural|msgid|msgstr(?:\[\d+\])?)?\s*(".*)')
QUOTED = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')      # a C string: its escapes (\" \\) skipped, then its closing quote


def check_strings(text: str) -> None:
    """polib reads a string without its closing quote as if its last character were that quote (`msgid "Hallo`
    is "Hall"): the catalog would come back translated with entries cut. Each string's end is checked first."""
    keyword = "msgid"
    for n, line in enumerate(text.splitlines(), 1):      # polib's lines, so its line numbers
        m = STRING_LINE.fullmatch(line.strip())
        if m is None:
            continue
        keyword = m.group(1) or keyword                    # a continuation line continues the last keyword's
        if not QUOTED.match(m.group(2)):
            raise DocumentError(400, "invalid_catalog", f"the .po file's {keyword} on line {n} is not terminated "
                                "(its string has no closing quote)", detail=repr(line.strip()[:60]))


def parse(text: str) -> polib.POFile:
    """A catalog's text (never a path) read by polib, or a DocumentError naming what is wrong with it."""
    check_strings(text)
    # polib.pofile reads a FILE when its argument names one: an upload saying "/etc/hostname" would be read
    # from this host's disk. Text ending in a line break names none (checked, not assumed).
    text = text if text.endswith("\n") else text + "\n"
    if os.path.lexists(text):
        raise DocumentError(400, "invalid_catalog", "the catalog's text is the name of a file")
    try:
        return polib.pofile(text, wrapwidth=0)
    except (OSError, ValueError, UnicodeError) as e:   # polib's syntax errors are OSErrors
        raise DocumentError(400, "invalid_catalog", "the catalog cannot be read (a syntax error)", detail=str(e)) \
            from None


def untranslated(catalog: polib.POFile) -> list[polib.POEntry]:
    return [e for e in catalog if e.msgid and not e.obsolete and not e.msgstr
            and not any(e.msgstr_plural.values())]


# The most plural forms a catalog may declare: gettext's languages use 1 to 6 (Arabic's); a header's nplurals of a
# million made a 159-byte upload render 36 MB, one of 5,000 digits a 500 (int() refuses it).
MOST_PLURALS = 10


def plurals(catalog: polib.POFile) -> int:
    """nplurals of the catalog's Plural-Forms header (2, English's and German's, when it has none); a 400 above
    MOST_PLURALS."""
    m = re.search(r"nplurals\s*=\s*(\d+)", catalog.metadata.get("Plural-Forms", ""))
    if m is None:
        return 2
    if len(m.group(1)) > 2 or not 1 <= int(m.group(1)) <= MOST_PLURALS:
        raise DocumentError(400, "invalid_catalog", f"the catalog's Plural-Forms header declares nplurals outside "
                            f"1..{MOST_PLURALS}")
    return int(m.group(1))


class Entries:
    """Some entries' msgid (and msgid_plural) cut into pieces: `texts` the runs to translate, `fill` puts
    their translations back and marks each entry fuzzy."""

    def __init__(self, entries: list[polib.POEntry]):
        self.entries = entries
        self.cut = [[pieces(t, PROTECTED if format_string(e) else PROTECTED_IN_TEXT)
                     for t in ([e.msgid, e.msgid_plural] if e.msgid_plural else [e.msgid])] for e in entries]
        self.texts = [p for ts in self.cut for t in ts for p, translate in t if translate]

    def fill(self, translations: list[str], nplurals: int) -> None:
        it = iter(translations)
        for entry, ts in zip(self.entries, self.cut):
            out = ["".join(next(it) if translate else p for p, translate in t) for t in ts]
            if entry.msgid_plural:
                entry.msgstr_plural = {n: out[0] if n == 0 else out[1] for n in range(nplurals)}
            else:
                entry.msgstr = out[0]
            if "fuzzy" not in entry.flags:
                entry.flags.append("fuzzy")


class Catalog:
    """A whole catalog as a Document: its untranslated entries' runs, and the catalog written back filled."""

    def __init__(self, text: str):
        self.catalog = parse(text)
        self.nplurals = plurals(self.catalog)        # refused here, before anything is translated
        self.entries = Entries(untranslated(self.catalog))
        self.texts = self.entries.texts

    def render(self, translations: list[str]) -> bytes:
        self.entries.fill(translations, self.nplurals)
        return str(self.catalog).encode("utf-8")
