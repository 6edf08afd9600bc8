"""The DALI pipeline's source: each planned batch's samples, read and checked, and their draws.

The loader (loader.py) hands the pipeline this feed through an external source; DALI calls it on the
driver thread (driver.py) once a batch, `prefetch_queue_depth` batches ahead of the batch it delivers,
and reads what it returns in place (no_copy). With dali.feed_processes, the reads and checks of the
next batches run in worker processes meanwhile (fastloader.decoding.shared_reads), into shared memory
DALI reads in place too; the feed then only unpacks what they found, and does the rest (known-bad
samples, substitutes, sizes, draws) as it does for what it reads itself.
"""
from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from typing import Callable, Iterable, Iterator, NamedTuple

import numpy as np

from fastloader.cache import CachedPixels
from fastloader.decoding.screen import DALI_FORMATS, Screened, read_screened
from fastloader.decoding.shared_reads import (
    CODING,
    HEIGHT,
    TURNED,
    WIDTH,
    Pending,
    Read,
    Received,
    SharedReads,
    Slab,
    worker_reads,
)
from fastloader.decoding.sizes import upright
from fastloader.draws import Augmenter
from fastloader.errors import SourceError, error_text
from fastloader.locations import Location, ReadArena
from fastloader.order import WeightedDraws, output_size, substitutes
from fastloader.samples import SampleIndex
from fastloader.schema import BOMB_PIXELS, SplitConfig
from fastloader.views import ViewPlan

from .augment import feed_arrays
from .pipeline import centre_boxes
from .sizes import SizeTable
from .stack import CPU_JPEG_CODINGS, cpu_decode_reason
from .transcode import transcoded_for_dali
from .views import stacked_groups, view_arrays

log = logging.getLogger("fastloader")

READS_AHEAD = 2
"""Batches sent to the worker processes beyond the one the feed is taking: enough to keep every
worker reading while the feed unpacks a batch and DALI takes it."""


class Sent(NamedTuple):
    """A planned batch's reads sent to the worker processes: the rows sent (the others are read here),
    every row's location, and the reads under way."""
    rows: list[int]
    locations: list[Location]
    pending: Pending


class Doings:
    """What the loader's own code does now inside the pipeline, one slot a thread: the driver thread
    feeds the next batches while DALI runs a sample hook on its own threads, and one shared slot lost
    a hung hook to a read that ended after the hook began. A stall names the longest running, which
    is what hangs. Words built only when a stall is reported: the read path begins one a sample."""

    def __init__(self):
        self.now: dict[int, tuple[str, str, float]] = {}

    def begin(self, doing: str, what: str) -> None:
        self.now[threading.get_ident()] = doing, what, time.monotonic()

    def end(self) -> None:
        self.now.pop(threading.get_ident(), None)

    def longest(self) -> tuple[str, str, float] | None:
        """(doing, on what, monotonic start) of what has run longest; None while nothing runs."""
        running = tuple(self.now.values())  # one call, whole under the GIL: other threads change it
        return min(running, key=lambda item: item[2]) if running else None


class Feed:
    """The pipeline's source: each planned batch's samples and their draws, one batch a call.

    Image files and shard members: their bytes, read here (one read per sample, off the training
    thread) and checked before DALI sees them (fastloader.decoding.screen.read_screened: the magic
    bytes, the header's size against dataset.max_pixels, the end marker), whether or not the split
    was screened: a file that is no image, a bomb or truncated would crash or exhaust DALI's
    decoder, and one changed since it was screened gets its crop or box drawn for its size now.
    What DALI decodes is exactly what was checked. The cache: the decoded pixels (one array per
    sample). Then, from each image's upright size: in eval mode its centre box, in train mode its
    crop box, flips and ops, drawn from its seed (fastloader.augment, as the torch backend draws
    them). Labels are not fed: the loader takes them from the index. DALI calls this on the thread
    that runs the pipeline (the driver thread, driver.py).

    A sample that cannot be used (found here, or `known_bad` from earlier) is left out of what is
    fed; in train mode its slot takes the first substitute of `fastloader.order.substitutes` that
    can be, as the torch backend's workers do. `fed` keeps, in order, the batches fed and not yet
    delivered (DALI calls the source `prefetch_queue_depth` batches ahead of the batch it delivers),
    each with the planned batches before it that came out empty (DALI takes no empty batch).

    `reads`: worker processes that read and check the next READS_AHEAD batches' local samples while
    this one is taken (dali.feed_processes); where they fail, the feed logs why once and reads here.
    At an epoch's end they read on into the first batches of the one expected next (`start`'s
    `following`): a new epoch's first batches are then ready, not read while DALI waits for them.
    """

    def __init__(self, index: SampleIndex, split: SplitConfig, png_copies: dict[int, str],
                 pixels: CachedPixels | None = None, exif_orientation: bool = True,
                 stored_sizes: np.ndarray | None = None, augmenter: Augmenter | None = None,
                 max_pixels: int = BOMB_PIXELS, refill: bool = False, sized: bool = False,
                 draws: WeightedDraws | None = None, hooked: bool = False, views: ViewPlan | None = None,
                 in_flight: int = 2, reads: SharedReads | None = None, gpu: bool = False):
        self.index = index
        self.gpu = gpu
        """The GPU flavour decodes what it is fed: what its decoder leaves to the CPU is counted (`on_cpu`)."""
        self.on_cpu: collections.Counter[str] = collections.Counter()
        """The batch being taken: why, and how many of its samples, the GPU flavour decodes on the CPU."""
        self.views = views
        """A train split's view groups: every view's draws are fed (views.view_arrays)."""
        self.stacking = stacked_groups(views) if views is not None else ()
        """Per view group, whether the graph runs its ops stacked: decided with the graph, here."""
        self.hooked = hooked
        """The graph runs the user's sample hook or graph function: each batch's (sample, seed) rows are fed."""
        self.draws = draws
        """The split's weighted draws, if any: a refilled slot's substitutes are drawn by them."""
        self.sized = sized
        """The planned batches carry their output size (a size schedule): fed with the draws."""
        self.pixels = pixels
        self.split, self.augmenter = split, augmenter
        self.max_pixels, self.refill = max_pixels, refill
        self.sizes = SizeTable(len(index), exif_orientation, stored_sizes) if pixels is None else None
        self.png_copies = png_copies  # sample -> its PNG copy, which DALI can decode (transcode.py)
        self.known_bad: dict[int, str] = {}  # sample -> why it cannot be fed or decoded, this epoch
        self.undecodable: dict[int, str] = {}
        """sample -> why DALI cannot decode it (the probe's finding, loader._recover): left out for the
        run, since feeding it again would break the pipeline again. What a read or check found is
        known only for its epoch: the next reads the sample again, as the torch workers do (a blob
        service's reset connection loses a sample for one epoch, not for the run)."""
        self.skipped: list[tuple[int, str]] = []  # (sample, why) left out, not yet attached to a fed batch
        self.empty: list[np.ndarray] = []  # planned batches left empty, not yet attached to a fed batch
        self.batches: Iterator[np.ndarray] = iter(())
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
        self.reads = reads
        self.ahead: collections.deque[tuple[np.ndarray, Sent | None]] = collections.deque()
        """The next planned batches, taken from `batches`, with their reads sent to the workers."""
        self.following: Callable[[], Iterable[np.ndarray]] | None = None
        """The batches of the epoch expected after this one (start's `following`)."""
        self.guessed: Iterator[np.ndarray] | None = None
        """`following`'s batches, once asked for (the first time this epoch's run out)."""
        self.upcoming: collections.deque[tuple[np.ndarray, Sent]] = collections.deque()
        """The first batches of `following`, sent to the workers as this epoch's own ran out; kept by
        the next `start` where its batches begin with them, else dropped."""
        self.reads_failed = False
        self.kind = "pixels" if pixels is not None else "bytes"
        """What the pipeline is fed (pipeline.feed_layout): decoded pixels or encoded bytes."""
        self.failure: SourceError | None = None
        """A source that changed under the loader, found by a read (DALI passes on only its words)."""
        self.doings = Doings()
        """What the loader's own code does now inside the pipeline (reading a sample, running a user's
        hook), thread by thread: what a stalled pipeline names."""

    def start(self, batches: Iterable[np.ndarray],
              following: Callable[[], Iterable[np.ndarray]] | None = None) -> None:
        """Feed these batches next (only while no driver runs the pipeline). `following`: the
        batches the next start will most likely be given (the next epoch's), read ahead into once
        these run out; called on the driver thread, then."""
        while self.held:  # the pipeline was reset (or never ran): nothing it was given is in it any more
            self.release(self.held.popleft()[1])
        self.drop_ahead()
        batches = iter(batches)
        upcoming, self.upcoming = self.upcoming, collections.deque()
        for planned, sent in upcoming:
            first = next(batches, None)
            if first is None or not np.array_equal(first, planned):  # another epoch, a resumed position
                self.reads.drop(sent.pending)
                if first is not None:
                    batches = itertools.chain((first,), batches)
            else:
                self.ahead.append((first, sent))
        self.batches = batches
        self.following, self.guessed = following, None
        self.fed.clear()
        self.skipped, self.empty = [], []
        self.stopping = False
        self.known_bad = dict(self.undecodable)

    def refuse(self, undecodable: dict[int, str]) -> None:
        """These samples broke the pipeline (the probe found them): never fed again, in any epoch."""
        self.undecodable.update(undecodable)

    def new_arenas(self) -> None:
        """Read the next batches into new memory: after a pipeline failed, the memory it was given
        is left to it, whatever of it DALI's threads may still read while it is torn down."""
        self.arenas = collections.deque(ReadArena() for _ in self.arenas)
        if self.reads is not None:
            self.reads.renew()  # the reads under way are waited for; their batches stay in `ahead`
            self.ahead = collections.deque((planned, None) for planned, _ in self.ahead)
            self.upcoming.clear()

    def drop_ahead(self) -> None:
        """Forget the planned batches taken ahead (an epoch ended early), once their reads end."""
        for _, sent in self.ahead:
            if sent is not None:
                self.reads.drop(sent.pending)
        self.ahead.clear()

    def close(self) -> None:
        """Stop the worker processes (the arrays DALI was given stay valid while it holds them)."""
        if self.reads is not None:
            self.reads_failed = True  # what fails from now on is the closing, not worth a warning
            self.reads.close()

    def stop(self) -> None:
        """End the epoch at the next call, from any thread (a loop left with `break`, close)."""
        self.stopping = True

    def unfinished(self) -> list[np.ndarray]:
        """The batches fed and not delivered, with those left empty before them, in order: what a
        new pipeline is fed again after this one failed."""
        return [*itertools.chain.from_iterable((*fed.empty, fed.plan) for fed in self.fed), *self.empty,
                *(planned for planned, _ in self.ahead)]

    def __call__(self) -> tuple:
        if len(self.held) > self.in_flight:  # fed `in_flight + 1` calls ago: out of the pipeline
            self.release(self.held.popleft()[1])
        self.arenas.rotate(-1)
        arena = self.arenas[0]  # the call `in_flight + 1` calls ago is out of the pipeline
        while True:
            planned, sent = (None, None) if self.stopping else self.next_planned()
            if planned is None:
                raise StopIteration  # ends DALI's epoch
            arena.reset()
            self.on_cpu = collections.Counter()
            batch, data, sizes, slab = self.take_batch(planned, arena, sent)
            if len(batch):
                break
            self.release(slab)
            self.empty.append(planned)
        if self.views is not None:  # every view's draws, from the view's seed (hooked: its (sample, seed) too)
            data += view_arrays(self.views, batch, sizes, self.hooked, self.stacking)
        elif self.split.mode == "train":  # every random choice of each sample, drawn from its seed
            side = output_size(planned, self.split.transform.size) if self.sized else None
            data += feed_arrays(self.augmenter, batch[:, 1], sizes, side)
        else:
            data += (centre_boxes(sizes, self.split),)
        if self.hooked and self.views is None:  # user_ops.HOOK_INPUTS
            data += (np.ascontiguousarray(batch[:, :2], dtype=np.int64),)
        self.fed.append(Fed(batch, self.skipped, self.empty, dict(self.on_cpu)))
        self.skipped, self.empty = [], []
        self.held.append((data, slab))  # DALI neither copies them (no_copy) nor keeps them alive: held until out
        return data

    def next_planned(self) -> tuple[np.ndarray | None, Sent | None]:
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
        if self.following is None or self.reads_failed:
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
        if self.reads_failed:
            return None
        locations = self.locations(planned[:, 0])
        known_bad = self.known_bad
        rows = [row for row, (sample, location) in enumerate(zip(planned[:, 0].tolist(), locations))
                if sample not in known_bad and worker_reads(location)]
        pending = self.reads.submit([locations[row] for row in rows])
        if pending is None:
            self.reads_stopped()
            return None
        return Sent(rows, locations, pending)

    def received(self, sent: Sent) -> Received | None:
        """What the workers read of a batch sent; None where they failed (then read here)."""
        pending = sent.pending
        self.doings.begin(f"waiting for the feed's worker processes {self.reads.pids} to read",
                          f"a batch from {pending.locations[0].name}")
        received = self.reads.take(pending)
        self.doings.end()
        if received is None:
            self.reads_stopped()
        return received

    def plain(self, planned: np.ndarray, sent: Sent, received: Received) -> bool:
        """Whether a batch can be taken by whole columns: every row read by the workers, a JPEG in
        the slab, none found bad (then or since)."""
        return (not received.odd and len(sent.rows) == len(planned)
                and (not self.known_bad or self.known_bad.keys().isdisjoint(planned[:, 0].tolist())))

    def take_plain(self, planned: np.ndarray, received: Received) -> np.ndarray:
        """A plain batch's upright sizes, kept, a file changed since screening named: what `take`
        does sample by sample, by whole columns."""
        sizes = upright(received.numbers[:, [HEIGHT, WIDTH, TURNED]], self.sizes.exif)  # plain rows: turned 0 or 1
        if self.gpu:  # plain rows are JPEGs: only a frame nvJPEG does not decode goes to the CPU
            for coding in received.numbers[np.isin(received.numbers[:, CODING], list(CPU_JPEG_CODINGS)), CODING]:
                self.on_cpu[cpu_decode_reason("JPEG", int(coding))] += 1
        for row, held in self.sizes.keep_all(planned[:, 0], sizes):
            _warn_resized(received.locations[row].name, held, tuple(sizes[row].tolist()))
        return sizes

    def reads_stopped(self) -> None:
        """The workers failed (or no slab was free): said once; the feed reads here from then on."""
        if self.reads.failure is None or self.reads_failed:
            return
        self.reads_failed = True
        log.warning("split '%s': the DALI feed's worker processes stopped reading (%s); the feed reads and checks "
                    "the samples on the driver thread from here (dali.feed_processes)", self.split.name,
                    self.reads.failure)
        self.reads.close()

    def release(self, slab: Slab | None) -> None:
        """A batch's slab back to the workers once DALI is done with the batch."""
        if slab is not None:
            self.reads.release(slab)

    def take_batch(self, planned: np.ndarray, arena: ReadArena | None = None, sent: Sent | None = None
                   ) -> tuple[np.ndarray, tuple[list[np.ndarray]], np.ndarray, Slab | None]:
        """(the (sample, seed) rows fed, (their data,), int64 [n, 2] upright sizes, the slab the
        workers read them into): the planned rows that can be used, a train slot that cannot refilled
        by a substitute. What is read here goes into `arena`."""
        batch, rows, data, sizes = planned, [], [], []
        reads, slab = itertools.repeat(None), None
        received = self.received(sent) if sent is not None else None
        if received is not None:
            slab = received.slab
            if self.plain(planned, sent, received):
                return planned, (received.arrays(),), self.take_plain(planned, received), slab
            reads = [None] * len(planned)
            for row, read in zip(sent.rows, received.reads()):
                reads[row] = read
        if sent is not None:
            locations = sent.locations
        else:
            locations = self.locations(planned[:, 0]) if self.pixels is None else itertools.repeat(None)
        for row, (sample, location, read) in enumerate(zip(planned[:, 0].tolist(), locations, reads)):
            taken = self.take(sample, arena, location, read)
            if taken is None and self.refill:
                sample, taken = self.substitute(int(planned[row, 1]), arena)
                if taken is not None:  # the substitute keeps the slot's seed
                    batch = batch.copy() if batch is planned else batch
                    batch[row, 0] = sample
            if taken is not None:
                rows.append(row)
                data.append(taken[0])
                sizes.append(taken[1])
        return batch[rows], (data,), np.array(sizes, dtype=np.int64).reshape(-1, 2), slab

    def substitute(self, seed: int, into: ReadArena | None = None
                   ) -> tuple[int, tuple[np.ndarray, tuple[int, int]] | None]:
        """The first substitute for a train slot of this seed that can be fed, and what `take` gave
        for it; (-1, None) where none can."""
        for sample in substitutes(seed, len(self.index), self.draws):
            taken = self.take(sample, into)
            if taken is not None:
                return sample, taken
        return -1, None

    def stuck_words(self) -> str:
        """What the feed is doing, for a pipeline that sent no batch for workers.timeout."""
        busy = self.doings.longest()
        if busy is None:
            return "the feed is not reading a sample: DALI is stuck in a batch (a file on a hung file system?)"
        return f"the loader has been {busy[0]} {busy[1]} for {time.monotonic() - busy[2]:.0f} s"

    def take(self, sample: int, into: ReadArena | None = None, location: Location | None = None,
             read: Read | None = None) -> tuple[np.ndarray, tuple[int, int]] | None:
        """What DALI is fed for a sample, and its upright size; None, noted in `skipped`, where it
        cannot be used: known bad, or its bytes fail the check now (then known bad, with the reason).
        `into`: the arena the bytes are read into (valid until the next batch); `location`: the
        sample's, where the batch's were looked up together (`locations`); `read`: its bytes and
        their check where a worker process read them."""
        if sample in self.known_bad:
            self.skipped.append((sample, self.known_bad[sample]))
            return None
        if self.pixels is not None:
            return self.pixels.image(sample), tuple(self.pixels.shapes[self.pixels.rows[sample]].tolist())
        if read is None:
            location = location or self.location(sample)
            self.doings.begin("reading", location.name)
            try:
                data, screened = read_screened(location, self.max_pixels, into)
            except SourceError as error:
                self.failure = error
                raise
            finally:
                self.doings.end()
        else:
            data, screened = read
        if screened.problem is None and screened.format not in DALI_FORMATS:  # a GIF of a split not screened
            data, screened = self.transcoded(sample, screened.format or "unknown")
        if screened.problem:
            self.known_bad[sample] = screened.problem
            self.skipped.append((sample, screened.problem))
            return None
        size = self.sizes.keep(sample, screened)
        if size.held is not None:
            _warn_resized(screened.path, size.held, size.now)
        if self.gpu and (reason := cpu_decode_reason(screened.format, screened.coding)) is not None:
            self.on_cpu[reason] += 1
        return (data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)), size.now

    def transcoded(self, sample: int, fmt: str) -> tuple[bytearray | None, Screened]:
        """The bytes of a PNG copy of a file in a format DALI cannot decode (transcode.py), checked."""
        try:
            self.png_copies.update(transcoded_for_dali(self.index, {sample: fmt}))
        except Exception as error:  # Pillow could not decode the file either
            return None, Screened(self.index.path(sample), problem=f"cannot be converted for DALI: {error_text(error)}")
        return read_screened(self.location(sample), self.max_pixels)

    def locations(self, samples: np.ndarray) -> list[Location]:
        """`location` of each of a batch's samples, looked up together."""
        found = self.index.locations(samples)
        if self.png_copies:
            found = [self.location(sample) if sample in self.png_copies else location
                     for sample, location in zip(samples.tolist(), found)]
        return found

    def location(self, sample: int) -> Location:
        """Where the bytes DALI decodes for a sample are: its file or shard member, or its PNG copy."""
        copy = self.png_copies.get(sample)
        return Location(copy, copy) if copy else self.index.location(sample)


def _warn_resized(path: str, held: tuple[int, int], now: tuple[int, int]) -> None:
    log.warning("%s changed since it was screened: it is %dx%d (height x width) now, the screening result said "
                "%dx%d; its crop or box is drawn for its size now, read from the bytes DALI decodes", path, *now, *held)


class Fed(NamedTuple):
    """A batch handed to the pipeline: its (sample, seed) rows (a substitute in a refilled slot);
    the known-bad samples left out just before it, with why; the planned batches just before it that came out
    empty (none of their samples could be fed); why and how many of its samples the GPU flavour
    decodes on the CPU."""
    plan: np.ndarray
    skipped: list[tuple[int, str]]
    empty: list[np.ndarray]
    on_cpu: dict[str, int]


