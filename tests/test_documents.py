"""service/documents without a server: docx, pptx and odt read and written back with their structure and their
runs' formatting kept (opened again with python-docx, python-pptx and lxml and compared), a catalog's
placeholders kept, and every hostile file refused with a DocumentError naming the problem, never a library's
exception. The translator here is a dictionary (and upper case for what it does not know), so each expected
text is known exactly; tests/test_translate_file.py runs the same files through a real server and model."""

import io
import zipfile

import docx
import polib
import pptx
import pytest
from lxml import etree

from documents_help import (ODF_NS, entity_bomb, many_runs, opendocument, replaced, slides, word, word_paragraph,
                            word_with_notes, zip_bomb, zipped)
from service.documents.formats import EXTENSIONS, format_of, load
from service.documents.limits import DocumentError, Limits

LIMITS = Limits(max_bytes=2_000_000, max_unpacked_bytes=30_000_000, max_entries=100, max_elements=50_000,
                max_texts=500)
WORDS = {"Das ist ein Satz mit fetten Wörtern darin.": "This is a sentence with bold words in it.",
         "fetten Wörtern": "bold words", "Die Kopfzeile": "The header", "Die Fußzeile": "The footer",
         "Zelle eins": "Cell one", "Zelle vier": "Cell four", "Der Titel": "The title", "Eine Notiz": "A note"}
BODY = ("Das ist ein Satz mit ", "fetten Wörtern", " darin.")


def translated(fmt: str, data: bytes) -> tuple[bytes, list[str]]:
    document = load(fmt, data, LIMITS)
    return document.render([WORDS.get(t, t.upper()) for t in document.texts]), document.texts


def test_a_docx_keeps_its_table_header_footer_and_bold_run():
    out, texts = translated("docx", word(BODY, "Die Kopfzeile", [["Zelle eins", ""], ["", "Zelle vier"]],
                                         "Die Fußzeile"))
    assert "".join(BODY) in texts and "fetten Wörtern" in texts        # the sentence whole, and the bold alone
    d = docx.Document(io.BytesIO(out))
    runs = [(r.text, r.bold) for r in d.paragraphs[0].runs]
    assert runs == [("This is a sentence with ", None), ("bold words", True), (" in it.", None)]
    assert d.sections[0].header.paragraphs[0].text == "The header"
    assert d.sections[0].footer.paragraphs[0].text == "The footer"
    assert [[c.text for c in row.cells] for row in d.tables[0].rows] == [["Cell one", ""], ["", "Cell four"]]


def test_a_docx_whose_bold_words_move_keeps_every_run_and_its_text_whole():
    """The translation of the bold words is not found in the sentence's: the bold run is placed proportionally,
    and the runs together still say the whole translation."""
    document = load("docx", word(BODY, "Die Kopfzeile", [["Zelle eins"]]), LIMITS)
    answers = {"".join(BODY): "Here bold words stand in the middle of it.", "fetten Wörtern": "fat words"}
    d = docx.Document(io.BytesIO(document.render([answers.get(t, t) for t in document.texts])))
    runs = d.paragraphs[0].runs
    assert "".join(r.text for r in runs) == "Here bold words stand in the middle of it."
    assert [r.bold for r in runs] == [None, True, None] and runs[1].text.strip()


def test_a_docxs_footnotes_endnotes_and_comments_are_translated():
    out, texts = translated("docx", word_with_notes("Die Fußzeile", "Die Kopfzeile", "Eine Notiz"))
    assert {"Die Fußzeile", "Die Kopfzeile", "Eine Notiz"} <= set(texts)
    z = zipfile.ZipFile(io.BytesIO(out))
    notes = {part: "".join(etree.fromstring(z.read(f"word/{part}.xml")).itertext())
             for part in ("footnotes", "endnotes")}
    assert notes == {"footnotes": " The footer", "endnotes": " The header"}
    assert [c.text for c in docx.Document(io.BytesIO(out)).comments] == ["A note"]


def test_a_docxs_simple_fields_keep_their_results_and_cut_the_text_around_them():
    """Word rewrites a field's result (a page number, a date, a cross-reference's text): the text around a field
    goes around it, not into the runs before it, and a result with words is translated alone."""
    def field(instr: str, result: str) -> str:
        return f'<w:fldSimple w:instr="{instr}"><w:r><w:t>{result}</w:t></w:r></w:fldSimple>'
    xml = ('<w:r><w:t xml:space="preserve">Seite </w:t></w:r>' + field("PAGE", "1") +
           '<w:r><w:t xml:space="preserve"> von </w:t></w:r>' + field("NUMPAGES", "3") +
           '<w:r><w:t xml:space="preserve"> in </w:t></w:r>' + field("REF _Ref1 \\h", "Die Kopfzeile"))
    out, texts = translated("docx", word_paragraph(xml))
    assert texts == ["Seite", "von", "in", "Die Kopfzeile"]
    p = etree.fromstring(zipfile.ZipFile(io.BytesIO(out)).read("word/document.xml")).find(".//{*}body/{*}p")
    W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
    parts = [(el.tag == W + "fldSimple", "".join(el.itertext())) for el in p]
    assert parts == [(False, "SEITE "), (True, "1"), (False, " VON "), (True, "3"), (False, " IN "),
                     (True, "The header")]


def test_a_docxs_tracked_insertion_keeps_its_translated_words_inside_it():
    rev = 'w:id="7" w:author="A" w:date="2024-01-01T00:00:00Z"'
    xml = ('<w:r><w:t xml:space="preserve">Das ist ein Satz mit </w:t></w:r>'
           f'<w:ins {rev}><w:r><w:t>fetten Wörtern</w:t></w:r></w:ins>'
           f'<w:del w:id="8" w:author="A" w:date="2024-01-01T00:00:00Z"><w:r><w:delText> alt</w:delText></w:r></w:del>'
           '<w:r><w:t xml:space="preserve"> darin.</w:t></w:r>')
    out, texts = translated("docx", word_paragraph(xml))
    assert texts == ["Das ist ein Satz mit fetten Wörtern darin.", "fetten Wörtern"]
    body = etree.fromstring(zipfile.ZipFile(io.BytesIO(out)).read("word/document.xml"))
    W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
    assert "".join(body.find(f".//{W}ins").itertext()) == "bold words"
    assert "".join(body.find(f".//{W}del").itertext()) == " alt"           # a deletion stays as it was written
    assert "".join(t.text for t in body.iter(W + "t")) == "This is a sentence with bold words in it."


def test_a_pptx_keeps_its_title_runs_and_notes():
    out, _ = translated("pptx", slides("Der Titel", BODY, "Eine Notiz"))
    slide = pptx.Presentation(io.BytesIO(out)).slides[0]
    assert slide.shapes.title.text == "The title"
    runs = slide.placeholders[1].text_frame.paragraphs[0].runs
    assert [(r.text, r.font.bold) for r in runs] == [("This is a sentence with ", None), ("bold words", True),
                                                      (" in it.", None)]
    assert slide.notes_slide.notes_text_frame.text == "A note"


def test_an_odt_keeps_its_span_table_header_and_mimetype_first():
    out, _ = translated("odt", opendocument("Der Titel", BODY, "Zelle eins", "Die Kopfzeile"))
    z = zipfile.ZipFile(io.BytesIO(out))
    assert z.infolist()[0].filename == "mimetype" and z.infolist()[0].compress_type == zipfile.ZIP_STORED
    ns = {"text": "urn:oasis:names:tc:opendocument:xmlns:text:1.0"}
    content = etree.fromstring(z.read("content.xml"))
    assert content.xpath("string(//text:h)", namespaces=ns) == "The title"
    p = content.xpath("//office:text/text:p", namespaces=ns | {
        "office": "urn:oasis:names:tc:opendocument:xmlns:office:1.0"})[0]
    assert p.text == "This is a sentence with " and p[0].text == "bold words" and p[0].tail == " in it."
    assert p[0].get("{%s}style-name" % ns["text"]) == "T1"
    assert content.xpath("string(//text:p[ancestor::*[local-name()='table-cell']])", namespaces=ns) == "Cell one"
    assert etree.fromstring(z.read("styles.xml")).xpath("string(//text:p)", namespaces=ns) == "The header"


def test_an_odp_slide_and_its_notes_are_translated_and_its_frames_kept():
    draw = 'xmlns:draw="urn:oasis:names:tc:opendocument:xmlns:drawing:1.0" ' \
           'xmlns:presentation="urn:oasis:names:tc:opendocument:xmlns:presentation:1.0"'
    content = (f'<?xml version="1.0" encoding="UTF-8"?><office:document-content {ODF_NS} {draw}><office:body>'
               '<office:presentation><draw:page draw:name="p1"><draw:frame><draw:text-box><text:p>Der Titel</text:p>'
               '</draw:text-box></draw:frame><presentation:notes><draw:frame><draw:text-box><text:p>Eine Notiz'
               '</text:p></draw:text-box></draw:frame></presentation:notes></draw:page></office:presentation>'
               '</office:body></office:document-content>')
    data = zipped({"mimetype": "application/vnd.oasis.opendocument.presentation", "content.xml": content})
    out, texts = translated("odp", data)
    assert texts == ["Der Titel", "Eine Notiz"]
    xml = zipfile.ZipFile(io.BytesIO(out)).read("content.xml").decode()
    assert "<text:p>The title</text:p>" in xml and "<text:p>A note</text:p>" in xml and 'draw:name="p1"' in xml
    assert refusal("odt", data).status == 400                    # an .odp named .odt


def test_a_catalog_keeps_its_placeholders_and_marks_entries_fuzzy():
    po = polib.POFile(wrapwidth=0)
    po.append(polib.POEntry(msgid="%s: Zelle eins <b>{count}</b>"))
    po.append(polib.POEntry(msgid="Die Kopfzeile", msgstr="Kept."))
    out, texts = translated("po", str(po).encode())
    assert texts == ["Zelle eins"]
    entries = polib.pofile(out.decode())
    assert entries[0].msgstr == "%s: Cell one <b>{count}</b>" and "fuzzy" in entries[0].flags
    assert entries[1].msgstr == "Kept."


def test_a_percent_sign_in_a_catalogs_plain_text_is_no_placeholder():
    """Outside an entry flagged as a format string, "% s" and "% a" (a printf space flag) and "%ig" (a conversion
    followed by a letter) are words; in a flagged one every conversion is kept."""
    po = polib.POFile(wrapwidth=0)
    po.append(polib.POEntry(msgid="Zu 100% sicher und 50% aller sind 100%ig froh."))
    po.append(polib.POEntry(msgid="% d Zelle eins", flags=["c-format"]))
    po.append(polib.POEntry(msgid="%s Zelle eins"))                  # unflagged, a placeholder still
    _, texts = translated("po", str(po).encode())
    assert texts == ["Zu 100% sicher und 50% aller sind 100%ig froh.", "Zelle eins", "Zelle eins"]


def test_a_catalog_that_names_a_file_of_this_host_is_not_read_from_disk(tmp_path):
    """polib.pofile takes a path or a catalog's text: an upload must never be taken for a path."""
    secret = tmp_path / "secret.po"
    secret.write_text('msgid "Geheim"\nmsgstr ""\n', encoding="utf-8")
    try:
        document = load("po", str(secret).encode(), LIMITS)
    except DocumentError as e:
        assert e.status == 400
    else:
        assert "Geheim" not in document.texts and b"Geheim" not in document.render(document.texts)


def test_text_and_html_files():
    out, _ = translated("txt", "Die Kopfzeile\r\n\r\n  \nZelle eins".encode())
    assert out.decode() == "The header\r\n\r\n  \nCell one"
    out, _ = translated("html", "<p>Das ist ein Satz mit <b>fetten Wörtern</b> darin.</p>".encode())
    assert out.decode() == "<p>This is a sentence with <b>bold words</b> in it.</p>"


def test_an_html_run_of_non_breaking_spaces_alone_is_kept_not_translated():
    # &nbsp; is not HTML's white space, so such a run was a text of its own, which no request accepts
    html = "<p>Zelle eins</p><p>&nbsp;</p><td>\u00a0&emsp;</td><p>Zelle vier&nbsp;</p>"
    out, texts = translated("html", html.encode())
    assert texts == ["Zelle eins", "Zelle vier\u00a0"]
    assert out.decode() == "<p>Cell one</p><p>&nbsp;</p><td>\u00a0&emsp;</td><p>ZELLE VIER&nbsp;</p>"


def test_the_formats_by_extension():
    assert [format_of(n) for n in ("a.DOCX", "b.pptx", "c.odt", "d.odp", "e.htm", "f.pot", "g.exe", "noext")] == \
        ["docx", "pptx", "odt", "odp", "html", "po", None, None]
    assert {"docx", "pptx", "odt", "odp", "txt", "html", "po"} <= set(EXTENSIONS)


def refusal(fmt: str, data: bytes, limits: Limits = LIMITS) -> DocumentError:
    with pytest.raises(DocumentError) as e:
        load(fmt, data, limits)
    return e.value


DOCX = word(BODY, "Die Kopfzeile", [["Zelle eins"]])


@pytest.mark.parametrize("name, data, status, words", [
    ("an entity bomb", entity_bomb(DOCX), 400, "DTD"),
    ("a zip bomb", zip_bomb(DOCX, 40_000_000), 413, "unpacked"),
    ("a million runs", many_runs(DOCX, 1_000_000), 413, "XML elements"),
    ("an odt named .docx", opendocument("a", ("b", "c", "d"), "e", "f"), 400, "OpenDocument text"),
    ("text named .docx", b"Hallo Welt", 400, "not a zip archive"),
    ("too many entries", replaced(DOCX, {f"x/{i}": b"" for i in range(120)}), 413, "entries"),
    ("a UTF-16 part", replaced(DOCX, {"word/document.xml": '<?xml version="1.0"?><w:document/>'.encode("utf-16")}),
     400, "not UTF-8"),
    ("a broken body", replaced(DOCX, {"word/document.xml": b"<w:document><w:body>"}), 400, "cannot be read"),
])
def test_hostile_documents_are_refused_naming_the_problem(name, data, status, words):
    e = refusal("docx", data)
    assert e.status == status and words in e.message, (name, e.message)


def test_declared_sizes_that_lie_are_caught_by_counting():
    """A zip whose central directory says an entry is small: zipfile stops at the declared size and the CRC
    no longer matches, so the entry cannot inflate past what was declared and counted."""
    data = bytearray(zip_bomb(DOCX, 40_000_000))
    central = bytes(data).find(b"word/media/image1.bin", len(data) - 4000) - 46   # its central directory record
    assert data[central:central + 4] == b"PK\x01\x02"
    data[central + 24:central + 28] = (1000).to_bytes(4, "little")   # the uncompressed size, a lie
    assert refusal("docx", bytes(data)).status in (400, 413)


def test_over_the_size_and_text_limits_and_wrong_text():
    assert refusal("docx", DOCX, Limits(1000, 10**8, 100, 10**5, 100)).status == 413
    e = refusal("docx", DOCX, Limits(10**7, 10**8, 100, 10**5, 2))
    assert e.status == 413 and "texts to translate" in e.message
    assert "zip archive" in refusal("txt", DOCX).message
    assert "not UTF-8" in refusal("txt", "Grüße".encode("latin-1")).message


def test_subtitles_and_markdown_read_whole_keep_timings_and_markup():
    srt = ("1\r\n00:00:01,000 --> 00:00:02,500\r\nDie Kopfzeile\r\n\r\n"
           "2\r\n00:00:03,000 --> 00:00:04,000\r\n<i>Zelle eins</i>\r\n")
    out, texts = translated("srt", srt.encode())
    assert texts == ["Die Kopfzeile", "Zelle eins"]                 # the tags around a cue's text are not sent
    assert out.decode() == srt.replace("Die Kopfzeile", "The header").replace("Zelle eins", "Cell one")
    md = "# Die Kopfzeile\n\n```\nDie Fußzeile\n```\n\n- Zelle eins\n"
    out, _ = translated("md", md.encode())
    assert out.decode() == "# The header\n\n```\nDie Fußzeile\n```\n\n- Cell one\n"


def markdown(text: str) -> str:
    """A Markdown text translated by the dictionary: what it does not know comes back in upper case."""
    return translated("md", text.encode())[0].decode()


def test_markdown_keeps_an_indented_paragraphs_indentation_so_it_stays_in_its_list_item():
    md = "- Erster Punkt der Liste\n\n  Ein zweiter Absatz im selben Listenpunkt.\n"
    assert markdown(md) == md.upper()


def test_markdown_list_content_indented_four_spaces_or_a_tab_is_translated_and_code_beyond_it_kept():
    """Inside a list item, a line indented to the item's text is the item's: only 4 columns more is code."""
    items = ("1. Erster Schritt der Einrichtung\n\n    Dieser Absatz gehört noch zum ersten Schritt.\n\n"
             "2. Zweiter Schritt\n    - Ein eingerückter Unterpunkt mit vier Leerzeichen\n"
             "* Punkt mit Stern\n\t- Unterpunkt mit Tabulator eingerückt\n")
    assert markdown(items) == items.upper()
    code = ("1. Schritt\n\n    ```\n    Zaun im Punkt\n    ```\n\n       Code im Punkt\n\n"
            "Absatz\n\n    Code außerhalb\n")
    assert markdown(code) == code.replace("Schritt", "SCHRITT").replace("Absatz", "ABSATZ")
    # indented code cannot interrupt a paragraph: an indented line after its text goes on with it
    assert markdown("Ein Absatz\n    geht weiter.\n- Punkt\n        auch.\n") == (
        "EIN ABSATZ GEHT WEITER.\n- PUNKT\n        AUCH.\n")


def test_markdown_setext_heading_keeps_its_underline_on_its_own_line():
    md = "Anleitung für das Werkzeug\n==========================\n\nZeile eins\nZeile zwei\n--\n"
    assert markdown(md) == "ANLEITUNG FÜR DAS WERKZEUG\n==========================\n\nZEILE EINS ZEILE ZWEI\n--\n"


def test_markdown_keeps_hard_line_breaks_and_translates_each_side_alone():
    md = ("Eine Zeile mit hartem Umbruch  \nund hier geht sie weiter.\n\nEin Umbruch\\\nmit einem Backslash.\n\n"
          "- Punkt  \n  weiter\n")
    out, texts = translated("md", md.encode())
    assert out.decode() == md.upper()
    assert texts == ["Eine Zeile mit hartem Umbruch", "und hier geht sie weiter.", "Ein Umbruch",
                     "mit einem Backslash.", "Punkt", "weiter"]


def test_markdown_translates_a_footnotes_text_and_keeps_link_reference_definitions():
    notes = ("Text mit Fußnote[^1].\n\n[^1]: Das ist die Fußnote mit Erklärung.\n\n"
             "    Ein zweiter Absatz der Fußnote.\n\n")
    links = '[foo]: https://example.org "Titel"\n[Die Kopfzeile]: <https://example.org/a b>\n'
    assert markdown(notes + links) == notes.upper() + links


def test_markdown_paragraph_starting_with_an_inline_tag_or_autolink_is_translated_and_html_blocks_kept():
    """CommonMark's HTML block start conditions: block-level tags, comments and the like, or a tag alone on its
    line; an inline tag or an autolink starts a paragraph."""
    md = ("<b>Hinweis:</b> Bitte lesen Sie die Anleitung vollständig.\n\n"
          "<kbd>Strg</kbd> drücken, um das Menü zu öffnen.\n\n<https://example.org> ist unsere Seite.\n\n")
    blocks = ('<div align="center">\n\n<!-- Ein Kommentar -->\n<details>\n<summary>Mehr dazu</summary>\n\n'
              "<table>\n<span class=\"x\">\n</details>\n")
    assert markdown(md + blocks) == (
        "<b>HINWEIS:</b> BITTE LESEN SIE DIE ANLEITUNG VOLLSTÄNDIG.\n\n"
        "<kbd>STRG</kbd> DRÜCKEN, UM DAS MENÜ ZU ÖFFNEN.\n\n<https://example.org> IST UNSERE SEITE.\n\n" + blocks)


@pytest.mark.parametrize("fmt, data", [
    ("txt", b""), ("txt", b"\n  \r\n"), ("srt", b""), ("vtt", b"\n"), ("md", b" "), ("html", b""),
    ("po", b""), ("po", "\ufeff\n".encode()), ("docx", b""),
])
def test_an_empty_file_is_refused_not_answered_empty(fmt, data):
    """Nothing to translate: a 400 that says so, not a 200 with an empty file (or a .po's bare header)."""
    e = refusal(fmt, data)
    assert e.status == 400 and e.code == "empty_file" and "the file is empty" in e.message, e.message


@pytest.mark.parametrize("catalog, where", [
    ('msgid "Hallo\nmsgstr ""\n', "msgid on line 1"),
    ('msgid "Zelle"\nmsgstr ""\n\n#: a.c:3\nmsgid "Hallo\\"\nmsgstr ""\n', "msgid on line 5"),
    ('msgid ""\n"Die Kopf\n"zeile"\nmsgstr ""\n', "msgid on line 2"),
    ('msgid "a"\nmsgid_plural "b\nmsgstr[0] ""\n', "msgid_plural on line 2"),
    ('msgid "Zelle eins"\nmsgstr[1] "x\n', "msgstr[1] on line 2"),
    ('#~ msgid "Alt\n#~ msgstr "Old"\n', "msgid on line 1"),
])
def test_a_catalog_with_an_unterminated_string_is_refused_naming_its_line(catalog, where):
    """polib reads `msgid "Hallo` as "Hall" (its last character taken for the quote): refused instead."""
    e = refusal("po", catalog.encode())
    assert e.status == 400 and f"the .po file's {where} is not terminated" in e.message, e.message


@pytest.mark.parametrize("nplurals", ["1000000", "9" * 5000, "0"])
def test_a_catalog_declaring_too_many_plural_forms_is_refused_before_it_is_translated(nplurals):
    """A header's nplurals of a million made a 159-byte upload render 36 MB (every plural entry that many times), one
    of 5,000 digits a 500 (int() refuses it)."""
    catalog = (f'msgid ""\nmsgstr ""\n"Plural-Forms: nplurals={nplurals}; plural=n;\\n"\n\n'
               'msgid "Datei"\nmsgid_plural "Dateien"\nmsgstr[0] ""\n')
    e = refusal("po", catalog.encode())
    assert e.status == 400 and "nplurals outside 1..10" in e.message, e.message


def test_a_catalog_with_six_plural_forms_gets_all_six():
    catalog = ('msgid ""\nmsgstr ""\n"Plural-Forms: nplurals=6; plural=n;\\n"\n\n'
               'msgid "Zelle"\nmsgid_plural "Zellen"\nmsgstr[0] ""\n')
    out, _ = translated("po", catalog.encode())
    assert len(polib.pofile(out.decode())[0].msgstr_plural) == 6


def test_a_catalog_whose_strings_end_in_escapes_is_read():
    _, texts = translated("po", b'msgid "Zelle \\\\"\nmsgstr ""\n\nmsgid ""\n"Die \\"Kopf\\" "\n"zeile"\nmsgstr ""\n')
    assert texts == ["Zelle \\", 'Die "Kopf" zeile']


def test_html_with_an_internal_dtd_subset_is_refused_and_a_plain_doctype_kept():
    """No entity is declared, expanded or passed on: the file is refused (shared/html_text.parse says why)."""
    e = refusal("html", b'<!DOCTYPE html [ <!ENTITY b "x"> ]><html><body><p>Hallo &b;</p></body></html>')
    assert e.status == 400 and e.code == "html_dtd" and "internal DTD subset" in e.message, e.message
    assert refusal("html", b"<!doctype HTML PUBLIC '-//W3C//DTD HTML 4.01//EN' [\n]>\n<p>Zelle eins</p>").code == \
        "html_dtd"
    kept = '<!-- <!DOCTYPE x [ --><script>var s = "<!DOCTYPE y [";</script>\n<p>Zelle eins</p>'
    out, _ = translated("html", kept.encode())       # not a declaration: kept byte for byte
    assert out.decode() == kept.replace("Zelle eins", "Cell one")
    out, _ = translated("html", "<!DOCTYPE html>\n<p>Zelle eins</p>".encode())
    assert out.decode() == "<!DOCTYPE html>\n<p>Cell one</p>"


def test_markdown_keeps_a_raw_html_block_whole_up_to_its_end_marker():
    """A comment, <pre>, <script> over several lines: every line up to the end marker kept as written (only the
    first was: the comment's and the script's other lines went to the model)."""
    kept = ("<!--\nEin Kommentar\nüber Zeilen -->\n", "<pre>\nCode bleibt\n</pre>\n",
            "<script>\nvar x = 'Hallo';\n</script>\n")
    md = ("Ein Satz.\n" + kept[0] + "Noch ein Satz.\n\n" + kept[1] + "\n" + kept[2]
          + "Ende hier.\n<!-- kurz -->\nText.\n<!-->\nLetzter Satz.\n")
    out, texts = translated("md", md.encode())
    assert out.decode() == ("EIN SATZ.\n" + kept[0] + "NOCH EIN SATZ.\n\n" + kept[1] + "\n" + kept[2] + "ENDE HIER.\n"
                            "<!-- kurz -->\nTEXT.\n<!-->\nLETZTER SATZ.\n")
    assert texts == ["Ein Satz.", "Noch ein Satz.", "Ende hier.", "Text.", "Letzter Satz."]
