"""The shards a loader's loop reads, told to the byte seam in order, so that those in an object
store are fetched ahead (sources/fetch_ahead.py), and what fetching cost the loop, for its stats.
"""
from __future__ import annotations

import numpy as np

from .samples import SampleIndex
from .sources import reading
from .stats import LoaderStats


class LoopFetches:
    """One loop's plan: moved on as its batches arrive, cancelled when the loop ends."""

    def __init__(self, plan, batches: list[np.ndarray], before, store):
        self._plan, self._before, self._store = plan, before, store
        self._read = np.cumsum([len(batch) for batch in batches]).tolist()  # samples read after each batch

    def reached(self, stats: LoaderStats) -> None:
        """The loop's stats.batches batches arrived: the shards read up to here may go; what was
        fetched and waited for so far goes into the stats."""
        self._plan.reached(self._read[stats.batches - 1])
        done = reading.fetch_counters(self._store).since(self._before)
        stats.network_wait_s, stats.fetched_bytes, stats.fetched_shards = (done.wait_s, done.fetched_bytes,
                                                                          done.fetched_shards)

    def cancel(self) -> None:
        self._plan.cancel()


class ShardFetches:
    """A loader's fetching ahead: one plan at a time, the newest loop's (a new loop cancels the last)."""

    def __init__(self, index: SampleIndex, reads_shards: bool):
        self._index = index
        self._reads_shards = reads_shards  # shards read by range (no uint8 cache in between)
        self._current: LoopFetches | None = None

    def start(self, batches: list[np.ndarray], where: str) -> LoopFetches | None:
        """The loop that reads these batches (of (sample, seed) rows), `where` naming it in the
        log: its plan, or None where it reads no shards from an object store."""
        self.cancel()
        ranges = self._index.ranges
        if not self._reads_shards or not batches or not reading.is_remote(ranges.files[0]):
            return None
        before = reading.fetch_counters(self._index.store)
        sequence = ranges.file[np.concatenate([batch[:, 0] for batch in batches])]
        plan = reading.will_read(ranges.files, ranges.identities, sequence, where, self._index.store)
        self._current = LoopFetches(plan, batches, before, self._index.store)
        return self._current

    def cancel(self) -> None:
        """Stop fetching for the newest loop (a new loop starts, or the loader closes)."""
        if self._current is not None:
            self._current.cancel()
        self._current = None
