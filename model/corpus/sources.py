"""The parallel sources the command-line flags of ``model.data`` ask for (``model.mono`` reads the
same flags for the sentence-like sides of the parallel corpus)."""

from __future__ import annotations

import argparse
import sys
from typing import Iterable

from .catalogs import DEB_LOCALE_DIR, catalog_origin, find_catalogs, read_gettext
from .debian import fetch_deb
from .ding import find_ding, read_ding
from .text import CorpusError, Pair
from .user import read_moses, read_tsv_corpus


def collect_sources(args: argparse.Namespace) -> tuple[list[Iterable[Pair]], list[str]]:
    """Resolve all inputs (downloading .debs if asked) into readers plus their descriptions.

    Order matters for deduplication (the first origin of a pair is kept): Ding, installed
    catalogs, extra catalogs, downloaded packages, then user corpora.
    """
    readers: list[Iterable[Pair]] = []
    sources: list[str] = []
    if not args.no_ding:
        ding = find_ding(args.ding, args.cache)
        readers.append(read_ding(ding))
        sources.append(f"ding:{ding}")
    catalog_roots = [] if args.no_locale or not args.locale_dir.is_dir() else [args.locale_dir]
    for root in [*catalog_roots, *args.gettext]:
        for cat in find_catalogs(root):
            readers.append(read_gettext(cat, catalog_origin(cat)))
            sources.append(f"gettext:{cat}")
    for name in args.fetch_deb:
        locale = fetch_deb(name, args.cache) / DEB_LOCALE_DIR
        cats = find_catalogs(locale, require_de=False) if locale.is_dir() else []
        if not cats:
            print(f"warning: package {name} has no German catalogs", file=sys.stderr)
        for cat in cats:
            readers.append(read_gettext(cat, f"deb:{name}:{cat.stem}"))
            sources.append(f"deb:{name}:{cat.name}")
    for path in args.tsv:
        if not path.is_file():
            raise CorpusError(f"TSV file not found: {path}")
        readers.append(read_tsv_corpus(path, args.tsv_direction))
        sources.append(f"tsv:{path} ({args.tsv_direction})")
    for prefix in args.moses:
        readers.append(read_moses(prefix))
        sources.append(f"moses:{prefix}")
    return readers, sources
