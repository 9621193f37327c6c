"""Word documents (.docx) by python-docx: the body (tables, nested tables and text boxes included), every
section's headers and footers, the footnotes, the endnotes and the comments.

python-docx opens and saves the package (its parts, relationships and content types as Word wrote them);
the paragraphs are walked at the XML level, since its Paragraph.runs leaves out runs inside hyperlinks,
fields and revisions. A slot is a run's <w:t>; its style is the run's <w:rPr> as written (and the hyperlink
and the tracked insertion it is in: an insertion's words go back into it, still tracked). A tab, a break, a
drawing, a field (its characters, or a simple field's start and end: its result is a stretch of its own, as
Word rewrites it), a note reference end a stretch. <w:instrText> (a field's code) and <w:delText> (a tracked
deletion's text, left in the source language) are never translated."""

from __future__ import annotations

import io

import docx
from docx.opc.constants import CONTENT_TYPE
from docx.opc.part import PartFactory, XmlPart
from lxml import etree

from .container import open_zip
from .limits import Limits
from .paragraphs import Slot, Translatable, stretches

W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"
PARTS = ("document.main", "header", "footer", "footnotes", "endnotes", "comments")  # after "wordprocessingml."
BOUNDARIES = {W + n for n in ("tab", "ptab", "br", "cr", "drawing", "pict", "object", "fldChar", "sym",
                              "footnoteReference", "endnoteReference", "commentReference", "noBreakHyphen")}
REVISIONS = (W + "ins", W + "moveTo")            # tracked insertions: their runs' words stay inside them
FIELD_END = object()                             # on the walk's stack: a simple field's end

# python-docx (1.2) loads the footnotes and endnotes as opaque parts, which it saves as they were read. Registered as
# XmlParts (PartFactory's hook for a content type) they are parsed on open and serialised on save, as the body is.
for _notes in (CONTENT_TYPE.WML_FOOTNOTES, CONTENT_TYPE.WML_ENDNOTES):
    PartFactory.part_type_for.setdefault(_notes, XmlPart)


def paragraph_items(p) -> list[Slot | None]:
    """A <w:p>'s slots and boundaries in document order; a paragraph inside it (a text box) is its own."""
    items: list[Slot | None] = []
    stack = list(reversed(p))
    while stack:
        el = stack.pop()
        if el is FIELD_END:
            items.append(None)
            continue
        if el.tag == W + "p":
            continue
        if el.tag == W + "t":
            run = el.getparent()
            props = run.find(W + "rPr")
            items.append(Slot(el, "text", (b"" if props is None else etree.tostring(props),
                                           container(run, (W + "hyperlink",)), container(run, REVISIONS))))
        elif el.tag in BOUNDARIES:
            items.append(None)
        elif el.tag == W + "fldSimple":          # its result between two boundaries, as a complex field's
            items.append(None)
            stack.append(FIELD_END)
        stack.extend(reversed(el))
    return items


def container(run, tags: tuple[str, ...]) -> tuple | None:
    """The attributes of the element of `tags` the run is in, within its paragraph (None: in none)."""
    outer = next(run.iterancestors(*tags, W + "p"), None)
    return tuple(sorted(outer.attrib.items())) if outer is not None and outer.tag in tags else None


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
