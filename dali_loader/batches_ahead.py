"""The DALI feed's planned batches, with the reads of the next ones sent ahead to worker processes.

With dali.feed_processes, worker processes (fastloader.decoding.shared_reads) read and check the
local samples of the READS_AHEAD batches after the one the feed is taking, into shared memory that
DALI reads in place; at an epoch's end they read on into the first batches of the one expected next
(fastloader.read_ahead: the same rule as the torch backend's workers), kept by the next `start` where
its batches begin with them and dropped otherwise. Without worker processes, or once they failed
(said once), the batches are handed on as planned and the feed reads them itself.
"""
from __future__ import annotations

import collections
import itertools
import logging
from typing import Callable, Iterable, Iterator, NamedTuple

import numpy as np

from fastloader.decoding.shared_reads import Pending, Received, SharedReads, Slab, worker_reads
from fastloader.locations import Location
from fastloader.read_ahead import in_flight_prefix

from .bad_samples import BadSamples

log = logging.getLogger("fastloader")

READS_AHEAD = 2
"""Batches sent to the worker processes beyond the one the feed is taking: enough to keep every
worker reading while the feed unpacks a batch and DALI takes it."""


class Sent(NamedTuple):
    """A planned batch's reads sent to the worker processes: the rows sent (the others are read by
    the feed), every row's location, and the reads under way."""
    rows: list[int]
    locations: list[Location]
    pending: Pending


class BatchesAhead:
    """An epoch's planned batches, one at a time (`next`), each with its reads where the workers took them.

    `locations(samples)`: where a batch's samples' bytes are (the feed's, PNG copies included);
    `bad`: the samples not sent (known bad); `waiting(what)`: a context for the wait on the workers,
    which a stalled pipeline names."""

    def __init__(self, reads: SharedReads | None, split_name: str, locations: Callable[[np.ndarray], list[Location]],
                 bad: BadSamples, waiting: Callable):
        self.reads = reads
        self.split_name = split_name
        self.locations, self.bad, self.waiting = locations, bad, waiting
        self.batches: Iterator[np.ndarray] = iter(())
        self.ahead: collections.deque[tuple[np.ndarray, Sent | None]] = collections.deque()
        """The next planned batches, taken from `batches`, with their reads sent to the workers."""
        self.following: Callable[[], Iterable[np.ndarray]] | None = None
        """The batches of the epoch expected after this one (start's `following`)."""
        self.guessed: Iterator[np.ndarray] | None = None
        """`following`'s batches, once asked for (the first time this epoch's run out)."""
        self.upcoming: collections.deque[tuple[np.ndarray, Sent]] = collections.deque()
        """The first batches of `following`, sent to the workers as this epoch's own ran out."""
        self.failed = reads is None
        """No worker reads (none asked for, or they stopped): the feed reads every sample itself."""

    @property
    def processes(self) -> int:
        """How many worker processes read for the feed now."""
        return self.reads.processes if not self.failed else 0

    def start(self, batches: Iterable[np.ndarray], following: Callable[[], Iterable[np.ndarray]] | None) -> None:
        """Hand on these batches next; read on into `following()`'s once they run out. What the workers
        read ahead into is kept where these begin with it (fastloader.read_ahead), else dropped."""
        self.drop_ahead()
        batches = iter(batches)
        upcoming, self.upcoming = self.upcoming, collections.deque()
        first = list(itertools.islice(batches, len(upcoming)))
        kept = in_flight_prefix((planned for planned, _ in upcoming), first)
        for _, sent in itertools.islice(upcoming, kept, None):  # another epoch, a resumed position
            self.reads.drop(sent.pending)
        self.ahead.extend(itertools.islice(upcoming, kept))
        self.batches = itertools.chain(first[kept:], batches)
        self.following, self.guessed = following, None

    def next(self) -> tuple[np.ndarray | None, Sent | None]:
        """The next planned batch (None at the end), and its reads where the workers took them; the
        batches after it sent to the workers meanwhile, READS_AHEAD of them."""
        if self.reads is None:
            return next(self.batches, None), None
        while len(self.ahead) + len(self.upcoming) <= READS_AHEAD:
            planned = next(self.batches, None)
            if planned is None:
                self.read_upcoming()
                break
            self.ahead.append((planned, self.send(planned)))
        return self.ahead.popleft() if self.ahead else (None, None)

    def read_upcoming(self) -> None:
        """This epoch's batches are all sent: the workers read on into the next one's first batches
        (`following`), as far as READS_AHEAD batches beyond the one taken."""
        if self.following is None or self.failed:
            return
        if self.guessed is None:
            self.guessed = iter(self.following())
        while len(self.ahead) + len(self.upcoming) <= READS_AHEAD:
            planned = next(self.guessed, None)
            sent = self.send(planned) if planned is not None else None
            if sent is None:  # the next epoch's end, or no slab free: its other batches are read when taken
                self.following = None
                return
            self.upcoming.append((planned, sent))

    def send(self, planned: np.ndarray) -> Sent | None:
        """A planned batch's local samples sent to the workers to be read (not the known-bad ones).
        A cache's pixels are never sent: the loader gives such a feed no workers."""
        if self.failed:
            return None
        locations = self.locations(planned[:, 0])
        bad = self.bad
        rows = [row for row, (sample, location) in enumerate(zip(planned[:, 0].tolist(), locations))
                if sample not in bad and worker_reads(location)]
        pending = self.reads.submit([locations[row] for row in rows])
        if pending is None:
            self.stopped()
            return None
        return Sent(rows, locations, pending)

    def received(self, sent: Sent) -> Received | None:
        """What the workers read of a batch sent; None where they failed (then the feed reads it)."""
        pending = sent.pending
        with self.waiting(f"waiting for the feed's worker processes {self.reads.pids} to read",
                          f"a batch from {pending.locations[0].name}"):
            received = self.reads.take(pending)
        if received is None:
            self.stopped()
        return received

    def stopped(self) -> None:
        """The workers failed (or no slab was free): said once; the feed reads here from then on."""
        if self.reads.failure is None or self.failed:
            return
        self.failed = True
        log.warning("split '%s': the DALI feed's worker processes stopped reading (%s); the feed reads and checks "
                    "the samples on the driver thread from here (dali.feed_processes)", self.split_name,
                    self.reads.failure)
        self.reads.close()

    def release(self, slab: Slab | None) -> None:
        """A batch's slab back to the workers once DALI is done with the batch."""
        if slab is not None:
            self.reads.release(slab)

    def renew(self) -> None:
        """After a pipeline failed: the reads under way are waited for and their memory left to the
        failed pipeline; the batches taken ahead are read again, into new memory."""
        if self.reads is not None:
            self.reads.renew()
            self.ahead = collections.deque((planned, None) for planned, _ in self.ahead)
            self.upcoming.clear()

    def drop_ahead(self) -> None:
        """Forget the planned batches taken ahead (an epoch ended early), once their reads end."""
        for _, sent in self.ahead:
            if sent is not None:
                self.reads.drop(sent.pending)
        self.ahead.clear()

    def taken_ahead(self) -> list[np.ndarray]:
        """The planned batches taken from `batches` and not yet handed on, in order."""
        return [planned for planned, _ in self.ahead]

    def close(self, settled: bool = False) -> None:
        """Stop the worker processes (the arrays DALI was given stay valid while it holds them);
        `settled`: for good, with no thread in the feed (SharedReads.close)."""
        if self.reads is not None:
            self.failed = True  # what fails from now on is the closing, not worth a warning
            self.reads.close(settled)
