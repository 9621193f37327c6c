"""OpenDocument text and presentations (.odt, .odp): the paragraphs and headings of content.xml (body, tables,
frames, notes, slides and their notes) and of styles.xml (the master pages' headers and footers).

Read with zipfile and lxml rather than a library: an ODF file is XML parts in a zip whose only rules for a
writer are that `mimetype` comes first and is stored uncompressed, which rewrite() keeps; the other entries
are copied as they were. odfpy has had no release since 2020 and builds its own DOM; odfdo (maintained) wraps
lxml behind private names, so walking mixed content with it would mean reaching past it. lxml is python-docx's
and python-pptx's parser already.

ODF text is mixed content: a <text:p>'s .text, its <text:span>s' (the style is the span's text:style-name,
a link's href) and every child's .tail. A tab, a line break, a run of spaces (<text:s>), a note, a frame, a
field end a stretch; bookmarks, reference marks and soft page breaks do not."""

from __future__ import annotations

import io
import zipfile

from lxml import etree

from .container import open_zip
from .limits import Limits
from .paragraphs import Slot, Translatable, stretches

TEXT = "{urn:oasis:names:tc:opendocument:xmlns:text:1.0}"
XLINK = "{http://www.w3.org/1999/xlink}"
PARTS = ("content.xml", "styles.xml")
INLINE = {TEXT + "span", TEXT + "a"}                  # text flows through these, in their own style
INVISIBLE = {TEXT + n for n in ("bookmark", "bookmark-start", "bookmark-end", "reference-mark",
                                "reference-mark-start", "reference-mark-end", "soft-page-break", "change-start",
                                "change-end", "change")}
PARAGRAPHS = (TEXT + "p", TEXT + "h")
PARSER = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)


def paragraph_items(p) -> list[Slot | None]:
    items: list[Slot | None] = [Slot(p, "text", ())]
    walk(p, (), items)
    return items


def walk(parent, style: tuple, items: list) -> None:
    """The children of `parent` (whose own text is in `style`): each one's text, then its tail in `style`."""
    for child in parent:
        if child.tag in INLINE:
            inner = (*style, child.get(TEXT + "style-name") or child.get(XLINK + "href") or child.tag)
            items.append(Slot(child, "text", inner))
            walk(child, inner, items)
        elif child.tag not in INVISIBLE:
            items.append(None)             # a tab, a space run, a note, a frame, a field: and not its insides
        items.append(Slot(child, "tail", style))


class OpenDocument:
    def __init__(self, data: bytes, kind: str, limits: Limits):
        self.archive = open_zip(data, kind, limits)
        self.trees = {name: etree.fromstring(self.archive.read(name), PARSER) for name in PARTS
                      if name in self.archive.namelist()}
        found = [s for tree in self.trees.values() for p in tree.iter(*PARAGRAPHS)
                 for s in stretches(paragraph_items(p))]
        self.translatable = Translatable(found)
        self.texts = self.translatable.texts

    def render(self, translations: list[str]) -> bytes:
        self.translatable.put(translations)
        return rewrite(self.archive, {name: etree.tostring(tree, xml_declaration=True, encoding="UTF-8")
                                      for name, tree in self.trees.items()})


def rewrite(archive: zipfile.ZipFile, replaced: dict[str, bytes]) -> bytes:
    """The archive with some entries replaced; `mimetype` first and stored, as ODF requires."""
    out = io.BytesIO()
    entries = sorted(archive.infolist(), key=lambda e: e.filename != "mimetype")
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for entry in entries:
            data = replaced.get(entry.filename) or archive.read(entry)
            stored = entry.filename == "mimetype"
            z.writestr(entry.filename, data, zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED)
    return out.getvalue()
