"""Manual pages as monolingual text: roff (man and mdoc macros) turned into prose paragraphs, each
labelled with the language it is in.

Debian packages install German translations under ``/usr/share/man/de`` (manpages-de, po4a) and English
pages under ``/usr/share/man/man[1-8]``; code examples and option synopses are skipped.
"""

from __future__ import annotations

import gzip
import hashlib
import re
import shlex
from pathlib import Path
from typing import Iterator

from .text import MAX_PARAGRAPH_CHARS, Paragraph, normalize_text

MAN_ROOT = Path("/usr/share/man")
MIN_PARAGRAPH_WORDS = 6  # shorter man-page paragraphs are headings and option lists

_NAMED = {"aq": "'", "dq": '"', "lq": '"', "rq": '"', "oq": "'", "cq": "'", "em": "—", "en": "–",
          "hy": "-", "co": "©", "rg": "®", "tm": "™", "bu": "•", "de": "°", "mu": "×", "ti": "~",
          "ha": "^", "rs": "\\", "ga": "`", "ul": "_", "a:": "ä", "o:": "ö", "u:": "ü", "A:": "Ä",
          "O:": "Ö", "U:": "Ü", ":a": "ä", ":o": "ö", ":u": "ü", ":A": "Ä", ":O": "Ö", ":U": "Ü", "ss": "ß",
          "'e": "é", "`e": "è", "'a": "á", "`a": "à", "^e": "ê", "^o": "ô", ",c": "ç", "-D": "Ð", "Fo": "«",
          "Fc": "»", "fo": "‹", "fc": "›", "+-": "±",
          "<=": "≤", ">=": "≥", "->": "→", "<-": "←", "sc": "§", "ua": "↑", "da": "↓", "pc": "·"}
_ESCAPE_RE = re.compile(
    r"\\(?:f(?:\[[^\]]*\]|\(..|.)"        # font changes
    r"|\((..)"                              # \(xx named glyph
    r"|\[([^\]]*)\]"                        # \[name] named glyph
    r"|\*(?:\[[^\]]*\]|\(..|.)"             # string interpolation
    r"|s[+-]?(?:\d+|\[[^\]]*\]|\(..)"       # size changes
    r"|[nwhvlLxDoSHzkbXYZ]'[^']*'"          # escapes with a quoted argument
    r"|[nk](?:\[[^\]]*\]|\(..|.)"           # registers
    r"|(.))"                                # everything else: one character
)
_SINGLE = {"-": "-", "e": "\\", "\\": "\\", " ": " ", "~": " ", "0": " ", "'": "'", "`": "`", ".": ".",
           "t": " ", "(": "(", "&": "", "|": "", "^": "", "%": "", "c": "", "!": "", ":": "", "/": "", ",": ""}
# Paragraph breaks (man and mdoc); .TP's next line is an option label, not prose.
_BREAK = {"PP", "P", "LP", "SH", "SS", "TP", "IP", "HP", "sp", "RS", "RE", "TQ", "Pp", "Sh", "Ss", "It", "Bl",
          "El", "Bd", "Ed", "Lp", "br", "in", "ti", "TH", "Dd", "Dt", "Os", "Nd", "SY", "YS", "OP"}
_FONT = {"B", "I", "R", "BR", "IR", "RB", "BI", "IB", "RI", "SM", "SB", "UR", "MT"}
_VERBATIM_START = {"nf", "EX", "Bd"}
_VERBATIM_END = {"fi", "EE", "Ed"}
_MDOC_CALLABLE = re.compile(r"^(?:[A-Z][a-z]|Ns|Fl|Ar|Cm|Op|Oo|Oc|Pa|Ql|Sy|Em|Dq|Sq|Pq|Xr|Nm|Ev|Va|Li)$")


def _unescape(text: str) -> str:
    def repl(m: re.Match) -> str:
        if m.group(1) is not None:
            return _NAMED.get(m.group(1), "")
        if m.group(2) is not None:
            name = m.group(2)
            if name.startswith("u") and len(name) == 5:  # \[u00E4]
                try:
                    return chr(int(name[1:], 16))
                except ValueError:
                    return ""
            return _NAMED.get(name, "")
        if m.group(3) is not None:
            return _SINGLE.get(m.group(3), "")
        return ""

    return _ESCAPE_RE.sub(repl, text)


def _macro_args(rest: str) -> list[str]:
    try:
        return shlex.split(rest, posix=True)
    except ValueError:
        return rest.split()


def roff_paragraphs(source: str) -> Iterator[str]:
    """Prose paragraphs of a man page (man or mdoc macros): macros dropped or replaced by their
    text, escapes resolved, code examples (.nf/.EX/.Bd) and synopses skipped."""
    lines: list[str] = []
    verbatim = skip_next = False
    section = ""

    def flush() -> Iterator[str]:
        if lines and section not in ("SYNOPSIS", "ÜBERSICHT", "NAME", "BEZEICHNUNG"):
            yield " ".join(lines)
        lines.clear()

    for raw in source.splitlines():
        if raw.startswith(('.\\"', "'\\\"", '.\\\\"')) or raw.strip() in (".", "'"):
            continue
        if raw.startswith((".", "'")):
            body = raw[1:].lstrip()
            # po4a wraps macros in conditionals: `.if !'po4a'hide' .BR …`
            cond = re.match(r"(?:if|ie|el)\b\s*(?:!?'[^']*'[^']*'|\S+)?\s*(.*)$", body)
            if cond and body.split(None, 1)[0] in ("if", "ie", "el"):
                body = cond.group(1).lstrip(".' ")
                if not body:
                    continue
            name, _, rest = body.partition(" ")
            if name in _VERBATIM_START:
                yield from flush()
                verbatim = True
                continue
            if name in _VERBATIM_END:
                verbatim = False
                continue
            if name in _BREAK:
                yield from flush()
                if name in ("SH", "Sh"):
                    section = _unescape(" ".join(_macro_args(rest))).strip().upper()
                skip_next = name in ("TP", "TQ", "It")
                continue
            if verbatim:
                continue
            if name in _FONT:
                args = _macro_args(rest)
                joined = "".join(args) if len(name) == 2 and name not in ("SM", "SB", "UR", "MT") else " ".join(args)
                text = _unescape(joined)
            elif _MDOC_CALLABLE.match(name):
                text = _unescape(" ".join(a for a in _macro_args(rest) if not _MDOC_CALLABLE.match(a)))
            else:
                continue  # requests (.de, .ds, .nr, .so, .ft, .ad …) carry no prose
        else:
            if verbatim:
                continue
            if not raw.strip():
                yield from flush()
                continue
            text = _unescape(raw)
        if skip_next:  # the label line of a .TP item
            skip_next = False
            continue
        if text.strip():
            lines.append(text.strip())
    yield from flush()


def _is_prose(text: str, min_words: int) -> bool:
    words = text.split()
    if len(words) < min_words or len(text) > MAX_PARAGRAPH_CHARS:
        return False
    letters = sum(ch.isalpha() for ch in text)
    # Option tables and command lines are mostly dashes, slashes and symbols.
    return letters >= 0.6 * len(text.replace(" ", "")) and text[0] not in "-/$#"


_STOPWORDS = {
    "de": set("der die das und ist nicht mit von zu ein eine einer eines dem den des im in auf für wird werden "
              "sie es wenn oder auch als bei nach aus wie kann diese dieser sich sind nur über vom zum zur".split()),
    "en": set("the and is are not with of to a an in on for will be it if or also as at after from how can this "
              "that these by only over which you your".split()),
}


def detect_lang(text: str) -> str | None:
    """"de" or "en" by stopword counts, None when the text has too few of either (code, tables).
    Manual pages under de/ keep untranslated English paragraphs, so the directory alone would lie."""
    words = re.findall(r"[^\W\d_]+", text.casefold())
    de = sum(w in _STOPWORDS["de"] for w in words)
    en = sum(w in _STOPWORDS["en"] for w in words)
    if max(de, en) < 2 or de == en:
        return None
    return "de" if de > en else "en"


def _decode(raw: bytes) -> str:
    # Older pages (e.g. shadow's German ones) are Latin-1; UTF-8 first since it rarely decodes wrong.
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _doc_order(path: Path) -> bytes:
    return hashlib.blake2b(str(path).encode(), digest_size=8).digest()


def read_man_pages(root: Path, lang: str, max_chars: int) -> Iterator[Paragraph]:
    """Paragraphs of the gzipped or plain man pages under `root`, pages in hash order, until
    `max_chars` characters of `lang` (0 = no cap); each labelled with the language it is in."""
    pages = sorted((p for p in root.rglob("*") if p.is_file() and re.search(r"\.\d\w*(\.gz)?$", p.name)),
                   key=_doc_order)
    total = 0
    for page in pages:
        try:
            raw = gzip.decompress(page.read_bytes()) if page.suffix == ".gz" else page.read_bytes()
        except (OSError, EOFError, gzip.BadGzipFile):
            continue
        source = _decode(raw)
        if source.lstrip().startswith(".so "):  # a link to another page
            continue
        origin = f"man:{page.relative_to(root.parent) if root.parent != root else page.name}"
        for text in roff_paragraphs(source):
            text = normalize_text(text)
            found = detect_lang(text) if _is_prose(text, MIN_PARAGRAPH_WORDS) else None
            if found:
                yield Paragraph(found, text, origin, origin)
                total += len(text) if found == lang else 0
        if max_chars and total >= max_chars:
            return


def english_man_roots(man_root: Path) -> list[Path]:
    return [p for p in sorted(man_root.glob("man[1-8]")) if p.is_dir()]
