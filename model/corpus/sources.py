"""The parallel sources the command-line flags of ``model.data`` ask for (``model.mono`` reads the
same flags for the sentence-like sides of the parallel corpus)."""

from __future__ import annotations

import argparse
import sys
from typing import Iterable

from .catalogs import DEB_LOCALE_DIR, catalog_origin, find_catalogs, read_gettext
from .debian import deb_version, fetch_deb
from .ding import find_ding, read_ding
from .lohelp import HELP_PACKAGES, LICENSE as LOHELP_LICENSE, read_libreoffice_help
from .text import CorpusError, Pair
from .user import read_moses, read_tsv_corpus


def collect_sources(args: argparse.Namespace) -> tuple[list[Iterable[Pair]], list[str]]:
    """Resolve all inputs (downloading .debs if asked) into readers plus their descriptions.

    Order matters for deduplication (the first origin of a pair is kept): Ding, installed
    catalogs, extra catalogs, downloaded packages, LibreOffice's help, then user corpora.
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
        root = fetch_deb(name, args.cache)
        # usr/share/locale/de/LC_MESSAGES, or a program's own (LibreOffice: .../resource/de/LC_MESSAGES)
        locales = [root / DEB_LOCALE_DIR] if (root / DEB_LOCALE_DIR).is_dir() else sorted(
            d for d in root.rglob("LC_MESSAGES") if d.parent.name == "de")
        cats = [cat for locale in locales for cat in find_catalogs(locale, require_de=False)]
        if not cats:
            print(f"warning: package {name} has no German catalogs", file=sys.stderr)
        for cat in cats:
            readers.append(read_gettext(cat, f"deb:{name}:{cat.stem}"))
            sources.append(f"deb:{name}:{cat.name}")
    if getattr(args, "libreoffice_help", False):
        roots = {lang: fetch_deb(pkg, args.cache) for lang, pkg in HELP_PACKAGES.items()}
        readers.append(read_libreoffice_help(roots["de"], roots["en"]))
        versions = ", ".join(f"{pkg}={deb_version(pkg, args.cache)}" for pkg in HELP_PACKAGES.values())
        sources.append(f"lohelp: {versions} ({LOHELP_LICENSE})")
    for path in args.tsv:
        if not path.is_file():
            raise CorpusError(f"TSV file not found: {path}")
        readers.append(read_tsv_corpus(path, args.tsv_direction))
        sources.append(f"tsv:{path} ({args.tsv_direction})")
    for prefix in args.moses:
        readers.append(read_moses(prefix))
        sources.append(f"moses:{prefix}")
    return readers, sources
