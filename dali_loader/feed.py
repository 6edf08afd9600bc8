"""The DALI pipeline's source: each planned batch, read and checked, with its draws, one batch a call.

The loader (loader.py) hands the pipeline this feed through an external source; DALI calls it on the
driver thread (driver.py) once a batch, `prefetch_queue_depth` batches ahead of the batch it delivers,
and reads what it returns in place (no_copy). The feed only schedules, and holds memory as long as
DALI may read it; the work is done by pieces that each do one job:

- batches_ahead.py: the planned batches, with the next ones' reads sent to worker processes
  (dali.feed_processes) and, at an epoch's end, the next epoch's first ones (fastloader.read_ahead);
- batch_reader.py: a planned batch read and checked, substitutes in refilled slots, as one value;
- inputs.py: the draws and the rest of what the graph is fed besides the images, pure functions;
- bad_samples.py: which samples are left out, and why: the loader's record, read and written here.
"""
from __future__ import annotations

import collections
import itertools
from typing import Callable, Iterable, NamedTuple

import numpy as np

from fastloader.decoding.shared_reads import Slab
from fastloader.locations import ReadArena

from .batch_reader import BatchReader
from .batches_ahead import BatchesAhead
from .inputs import InputPlan, batch_inputs


class Fed(NamedTuple):
    """A batch handed to the pipeline: its (sample, seed) rows (a substitute in a refilled slot);
    the known-bad samples left out just before it, with why; the planned batches just before it that came out
    empty (none of their samples could be fed); why and how many of its samples the GPU flavour
    decodes on the CPU."""
    plan: np.ndarray
    skipped: list[tuple[int, str]]
    empty: list[np.ndarray]
    on_cpu: dict[str, int]


class Feed:
    """The pipeline's source: each planned batch's samples and their draws, one batch a call.

    Labels are not fed: the loader takes them from the index. `fed` keeps, in order, the batches
    fed and not yet delivered (DALI calls the source `prefetch_queue_depth` batches ahead of the
    batch it delivers), each with the planned batches before it that came out empty (DALI takes no
    empty batch) and the samples left out before it.
    """

    def __init__(self, ahead: BatchesAhead, reader: BatchReader, inputs: InputPlan, in_flight: int = 2):
        self.ahead, self.reader, self.inputs = ahead, reader, inputs
        self.kind = "pixels" if reader.pixels is not None else "bytes"
        """What the pipeline is fed (pipeline.feed_layout): decoded pixels or encoded bytes."""
        self.skipped: list[tuple[int, str]] = []  # (sample, why) left out, not yet attached to a fed batch
        self.empty: list[np.ndarray] = []  # planned batches left empty, not yet attached to a fed batch
        self.fed: collections.deque[Fed] = collections.deque()
        self.stopping = False
        self.arenas = collections.deque(ReadArena() for _ in range(in_flight + 1))
        """Where the batches' bytes are read here, one arena a call in turn. DALI reads what a call
        returns where it lies (external_source's no_copy) until the batch's outputs are out, `in_flight`
        (the pipeline's prefetch_queue_depth) calls later: a call's arena is reused only after that,
        and the arrays a call returns (and its slab of the worker processes' reads) are held as long
        (`held`). A planned batch that comes out empty feeds nothing, so it takes no arena of its own."""
        self.held: collections.deque[tuple[tuple, Slab | None]] = collections.deque()
        self.in_flight = in_flight

    def start(self, batches: Iterable[np.ndarray],
              following: Callable[[], Iterable[np.ndarray]] | None = None) -> None:
        """Feed these batches next (only while no driver runs the pipeline). `following`: the
        batches the next start will most likely be given (the next epoch's), read ahead into once
        these run out; called on the driver thread, then."""
        while self.held:  # the pipeline was reset (or never ran): nothing it was given is in it any more
            self.ahead.release(self.held.popleft()[1])
        self.ahead.start(batches, following)
        self.fed.clear()
        self.skipped, self.empty = [], []
        self.stopping = False
        self.reader.bad.new_epoch()

    def new_arenas(self) -> None:
        """Read the next batches into new memory: after a pipeline failed, the memory it was given
        is left to it, whatever of it DALI's threads may still read while it is torn down."""
        self.arenas = collections.deque(ReadArena() for _ in self.arenas)
        self.ahead.renew()

    def stop(self) -> None:
        """End the epoch at the next call, from any thread (a loop left with `break`, close)."""
        self.stopping = True

    def unfinished(self) -> list[np.ndarray]:
        """The batches fed and not delivered, with those left empty before them, in order: what a
        new pipeline is fed again after this one failed."""
        return [*itertools.chain.from_iterable((*fed.empty, fed.plan) for fed in self.fed), *self.empty,
                *self.ahead.taken_ahead()]

    def close(self, settled: bool = False) -> None:
        """Stop the worker processes. `settled`: the pipeline is gone and no thread calls the feed
        any more, so the batches it was given are let go too, and with them the slabs' memory."""
        self.ahead.close(settled)
        if settled:
            self.held.clear()

    def __call__(self) -> tuple:
        if len(self.held) > self.in_flight:  # fed `in_flight + 1` calls ago: out of the pipeline
            self.ahead.release(self.held.popleft()[1])
        self.arenas.rotate(-1)
        arena = self.arenas[0]  # the call `in_flight + 1` calls ago is out of the pipeline
        while True:
            planned, sent = (None, None) if self.stopping else self.ahead.next()
            if planned is None:
                raise StopIteration  # ends DALI's epoch
            arena.reset()
            received = self.ahead.received(sent) if sent is not None else None
            taken = self.reader.read(planned, arena, sent, received)
            self.skipped += taken.notes.skipped
            if len(taken.batch):
                break
            self.ahead.release(taken.slab)
            self.empty.append(planned)
        data = (taken.data, *batch_inputs(self.inputs, planned, taken.batch, taken.sizes))
        self.fed.append(Fed(taken.batch, self.skipped, self.empty, dict(taken.notes.on_cpu)))
        self.skipped, self.empty = [], []
        self.held.append((data, taken.slab))  # DALI neither copies them (no_copy) nor keeps them alive: held until out
        return data
