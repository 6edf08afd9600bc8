"""When a missing batch from a DALI driver thread is a stall, and what the error then says.

A read that never returns (a hung file system, a user's hook that loops) cannot be stopped from
outside: the trainer waiting for a batch gives up after workers.timeout, the first batch
FIRST_BATCH_TIMES that (the pipeline is built and warmed up), with an error that names what the
loader was doing. At exit, a batch still being decoded is waited for up to the same limit.
"""
from __future__ import annotations

import time
from typing import Callable

FIRST_BATCH_TIMES = 3
"""The first batch may take this many times workers.timeout: the pipeline is built and warmed up."""


class StallWatch:
    """`limit_s`: workers.timeout, the longest wait for a batch (None: wait for ever); `doing()`:
    what the loader is doing now, for the message."""

    def __init__(self, limit_s: float | None, doing: Callable[[], str] | None):
        self.limit_s, self.doing = limit_s, doing
        self.first = True
        """No batch came yet: the first may take FIRST_BATCH_TIMES x the limit."""
        self.batch_started = time.monotonic()
        """When the driver thread last called into DALI."""
        self.reported = False
        """A stall was reported: nothing waits for the thread any more."""

    def limit(self) -> float:
        return self.limit_s * (FIRST_BATCH_TIMES if self.first else 1)

    def overdue(self, started: float) -> bool:
        """A wait for a batch begun at `started` (monotonic) has run past the limit."""
        return self.limit_s is not None and time.monotonic() - started > self.limit()

    def report(self, waited: float) -> TimeoutError:
        """The stall, said: what hangs and what to do. Nothing waits for the thread from now on."""
        self.reported = True
        what = self.doing() if self.doing else "DALI is stuck in a batch"
        first = f"; the first batch: {FIRST_BATCH_TIMES}x that" if self.first else ""
        return TimeoutError(f"no batch came from the DALI pipeline for {waited:.0f} s (workers.timeout "
                            f"{self.limit_s:g} s{first}): {what}. The loader stopped; raise workers.timeout "
                            f"if batches may take longer, or fix what hangs, and build a new loader")

    def patience_at_exit(self) -> float:
        """How much longer the exit hook waits for the thread's current DALI call: until it has run
        for the limit, none once a stall was reported."""
        if self.reported or self.limit_s is None:
            return 0.0
        return max(0.0, self.batch_started + self.limit() - time.monotonic())
