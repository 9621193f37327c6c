"""A paragraph's text, translated with its runs' formatting kept, whatever the format.

A format module (word.py, slides.py, opendocument.py) gives each paragraph as a list of items: a Slot (an XML
element's .text or .tail holding some of the paragraph's characters, with its formatting as a comparable
`style`) or None, a boundary the text does not flow across (a tab, a line break, an image, a field). Between
two boundaries, a stretch: one text for the model, its sentences whole. Consecutive slots of the same style
are one group (Word cuts runs for spelling marks and revision ids, not only for formatting).

The groups' formatting goes back into the translation as html_text.py puts inline tags back for
LibreTranslate's format=html, the placing tested there: the stretch becomes an HTML fragment in which every
group not in the stretch's main style (the one with the most characters) is a <span data-r="i">; each such
span is also translated alone, and where that translation is found as whole words in the stretch's, the
span wraps it, else it goes where it stood proportionally. The rendered fragment is read back piece by piece:
a span's text goes into its group's first slot, the text between spans into the main-style group that stood
there, and every other slot of a group is emptied. No element is added, moved or removed: images, fields,
bookmarks and the runs' properties stay where they were. A stretch with no letter is left as it is."""

from __future__ import annotations

import html
from dataclasses import dataclass
from html.parser import HTMLParser

from ..shared import html_text


@dataclass
class Slot:
    element: object     # an lxml element
    attr: str           # "text" or "tail"
    style: object       # equal for slots formatted alike

    @property
    def value(self) -> str:
        return getattr(self.element, self.attr) or ""

    def put(self, text: str) -> None:
        setattr(self.element, self.attr, text)


class Stretch:
    """Slots between two boundaries, as one HTML fragment to translate."""

    def __init__(self, slots: list[Slot]):
        self.groups: list[list[Slot]] = []
        for slot in slots:
            if self.groups and self.groups[-1][0].style == slot.style:
                self.groups[-1].append(slot)
            else:
                self.groups.append([slot])
        texts = ["".join(s.value for s in g) for g in self.groups]
        weight: dict = {}
        for group, text in zip(self.groups, texts):
            weight[group[0].style] = weight.get(group[0].style, 0) + len(text.strip())
        main = max(weight, key=weight.get)
        self.wrapped = [i for i, g in enumerate(self.groups) if g[0].style != main]
        self.gaps: list[int | None] = [None]   # the main-style group before the first span, between spans, after
        for i, g in enumerate(self.groups):
            if g[0].style == main:
                self.gaps[-1] = i
            else:
                self.gaps.append(None)
        source = "".join(html.escape(t, quote=False) if i not in self.wrapped else
                         f'<span data-r="{i}">{html.escape(t, quote=False)}</span>' for i, t in enumerate(texts))
        self.fragment = html_text.parse(source)
        self.translatable = any(c.isalpha() for t in texts for c in t)

    def put(self, rendered: str) -> None:
        out = [""] * len(self.groups)
        for text, span, closed in Pieces(rendered).pieces:
            if span is not None:
                out[span] += text
            elif (gap := self.gaps[closed]) is not None:
                out[gap] += text
            else:                              # two spans side by side: the text between goes to the one before
                out[self.wrapped[max(closed - 1, 0)]] += text
        for group, text in zip(self.groups, out):
            group[0].put(text)
            for slot in group[1:]:
                slot.put("")


class Pieces(HTMLParser):
    """A rendered fragment as (text, the span's group or None, how many spans were closed before it)."""

    def __init__(self, rendered: str):
        super().__init__(convert_charrefs=True)
        self.pieces: list[tuple[str, int | None, int]] = []
        self.span: int | None = None
        self.closed = 0
        self.feed(rendered)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.span = int(dict(attrs)["data-r"])

    def handle_endtag(self, tag):
        self.span, self.closed = None, self.closed + 1

    def handle_data(self, data):
        self.pieces.append((data, self.span, self.closed))


def stretches(paragraph: list[Slot | None]) -> list[Stretch]:
    """A paragraph's items cut at its boundaries (None), the stretches with something to translate."""
    out, current = [], []
    for item in [*paragraph, None]:
        if item is not None:
            current.append(item)
        elif current:
            stretch = Stretch(current)
            if stretch.translatable:
                out.append(stretch)
            current = []
    return out


class Translatable:
    """Every stretch of a document: `texts` to translate (each stretch's, then its spans alone, html_text's
    order) and `put` to write the translations back into the document's elements."""

    def __init__(self, all_stretches: list[Stretch]):
        self.stretches = all_stretches
        self.texts = html_text.texts([s.fragment for s in all_stretches], leaves=True)

    def put(self, translations: list[str]) -> None:
        rendered = html_text.render([s.fragment for s in self.stretches], translations, leaves=True)
        for stretch, fragment in zip(self.stretches, rendered):
            stretch.put(fragment)
