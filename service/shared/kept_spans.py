"""What a translation writes back as the source wrote it: spans a client marks `<dnt>…</dnt>`, URLs, e-mail
addresses, `code spans`, and runs of characters the model cannot write (emoji, symbols outside its vocabulary,
which its tokenizer reads as unknown and its output would drop: "Hallo 😀 Welt" came back "Hallo world").

Each span is replaced in the source by a placeholder the model copies like a name ("XQ1", "XQ2"...; "XQ01"... when
there are ten or more; letters neither the text nor the request's glossary terms hold; what a budget cut of one
leaves, "XQ", is removed), the
placeholder's pieces become a term the beam search must write (constraints.py), so the search places it where the
sentence puts it, and the placeholder in the translation is replaced by the span as written. Where a search could
not place one (its length budget ran out; greedy search and sampling keep no terms and place it only when the model
copies it), the span is appended at the end, so nothing the client sent is lost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

# <dnt>…</dnt> (Riva's tag; its content kept, the tags dropped), a URL, an e-mail address, a `code span`.
MARKED = re.compile(r"<dnt>(?P<dnt>.*?)</dnt>"
                    r"|(?P<url>\b(?:https?|ftp)://[^\s<>\"]+[^\s<>\".,;:!?)\]}'])"
                    r"|(?P<mail>\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b)"
                    r"|(?P<code>`[^`\n]+`)", re.S)
# Placeholders' letters: the first pair (then triple) that neither the text nor the request's glossary terms hold,
# so a placeholder is never a term's, and a term never matches a placeholder.
PREFIXES = tuple(a + b for a in "XZQJV" for b in "QXZJV" if a != b) + tuple(
    a + b + c for a in "XZQ" for b in "QXZ" for c in "JVQ" if a != b != c)
# Typographic quotes read as their ASCII forms rather than kept: a model whose vocabulary lacks „“ ‘’ still reads
# the quotation, and a translation's quotes follow its own language rather than the source's.
QUOTES = str.maketrans({"„": '"', "“": '"', "”": '"', "‚": "'", "‘": "'", "’": "'", "«": '"', "»": '"'})


@dataclass
class Kept:
    """A sentence with its kept spans replaced by placeholders: `text` goes to the model, `spans[i]` comes back
    where placeholder i stands in the translation."""
    text: str
    spans: list[str] = field(default_factory=list)
    prefix: str = PREFIXES[0]

    def placeholder(self, i: int) -> str:
        # As wide as the last one's number (XQ01 ... XQ12), so that none begins another: the search follows terms
        # that start alike together, and XQ1 met at the start of XQ12 would stand where XQ12 should.
        return f"{self.prefix}{i + 1:0{len(str(len(self.spans)))}d}"

    def placeholders(self) -> list[str]:
        return [self.placeholder(i) for i in range(len(self.spans))]

    def restore(self, translation: str) -> str:
        """The translation with each placeholder replaced by its span (a placeholder the model wrote again: the
        copy dropped); a span whose placeholder is missing is appended (after a space)."""
        if not self.spans:
            return translation
        missing = []
        for i in reversed(range(len(self.spans))):
            placeholder = self.placeholder(i)
            pattern = re.compile(rf" ?(?<![A-Za-z]){re.escape(placeholder)}(?P<tail>[A-Za-z]*[0-9]*)")
            found = [(m.start(), end, m.group().startswith(" ")) for m in pattern.finditer(translation)
                     if (end := _end(m, placeholder)) is not None]
            if not found:
                missing.append(self.spans[i])
                continue
            (start, end, spaced), *copies = found
            for a, b, _ in reversed(copies):
                translation = translation[:a] + translation[b:]
            translation = translation[:start] + (" " if spaced else "") + self.spans[i] + translation[end:]
        # What is left of a placeholder the search began and its budget cut ("XQ"), or one a search that need not
        # place them wrote mangled ("XQ07088XXQ", greedy search): not the client's text. The prefix stands in no
        # source, so any word holding it now is one of ours.
        translation = re.sub(rf" ?[A-Za-z0-9]*{re.escape(self.prefix)}[A-Za-z0-9]*", "", translation)
        return " ".join([translation.rstrip(), *reversed(missing)]).strip() if missing else translation


def _end(m: re.Match, placeholder: str) -> int | None:
    """Where a placeholder's match ends: past the letters and digits run on to it when they repeat its end (a
    search's stutter: "XQ10Q10" and "XQ1010" are XQ10 once), else right after it ("XQ1s": the "s" is the model's);
    None when a digit follows that is no such repeat (another number, not this placeholder)."""
    tail = m.group("tail")
    if tail and placeholder.endswith(tail):
        return m.end()
    return None if tail[:1].isdigit() else m.start("tail")


def keep(sentence: str, writable: Callable[[str], bool], avoid: str = "") -> Kept:
    """The sentence's kept spans (see the module docstring) replaced by placeholders; `writable(ch)`: whether the
    model can write the character ch; `avoid`: text a placeholder's letters must not stand in either (the
    glossary's terms)."""
    if "<" not in sentence and "@" not in sentence and "`" not in sentence and "://" not in sentence and all(
            writable(ch) for ch in set(sentence) if not ch.isspace()):
        return Kept(sentence)              # the common case, on every request's path: each character once
    spans: list[tuple[int, int, str]] = []                 # (start, end, what comes back)
    for m in MARKED.finditer(sentence):
        spans.append((m.start(), m.end(), m.group("dnt") if m.group("dnt") is not None else m.group()))
    taken = [False] * len(sentence)
    for start, end, _ in spans:
        taken[start:end] = [True] * (end - start)
    i = 0
    while i < len(sentence):
        if not taken[i] and not sentence[i].isspace() and not writable(sentence[i]):
            j = i
            while j < len(sentence) and not taken[j] and not sentence[j].isspace() and not writable(sentence[j]):
                j += 1
            spans.append((i, j, sentence[i:j]))
            i = j
        else:
            i += 1
    if not spans:
        return Kept(sentence)
    prefix = next((p for p in PREFIXES if p not in sentence and p not in avoid), None)
    if prefix is None:                   # every pair and triple taken (a long random string): nothing is kept
        return Kept(sentence)
    kept = Kept("", [s for _, _, s in sorted(spans)], prefix)
    out, last = [], 0
    for n, (start, end, _) in enumerate(sorted(spans)):
        out += [sentence[last:start], kept.placeholder(n)]
        last = end
    kept.text = "".join(out + [sentence[last:]])
    return kept
