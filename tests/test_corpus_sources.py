"""The corpus sources added for issue 39 (more sentence-level text): catalogs zipped inside Debian packages
(calibre's locales.zip), PyPI wheels' German catalogs, the Debian Reference aligned by structure, and the
rule that none of them changes a held-out split. Every fixture is built here; nothing touches the network
(fetch_deb and fetch_wheel find their cached download, and pip/apt would fail the test if called)."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import polib
import pytest

from model.corpus.catalogs import find_catalogs, german_members, package_catalogs, read_gettext
from model.corpus.debian import deb_licence
from model.corpus.debref import BlockParser, align_blocks, read_blocks, read_debian_reference
from model.corpus.split import split_corpus
from model.corpus.text import Pair
from model.corpus.tsv import read_pairs
from model.corpus.wheels import fetch_wheel, find_wheel, read_wheel, wheel_licence, wheel_version
from model.data import main
from model.corpus.sources import STRUCTURED_DEBS
from model.corpus.text import CorpusError
from test_corpus_documentation import (DOCBOOK_XSL, GNUCASH_DE, GNUCASH_EN, MALLARD_DE, MALLARD_EN, PUBLICAN_DE,
                                       PUBLICAN_EN, write_handbook, write_mallard)
from test_corpus_firefox import make_packages
from test_corpus_games import freeorion_tree, hedgewars_tree

FIXTURE = Path(__file__).parent / "fixtures" / "ding_sample.txt"


def mo_bytes(entries: dict[str, str], tmp: Path) -> bytes:
    po = polib.POFile()
    po.metadata = {"Content-Type": "text/plain; charset=UTF-8", "Language": "de"}
    for msgid, msgstr in entries.items():
        po.append(polib.POEntry(msgid=msgid, msgstr=msgstr))
    po.save_as_mofile(str(tmp))
    return tmp.read_bytes()


CATALOG = {"The ticket has been sent to your email address.": "Das Ticket wurde an Ihre E-Mail-Adresse gesendet.",
           "Save": "Speichern"}


def make_wheel(cache: Path, tmp: Path, metadata: str, name: str = "demo_shop-1.2.0-py3-none-any.whl") -> Path:
    """A tiny wheel: a German .po/.mo pair of one domain, a de_DE (Babel) catalog, French and Swiss German
    catalogs that must be left out, and its METADATA."""
    cache.mkdir(parents=True, exist_ok=True)
    wheel = cache / name
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("demo_shop/locale/de/LC_MESSAGES/django.mo", mo_bytes(CATALOG, tmp / "a.mo"))
        zf.writestr("demo_shop/locale/de/LC_MESSAGES/django.po", "this .po must not be read: its .mo is there")
        zf.writestr("demo_shop/translations/de_DE/LC_MESSAGES/messages.mo",
                    mo_bytes({"Your order is complete.": "Ihre Bestellung ist abgeschlossen."}, tmp / "b.mo"))
        zf.writestr("demo_shop/locale/fr/LC_MESSAGES/django.mo", mo_bytes({"Save": "Enregistrer"}, tmp / "c.mo"))
        zf.writestr("demo_shop/locale/de_CH/LC_MESSAGES/django.mo", mo_bytes({"Save": "Sichern"}, tmp / "d.mo"))
        zf.writestr("demo_shop-1.2.0.dist-info/METADATA", metadata)
    return wheel


def no_network(*args, **kwargs):
    raise AssertionError(f"a download was attempted: {args}")


def test_german_members_prefer_the_compiled_catalog() -> None:
    names = ["p/locale/de/LC_MESSAGES/django.po", "p/locale/de/LC_MESSAGES/django.mo",
             "p/locale/de/LC_MESSAGES/djangojs.po", "p/locale/fr/LC_MESSAGES/django.mo",
             "p/translations/de_DE/LC_MESSAGES/messages.po", "de/messages.mo", "de/lcdata.calibre_msgpack",
             "p/locale/de_AT/LC_MESSAGES/django.mo", "p/templates/de.html"]
    assert german_members(names) == ["de/messages.mo", "p/locale/de/LC_MESSAGES/django.mo",
                                     "p/locale/de/LC_MESSAGES/djangojs.po",
                                     "p/translations/de_DE/LC_MESSAGES/messages.po"]


def test_wheel_catalogs_version_and_licence(tmp_path: Path, monkeypatch) -> None:
    wheel = make_wheel(tmp_path / "wheels", tmp_path, "Metadata-Version: 2.4\nName: demo-shop\nVersion: 1.2.0\n"
                       "License: Licensing of demo\nClassifier: License :: OSI Approved :: MIT License\n")
    monkeypatch.setattr(subprocess, "run", no_network)
    assert fetch_wheel("Demo-Shop", tmp_path / "wheels") == wheel           # cached: pip is not called
    assert find_wheel("demo-shop==9.9", tmp_path / "wheels") is None
    assert wheel_version(wheel) == "1.2.0" and wheel_licence(wheel) == "MIT License"
    pairs = list(read_wheel(wheel, "demo-shop"))
    assert sorted((p.de, p.en, p.origin) for p in pairs) == [
        ("Das Ticket wurde an Ihre E-Mail-Adresse gesendet.", "The ticket has been sent to your email address.",
         "wheel:demo-shop:django"),
        ("Ihre Bestellung ist abgeschlossen.", "Your order is complete.", "wheel:demo-shop:messages"),
        ("Speichern", "Save", "wheel:demo-shop:django")]
    spdx = make_wheel(tmp_path / "other", tmp_path, "Name: x\nLicense-Expression: GPL-3.0-or-later\n"
                      "Classifier: License :: OSI Approved :: MIT License\n")
    assert wheel_licence(spdx) == "GPL-3.0-or-later"


def test_catalogs_zipped_inside_a_debian_package(tmp_path: Path) -> None:
    """calibre keeps its catalogs in usr/share/calibre/localization/locales.zip (de/messages.mo)."""
    root = tmp_path / "extracted" / "calibre"
    archive = root / "usr/share/calibre/localization/locales.zip"
    archive.parent.mkdir(parents=True)
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("de/messages.mo", mo_bytes(CATALOG, tmp_path / "a.mo"))
        zf.writestr("fr/messages.mo", mo_bytes({"Save": "Enregistrer"}, tmp_path / "b.mo"))
    cats = package_catalogs(root)
    assert [c.relative_to(root).as_posix() for c in cats] == [
        "usr/share/calibre/localization/locales.zip.unpacked/de/messages.mo"]
    assert package_catalogs(root) == cats                                   # unpacked once, reused


def test_package_licence_from_its_copyright_file(tmp_path: Path) -> None:
    copyright_file = tmp_path / "calibre/usr/share/doc/calibre/copyright"
    copyright_file.parent.mkdir(parents=True)
    copyright_file.write_text("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\n"
                              "Files: src/odf/*\nLicense: GPL-2+\n\nFiles: *\nCopyright: Kovid Goyal\n"
                              "License: GPL-3\n\nLicense: GPL-3\n full text\n")
    assert deb_licence(tmp_path / "calibre", "calibre") == "GPL-3"
    assert deb_licence(tmp_path / "calibre", "wesnoth-1.16-httt") == "GPL-2+"     # free text: read by hand
    assert deb_licence(tmp_path / "calibre", "unknown-package") is None


PAGE = """<html><body><div class="chapter"><h1 class="title"><a id="_{s1}"/>2. {title}</h1>
<p>{p1}</p><div class="itemizedlist"><ul><li><p>{item}</p></li></ul></div>
<pre class="screen">$ apt-get update</pre>
<table><tr><td>aptitude</td><td>{cell}</td></tr></table>
<div class="section"><h2 class="title"><a id="_second"/>2.1. {title2}</h2>{extra}<p>{p2}</p></div>
<p>{untranslated}</p></div></body></html>"""
DE = dict(s1="pm", title="Debian-Paketverwaltung", p1="Das ist der erste Absatz. Er hat zwei Sätze.",
          item="Jedes Paket enthält sein eigenes Konfigurationsskript.", cell="Paketverwaltung mit Textoberfläche",
          title2="Grundlagen", extra="<p>Ein Absatz, den es nur auf Deutsch gibt.</p>",
          p2="Dieser Abschnitt passt nicht zusammen.",
          untranslated="This paragraph was left in English by the translation tool.")
EN = dict(s1="pm", title="Debian package management", p1="This is the first paragraph. It has two sentences.",
          item="Each package comes with its own configuration script.", cell="text-based package manager",
          title2="Basics", extra="", p2="This section does not match.",
          untranslated="This paragraph was left in English by the translation tool.")


def write_reference(root: Path, lang: str, text: dict[str, str]) -> None:
    page = root / f"usr/share/debian-reference/ch02.{lang}.html"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(PAGE.format(**text), encoding="utf-8")


def test_debian_reference_aligns_by_section_and_drops_what_does_not_match(tmp_path: Path) -> None:
    write_reference(tmp_path / "de", "de", DE)
    write_reference(tmp_path / "en", "en", EN)
    de = read_blocks(tmp_path / "de/usr/share/debian-reference/ch02.de.html")
    assert ("_pm", "td", "aptitude") in de and not any("apt-get" in b[2] for b in de)    # no <pre> text
    pairs = list(read_debian_reference(tmp_path / "de", tmp_path / "en"))
    assert [(p.de, p.en) for p in pairs] == [
        ("Debian-Paketverwaltung", "Debian package management"),        # "2. " numbering gone
        ("Das ist der erste Absatz.", "This is the first paragraph."),  # cut into sentences
        ("Er hat zwei Sätze.", "It has two sentences."),
        ("Jedes Paket enthält sein eigenes Konfigurationsskript.",
         "Each package comes with its own configuration script."),
        ("Paketverwaltung mit Textoberfläche", "text-based package manager"),
    ]   # section "_second" has an extra German paragraph: all of it left out; the English paragraph too
    assert {p.origin for p in pairs} == {"debref:ch02"} and pairs[1].sentence
    same = read_blocks(tmp_path / "en/usr/share/debian-reference/ch02.en.html")
    assert len(align_blocks(same, same)) == len(same)                   # equal shapes: block for block


def test_added_sources_train_only_and_never_change_a_held_out_split() -> None:
    held = [Pair(f"Die Datei Nummer {i} wird jetzt gespeichert.", f"The file number {i} is now saved.",
                 f"lohelp:page{i}", True) for i in range(20)]
    added = [Pair(f"Das Dokument Nummer {i} wird nun gesichert.", f"The document number {i} is now stored.",
                  f"wheel:shop:django{i}", True) for i in range(20)]
    added += [Pair(f"Die Datei {i} ist gespeichert.", f"The file number {i} is now saved.", "debref:ch01", True)
              for i in range(20)]                                        # repeats held-out English sides
    base, _ = split_corpus(held, test_size=0, dev_size=0, software_test_size=8)
    more, leaks = split_corpus(held + added, test_size=0, dev_size=0, software_test_size=8)
    assert more["test-software"] == base["test-software"]
    assert all(p.origin.startswith("lohelp:") for p in more["test-software"])
    held_en = {p.en for p in more["test-software"]}
    assert not held_en & {p.en for p in more["train"]} and leaks == 8


def test_main_records_new_sources_and_keeps_the_splits(tmp_path: Path, monkeypatch) -> None:
    cache, wheels = tmp_path / "debs", tmp_path / "wheels"
    for lang, text in (("de", DE), ("en", EN)):
        write_reference(cache / "extracted" / f"debian-reference-{lang}", lang, text)
        (cache / f"debian-reference-{lang}_2.100_all.deb").write_bytes(b"")
    make_wheel(wheels, tmp_path, "Name: demo-shop\nLicense-Expression: AGPL-3.0-only\n")
    monkeypatch.setattr(subprocess, "run", no_network)
    common = ["--ding", str(FIXTURE), "--no-locale", "--test-size", "3", "--dev-size", "2", "--cache", str(cache),
              "--wheel-cache", str(wheels)]
    assert main([*common, "--out", str(tmp_path / "base")]) == 0
    assert main([*common, "--out", str(tmp_path / "more"), "--fetch-wheel", "demo-shop", "--debian-reference"]) == 0
    for name in ("dev", "test"):
        assert (tmp_path / "base" / f"{name}.tsv").read_bytes() == (tmp_path / "more" / f"{name}.tsv").read_bytes()
    meta = json.loads((tmp_path / "more" / "meta.json").read_text(encoding="utf-8"))
    assert meta["counts"]["wheel:demo-shop"] == {"raw": 3, "kept": 3}
    assert meta["counts"]["debref"] == {"raw": 5, "kept": 5}
    assert meta["licences"]["wheel:demo-shop"] == "AGPL-3.0-only" and meta["licences"]["debref"].startswith("GPL-2+")
    assert "wheel:demo-shop=1.2.0 (AGPL-3.0-only): 2 catalogs" in meta["sources"]
    assert any(s.startswith("debref: debian-reference-de=2.100") for s in meta["sources"])
    train = read_pairs(tmp_path / "more" / "train.tsv")
    assert ("Ihre Bestellung ist abgeschlossen.", "Your order is complete.") in train


def test_fetch_deb_reads_a_structured_package_by_its_own_format(tmp_path: Path, monkeypatch) -> None:
    """--fetch-deb hedgewars-data goes to the Lua/keyed reader (not to gettext catalogs it has none of): its
    pairs count as one source with the package's licence and version, and only train."""
    cache = tmp_path / "debs"
    hedgewars_tree(cache / "extracted" / "hedgewars-data")
    (cache / "hedgewars-data_1.0.2-6_all.deb").write_bytes(b"")
    monkeypatch.setattr(subprocess, "run", no_network)
    common = ["--ding", str(FIXTURE), "--no-locale", "--test-size", "3", "--dev-size", "2", "--cache", str(cache)]
    assert main([*common, "--out", str(tmp_path / "base")]) == 0
    assert main([*common, "--out", str(tmp_path / "more"), "--fetch-deb", "hedgewars-data"]) == 0
    for name in ("dev", "test"):
        assert (tmp_path / "base" / f"{name}.tsv").read_bytes() == (tmp_path / "more" / f"{name}.tsv").read_bytes()
    meta = json.loads((tmp_path / "more" / "meta.json").read_text(encoding="utf-8"))
    assert meta["counts"]["hedgewars"]["kept"] > 0 and meta["licences"]["hedgewars"] == "GPL-2"
    assert "hedgewars: hedgewars-data=1.0.2-6 (GPL-2)" in meta["sources"]
    assert {o.split(":")[0] for o in meta["origins"]} == {"ding", "hedgewars"}


def test_djangos_own_catalogs_are_refused(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(subprocess, "run", no_network)
    with pytest.raises(SystemExit) as stop:
        main(["--ding", str(FIXTURE), "--no-locale", "--out", str(tmp_path), "--fetch-wheel", "Django==5.2.19"])
    assert stop.value.code == 2 and "held out for evaluation" in capsys.readouterr().err


def structured_fixture(name: str, tmp: Path) -> dict[str, Path]:
    """Each structured package's test fixture, unpacked under tmp: its reader's roots."""
    if name == "firefox-esr-l10n-de":
        return make_packages(tmp)
    root = tmp / name
    if name == "hedgewars-data":
        hedgewars_tree(root)
    elif name == "freeorion-data":
        freeorion_tree(root)
    elif name == "gnome-user-docs":
        write_mallard(root, "a.page", MALLARD_EN, MALLARD_DE)
    elif name == "debian-handbook":
        write_handbook(root, "apt.html", PUBLICAN_EN, PUBLICAN_DE)
    else:
        for lang, fields in (("en", GNUCASH_EN), ("de", GNUCASH_DE)):
            (root / f"usr/share/doc/gnucash-docs/gnucash-guide-{lang}").mkdir(parents=True)
            (root / f"usr/share/doc/gnucash-docs/gnucash-guide-{lang}/a.html").write_text(
                DOCBOOK_XSL.format(**fields), encoding="utf-8")
            (root / f"usr/share/doc/gnucash-docs/gnucash-help-{lang}").mkdir(parents=True)
    return {name: root}


@pytest.mark.parametrize("name", list(STRUCTURED_DEBS))
def test_each_structured_reader_names_its_pairs_by_its_kind(name: str, tmp_path: Path) -> None:
    """meta.json's source, its licence and --upsample's name are the reader's origin kind: a reader whose
    origins said otherwise would count as a source of no licence."""
    kind, _, _, read = STRUCTURED_DEBS[name]
    pairs = list(read(structured_fixture(name, tmp_path)))
    assert pairs and {p.origin.split(":")[0] for p in pairs} == {kind}


@pytest.mark.parametrize("name", list(STRUCTURED_DEBS))
def test_a_package_of_another_layout_is_an_error_not_an_empty_source(name: str, tmp_path: Path) -> None:
    _, packages, _, read = STRUCTURED_DEBS[name]
    with pytest.raises(CorpusError):
        list(read({pkg: tmp_path / pkg for pkg in packages}))


def test_corrupt_archives_are_corpus_errors(tmp_path: Path) -> None:
    roots = make_packages(tmp_path)
    xpi = next((roots["firefox-esr-l10n-de"] / "usr/lib/firefox-esr/browser/extensions").glob("*.xpi"))
    xpi.write_bytes(b"PK\x03\x04 cut short")
    with pytest.raises(CorpusError, match="zip"):
        list(STRUCTURED_DEBS["firefox-esr-l10n-de"][3](roots))
    root = hedgewars_tree(tmp_path / "hw")
    qm = root / "usr/share/games/hedgewars/Data/Locale/hedgewars_de.qm"
    qm.write_bytes(qm.read_bytes()[:-3])
    with pytest.raises(CorpusError, match="truncated"):
        list(STRUCTURED_DEBS["hedgewars-data"][3]({"hedgewars-data": root}))


def test_djangos_own_catalogs_are_held_out_whatever_the_route(tmp_path: Path, capsys) -> None:
    """--fetch-deb python3-django or --gettext on a site-packages tree reach Django's catalogs through
    read_gettext: they are skipped there, another project's django.mo domain is not."""
    site = tmp_path / "site-packages"
    for where in ("django/conf/locale/de/LC_MESSAGES", "django/contrib/admin/locale/de/LC_MESSAGES",
                  "pretix/locale/de/LC_MESSAGES"):
        (site / where).mkdir(parents=True)
        (site / where / "django.mo").write_bytes(mo_bytes(CATALOG, tmp_path / "x.mo"))
    pairs = [p for cat in find_catalogs(site) for p in read_gettext(cat, "gettext:django")]
    assert len(pairs) == len(CATALOG)           # pretix's alone
    assert capsys.readouterr().err.count("held out for evaluation") == 2


def test_a_self_closed_skipped_element_and_a_table_of_contents_open_no_blocks(tmp_path: Path) -> None:
    page = tmp_path / "p.html"
    page.write_text('<div class="toc"><dl><dt>1. Intro</dt></dl></div><pre/><p>Text one.</p><p>Text two.</p>',
                    encoding="utf-8")

    class WithToc(BlockParser):
        def skips(self, tag, attrs):
            return super().skips(tag, attrs) or "toc" in (attrs.get("class") or "")
    assert [b[1:] for b in read_blocks(page, WithToc)] == [("p", "Text one."), ("p", "Text two.")]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
