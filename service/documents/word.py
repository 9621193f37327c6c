"""Word documents (.docx) by python-docx: the body (tables, nested tables and text boxes included), every
section's headers and footers, and the footnotes and endnotes where python-docx loads them as XML parts.

python-docx opens and saves the package (its parts, relationships and content types as Word wrote them);
the paragraphs are walked at the XML level, since its Paragraph.runs leaves out runs inside hyperlinks,
fields and revisions. A slot is a run's <w:t>; its style is the run's <w:rPr> as written (and the hyperlink
it is in). A tab, a break, a drawing, a field character, a note reference end a stretch. <w:instrText> (a
field's code) and <w:delText> (deleted text) are never translated."""

from __future__ import annotations

import io

import docx
from docx.opc.part import XmlPart
from lxml import etree

from .container import open_zip
from .limits import Limits
from .paragraphs import Slot, Translatable, stretches

W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"
PARTS = ("document.main", "header", "footer", "footnotes", "endnotes")   # content types, after "wordprocessingml."
BOUNDARIES = {W + n for n in ("tab", "ptab", "br", "cr", "drawing", "pict", "object", "fldChar", "sym",
                              "footnoteReference", "endnoteReference", "commentReference", "noBreakHyphen")}


def paragraph_items(p) -> list[Slot | None]:
    """A <w:p>'s slots and boundaries in document order; a paragraph inside it (a text box) is its own."""
    items: list[Slot | None] = []
    stack = list(reversed(p))
    while stack:
        el = stack.pop()
        if el.tag == W + "p":
            continue
        if el.tag == W + "t":
            run = el.getparent()
            props = run.find(W + "rPr")
            link = next((a for a in run.iterancestors(W + "hyperlink", W + "p")), None)
            target = tuple(sorted(link.attrib.items())) if link is not None and link.tag == W + "hyperlink" else None
            items.append(Slot(el, "text", (b"" if props is None else etree.tostring(props), target)))
        elif el.tag in BOUNDARIES:
            items.append(None)
        stack.extend(reversed(el))
    return items


class WordDocument:
    def __init__(self, data: bytes, limits: Limits):
        open_zip(data, "docx", limits)
        self.document = docx.Document(io.BytesIO(data))
        found = []
        for part in self.document.part.package.iter_parts():
            if isinstance(part, XmlPart) and any(part.content_type.endswith(f"wordprocessingml.{n}+xml")
                                                 for n in PARTS):
                for p in part.element.iter(W + "p"):
                    found += stretches(paragraph_items(p))
        self.translatable = Translatable(found)
        self.texts = self.translatable.texts

    def render(self, translations: list[str]) -> bytes:
        self.translatable.put(translations)
        for stretch in self.translatable.stretches:   # a translation may begin or end with a space
            for group in stretch.groups:
                group[0].element.set(XML_SPACE, "preserve")
        out = io.BytesIO()
        self.document.save(out)
        return out.getvalue()
