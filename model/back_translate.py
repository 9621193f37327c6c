"""Tagged back-translation (Sennrich et al. 2016; Caswell et al. 2019): monolingual everyday text, translated by
the committed model into the other language, trains the direction whose target it is, its machine-made source
marked by a ``<bt>`` piece the model sees on synthetic sources only.

The recipe (docs/training.md, "Back-translation"), three steps:

1. ``python -m model.back_translate --fetch-deb fortunes-de --fetch-deb fortunes ... --out data/bt-mono``
   writes ``de.tsv`` and ``en.tsv``: per line the real sentence, a copy of it for the bulk command to translate
   in place, and the origin ``bt-PACKAGE:LANG`` (LANG the language the copy becomes: the synthetic side), plus
   ``meta.json`` (each package's version, licence and counts). Sentences of the held-out splits (dev, test,
   test-software of each ``--held-out`` directory, either side) are left out here already.
2. ``transerve translate data/bt-mono/de.tsv --column 2 -s de -t en -o data/bt-mono/de.bt.tsv`` (and en → de):
   the committed package, in-process.
3. ``python -m model.data ... --back-translate data/bt-mono/de.bt.tsv --back-translate data/bt-mono/en.bt.tsv``:
   the synthetic pairs join the corpus after every real source (a real pair wins a duplicate), through the same
   cleaning (length ratio) and leak filter; they never become dev or test (those are Ding's and software text's).

The trainer reads the origin: a pair ``bt-*:LANG`` trains only the direction from LANG, with ``<bt>`` after the
``<2xx>`` tag (model/tokenizer.py's ``source_ids``); the vocabulary gets the piece from ``python -m model.vocab``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections import Counter
from pathlib import Path
from typing import Iterator, Sequence

from .corpus import fortunes
from .corpus.debian import DEFAULT_CACHE, deb_version, fetch_deb
from .corpus.split import match_key
from .corpus.text import CorpusError, Pair, normalize_text
from .tokenizer import BT_PIECE  # noqa: F401  (the tag's piece, model/tokenizer.py: re-exported for the recipe)

ORIGIN_PREFIX = "bt-"
LANGS = ("de", "en")
HELD_OUT_SPLITS = ("dev.tsv", "test.tsv", "test-software.tsv")


def origin_of(package: str, synthetic_lang: str) -> str:
    """A synthetic pair's origin: its package and the language of its machine-made side."""
    return f"{ORIGIN_PREFIX}{package}:{synthetic_lang}"


def synthetic_lang(origin: str) -> str | None:
    """The language of a pair's machine-made side ("bt-fortunes-de:en" -> "en"); None for a real pair."""
    if not origin.startswith(ORIGIN_PREFIX):
        return None
    lang = origin.rpartition(":")[2]
    return lang if lang in LANGS else None


def held_out_keys(dirs: Sequence[Path]) -> set[str]:
    """Both sides of every held-out split of the data directories, as the leak filter compares them."""
    keys: set[str] = set()
    for d in dirs:
        found = [d / name for name in HELD_OUT_SPLITS if (d / name).is_file()]
        if not found:
            raise CorpusError(f"--held-out {d}: no {', '.join(HELD_OUT_SPLITS)} there")
        for path in found:
            for line in path.read_text(encoding="utf-8").splitlines():
                keys.update(match_key(normalize_text(c)) for c in line.split("\t")[:2])
    return keys


def monolingual(packages: Sequence[str], cache: Path, held: set[str]) -> tuple[dict[str, list[tuple[str, str]]],
                                                                                 dict[str, dict]]:
    """Each language's (sentence, package) list, deduplicated and without held-out sentences, and each package's
    version, licence and counts."""
    out: dict[str, list[tuple[str, str]]] = {lang: [] for lang in LANGS}
    seen: set[str] = set()
    info: dict[str, dict] = {}
    for package in packages:
        if package not in fortunes.PACKAGES:
            raise CorpusError(f"--fetch-deb {package}: no monolingual reader (known: {', '.join(fortunes.PACKAGES)})")
        lang, licence, _ = fortunes.PACKAGES[package]
        counts = Counter()
        for sentence in fortunes.read(fetch_deb(package, cache), package):
            counts["raw"] += 1
            key = match_key(sentence)
            reason = "held_out" if key in held else "duplicate" if key in seen else "kept"
            counts[reason] += 1
            if reason == "kept":
                seen.add(key)
                out[lang].append((sentence, package))
        info[package] = {"lang": lang, "version": deb_version(package, cache), "licence": licence,
                         "origin": origin_of(package, other(lang)), **counts}
    return out, info


def other(lang: str) -> str:
    return LANGS[1 - LANGS.index(lang)]


def write_monolingual(out: Path, sentences: dict[str, list[tuple[str, str]]], info: dict, argv) -> None:
    """LANG.tsv (sentence, the copy to translate, origin) per language, and meta.json."""
    out.mkdir(parents=True, exist_ok=True)
    for lang, rows in sentences.items():
        with open(out / f"{lang}.tsv", "w", encoding="utf-8") as f:
            f.writelines(f"{s}\t{s}\t{origin_of(pkg, other(lang))}\n" for s, pkg in rows)
    meta = {"kind": "back-translation source", "columns": ["real", "to translate", "origin"],
            "sentences": {lang: len(rows) for lang, rows in sentences.items()}, "packages": info,
            "created_by": "python -m model.back_translate " + shlex.join(argv)}
    (out / "meta.json").write_text(json.dumps(meta, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def read_back_translations(path: Path) -> Iterator[Pair]:
    """A translated LANG.tsv as synthetic pairs: the real sentence on its language's side, the machine translation
    on the other, the origin naming which is which. A line without a translation is refused."""
    if not path.is_file():
        raise CorpusError(f"--back-translate {path}: no such file")
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            cols = line.rstrip("\n").split("\t")
            lang = synthetic_lang(cols[2]) if len(cols) == 3 else None
            if lang is None:
                raise CorpusError(f"--back-translate {path}:{n}: not real<TAB>translation<TAB>bt-PACKAGE:LANG "
                                  "(python -m model.back_translate, then transerve translate --column 2)")
            real, synthetic = cols[0], cols[1]
            de, en = (synthetic, real) if lang == "de" else (real, synthetic)
            yield Pair(de, en, cols[2], sentence=True)


def add_back_translate_argument(p: argparse.ArgumentParser) -> None:
    """model.data's --back-translate."""
    p.add_argument("--back-translate", type=Path, action="append", default=[], metavar="PATH",
                   help="back-translated monolingual text, real<TAB>machine translation<TAB>bt-PACKAGE:LANG a line "
                   "(python -m model.back_translate, then transerve translate --column 2; repeatable): "
                   "synthetic pairs read after every real source, trained only from their machine-made side with a "
                   "<bt> tag (docs/training.md, 'Back-translation')")


def licences_of(paths: Sequence[Path]) -> dict[str, str]:
    """meta.json's licence of each back-translated source (by its meta.json source name, bt-PACKAGE), from the
    extract step's meta.json beside each file."""
    found: dict[str, str] = {}
    for path in paths:
        meta = path.parent / "meta.json"
        if meta.is_file():
            for package, info in json.loads(meta.read_text(encoding="utf-8")).get("packages", {}).items():
                found[ORIGIN_PREFIX + package] = (f"{info['licence']} (Debian {package} {info.get('version')}; "
                                                  "machine-translated by models/de-en)")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m model.back_translate", description="Monolingual everyday text for "
                                "tagged back-translation: OUT/{de,en}.tsv from Debian packages (downloaded, never "
                                "installed) for the bulk command to translate (docs/training.md, 'Back-translation').")
    p.add_argument("--fetch-deb", action="append", required=True, metavar="NAME",
                    help=f"a package of monolingual text (repeatable): {', '.join(fortunes.PACKAGES)}")
    p.add_argument("--held-out", action="append", type=Path, default=[], metavar="DATA",
                    help="a data directory whose dev/test splits (either side) are left out (repeatable)")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="download cache for .debs")
    p.add_argument("--out", type=Path, default=Path("data/bt-mono"))
    args = p.parse_args(argv)
    try:
        sentences, info = monolingual(args.fetch_deb, args.cache, held_out_keys(args.held_out))
    except CorpusError as e:
        p.exit(2, f"error: {e}\n")
    write_monolingual(args.out, sentences, info, argv)
    for package, i in info.items():
        print(f"{package} ({i['lang']}, {i['licence']}): raw {i.get('raw', 0)}, kept {i.get('kept', 0)}, "
              f"duplicate {i.get('duplicate', 0)}, held out {i.get('held_out', 0)}")
    print(f"wrote {args.out}: " + ", ".join(f"{lang} {len(rows)}" for lang, rows in sentences.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
