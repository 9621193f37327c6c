"""Debian packages downloaded (``apt-get download``) and unpacked (``dpkg -x``), never installed: the
Ding dictionary and other programs' German catalogs come from them."""

from __future__ import annotations

import glob
import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

from .text import CorpusError

DEFAULT_CACHE = Path("~/.cache/transerve/debs")
# Packages whose copyright file is free text or a link into another package (no DEP-5 "Files: *"), their
# licence as read by hand from those files (Debian 12): the prefix of the name is enough for wesnoth's
# campaigns, which all carry the same text.
FREE_TEXT_LICENCES = {
    "wesnoth-1.16-": "GPL-2+",
    "digikam-data": "GPL-2+",
    "inkscape": "GPL (free-text copyright file; some portions public domain)",
    "evolution-common": "LGPL-2 or LGPL-3",
    "gcc-12-locales": "GPL-3+ (gcc-12-base's copyright file)",
}


def deb_version(name: str, cache: Path) -> str | None:
    """The version of the package ``fetch_deb`` downloaded into ``cache`` (from its file name), if any."""
    debs = sorted(cache.expanduser().glob(f"{glob.escape(name)}_*.deb"))
    return unquote(debs[-1].name.split("_")[1]) if debs else None


def fetch_deb(name: str, cache: Path) -> Path:
    """``apt-get download`` a package into ``cache`` and ``dpkg -x`` it; return the tree.

    Reuses an earlier download/extraction so a second run works offline.  Nothing is
    installed: ``apt-get download`` only fetches the .deb (it works without root).
    """
    cache = cache.expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    root = cache / "extracted" / name
    if root.is_dir() and any(root.iterdir()):
        return root
    debs = sorted(cache.glob(f"{glob.escape(name)}_*.deb"))
    if not debs:
        try:
            proc = subprocess.run(
                ["apt-get", "download", name], cwd=cache, capture_output=True, text=True
            )
        except FileNotFoundError as exc:
            raise CorpusError(f"cannot download {name}: apt-get is not available") from exc
        if proc.returncode != 0:
            raise CorpusError(
                f"'apt-get download {name}' failed (exit {proc.returncode}): "
                f"{proc.stderr.strip() or proc.stdout.strip()}"
            )
        debs = sorted(cache.glob(f"{glob.escape(name)}_*.deb"))
        if not debs:
            raise CorpusError(f"'apt-get download {name}' produced no {name}_*.deb in {cache}")
    root.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["dpkg", "-x", str(debs[-1]), str(root)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise CorpusError(f"'dpkg -x {debs[-1]}' failed: {proc.stderr.strip()}")
    return root


def deb_licence(root: Path, name: str) -> str | None:
    """The licence of ``Files: *`` in an unpacked package's machine-readable copyright file (DEP-5), if it
    has one: most of a package's catalogs are its own program's text. Packages whose copyright file is free
    text (wesnoth) or a link into another package (gcc-12-locales) give ``FREE_TEXT_LICENCES``' entry, or
    None."""
    path = root / "usr/share/doc" / name / "copyright"
    read_by_hand = next((v for k, v in FREE_TEXT_LICENCES.items() if name.startswith(k)), None)
    if not path.is_file():
        return read_by_hand
    for paragraph in re.split(r"\n\s*\n", path.read_text(encoding="utf-8", errors="replace")):
        fields = dict(re.findall(r"^(Files|License):[ \t]*(.*)$", paragraph, re.M))
        if fields.get("Files", "").split()[:1] == ["*"] and fields.get("License", "").strip():
            return fields["License"].strip()
    return read_by_hand
