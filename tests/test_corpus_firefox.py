"""Firefox's German language pack against the English text in its omni.ja archives (model.corpus.firefox,
issue 55): strings pair by (file, key), never by position. Every fixture is a small zip built here in the
real packages' layout; nothing touches the network."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from model.corpus.firefox import (
    ENGLISH_PACKAGE, GERMAN_PACKAGE, locale_path, parse_fluent, printf_signature, read)

EN_BRAND = """\
-brand-short-name = Firefox
-brand-full-name = Mozilla { -brand-short-name }
-sync-brand-name = Firefox Sync
"""
# A German term declined by case has no one plain value: messages using it are left out.
DE_BRAND = """\
-brand-short-name = Firefox
-brand-full-name = Mozilla { -brand-short-name }
-sync-brand-name = { $case ->
   *[nominative] Firefox Sync
    [genitive] Firefox Syncs
}
"""

# The German file has its messages in another order, one the English lacks, and lacks one itself.
EN_FTL = """\
## Tab bar
tabs-close-button = Close tabs
    .title = Close all tabs in this window
    .accesskey = C
update-ready = { -brand-short-name } has downloaded an update
    and will restart when you are ready.
greeting = Hello, { $name }! Welcome to { -brand-full-name }.
tab-count = { $count ->
    [one] One tab
   *[other] { $count } tabs
}
after-select = Paste here
learn-more = Learn more
sync-now = Sync now with { -sync-brand-name }
privacy-note = Your data stays on this device. <a data-l10n-name="link">{ learn-more }</a>
missing-variable = Open { $url } in a new window
only-english = This has no translation yet
untranslated = Downloads
platform-label =
    { PLATFORM() ->
        [macos] Show in Finder
       *[other] Open Folder
    }
size-value = { NUMBER($size, maximumFractionDigits: 1) } MB free
discard-button = Do&n't Save
dialog-window =
    .style = min-width: 36em
"""
DE_FTL = """\
greeting = Hallo, { $name }! Willkommen bei { -brand-full-name }.
tab-count = { $count ->
    [one] Ein Tab
   *[other] { $count } Tabs
}
missing-variable = In einem neuen Fenster öffnen
update-ready = { -brand-short-name } hat ein Update heruntergeladen
    und wird neu starten, wenn Sie bereit sind.
tabs-close-button = Tabs schließen
    .title = Alle Tabs in diesem Fenster schließen
    .accesskey = s
after-select = Hier einfügen
learn-more = Weitere Informationen
sync-now = Jetzt mit { -sync-brand-name(case: "nominative") } synchronisieren
privacy-note = Ihre Daten bleiben auf diesem Gerät. <a data-l10n-name="link">{ learn-more }</a>
untranslated = Downloads
platform-label =
    { PLATFORM() ->
        [macos] Im Finder anzeigen
       *[other] Ordner öffnen
    }
size-value = { NUMBER($size, maximumFractionDigits: 1) } MB frei
discard-button = &Nicht speichern
dialog-window =
    .style = min-width: 42em
only-german = Nur auf Deutsch
"""
EN_PROPERTIES = """\
# A comment
saveAs.label=Save Page As…
saveAs.accesskey=A
download.failed=The download of %S failed because %S could not be read.
nameTooLong = The file name is too long
multiline=This value goes on \\
    over two lines.
tabsToDevice=Send tab to device;Send #1 tabs to device
notificationCount=#1 notification;#1 notifications
wrongPlaceholder=Reload %S now
escaped=The caf\\u00e9 is open
"""
DE_PROPERTIES = """\
saveAs.label=Seite speichern unter…
saveAs.accesskey=u
download.failed=Der Download von %2$S ist fehlgeschlagen, weil %1$S nicht gelesen werden konnte.
nameTooLong = Der Dateiname ist zu lang
multiline=Dieser Wert geht über \\
    zwei Zeilen.
tabsToDevice=Tab an Gerät senden;#1 Tabs an Gerät senden
notificationCount=Eine Benachrichtigung;#1 Benachrichtigungen
wrongPlaceholder=Jetzt neu laden
escaped=Das Caf\\u00e9 ist geöffnet
"""


def write_zip(path: Path, members: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in members.items():
            zf.writestr(name, text)


def make_packages(tmp: Path) -> dict[str, Path]:
    """Both packages unpacked as dpkg -x leaves them: the German language pack (.xpi), the English
    toolkit and browser omni.ja archives."""
    de, en = tmp / GERMAN_PACKAGE, tmp / ENGLISH_PACKAGE
    app = "usr/lib/firefox-esr"
    write_zip(de / app / "browser/extensions/langpack-de@firefox-esr.mozilla.org.xpi", {
        "manifest.json": "{}",
        "browser/localization/de/branding/brand.ftl": DE_BRAND,
        "browser/localization/de/browser/demo.ftl": DE_FTL,
        "chrome/de/locale/de/global/demo.properties": DE_PROPERTIES,
        "chrome/de/locale/de/global/intl.properties": "intl.accept_languages = de, en-US, en\n",
        "localization/de/toolkit/only-german.ftl": "word = Wort\n",
    })
    write_zip(en / app / "omni.ja", {
        "chrome/en-US/locale/en-US/global/demo.properties": EN_PROPERTIES,
        "chrome/en-US/locale/en-US/global/intl.properties": "intl.accept_languages = en-US, en\n",
        "chrome/toolkit/content/global/demo.js": "// not text",
    })
    write_zip(en / app / "browser/omni.ja", {
        "localization/en-US/branding/brand.ftl": EN_BRAND,
        "localization/en-US/browser/demo.ftl": EN_FTL,
    })
    return {GERMAN_PACKAGE: de, ENGLISH_PACKAGE: en}


def test_locale_paths_agree_between_language_pack_and_omni_ja() -> None:
    assert locale_path("browser/localization/de/browser/panelUI.ftl", "de") == \
        "browser/localization/browser/panelUI.ftl"
    assert locale_path("browser/localization/en-US/browser/panelUI.ftl", "en-US") == \
        "browser/localization/browser/panelUI.ftl"
    assert locale_path("chrome/de/locale/de/global/x.properties", "de") == "chrome/global/x.properties"
    assert locale_path("browser/chrome/en-US/locale/branding/brand.properties", "en-US") == \
        "browser/chrome/branding/brand.properties"
    assert locale_path("chrome/de/locale/de/global/intl.css", "de") is None
    assert locale_path("chrome/de/locale/de/global/intl.properties", "de") is None     # settings
    assert locale_path("localization/fr/toolkit/x.ftl", "de") is None


def test_fluent_entries_attributes_and_multiline_values() -> None:
    entries = parse_fluent(EN_FTL)
    assert entries["tabs-close-button.title"] == "Close all tabs in this window"
    assert entries["update-ready"] == ("{ -brand-short-name } has downloaded an update\n"
                                       "and will restart when you are ready.")
    assert entries["tab-count"].endswith("}") and entries["after-select"] == "Paste here"   # "}" in column 0
    assert "dialog-window" not in entries and entries["dialog-window.style"] == "min-width: 36em"


def test_printf_placeholders_compare_by_position() -> None:
    assert printf_signature("%S of %S") == printf_signature("%2$S von %1$S")
    assert printf_signature("%S") != printf_signature("%S %S")
    assert printf_signature("#1 tabs") != printf_signature("tabs")


def test_read_pairs_by_file_and_key(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail(f"a command was run: {a}"))
    pairs = list(read(make_packages(tmp_path)))
    ftl = [(p.de, p.en) for p in pairs if p.origin == "firefox:browser/localization/browser/demo.ftl"]
    assert ftl == [
        ("Tabs schließen", "Close tabs"),
        ("Alle Tabs in diesem Fenster schließen", "Close all tabs in this window"),   # an attribute
        ("Firefox hat ein Update heruntergeladen und wird neu starten, wenn Sie bereit sind.",
         "Firefox has downloaded an update and will restart when you are ready."),    # multi-line, a term
        ("Hallo, {$name}! Willkommen bei Mozilla Firefox.", "Hello, {$name}! Welcome to Mozilla Firefox."),
        ("Hier einfügen", "Paste here"),
        ("Weitere Informationen", "Learn more"),
        ("Ihre Daten bleiben auf diesem Gerät. Weitere Informationen",
         "Your data stays on this device. Learn more"),                              # markup stripped
        ("{$size} MB frei", "{$size} MB free"),
        ("Nicht speichern", "Don't Save"),
    ]   # gone: select expressions, a term with cases, access keys, a dropped variable, one-sided and
    # untranslated keys, .style
    props = [(p.de, p.en) for p in pairs if p.origin == "firefox:chrome/global/demo.properties"]
    assert props == [
        ("Seite speichern unter…", "Save Page As…"),
        ("Der Download von %2$S ist fehlgeschlagen, weil %1$S nicht gelesen werden konnte.",
         "The download of %S failed because %S could not be read."),
        ("Der Dateiname ist zu lang", "The file name is too long"),
        ("Dieser Wert geht über zwei Zeilen.", "This value goes on over two lines."),
        ("Tab an Gerät senden", "Send tab to device"),                               # a plural list, form by form
        ("#1 Tabs an Gerät senden", "Send #1 tabs to device"),
        ("#1 Benachrichtigungen", "#1 notifications"),                               # "Eine" for "#1": dropped
        ("Das Café ist geöffnet", "The café is open"),
    ]
    assert len(pairs) == len(ftl) + len(props)                 # nothing from intl.properties or one-sided files
    sentences = {p.en for p in pairs if p.sentence}
    assert "Firefox has downloaded an update and will restart when you are ready." in sentences
    assert "Close tabs" not in sentences


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
