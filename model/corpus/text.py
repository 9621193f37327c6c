"""The records every source yields, the error type, and the text normalisation applied to every side
of every source *before* deduplication and leak checks: NFC, curly quotes to ASCII quotes, no
control/format characters, single spaces (otherwise ``it’s`` and ``it's`` would count as different
sentences)."""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
from dataclasses import dataclass

DIRECTIONS = ("de-en", "en-de")


class CorpusError(ValueError):
    """A problem with an input corpus that the user has to fix (reported without traceback)."""


def require_dirs(*dirs) -> None:
    """A reader of a package's two languages stops here when one is missing (a package of another layout),
    rather than adding a source of no pairs."""
    if missing := [str(d) for d in dirs if not d.is_dir()]:
        raise CorpusError(f"not a directory: {', '.join(missing)}")


@dataclass(frozen=True)
class Pair:
    """One aligned segment pair.

    ``sentence`` marks pairs whose sides both look like sentences (``ding.is_sentence``): Ding's
    are what dev and test are drawn from, the software texts' (gettext, LibreOffice's help) what
    the second test split, ``test-software``, is drawn from.
    """

    de: str
    en: str
    origin: str
    sentence: bool = False


@dataclass(frozen=True)
class Paragraph:
    """One paragraph of monolingual text (``model.mono``)."""

    lang: str
    text: str
    origin: str   # e.g. "man:de/man1/apropos.1", "ding", "gettext:PackageKit"
    doc: str      # the unit the dev/test split is drawn by


MAX_PARAGRAPH_CHARS = 2000   # longer man-page "paragraphs" are tables; user text is cut there


# Typographic quotes are mapped to ASCII so that "it’s" (Ding) and "it's" (most other text)
# are the same string for deduplication, leak checks and the tokenizer.  Guillemets are
# quotation marks in German text, so they become '"' as well.
_QUOTE_MAP = str.maketrans(
    {
        "\u2018": "'",  # ‘
        "\u2019": "'",  # ’
        "\u201a": "'",  # ‚
        "\u201b": "'",  # ‛
        "\u2032": "'",  # ′
        "\u201c": '"',  # “
        "\u201d": '"',  # ”
        "\u201e": '"',  # „
        "\u201f": '"',  # ‟
        "\u2033": '"',  # ″
        "\u00ab": '"',  # «
        "\u00bb": '"',  # »
        "\u2039": "'",  # ‹
        "\u203a": "'",  # ›
    }
)
_WS_RE = re.compile(r"\s+")


@functools.cache
def _invisible_re() -> re.Pattern[str]:
    """Regex of all Cc/Cf characters except the whitespace controls (built once, ~0.2 s)."""
    codes = [
        c
        for c in range(sys.maxunicode + 1)
        if unicodedata.category(chr(c)) in ("Cc", "Cf") and chr(c) not in "\t\n\r\v\f"
    ]
    ranges: list[tuple[int, int]] = []
    for c in codes:
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1] = (ranges[-1][0], c)
        else:
            ranges.append((c, c))
    body = "".join(
        re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}"
        for a, b in ranges
    )
    return re.compile(f"[{body}]+")


def normalize_text(text: str) -> str:
    """NFC, ASCII quotes, no control/format characters, single spaces, stripped.

    Tabs and newlines become spaces (the output is TSV).  Unicode categories Cc (controls) and
    Cf (soft hyphen, zero-width space, BOM, ...) are removed: they are invisible, differ between
    otherwise identical strings and would only waste tokenizer vocabulary.
    """
    text = unicodedata.normalize("NFC", text).translate(_QUOTE_MAP)
    if not (text.isascii() and text.isprintable()):
        text = _invisible_re().sub("", text)
    return _WS_RE.sub(" ", text).strip()
