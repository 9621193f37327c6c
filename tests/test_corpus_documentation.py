"""Documentation shipped in German and English by Debian packages, aligned block by block (issue 55): GNOME's
Mallard help (``mallard``), the Debian Administrator's Handbook and GnuCash's manuals (``handbook``). Every
fixture is a small hand-made page pair in the package's layout, written under tmp_path; nothing is
downloaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from model.corpus import handbook, mallard
from model.corpus.debref import read_blocks, sentence_pairs


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def pairs_of(pairs) -> list[tuple[str, str]]:
    return [(p.de, p.en) for p in pairs]


MALLARD = """<?xml version="1.0" encoding="utf-8"?>
<page xmlns="http://projectmallard.org/1.0/" xmlns:its="http://www.w3.org/2005/11/its" type="topic" id="demo">
  <info>
    <link type="guide" xref="index"/>
    <credit type="author"><name>Shaun McCance</name><email>shaunm@gnome.org</email></credit>
    {translators}
    <desc>{desc}</desc>
  </info>
  <title>{title}</title>
  <p>{intro}</p>
  <steps>
    <item><p>{step}</p></item>
  </steps>
  <screen its:translate="no"><output>$ </output><input>gsettings set org.gnome.a11y show true</input></screen>
  <code>gsettings get org.gnome.desktop.a11y always-show-universal-access-status</code>
  {comment}
  <table><tr><td><p>{cell}</p></td></tr></table>
  <p>{hole} <link xref="a11y-icon"/>.</p>
  <p>{hole} <link href="https://wiki.gnome.org/Accessibility"/>.</p>
  <p>The <app>gnome-shell</app> extension is described in the upstream documentation.</p>
</page>
"""
MALLARD_EN = dict(
    translators="", desc="Turn on the accessibility menu.", title="Always show the accessibility menu",
    intro="The menu is in the top bar. It gives quick access to the settings.",
    step="Press <keyseq><key>Ctrl</key><key>Alt</key><key>S</key></keyseq> or choose "
         "<guiseq><gui>Settings</gui><gui>Accessibility</gui></guiseq>.",
    comment="<comment><cite date=\"2012-02-19\">shaunm</cite><p>Explain the Orca settings here.</p></comment>",
    cell="Shows the menu even when no setting is on.", hole="For more, see")
MALLARD_DE = dict(
    translators="<mal:credit xmlns:mal=\"http://projectmallard.org/1.0/\" type=\"translator copyright\">"
                "<mal:name>Mario Blättermann</mal:name><mal:years>2011</mal:years></mal:credit>",
    desc="Das Barrierefreiheitsmenü einschalten.", title="Das Barrierefreiheitsmenü immer anzeigen",
    intro="Das Menü befindet sich in der oberen Leiste. Es bietet schnellen Zugriff auf die Einstellungen.",
    step="Drücken Sie <keyseq><key>Strg</key><key>Alt</key><key>S</key></keyseq> oder wählen Sie "
         "<guiseq><gui>Einstellungen</gui><gui>Barrierefreiheit</gui></guiseq>.",
    comment="", cell="Zeigt das Menü auch dann, wenn keine Einstellung aktiv ist.",
    hole="Weitere Informationen finden Sie in")


def write_mallard(root: Path, page: str, en: dict[str, str], de: dict[str, str]) -> None:
    write(root / mallard.HELP_DIRS["en"] / "gnome-help" / page, MALLARD.format(**en))
    write(root / mallard.HELP_DIRS["de"] / "gnome-help" / page, MALLARD.format(**de))


def test_mallard_pages_aligned_block_by_block(tmp_path: Path) -> None:
    write_mallard(tmp_path, "a11y-menu.page", MALLARD_EN, MALLARD_DE)
    pairs = list(mallard.read({"gnome-user-docs": tmp_path}))
    assert pairs_of(pairs) == [
        ("Das Barrierefreiheitsmenü einschalten.", "Turn on the accessibility menu."),
        ("Das Barrierefreiheitsmenü immer anzeigen", "Always show the accessibility menu"),
        ("Das Menü befindet sich in der oberen Leiste.", "The menu is in the top bar."),     # cut into sentences
        ("Es bietet schnellen Zugriff auf die Einstellungen.", "It gives quick access to the settings."),
        ("Drücken Sie Strg+Alt+S oder wählen Sie Einstellungen ▸ Barrierefreiheit.",
         "Press Ctrl+Alt+S or choose Settings ▸ Accessibility."),
        ("Zeigt das Menü auch dann, wenn keine Einstellung aktiv ist.", "Shows the menu even when no setting is on."),
    ]   # no screen, code block, comment, credit, block with an empty link, or block left in English
    assert {p.origin for p in pairs} == {"gnome-user-docs:gnome-help/a11y-menu"} and pairs[2].sentence
    blocks = mallard.read_page_blocks(tmp_path / mallard.HELP_DIRS["en"] / "gnome-help/a11y-menu.page")
    assert not any("gsettings" in text or "Orca" in text for _, text in blocks)


def test_mallard_page_with_another_block_sequence_is_refused(tmp_path: Path) -> None:
    write_mallard(tmp_path, "a11y-menu.page", MALLARD_EN, MALLARD_DE)
    write_mallard(tmp_path, "a11y-stale.page", MALLARD_EN,
                  {**MALLARD_DE, "comment": "<p>Ein Absatz einer älteren Fassung der Seite.</p>"})
    write(tmp_path / mallard.HELP_DIRS["de"] / "gnome-help/only-german.page", MALLARD.format(**MALLARD_DE))
    write(tmp_path / mallard.HELP_DIRS["de"] / "gnome-help/broken.page", "<page><p>kaputt</page>")
    write(tmp_path / mallard.HELP_DIRS["en"] / "gnome-help/broken.page", "<page><p>broken</p></page>")
    origins = {p.origin for p in mallard.read({"gnome-user-docs": tmp_path})}
    assert origins == {"gnome-user-docs:gnome-help/a11y-menu"}


PUBLICAN = """<?xml version="1.0" encoding="UTF-8" standalone="no"?>
<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Strict//EN" "http://www.w3.org/TR/xhtml1/DTD/xhtml1-strict.dtd">
<html xmlns="http://www.w3.org/1999/xhtml"><head><title>{h1}</title></head><body>
<div id="banner"><a href="http://debian-handbook.info/get/"><span class="text">Download the ebook</span></a></div>
<ul class="docnav top"><li class="previous"><a href="x.html"><strong>{prev}</strong></a></li></ul>
<div class="chapter"><div class="titlepage"><h1 class="title"><a xmlns="" id="apt"></a>{h1}</h1></div>
<div class="toc"><dl class="toc"><dt><span class="section"><a href="#s">6.1. {toc}</a></span></dt></dl></div>
<div class="para">{para} <div xmlns="" class="url">→ <a href="https://www.debian.org/{lang}">https://www.debian.org/{lang}</a></div>
</div><div class="para">{list_intro}<div class="itemizedlist"><ul><li class="listitem">
<div class="para">{item}</div></li></ul></div>
</div><div class="example"><p class="title"><strong>{example}</strong></p>
<div class="example-contents"><pre class="screen"><code class="computeroutput"># </code>
<strong class="userinput"><code>apt update</code></strong></pre></div></div>
<div class="para">{stale}</div>{extra}<table><tr><td>{cell}</td></tr></table></div></body></html>
"""
PUBLICAN_EN = dict(h1="Chapter 6. Maintenance and Updates", prev="Prev", toc="Filling in the sources.list File",
                   lang="en", para="APT is a vast project whose original plans included a graphical interface.",
                   list_intro="Both tools are built on top of the same library:",
                   item="The first field indicates the source type.", example="Example 6.1. A sources.list entry",
                   stale="Conversely, the public interface of apt-get is well defined and will not change.",
                   extra="", cell="aptitude")
PUBLICAN_DE = dict(h1="Kapitel 6. Wartung und Aktualisierung", prev="Zurück", toc="Befüllen der sources.list Datei",
                   lang="de", para="APT ist ein gewaltiges Projekt, dessen ursprünglicher Entwurf eine grafische "
                                   "Schnittstelle vorsah.",
                   list_intro="Beide Werkzeuge bauen auf derselben Bibliothek auf:",
                   item="Das erste Feld gibt die Art der Quelle an.",
                   example="Beispiel 6.1. Ein Eintrag der sources.list",
                   stale="Conversely, the public interface of apt-get is well defined and will not change.",
                   extra="", cell="aptitude")


def write_handbook(root: Path, name: str, en: dict[str, str], de: dict[str, str]) -> None:
    write(root / handbook.HANDBOOK_DIRS["en"] / name, PUBLICAN.format(**en))
    write(root / handbook.HANDBOOK_DIRS["de"] / name, PUBLICAN.format(**de))


def test_handbook_files_aligned_block_by_block(tmp_path: Path) -> None:
    write_handbook(tmp_path, "apt.html", PUBLICAN_EN, PUBLICAN_DE)
    pairs = list(handbook.read_handbook({"debian-handbook": tmp_path}))
    expected = [
        ("Wartung und Aktualisierung", "Maintenance and Updates"),       # <title>: "Kapitel 6. " gone
        ("Wartung und Aktualisierung", "Maintenance and Updates"),       # <h1>
        ("APT ist ein gewaltiges Projekt, dessen ursprünglicher Entwurf eine grafische Schnittstelle vorsah.",
         "APT is a vast project whose original plans included a graphical interface."),   # no URL after it
        ("Das erste Feld gibt die Art der Quelle an.", "The first field indicates the source type."),
        ("Beide Werkzeuge bauen auf derselben Bibliothek auf:", "Both tools are built on top of the same library:"),
        ("Ein Eintrag der sources.list", "A sources.list entry"),
    ]   # no banner, navigation, table of contents, screen, paragraph left in English, command in a cell
    assert pairs_of(pairs) == expected
    assert {p.origin for p in pairs} == {"debian-handbook:apt"} and pairs[2].sentence
    blocks = read_blocks(tmp_path / handbook.HANDBOOK_DIRS["en"] / "apt.html", handbook.DocBookBlocks)
    assert not any("apt update" in text or "debian.org" in text for _, _, text in blocks)


def test_handbook_file_with_another_block_sequence_is_refused(tmp_path: Path) -> None:
    write_handbook(tmp_path, "apt.html", PUBLICAN_EN, PUBLICAN_DE)
    write_handbook(tmp_path, "sect.apt-get.html", PUBLICAN_EN,
                   {**PUBLICAN_DE, "extra": '<div class="para">Ein Absatz, den es nur auf Deutsch gibt.</div>'})
    assert {p.origin for p in handbook.read_handbook({"debian-handbook": tmp_path})} == {"debian-handbook:apt"}


DOCBOOK_XSL = """<html><head><meta http-equiv="Content-Type" content="text/html; charset=UTF-8">
<title>{title}</title></head>
<body bgcolor="white"><div class="navheader"><table width="100%"><tr><th colspan="3">{title}</th></tr>
<tr><td><a accesskey="p" href="chapter_cc.html">&lt;&lt;&lt; {prev}</a></td></tr></table><hr></div>
<div class="sect1"><div class="titlepage"><h2 class="title"><a name="cc-concepts1"></a>{title}</h2></div>
<p>{p1}</p><br><dl class="variablelist"><dt><span class="term">{term}</span></dt><dd>{definition}</dd></dl>
<div class="itemizedlist"><ul><li class="listitem">{item}</li></ul></div>
<pre class="screen">gnucash-cli --quotes get $HOME/finances.gnucash</pre>{extra}</div>
<div class="navfooter"><hr><table width="100%"><tr><td>{prev}</td><td>{up}</td></tr></table></div></body></html>
"""
GNUCASH_EN = dict(title="7.1. Concepts", prev="Prev", up="Up", term="Liability",
                  p1="A credit card account is a short-term loan. You buy things and pay the money back.",
                  definition="What you owe.", item="Enter each purchase as a separate transaction.", extra="")
GNUCASH_DE = dict(title="7.1. Konzepte", prev="Zurück", up="Nach oben", term="Verbindlichkeit",
                  p1="Ein Kreditkartenkonto ist ein kurzfristiges Darlehen. Sie kaufen Dinge und zahlen das Geld "
                     "zurück.",
                  definition="Was Sie schulden.", item="Geben Sie jeden Kauf als separate Buchung ein.", extra="")


def test_gnucash_manuals_aligned_and_disagreeing_files_refused(tmp_path: Path) -> None:
    docs = tmp_path / handbook.GNUCASH_DIR
    for name, en, de in (("cc-concepts1.html", GNUCASH_EN, GNUCASH_DE),
                         ("cc-together1.html", GNUCASH_EN, {**GNUCASH_DE, "extra": "<p>Neu geschrieben.</p>"})):
        write(docs / "gnucash-guide-en" / name, DOCBOOK_XSL.format(**en))
        write(docs / "gnucash-guide-de" / name, DOCBOOK_XSL.format(**de))
    write(docs / "gnucash-help-de/only-german.html", DOCBOOK_XSL.format(**GNUCASH_DE))
    pairs = list(handbook.read_gnucash({"gnucash-docs": tmp_path}))
    assert pairs_of(pairs) == [
        ("Konzepte", "Concepts"), ("Konzepte", "Concepts"),
        ("Ein Kreditkartenkonto ist ein kurzfristiges Darlehen.", "A credit card account is a short-term loan."),
        ("Sie kaufen Dinge und zahlen das Geld zurück.", "You buy things and pay the money back."),
        ("Verbindlichkeit", "Liability"), ("Was Sie schulden.", "What you owe."),
        ("Geben Sie jeden Kauf als separate Buchung ein.", "Enter each purchase as a separate transaction."),
    ]   # no navigation bars, no screen; cc-together1 has a paragraph more in German: refused whole
    assert {p.origin for p in pairs} == {"gnucash:guide/cc-concepts1"}


def test_sentences_of_unequal_length_keep_the_block_whole() -> None:
    de = ("Die Filter zeigen neue Pakete, installierte Pakete usw. Während Sie die Listen durchgehen, wählen Sie "
          "Operationen aus. Diese werden nicht sofort ausgeführt.")
    en = ("Its filters give access to new packages and so on. If you browse these lists, you can select operations; "
          "these are not performed immediately.")     # two sentences each, but not the same two
    assert sentence_pairs(de, en) == [(de, en)]
    assert sentence_pairs("Das ist gut. Das ist schlecht.", "This is good. This is bad.") == [
        ("Das ist gut.", "This is good."), ("Das ist schlecht.", "This is bad.")]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
