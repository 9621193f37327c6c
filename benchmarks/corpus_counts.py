"""What each corpus source gives: raw and kept pairs (meta.json, before --min-words) and the sentence-level
pairs it has in train.tsv (after deduplication, the leak check against dev and both test splits, and
--min-words), as a markdown table.

    python -m model.data --out data/de-en-more ... --min-words 4
    python benchmarks/corpus_counts.py data/de-en-more

A source's kept pairs are what it adds to the sources read before it (the first origin of a pair wins, in
model.corpus.sources' order). wesnoth's 17 packages count as one row.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from model.corpus.clean import source_name  # noqa: E402

BASE = ("ding", "gettext", "deb:libreoffice-l10n-de", "lohelp")
# Placeholders and markup: %s, {name}, $name, <b>; such pairs teach formats more than language.
_PLACEHOLDER = re.compile(r"[%{$<]")


def family(source: str) -> str:
    return "deb:wesnoth-1.16-* (data + campaigns)" if source.startswith("deb:wesnoth-1.16-") else source


def versions(meta: dict) -> dict[str, str]:
    """Each package's version from the source descriptions (``deb:NAME=VERSION (...)``, ``debref: PKG=VERSION,
    ...``, ``hedgewars: PKG=VERSION (...)``)."""
    found = {}
    for described in meta["sources"]:
        m = re.match(r"(deb|wheel):([^=\s]+)=(\S+)", described)
        if m:
            found.setdefault(family(f"{m[1]}:{m[2]}"), m[3])
        elif re.match(r"[\w-]+: \S+=", described):      # "debref: PKG=VERSION, ...", "hedgewars: PKG=VERSION ..."
            found[described.split(":")[0]] = described.split("=", 1)[1].split(",")[0].split()[0]
    return found


def table(data: Path) -> str:
    meta = json.loads((data / "meta.json").read_text(encoding="utf-8"))
    raw, kept, licence = Counter(), Counter(), {}
    for name, counts in meta["counts"].items():
        raw[family(name)] += counts["raw"]
        kept[family(name)] += counts["kept"]
        licence[family(name)] = meta["licences"][name]
    sentences, plain, words = Counter(), Counter(), Counter()
    with open(data / "train.tsv", encoding="utf-8") as f:
        for line in f:
            de, en, origin = line.rstrip("\n").split("\t")[:3]
            if min(len(de.split()), len(en.split())) < 4:
                continue
            name = family(source_name(origin))
            sentences[name] += 1
            plain[name] += not _PLACEHOLDER.search(de + en)
            words[name] += len(en.split())
    version = versions(meta)
    rows = ["| source | version | licence | raw | kept | sentence-level pairs in train | of them without `%`, `{`, "
            "`$`, `<` | English words in them |", "|---|---|---|---:|---:|---:|---:|---:|"]
    added = [name for name in raw if name not in BASE]
    for name in [*added, *(n for n in BASE if n in raw)]:
        rows.append(f"| {name} | {version.get(name, '')} | {licence[name]} | {raw[name]:,} | {kept[name]:,} | "
                    f"{sentences[name]:,} | {plain[name]:,} | {words[name]:,} |")
    total = [sum(c[n] for n in added) for c in (raw, kept, sentences, plain, words)]
    rows.append("| **added sources** | | | " + " | ".join(f"**{t:,}**" for t in total) + " |")
    rows.append(f"\nsplits: {meta['splits']}, leaks removed from train: {meta['leaks_removed']}")
    return "\n".join(rows)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", type=Path, help="a model.data output directory (meta.json, train.tsv)")
    print(table(p.parse_args(argv).data))


if __name__ == "__main__":
    main()
