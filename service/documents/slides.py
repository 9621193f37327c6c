"""PowerPoint presentations (.pptx) by python-pptx: every slide's shapes (text frames, tables, grouped
shapes), and its notes. Layouts and masters are left as they are: their text is the template's prompts.

python-pptx opens and saves the package; the paragraphs are walked at the XML level (DrawingML's <a:p>,
the same in shapes, tables and notes). A slot is a run's <a:t>, its style the run's <a:rPr> as written; a
line break (<a:br>) and a field (<a:fld>: a slide number, a date) end a stretch."""

from __future__ import annotations

import io

import pptx
from lxml import etree

from .container import open_zip
from .limits import Limits
from .paragraphs import Slot, Translatable, stretches

A = "{http://schemas.openxmlformats.org/drawingml/2006/main}"


def paragraph_items(p) -> list[Slot | None]:
    items: list[Slot | None] = []
    for child in p:
        if child.tag == A + "r" and (t := child.find(A + "t")) is not None:
            props = child.find(A + "rPr")
            items.append(Slot(t, "text", b"" if props is None else etree.tostring(props)))
        elif child.tag in (A + "br", A + "fld"):
            items.append(None)
    return items


class Presentation:
    def __init__(self, data: bytes, limits: Limits):
        open_zip(data, "pptx", limits)
        self.presentation = pptx.Presentation(io.BytesIO(data))
        roots = []
        for slide in self.presentation.slides:
            roots.append(slide.element)
            if slide.has_notes_slide:
                roots.append(slide.notes_slide.element)
        found = [s for root in roots for p in root.iter(A + "p") for s in stretches(paragraph_items(p))]
        self.translatable = Translatable(found)
        self.texts = self.translatable.texts

    def render(self, translations: list[str]) -> bytes:
        self.translatable.put(translations)
        out = io.BytesIO()
        self.presentation.save(out)
        return out.getvalue()
