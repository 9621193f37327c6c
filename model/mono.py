"""Offline preparation of German and English monolingual text for the decoder-only model.

``python -m model.data --monolingual --out data/mono`` writes ``train.tsv``, ``dev.tsv``,
``test.tsv`` (``lang<TAB>text<TAB>origin`` per line, one paragraph each) and ``meta.json`` from:

* the sentence-like sides of the parallel corpus sources (the same Ding and gettext readers and
  flags as ``model.data``): German and English sentences of four words or more;
* manual pages that Debian packages install (:mod:`model.corpus.man`): ``/usr/share/man/de``
  (German) and ``/usr/share/man/man[1-8]`` (English);
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
import hashlib
import json
import re
import shlex
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from .corpus.clean import clean_corpus
from .corpus.man import MAN_ROOT, english_man_roots, read_man_pages
from .corpus.sources import collect_sources
from .corpus.text import MAX_PARAGRAPH_CHARS, CorpusError, Paragraph, normalize_text

MIN_WORDS = 4            # shorter corpus sides are dictionary terms, not running text


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


def read_sources(args: argparse.Namespace) -> tuple[list[Iterable[Paragraph]], list[str]]:
    """The paragraph readers the flags ask for, and their descriptions for meta.json."""
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
    return sources, described


def write_corpus(out: Path, splits: dict[str, list[Paragraph]], stats: Counter, described: list[str],
                 argv: Sequence[str]) -> dict[str, Counter]:
    """The split files and meta.json; -> characters per split and language."""
    out.mkdir(parents=True, exist_ok=True)
    for name, paras in splits.items():
        write_split(out / f"{name}.tsv", paras)
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
    (out / "meta.json").write_text(json.dumps(meta, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return chars


def main(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``model.data --monolingual``: 0, or 2 with a message when there is no usable text."""
    start = time.monotonic()
    sources, described = read_sources(args)
    try:
        splits, stats = split_paragraphs((p for s in sources for p in s), args.held_out_permille)
    except CorpusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not splits["train"]:
        print("error: no monolingual text found; give --text files or install man pages", file=sys.stderr)
        return 2
    chars = write_corpus(args.out, splits, stats, described, argv)
    width = max(len(k) for k in stats) if stats else 10
    for k, v in sorted(stats.items()):
        print(f"{k:<{width}}  {v:>9}")
    print("splits: " + ", ".join(f"{k}={len(v)} ({sum(chars[k].values()) / 1e6:.1f}M chars)"
                                 for k, v in splits.items()))
    print(f"wrote {args.out} in {time.monotonic() - start:.1f}s")
    return 0
