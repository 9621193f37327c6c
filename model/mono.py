"""Offline preparation of German and English monolingual text for the decoder-only model.

``python -m model.data --monolingual --out data/mono`` writes ``train.tsv``, ``dev.tsv``,
``test.tsv`` (``lang<TAB>text<TAB>origin`` per line, one paragraph each) and ``meta.json`` from:

* the sentence-like sides of the parallel corpus sources (the same Ding and gettext readers and
  flags as ``model.data``): German and English sentences of four words or more;
* manual pages that Debian packages install: ``/usr/share/man/de`` (German translations from
  manpages-de and po4a) and ``/usr/share/man/man[1-8]`` (English), turned from roff into
  paragraphs by :func:`roff_paragraphs`; code examples and option synopses are skipped;
* user text files (``--text PATH --text-lang de``), paragraphs separated by blank lines.

Why it looks the way it does:

* The held-out split is chosen per *document* (a manual page, or one corpus sentence) by a hash
  of its id, so no paragraph of a test page was seen in training and the split is the same on
  every machine.
* English text is far more plentiful than German here; ``--max-chars-per-lang`` keeps the two
  languages within the same order of magnitude, taking manual pages in hash order so the cap
  samples across packages rather than the alphabetically first ones.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import shlex
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from .data import CorpusError, clean_corpus, collect_sources, normalize_text

MAN_ROOT = Path("/usr/share/man")
MIN_WORDS = 4            # shorter corpus sides are dictionary terms, not running text
MIN_PARAGRAPH_WORDS = 6  # shorter man-page paragraphs are headings and option lists
MAX_PARAGRAPH_CHARS = 2000


@dataclass(frozen=True)
class Paragraph:
    lang: str
    text: str
    origin: str   # e.g. "man:de/man1/apropos.1", "ding", "gettext:PackageKit"
    doc: str      # the unit the dev/test split is drawn by


# --------------------------------------------------------------------------------------------
# roff (man pages) to text
# --------------------------------------------------------------------------------------------

_NAMED = {"aq": "'", "dq": '"', "lq": '"', "rq": '"', "oq": "'", "cq": "'", "em": "—", "en": "–",
          "hy": "-", "co": "©", "rg": "®", "tm": "™", "bu": "•", "de": "°", "mu": "×", "ti": "~",
          "ha": "^", "rs": "\\", "ga": "`", "ul": "_", "a:": "ä", "o:": "ö", "u:": "ü", "A:": "Ä",
          "O:": "Ö", "U:": "Ü", ":a": "ä", ":o": "ö", ":u": "ü", ":A": "Ä", ":O": "Ö", ":U": "Ü", "ss": "ß",
          "'e": "é", "`e": "è", "'a": "á", "`a": "à", "^e": "ê", "^o": "ô", ",c": "ç", "-D": "Ð", "Fo": "«", "Fc": "»", "fo": "‹", "fc": "›", "+-": "±",
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


def read_corpus_sides(args: argparse.Namespace) -> Iterator[Paragraph]:
    """Sentence-like sides of the parallel sources that `model.data` reads (same flags)."""
    readers, _ = collect_sources(args)
    pairs, _ = clean_corpus(pair for reader in readers for pair in reader)
    for p in pairs:
        for lang, text in (("de", p.de), ("en", p.en)):
            if len(text.split()) >= MIN_WORDS:
                yield Paragraph(lang, text, p.origin, text)


def read_text_file(path: Path, lang: str) -> Iterator[Paragraph]:
    if not path.is_file():
        raise CorpusError(f"text file not found: {path}")
    origin = f"text:{path.name}"
    for block in re.split(r"\n\s*\n", path.read_text(encoding="utf-8", errors="replace")):
        text = normalize_text(block)
        if len(text.split()) >= MIN_WORDS:
            yield Paragraph(lang, text[:MAX_PARAGRAPH_CHARS], origin, f"{origin}#{hash_bucket(text)}")


# --------------------------------------------------------------------------------------------
# Split and write
# --------------------------------------------------------------------------------------------


def hash_bucket(doc: str, buckets: int = 1000) -> int:
    return int.from_bytes(hashlib.blake2b(doc.encode("utf-8"), digest_size=8).digest(), "big") % buckets


def split_paragraphs(paragraphs: Iterable[Paragraph], held_out_permille: int = 10
                     ) -> tuple[dict[str, list[Paragraph]], Counter]:
    """Deduplicates by text (first wins) and splits by document: buckets [0, p) are test,
    [p, 2p) dev, the rest train (p per mille of documents each)."""
    seen: set[str] = set()
    splits: dict[str, list[Paragraph]] = {"train": [], "dev": [], "test": []}
    stats: Counter = Counter()
    for para in paragraphs:
        source = para.origin.split(":")[0] + ":" + para.lang
        stats[source + ":raw"] += 1
        key = para.text.casefold()
        if key in seen:
            continue
        seen.add(key)
        stats[source + ":kept"] += 1
        b = hash_bucket(para.doc)
        name = "test" if b < held_out_permille else "dev" if b < 2 * held_out_permille else "train"
        splits[name].append(para)
    return splits, stats


def write_split(path: Path, paragraphs: Sequence[Paragraph]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        for p in paragraphs:
            fh.write(f"{p.lang}\t{p.text}\t{p.origin}\n")


def read_texts(path: str | Path) -> list[tuple[str, str]]:
    """(lang, text) of a split written by this module; a one-column file is text of unknown language."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            cols = line.rstrip("\r\n").split("\t")
            if cols == [""]:
                continue
            out.append((cols[0], cols[1]) if len(cols) >= 2 else ("", cols[0]))
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("monolingual text (--monolingual)")
    g.add_argument("--man-root", type=Path, default=MAN_ROOT,
                   help="manual pages: ROOT/de (German) and ROOT/man[1-8] (English)")
    g.add_argument("--no-man", action="store_true", help="do not read manual pages")
    g.add_argument("--no-corpus", action="store_true", help="do not read the parallel sources' sides")
    g.add_argument("--text", type=Path, action="append", default=[], metavar="PATH",
                   help="user text file, paragraphs separated by blank lines (repeatable; see --text-lang)")
    g.add_argument("--text-lang", default="en", help="language of the --text files (default en)")
    g.add_argument("--max-chars-per-lang", type=int, default=40_000_000,
                   help="cap on manual-page characters per language (0 = none)")
    g.add_argument("--held-out-permille", type=int, default=10,
                   help="documents per thousand in each of dev and test (default 10)")


def main(args: argparse.Namespace, argv: Sequence[str]) -> int:
    start = time.monotonic()
    sources: list[Iterable[Paragraph]] = []
    described: list[str] = []
    if not args.no_corpus:
        sources.append(read_corpus_sides(args))
        described.append("parallel corpus sides (model.data sources)")
    if not args.no_man:
        if (args.man_root / "de").is_dir():
            sources.append(read_man_pages(args.man_root / "de", "de", args.max_chars_per_lang))
            described.append(f"man:{args.man_root / 'de'}")
        for root in english_man_roots(args.man_root):
            # Each section gets its share of the English cap.
            share = args.max_chars_per_lang // max(1, len(english_man_roots(args.man_root)))
            sources.append(read_man_pages(root, "en", share))
            described.append(f"man:{root}")
    for path in args.text:
        sources.append(read_text_file(path, args.text_lang))
        described.append(f"text:{path} ({args.text_lang})")
    try:
        splits, stats = split_paragraphs((p for s in sources for p in s), args.held_out_permille)
    except CorpusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not splits["train"]:
        print("error: no monolingual text found; give --text files or install man pages", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for name, paras in splits.items():
        write_split(args.out / f"{name}.tsv", paras)
    chars = {name: Counter() for name in splits}
    for name, paras in splits.items():
        for p in paras:
            chars[name][p.lang] += len(p.text)
    meta = {
        "kind": "monolingual",
        "langs": sorted({p.lang for paras in splits.values() for p in paras}),
        "columns": ["lang", "text", "origin"],
        "counts": dict(sorted(stats.items())),
        "splits": {name: len(v) for name, v in splits.items()},
        "characters": {name: dict(sorted(c.items())) for name, c in chars.items()},
        "sources": described,
        "created_by": "python -m model.data " + shlex.join(argv),
    }
    (args.out / "meta.json").write_text(json.dumps(meta, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    width = max(len(k) for k in stats) if stats else 10
    for k, v in sorted(stats.items()):
        print(f"{k:<{width}}  {v:>9}")
    print("splits: " + ", ".join(f"{k}={len(v)} ({sum(chars[k].values()) / 1e6:.1f}M chars)"
                                 for k, v in splits.items()))
    print(f"wrote {args.out} in {time.monotonic() - start:.1f}s")
    return 0
