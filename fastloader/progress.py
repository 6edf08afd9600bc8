"""Progress of long work (screening, `check`, `cache`, `bench` rounds) on stderr, drawn by tqdm: a
bar with rate and time left on a terminal; elsewhere a line every ~10% (so CI logs and pipes stay
short), such as `120/240 files (50%)`."""
from __future__ import annotations

import math
import sys

from tqdm import tqdm

LINE = "{n_fmt}/{total_fmt} {unit} ({percentage:.0f}%)"
"""A progress line off a terminal."""


class _Bar(tqdm):
    monitor_interval = 0  # no monitor thread: the screening and the cache fork worker processes


class _Lines:
    """tqdm's output off a terminal: each refresh as a line of its own rather than a rewrite of the
    last one (tqdm writes '\\r', the line and padding)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        line = text.strip("\r\n ")
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


class Progress:
    def __init__(self, total: int, unit: str = "batches"):
        total = max(1, total)
        self.lines = not sys.stderr.isatty()
        if not self.lines:
            self.bar = _Bar(total=total, unit=f" {unit}", file=sys.stderr, dynamic_ncols=True)
        else:  # no line before the first step; then one per tenth of the work
            self.bar = _Bar(total=total, unit=unit, file=_Lines(sys.stderr), bar_format=LINE, leave=False,
                            delay=1e-6, mininterval=0, miniters=math.ceil(total / 10))

    @property
    def done(self) -> int:
        return self.bar.n

    def advance(self, count: int = 1) -> None:
        self.bar.update(count)

    def update(self, done: int) -> None:
        self.bar.update(done - self.bar.n)

    def finish(self) -> None:
        if self.lines and self.bar.last_print_n < self.bar.n:  # the last line, if no tenth ended there
            self.bar.refresh()
        self.bar.close()
