"""German gettext catalogs inside Python wheels from PyPI (``--fetch-wheel``): Django and Babel projects
ship their translations in the wheel (``pretix/locale/de/LC_MESSAGES/django.mo``,
``indico/translations/de_DE/LC_MESSAGES/messages.po``), so ``pip download --no-deps`` fetches them without
installing anything or pulling dependencies. Each wheel keeps its own licence (its METADATA) and version
(its file name), recorded in meta.json.
"""

from __future__ import annotations

import email.parser
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Iterator

from .catalogs import read_gettext, unzip_catalogs
from .text import CorpusError, Pair

DEFAULT_WHEEL_CACHE = Path("~/.cache/transerve/wheels")
# A wheel's file name: NAME-VERSION(-BUILD)?-PYTHON-ABI-PLATFORM.whl, NAME with "_" for "-" and any case.
_WHEEL_NAME = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)-")


def _normalise(name: str) -> str:
    """PEP 503's comparable project name: ``Django`` / ``django_allauth`` -> ``django`` / ``django-allauth``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def find_wheel(name: str, cache: Path) -> Path | None:
    """The newest-named wheel of project ``name`` (``NAME`` or ``NAME==VERSION``) in ``cache``, if any."""
    project, _, version = name.partition("==")
    found = []
    for path in sorted(cache.glob("*.whl")):
        m = _WHEEL_NAME.match(path.name)
        if m and _normalise(m["name"]) == _normalise(project) and version in ("", m["version"]):
            found.append(path)
    return found[-1] if found else None


def fetch_wheel(name: str, cache: Path) -> Path:
    """``pip download --no-deps`` one project's wheel into ``cache`` (reused on later runs, so a second run
    works offline); ``name`` may pin a version (``pretix==2026.8.0``)."""
    cache = cache.expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    wheel = find_wheel(name, cache)
    if wheel is not None:
        return wheel
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--dest", str(cache),
           "--disable-pip-version-check", "--quiet", name]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CorpusError(f"'pip download {name}' failed (exit {proc.returncode}): "
                          f"{(proc.stderr or proc.stdout).strip()[-500:]}")
    wheel = find_wheel(name, cache)
    if wheel is None:
        raise CorpusError(f"'pip download {name}' left no wheel of {name} in {cache}")
    return wheel


def wheel_version(wheel: Path) -> str:
    m = _WHEEL_NAME.match(wheel.name)
    return m["version"] if m else "?"


def wheel_licence(wheel: Path) -> str:
    """The wheel's licence from its METADATA: ``License-Expression`` (SPDX), else the ``License ::``
    classifiers, else the first line of ``License`` (a free-text field: pretix's says only "Licensing of
    pretix", so the classifiers come first)."""
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA")), None)
        text = zf.read(meta_name).decode("utf-8", "replace") if meta_name else ""
    meta = email.parser.HeaderParser().parsestr(text)
    if meta.get("License-Expression"):
        return str(meta["License-Expression"]).strip()
    classifiers = [c.split("::")[-1].strip() for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    if classifiers:
        return ", ".join(classifiers)
    return (str(meta.get("License") or "").strip().splitlines() or ["unknown: see the wheel's METADATA"])[0]


def wheel_catalogs(wheel: Path) -> list[Path]:
    """The wheel's German catalogs, unpacked beside it (``<wheel>.unpacked/``) on first use."""
    return unzip_catalogs(wheel, wheel.with_name(wheel.name + ".unpacked"))


def read_wheel(wheel: Path, project: str) -> Iterator[Pair]:
    """Pairs of every German catalog in one wheel, origin ``wheel:<project>:<domain>``."""
    for cat in wheel_catalogs(wheel):
        yield from read_gettext(cat, f"wheel:{project}:{cat.stem}")
