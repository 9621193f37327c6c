"""Progress on standard error: a bar redrawn in place on a terminal, a quiet line every `every` seconds
otherwise (a log, a CI job: no carriage returns), and one summary line at the end either way."""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


def clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    def __init__(self, mode: str, total: Optional[int], *, done: int = 0, stream: TextIO = sys.stderr,
                 every: float = 10.0):
        self.bar = mode == "bar" or (mode == "auto" and stream.isatty())
        self.quiet = mode == "off"
        self.total, self.done, self.stream, self.every = total, done, stream, every
        self.resumed = done                      # records a stopped run had written
        self.segments = self.tokens = 0          # this run's (a resumed run's rates leave the earlier out)
        self.start = self.shown = time.monotonic()

    def update(self, segments: int, tokens: int) -> None:
        self.segments, self.tokens, self.done = self.segments + segments, self.tokens + tokens, self.done + segments
        now = time.monotonic()
        if self.quiet or now - self.shown < (0.2 if self.bar else self.every):
            return
        self.shown = now
        self._show(now, end="\r" if self.bar else "\n")

    def finish(self, what: str = "done") -> None:
        if not self.quiet:
            self._show(time.monotonic(), end="\n", what=what)

    def _show(self, now: float, *, end: str, what: str = "") -> None:
        elapsed = max(now - self.start, 1e-9)
        rate, tokens = self.segments / elapsed, self.tokens / elapsed
        of = f"/{self.total}" if self.total else ""
        eta = ""
        if self.total and rate > 0 and not what:
            eta = f", ETA {clock(max(self.total - self.done, 0) / rate)}"
        text = f"{self.done}{of} segments, {rate:.1f} segments/s, {tokens:.0f} tokens/s{eta}"
        if self.bar and self.total and not what:
            filled = min(int(30 * self.done / self.total), 30)
            text = f"[{'#' * filled}{'.' * (30 - filled)}] {100 * self.done / self.total:5.1f}% {text}"
        if what:
            text = f"{what}: {text} in {clock(elapsed)}" + (f" (resumed after {self.resumed})" if self.resumed else "")
        self.stream.write(("\r\x1b[K" if self.bar else "") + "transerve translate: " + text + end)
        self.stream.flush()
