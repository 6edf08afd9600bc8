"""A progress line for long work, on stderr: rewritten in place on a terminal, a line every 10%
otherwise (so CI logs and pipes stay short)."""
from __future__ import annotations

import sys


class Progress:
    def __init__(self, total: int, unit: str = "batches"):
        self.total, self.unit = max(1, total), unit
        self.tty, self.last, self.done = sys.stderr.isatty(), -1, 0

    def advance(self, count: int = 1) -> None:
        self.update(self.done + count)

    def update(self, done: int) -> None:
        self.done = done
        percent = 100 * done // self.total
        if self.tty:
            sys.stderr.write(f"\r{done}/{self.total} {self.unit} ({percent}%)")
        elif percent // 10 != self.last // 10:
            sys.stderr.write(f"{done}/{self.total} {self.unit} ({percent}%)\n")
        self.last = percent
        sys.stderr.flush()

    def finish(self) -> None:
        if self.tty:
            sys.stderr.write("\n")
