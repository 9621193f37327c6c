"""The text of HTML fragments, for LibreTranslate's format=html: what to translate, and the fragment rebuilt
around the translations with its markup as written.

Parsing is the standard library's html.parser, as a browser tolerates HTML (unclosed elements, stray end
tags, bare `&`); each event's markup is cut from the source by its position, so tags, attributes, comments and
everything inside `<script>`, `<style>`, `<code>`, `<pre>`, `<kbd>`, `<samp>`, `<var>`, `<textarea>`,
`<svg>`, `<math>` and an element with `translate="no"` (or class `notranslate`) come back byte for byte.

What is translated: runs of text. A run is the text between two block boundaries (the start or end of any
element not inline, `<br>`, a kept element), with its inline elements (`<b>`, `<a>`, `<span>`, ...) inside it:
`<p>Das ist <b>gut</b>.</p>` is ONE text, "Das ist gut.", so the model sees whole sentences, not "Das ist" and
"gut" cut apart. Whitespace inside a run is collapsed as a browser shows it. The inline tags are then put back
into the run's translation:

- an inline element holding only text is also translated alone (in the same batch), and where that
  translation occurs exactly once, as whole words, in the run's translation (ignoring case and the
  punctuation around it), its tags wrap that occurrence: `<b>good</b>` in "That is good.";
- otherwise each tag goes where it stood proportionally (its offset in the source run scaled to the
  translation's length), moved to the nearest word edge: never inside a word, never before a tag that came
  before it, so the tags come back in their order and nesting, around the translated words.

This keeps the sentence whole (what decides the translation's quality) at the cost of a tag sometimes wrapping
a neighbouring word when the model reorders a sentence; cutting the sentence at its tags would always cost
quality. Where the alone-translations would take the request over the server's text count, only the
proportional placing is used.

Which tags are inline is HTML's by default (INLINE, INLINE_POINTS); a caller may pass other sets (Splitting):
DeepL's tag_handling=xml names its own, `non_splitting_tags` made inline (a self-closing one an inline point, as
`<img>` is) and `splitting_tags` boundaries. Names are matched in lower case: html.parser lowers them, so an
XML document's `<X>` and `<x>` are one tag here.

Entities: a translated character that the source wrote as an entity (`&nbsp;`, `&auml;`, `&#8364;`) is
written as that entity again; `&`, `<` and `>` are always escaped (a translation cannot inject markup).

Limits, for hostile markup: elements nested deeper than MAX_DEPTH (400), more than MAX_ELEMENTS elements in a
request (413), and markup left unclosed at the end so that html.parser would scan it again for every `<` in
it (quadratic: 9 s for 10,000 characters of `<a <b <c ...`; 400). Unclosed markup shorter than that is kept
as written, untranslated.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from html import unescape
from html.parser import HTMLParser

MAX_DEPTH = 256              # libxml2's default nesting limit
MAX_ELEMENTS = 5000          # start tags per request
MAX_UNPARSED_WORK = 1_000_000  # characters left unparsed x their '<'s, per request (about 0.3 s of parsing)

INLINE = frozenset("a abbr b bdi bdo cite data del dfn em font i ins label mark q s small span strike strong sub "
                   "sup time tt u".split())
INLINE_POINTS = frozenset("img wbr input".split())   # void elements that do not end a run
VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())
KEEP = frozenset("script style code pre kbd samp var textarea svg math template noscript iframe object".split())
AUTOCLOSE = frozenset("p li dt dd tr td th option".split())   # <li>one<li>two: the second closes the first
SPACE = " \t\n\r\f"           # HTML's whitespace (not U+00A0, &nbsp;)
PUNCT = ".,;:!?…\"'“”„«»()[]"
JOINERS = "'’-"                # inside a word, not an edge of one
ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


@dataclass(frozen=True)
class Splitting:
    """Which elements stay inside a run: `inline` ones (a start and an end tag) and `points` (a void or
    self-closing tag); every other tag ends a run. HTML's, or a request's own (xml())."""
    inline: frozenset[str] = INLINE
    points: frozenset[str] = INLINE_POINTS

    @classmethod
    def xml(cls, splitting: tuple[str, ...], non_splitting: tuple[str, ...]) -> Splitting:
        """HTML's sets with `non_splitting` added and `splitting` taken away (a tag in both splits)."""
        joins, splits = frozenset(t.lower() for t in non_splitting), frozenset(t.lower() for t in splitting)
        return cls((INLINE | joins) - splits, (INLINE_POINTS | joins) - splits)


HTML = Splitting()


class MarkupError(Exception):
    """`message` quotes none of the markup: a DeepL document job stores it (documents.limits.DocumentError).
    `detail`, the markup that shows the problem, is for an answer given within the request: str(e) has both."""

    def __init__(self, status: int, message: str, code: str = "invalid_html", detail: str | None = None):
        super().__init__(f"{message} ({detail})" if detail else message)
        self.status, self.message, self.code, self.detail = status, message, code, detail


@dataclass
class Mark:
    pos: int        # where it stands in Run.text
    raw: str        # the markup as written
    kind: str       # "open", "close" or "point"
    # A point (an image, a comment) with whitespace before or after it among the text: a word edge of the
    # translation has the space on one side only, so render_run writes the other back.
    space_before: bool = False
    space_after: bool = False


@dataclass
class Run:
    """A run of text to translate, whitespace collapsed, with its inline markup."""
    text: str
    marks: list[Mark]
    leaves: list[int]           # index in marks of the open tag of each inline element holding only text
    prefix: str = ""            # the whitespace before and after it, as written
    suffix: str = ""

    def leaf_text(self, k: int) -> str:
        return self.text[self.marks[k].pos:self.marks[k + 1].pos].strip(SPACE)


@dataclass
class Fragment:
    parts: list[str | Run]      # markup as written, or a run to translate
    entities: dict[str, str] = field(default_factory=dict)   # character -> the entity the source wrote


class Counter:
    """The elements of one request (MAX_ELEMENTS) and its unparsed work (MAX_UNPARSED_WORK)."""
    def __init__(self):
        self.elements = self.work = 0


class _Reader(HTMLParser):
    """A fragment as events (offset, kind, tag, attrs); an event's markup is source[offset:the next offset]."""

    def __init__(self, source: str):
        super().__init__(convert_charrefs=False)
        self.lines, i = [0], source.find("\n")
        while i >= 0:
            self.lines.append(i + 1)
            i = source.find("\n", i + 1)
        self.events: list[tuple[int, str, str, list]] = []
        self.closing = False    # close(): what is left is malformed markup, kept as written

    def _add(self, kind: str, tag: str = "", attrs: list | None = None) -> None:
        line, col = self.getpos()
        self.events.append((self.lines[line - 1] + col, "markup" if self.closing else kind, tag, attrs or []))

    def handle_starttag(self, tag, attrs):
        self._add("open", tag, attrs)

    def handle_startendtag(self, tag, attrs):
        self._add("point", tag, attrs)

    def handle_endtag(self, tag):
        self._add("close", tag)

    def handle_data(self, data):
        self._add("text")

    def handle_entityref(self, name):
        self._add("entity")

    def handle_charref(self, name):
        self._add("entity")

    def handle_comment(self, data):
        self._add("comment")

    def handle_decl(self, decl):
        """HTML has no internal DTD subset: html.parser ends `<!DOCTYPE html [ <!ENTITY b "x"> ]>` at the entity's
        `>`, so ` ]>` became text and `&b;` a stray `&`, both escaped. Refused rather than kept: keeping it would
        hand the entity declarations on to whatever reads the result next (an XML parser, for XHTML), an entity
        bomb passed through; refusing expands nothing, as documents/container.py refuses a DTD in a zip's XML
        parts. Only a declaration the parser reads as one: a `<!DOCTYPE x [` in a comment or a script is text."""
        if decl[:7].lower() == "doctype" and "[" in decl:
            line, col = self.getpos()
            raise MarkupError(400, f"the HTML's DOCTYPE has an internal DTD subset (at character "
                              f"{self.lines[line - 1] + col}): entity declarations are not supported; remove them "
                              "and write the entities' text out", "html_dtd")
        self._add("markup")

    def handle_pi(self, data):
        self._add("markup")

    def unknown_decl(self, data):
        self._add("markup")


def read_events(source: str, counter: Counter) -> list[tuple[str, str, str, list]]:
    """(kind, tag, attrs, markup as written) of each event; a 400 for markup whose parse would be quadratic."""
    reader = _Reader(source)
    reader.feed(source)
    left = reader.rawdata     # an unclosed tag, comment or declaration and all after it
    counter.work += len(left) * left.count("<")
    if counter.work > MAX_UNPARSED_WORK:
        at = len(source) - len(left)
        raise MarkupError(400, f"the HTML has markup that never closes (at character {at}, with {left.count('<')} "
                          "'<' after it); close it, or write a literal < as &lt;", detail=repr(left[:20]))
    reader.closing = True
    reader.close()
    ends = [e[0] for e in reader.events[1:]] + [len(source)]
    return [(kind, tag, attrs, source[at:end]) for (at, kind, tag, attrs), end in zip(reader.events, ends)]


def keep_attrs(attrs: list) -> bool:
    a = {k: v or "" for k, v in attrs}
    return a.get("translate", "").strip().lower() == "no" or "notranslate" in a.get("class", "").split()


class _Builder:
    """Events into a Fragment: markup as written, runs of text in between."""

    def __init__(self, counter: Counter, tags: Splitting = HTML):
        self.counter, self.tags = counter, tags
        self.fragment = Fragment([])
        self.stack: list[str] = []          # open elements
        self.keep_from: int | None = None   # len(stack) once a kept element opened
        self.pieces: list[tuple[str, str, str]] = []   # the current run: (kind, markup, text or tag kind)

    def add(self, kind: str, tag: str, attrs: list, raw: str) -> None:
        if kind in ("open", "point"):
            self.counter.elements += 1
            if self.counter.elements > MAX_ELEMENTS:
                raise MarkupError(413, f"the HTML has more than {MAX_ELEMENTS} elements; send it in parts")
        if self.keep_from is not None:
            self.fragment.parts.append(raw)
            self.track(kind, tag)
            if len(self.stack) < self.keep_from:
                self.keep_from = None
        elif kind == "open" and tag not in VOID:
            self.open(tag, attrs, raw)
        elif kind == "close":
            self.track(kind, tag)
            self.inline(raw, "close") if tag in self.tags.inline else self.boundary(raw)
        elif kind in ("text", "entity"):
            self.text(kind, raw)
        elif kind == "comment" or (kind in ("open", "point") and tag in self.tags.points):
            self.inline(raw, "point")
        else:   # <br>, <hr>, declarations, malformed leftovers
            self.boundary(raw)

    def track(self, kind: str, tag: str) -> None:
        """The open elements after this event: a start tag pushed, an end tag pops to its element (a stray
        one changes nothing)."""
        if kind == "open" and tag not in VOID:
            if tag in AUTOCLOSE and self.stack and self.stack[-1] == tag:
                self.stack.pop()
            if len(self.stack) >= MAX_DEPTH:
                raise MarkupError(400, f"the HTML nests elements more than {MAX_DEPTH} deep")
            self.stack.append(tag)
        elif kind == "close" and tag in self.stack:
            del self.stack[len(self.stack) - 1 - self.stack[::-1].index(tag):]

    def open(self, tag: str, attrs: list, raw: str) -> None:
        self.track("open", tag)
        if tag in KEEP or keep_attrs(attrs):
            self.boundary(raw)
            self.keep_from = len(self.stack)
        elif tag in self.tags.inline:
            self.inline(raw, "open")
        else:
            self.boundary(raw)

    def text(self, kind: str, raw: str) -> None:
        value = unescape(raw)
        if kind == "entity" and len(value) == 1 and raw.endswith(";"):
            self.fragment.entities.setdefault(value, raw)
        self.pieces.append(("text", raw, value))

    def inline(self, raw: str, kind: str) -> None:
        self.pieces.append(("mark", raw, kind))

    def boundary(self, raw: str) -> None:
        self.flush()
        self.fragment.parts.append(raw)

    def flush(self) -> None:
        if self.pieces:
            run = make_run(self.pieces)
            self.fragment.parts.append(run if run is not None else "".join(p[1] for p in self.pieces))
            self.pieces = []


def make_run(pieces: list[tuple[str, str, str]]) -> Run | None:
    """A run from its pieces, or None where it has no text to translate."""
    out: list[str] = []
    marks: list[Mark] = []
    opened: list[list] = []     # [index in marks, holds only text] of the inline elements open in the run
    leaves: list[int] = []
    pending = False             # whitespace seen since the last character
    spaced = False              # whitespace seen since the last character or mark
    point: Mark | None = None   # a point with no character after it yet
    for kind, raw, value in pieces:
        if kind == "text":
            for c in value:
                if c in SPACE:
                    pending = spaced = True
                    if point is not None:
                        point.space_after = True
                    continue
                if pending and out:
                    out.append(" ")
                out.append(c)
                pending, spaced, point = False, False, None
            continue
        if value == "close" and opened:
            k, only_text = opened.pop()
            if only_text and k == len(marks) - 1:
                leaves.append(k)
        for o in opened:
            o[1] = False        # a tag inside: not only text
        if value == "open":
            opened.append([len(marks), True])
        is_point = value == "point"
        marks.append(Mark(len(out) + (1 if pending and out else 0), raw, value,
                          space_before=is_point and spaced and bool(out)))
        point, spaced = (marks[-1] if is_point else None), False
    text = "".join(out)
    if not text.strip():        # nothing to translate: a cell of &nbsp; (not HTML's white space) stays as it was
        return None
    for m in marks:
        m.pos = min(m.pos, len(text))
    first, last = pieces[0], pieces[-1]
    prefix = first[1][:len(first[1]) - len(first[1].lstrip(SPACE))] if first[0] == "text" else ""
    suffix = last[1][len(last[1].rstrip(SPACE)):] if last[0] == "text" else ""
    return Run(text, marks, leaves, prefix, suffix)


def parse(source: str, counter: Counter | None = None, tags: Splitting = HTML) -> Fragment:
    """A fragment's markup and runs; MarkupError (400/413) for hostile markup (see the module's docstring)."""
    builder = _Builder(counter or Counter(), tags)
    for kind, tag, attrs, raw in read_events(source, builder.counter):
        builder.add(kind, tag, attrs, raw)
    builder.flush()
    return builder.fragment


def parse_all(sources: list[str], tags: Splitting = HTML) -> list[Fragment]:
    counter = Counter()
    return [parse(s, counter, tags) for s in sources]


def texts(fragments: list[Fragment], leaves: bool) -> list[str]:
    """What to translate, in order: each run's text, then (leaves) the text of each of its inline elements
    that hold only text."""
    out = []
    for f in fragments:
        for run in f.parts:
            if isinstance(run, Run):
                out.append(run.text)
                out += [t for k in run.leaves if (t := run.leaf_text(k))] if leaves else []
    return out


def render(fragments: list[Fragment], translations: list[str], leaves: bool) -> list[str]:
    """The fragments with their runs translated (translations in the order of texts(fragments, leaves))."""
    it, out = iter(translations), []
    for f in fragments:
        parts = []
        for run in f.parts:
            if isinstance(run, str):
                parts.append(run)
                continue
            target = next(it).strip(SPACE)
            alone = {k: next(it) for k in run.leaves if run.leaf_text(k)} if leaves else {}
            parts.append(render_run(run, target, alone, f.entities))
        out.append("".join(parts))
    return out


def render_run(run: Run, target: str, alone: dict[int, str], entities: dict[str, str]) -> str:
    positions = place(run, target, alone)
    out, last = [run.prefix], 0
    for mark, at in zip(run.marks, positions):
        before = " " if mark.space_before and 0 < at and target[at - 1] not in SPACE else ""
        after = " " if mark.space_after and at < len(target) and target[at] not in SPACE else ""
        out += [escape(target[last:at], entities), before, mark.raw, after]
        last = at
    out += [escape(target[last:], entities), run.suffix]
    return "".join(out)


def escape(text: str, entities: dict[str, str]) -> str:
    return "".join(entities.get(c) or ESCAPES.get(c, c) for c in text)


def find_once(target: str, words: str) -> tuple[int, int] | None:
    """Where words occur exactly once in target as whole words, ignoring case and the punctuation around them."""
    words = words.strip(SPACE + PUNCT)
    if not words:
        return None
    hay, needle = target.lower(), words.lower()
    if len(hay) != len(target) or len(needle) != len(words):   # a character whose lower case is longer
        hay, needle = target, words
    i = hay.find(needle)
    if i < 0 or hay.find(needle, i + 1) >= 0:
        return None
    j = i + len(needle)
    if (i and target[i - 1].isalnum()) or (j < len(target) and target[j].isalnum()):
        return None
    return i, j


def word_edges(text: str) -> tuple[list[int], list[int]]:
    """The offsets where a word starts and where one ends (0 and the end included in both)."""
    n = len(text)
    word = [c.isalnum() for c in text]
    for i in range(1, n - 1):     # I'm, don't, well-known: one word
        word[i] = word[i] or (text[i] in JOINERS and text[i - 1].isalnum() and text[i + 1].isalnum())
    starts = [i for i in range(n) if word[i] and (i == 0 or not word[i - 1])]
    ends = [i for i in range(1, n + 1) if word[i - 1] and (i == n or not word[i])]
    return sorted({0, n, *starts}), sorted({0, n, *ends})


def nearest(edges: list[int], guess: int, lo: int) -> int:
    """The edge nearest guess that is not before lo (lo itself where none is)."""
    i = bisect_left(edges, lo)
    if i == len(edges):
        return lo
    j = bisect_left(edges, guess, lo=i)
    cands = [edges[k] for k in (j - 1, j) if i <= k < len(edges)]
    return min(cands, key=lambda e: (abs(e - guess), e))


def place(run: Run, target: str, alone: dict[int, str]) -> list[int]:
    """Where each of the run's tags goes in its translation: in order, at word edges (see the docstring)."""
    found: dict[int, int] = {}
    for k, words in alone.items():
        if (span := find_once(target, words)) is not None:
            found[k], found[k + 1] = span
    leaves = set(run.leaves)
    starts, ends = word_edges(target)
    points = sorted({*starts, *ends})
    scale = len(target) / max(1, len(run.text))
    out: list[int] = []
    for k, mark in enumerate(run.marks):
        lo = out[-1] if out else 0
        if k in found and found[k] >= lo:
            out.append(found[k])
            continue
        if mark.kind == "open":
            found.pop(k + 1, None)    # its close goes by proportion too
        edges = starts if mark.kind == "open" else ends if mark.kind == "close" else points
        at = nearest(edges, round(mark.pos * scale), lo)
        if mark.kind == "close" and k - 1 in leaves and at == lo:   # an inline element's words: not empty
            at = nearest(edges, at + 1, at + 1) if at < len(target) else at
        out.append(at)
    return out
