"""What the loader's own code does now inside a DALI pipeline, thread by thread: what a stall names."""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator


class InProgress:
    """One slot a thread: the driver thread feeds the next batches while DALI runs a sample hook on
    its own threads, and one shared slot lost a hung hook to a read that ended after the hook began.
    A stall names the longest running, which is what hangs. Words are built only when a stall is
    reported: the read path begins one a sample."""

    def __init__(self):
        self.now: dict[int, tuple[str, str, float]] = {}

    def begin(self, doing: str, what: str) -> None:
        self.now[threading.get_ident()] = doing, what, time.monotonic()

    def end(self) -> None:
        self.now.pop(threading.get_ident(), None)

    @contextlib.contextmanager
    def during(self, doing: str, what: str) -> Iterator[None]:
        self.begin(doing, what)
        try:
            yield
        finally:
            self.end()

    def longest(self) -> tuple[str, str, float] | None:
        """(doing, on what, monotonic start) of what has run longest; None while nothing runs."""
        running = tuple(self.now.values())  # one call, whole under the GIL: other threads change it
        return min(running, key=lambda item: item[2]) if running else None

    def stuck_words(self) -> str:
        """What the loader is doing, for a pipeline that sent no batch for workers.timeout."""
        busy = self.longest()
        if busy is None:
            return "the feed is not reading a sample: DALI is stuck in a batch (a file on a hung file system?)"
        return f"the loader has been {busy[0]} {busy[1]} for {time.monotonic() - busy[2]:.0f} s"
