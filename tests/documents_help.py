"""Documents made for the tests of service/documents and LibreTranslate's /translate_file: real files written
by python-docx and python-pptx, an OpenDocument text written as LibreOffice lays one out, and hostile ones (a
zip bomb, an entity bomb, a document of very many runs). Each builder returns the file's bytes."""

import io
import zipfile

import docx
import pptx
from docx.oxml import parse_xml

ODF_NS = ('xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
          'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
          'xmlns:style="urn:oasis:names:tc:opendocument:xmlns:style:1.0" '
          'xmlns:table="urn:oasis:names:tc:opendocument:xmlns:table:1.0"')


def word(body: list[tuple[str, str, str]], header: str, cells: list[list[str]], footer: str = "") -> bytes:
    """A .docx: one paragraph of three runs (plain, bold, plain), a header, a footer and a table."""
    d = docx.Document()
    d.sections[0].header.paragraphs[0].text = header
    d.sections[0].footer.paragraphs[0].text = footer
    before, bold, after = body
    p = d.add_paragraph(before)
    p.add_run(bold).bold = True
    p.add_run(after)
    table = d.add_table(rows=len(cells), cols=len(cells[0]))
    for r, row in enumerate(cells):
        for c, text in enumerate(row):
            table.cell(r, c).text = text
    out = io.BytesIO()
    d.save(out)
    return out.getvalue()


def slides(title: str, runs: tuple[str, str, str], notes: str) -> bytes:
    prs = pptx.Presentation()
    slide = prs.slides.add_slide(prs.slide_layouts[1])
    slide.shapes.title.text = title
    p = slide.placeholders[1].text_frame.paragraphs[0]
    for i, text in enumerate(runs):
        run = p.add_run()
        run.text = text
        run.font.bold = i == 1 or None
    slide.notes_slide.notes_text_frame.text = notes
    out = io.BytesIO()
    prs.save(out)
    return out.getvalue()


def opendocument(heading: str, runs: tuple[str, str, str], cell: str, header: str) -> bytes:
    """An .odt: a heading, a paragraph with a styled span, a table cell, a master page's header."""
    before, styled, after = runs
    content = (f'<?xml version="1.0" encoding="UTF-8"?><office:document-content {ODF_NS} office:version="1.3">'
               f'<office:body><office:text><text:h text:outline-level="1">{heading}</text:h><text:p>{before}'
               f'<text:span text:style-name="T1">{styled}</text:span>{after}</text:p><table:table><table:table-row>'
               f'<table:table-cell><text:p>{cell}</text:p></table:table-cell></table:table-row></table:table>'
               '</office:text></office:body></office:document-content>')
    styles = (f'<?xml version="1.0" encoding="UTF-8"?><office:document-styles {ODF_NS}><office:master-styles>'
              f'<style:master-page style:name="Standard"><style:header><text:p>{header}</text:p></style:header>'
              '</style:master-page></office:master-styles></office:document-styles>')
    return zipped({"mimetype": "application/vnd.oasis.opendocument.text", "content.xml": content,
                   "styles.xml": styles, "META-INF/manifest.xml": '<?xml version="1.0" encoding="UTF-8"?>'
                   '<manifest:manifest xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0"/>'})


def zipped(entries: dict[str, str | bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in entries.items():
            z.writestr(name, data, zipfile.ZIP_STORED if name == "mimetype" else zipfile.ZIP_DEFLATED)
    return out.getvalue()


def replaced(document: bytes, entries: dict[str, str | bytes]) -> bytes:
    """A zip with some entries replaced or added, the others as they were."""
    with zipfile.ZipFile(io.BytesIO(document)) as z:
        kept = {i.filename: z.read(i) for i in z.infolist() if i.filename not in entries}
    return zipped(kept | entries)


def entity_bomb(document: bytes) -> bytes:
    """The .docx with a body that expands to 10^9 characters if its entities are expanded (billion laughs)."""
    levels = ['<!ENTITY lol0 "lollollollollollollollollollol">'] + [
        f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10}">' for i in range(1, 9)]
    body = (f'<?xml version="1.0" encoding="UTF-8"?><!DOCTYPE w:document [{"".join(levels)}]>'
            '<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body><w:p>'
            '<w:r><w:t>&lol8;</w:t></w:r></w:p></w:body></w:document>')
    return replaced(document, {"word/document.xml": body})


def zip_bomb(document: bytes, unpacked: int) -> bytes:
    """The .docx with an entry of `unpacked` zero bytes (deflate packs it about a thousand times smaller)."""
    return replaced(document, {"word/media/image1.bin": bytes(unpacked)})


def many_runs(document: bytes, runs: int) -> bytes:
    """The .docx whose body is one paragraph of `runs` runs (tiny once packed: the runs are all alike)."""
    body = ('<?xml version="1.0" encoding="UTF-8"?><w:document xmlns:w="http://schemas.openxmlformats.org/'
            'wordprocessingml/2006/main"><w:body><w:p>' + "<w:r><w:t>a</w:t></w:r>" * runs + "</w:p></w:body>"
            "</w:document>")
    return replaced(document, {"word/document.xml": body})


W_NS = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
WML = "application/vnd.openxmlformats-officedocument.wordprocessingml"
NOTE_REL = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"


def word_with_notes(footnote: str, endnote: str, comment: str) -> bytes:
    """A .docx whose paragraph refers to a footnote and an endnote (their parts added as Word writes them, which
    python-docx cannot) and carries a comment, with the notes' and the comment's texts."""
    d = docx.Document()
    p = d.add_paragraph("Der Umsatz ist gestiegen")
    d.add_comment(p.runs[0], text=comment, author="A", initials="A")
    for kind in ("footnote", "endnote"):
        p._p.append(parse_xml(f'<w:r {W_NS}><w:{kind}Reference w:id="1"/></w:r>'))
    out = io.BytesIO()
    d.save(out)
    entries = {}
    with zipfile.ZipFile(out) as z:
        types, rels = z.read("[Content_Types].xml").decode(), z.read("word/_rels/document.xml.rels").decode()
    for kind, text in (("footnote", footnote), ("endnote", endnote)):
        entries[f"word/{kind}s.xml"] = (
            f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:{kind}s {W_NS}>'
            f'<w:{kind} w:type="separator" w:id="-1"><w:p><w:r><w:separator/></w:r></w:p></w:{kind}>'
            f'<w:{kind} w:id="1"><w:p><w:r><w:{kind}Ref/></w:r><w:r><w:t xml:space="preserve"> {text}</w:t></w:r>'
            f'</w:p></w:{kind}></w:{kind}s>')
        types = types.replace("</Types>", f'<Override PartName="/word/{kind}s.xml" '
                              f'ContentType="{WML}.{kind}s+xml"/></Types>')
        rels = rels.replace("</Relationships>", f'<Relationship Id="rIdN{kind}" Type="{NOTE_REL}/{kind}s" '
                            f'Target="{kind}s.xml"/></Relationships>')
    return replaced(out.getvalue(), entries | {"[Content_Types].xml": types, "word/_rels/document.xml.rels": rels})


def word_paragraph(xml: str) -> bytes:
    """A .docx whose one paragraph's content is `xml` (runs, fields, revisions), in the w: namespace."""
    d = docx.Document()
    p = d.add_paragraph()
    for child in list(parse_xml(f'<w:p {W_NS}>{xml}</w:p>')):
        p._p.append(child)
    out = io.BytesIO()
    d.save(out)
    return out.getvalue()
