"""A planned batch's samples, read and checked for DALI: what it is fed, as one value.

Image files and shard members: their bytes, read here (one read per sample, off the training
thread) or by the feed's worker processes (batches_ahead.py), and checked before DALI sees them
(fastloader.decoding.screen.read_screened: the magic bytes, the header's size against
dataset.max_pixels, the end marker), whether or not the split was screened: a file that is no image,
a bomb or truncated would crash or exhaust DALI's decoder, and one changed since it was screened
gets its crop or box drawn for its size now. What DALI decodes is exactly what was checked. The
cache: the decoded pixels (one array per sample). Each sample's upright size is kept (sizes.py), for
its draws (inputs.py).

A sample that cannot be used (found here, or known bad from earlier: bad_samples.py) is left out of
the batch; in train mode with dataset.on_bad_image: skip its slot takes the first substitute of
`fastloader.order.substitutes` that can be, as the torch backend's workers do.
"""
from __future__ import annotations

import collections
import itertools
import logging
from typing import NamedTuple

import numpy as np

from fastloader.cache import CachedPixels
from fastloader.decoding.screen import DALI_FORMATS, Screened, read_screened
from fastloader.decoding.shared_reads import CODING, HEIGHT, SAMPLING, TURNED, WIDTH, Read, Received, Slab
from fastloader.decoding.sizes import upright
from fastloader.errors import SourceError, error_text
from fastloader.imaging.jpeg_header import SAMPLINGS
from fastloader.locations import Location, ReadArena
from fastloader.order import WeightedDraws, substitutes
from fastloader.samples import SampleIndex
from fastloader.schema import BOMB_PIXELS

from .bad_samples import BadSamples
from .batches_ahead import Sent
from .in_progress import InProgress
from .sizes import SizeTable
from .stack import CPU_JPEG_CODINGS, GpuDecoding, cpu_decode_reason, region_refused
from .transcode import transcoded_for_dali

log = logging.getLogger("fastloader")


class Notes(NamedTuple):
    """What reading a batch found besides its data: the samples left out, with why (in order), and why
    and how many of its samples the GPU flavour decodes on the CPU."""
    skipped: list[tuple[int, str]]
    on_cpu: collections.Counter


class Taken(NamedTuple):
    """A planned batch as DALI is fed it: the (sample, seed) rows used (a substitute in a refilled
    slot), their data (one array a sample), int64 [n, 2] upright sizes, the slab the worker
    processes read them into (held until DALI is done with the batch), and the notes."""
    batch: np.ndarray
    data: list[np.ndarray]
    sizes: np.ndarray
    slab: Slab | None
    notes: Notes


class BatchReader:
    """Reads planned batches for DALI (`read`), one sample at a time (`take`) or, where the worker
    processes read a whole batch of JPEGs, by whole columns."""

    def __init__(self, index: SampleIndex, png_copies: dict[int, str], bad: BadSamples, in_progress: InProgress,
                 pixels: CachedPixels | None = None, exif_orientation: bool = True,
                 stored_sizes: np.ndarray | None = None, max_pixels: int = BOMB_PIXELS, refill: bool = False,
                 draws: WeightedDraws | None = None, gpu: GpuDecoding | None = None):
        self.index = index
        self.png_copies = png_copies  # sample -> its PNG copy, which DALI can decode (transcode.py)
        self.bad, self.in_progress = bad, in_progress
        self.pixels = pixels
        self.sizes = SizeTable(len(index), exif_orientation, stored_sizes) if pixels is None else None
        self.max_pixels, self.refill = max_pixels, refill
        self.draws = draws
        """The split's weighted draws, if any: a refilled slot's substitutes are drawn by them."""
        self.gpu = gpu
        """The GPU flavour's decoding (None: the CPU flavour's): what its decoders leave to the CPU is noted,
        by stack.cpu_decode_reason."""
        self.failure: SourceError | None = None
        """A source that changed under the loader, found by a read (DALI passes on only its words)."""

    def read(self, planned: np.ndarray, arena: ReadArena | None = None, sent: Sent | None = None,
             received: Received | None = None) -> Taken:
        """A planned batch's usable rows, read into `arena` where read here; `sent`, `received`: its
        rows the worker processes were sent, and what they read (None where they failed)."""
        notes = Notes([], collections.Counter())
        batch, rows, data, sizes = planned, [], [], []
        reads, slab = itertools.repeat(None), None
        if received is not None:
            slab = received.slab
            if self.plain(planned, sent, received):
                return Taken(planned, received.arrays(), self.plain_sizes(planned, received, notes), slab, notes)
            reads = [None] * len(planned)
            for row, read in zip(sent.rows, received.reads()):
                reads[row] = read
        if sent is not None:
            locations = sent.locations
        else:
            locations = self.locations(planned[:, 0]) if self.pixels is None else itertools.repeat(None)
        for row, (sample, location, read) in enumerate(zip(planned[:, 0].tolist(), locations, reads)):
            taken = self.take(sample, notes, arena, location, read)
            if taken is None and self.refill:
                sample, taken = self.substitute(int(planned[row, 1]), notes, arena)
                if taken is not None:  # the substitute keeps the slot's seed
                    batch = batch.copy() if batch is planned else batch
                    batch[row, 0] = sample
            if taken is not None:
                rows.append(row)
                data.append(taken[0])
                sizes.append(taken[1])
        return Taken(batch[rows], data, np.array(sizes, dtype=np.int64).reshape(-1, 2), slab, notes)

    def plain(self, planned: np.ndarray, sent: Sent, received: Received) -> bool:
        """Whether a batch can be taken by whole columns: every row read by the workers, a JPEG in
        the slab, none found bad (then or since)."""
        return not received.odd and len(sent.rows) == len(planned) and self.bad.none_of(planned[:, 0].tolist())

    def plain_sizes(self, planned: np.ndarray, received: Received, notes: Notes) -> np.ndarray:
        """A plain batch's upright sizes, kept, a file changed since screening named: what `take`
        does sample by sample, by whole columns."""
        sizes = upright(received.numbers[:, [HEIGHT, WIDTH, TURNED]], self.sizes.exif)  # plain rows: turned 0 or 1
        if self.gpu is not None:  # plain rows are JPEGs: a frame nvJPEG does not decode, or a region it refuses
            numbers = received.numbers
            to_cpu = np.isin(numbers[:, CODING], list(CPU_JPEG_CODINGS))
            refused = [SAMPLINGS.index(s) for s in SAMPLINGS if region_refused(s, self.gpu)]
            to_cpu |= np.isin(numbers[:, SAMPLING], refused)
            for coding, sampling in numbers[to_cpu][:, [CODING, SAMPLING]].tolist():
                notes.on_cpu[cpu_decode_reason("JPEG", coding, SAMPLINGS[max(sampling, 0)], self.gpu)] += 1
        for row, held in self.sizes.keep_all(planned[:, 0], sizes):
            _warn_resized(received.locations[row].name, held, tuple(sizes[row].tolist()))
        return sizes

    def substitute(self, seed: int, notes: Notes, into: ReadArena | None = None
                   ) -> tuple[int, tuple[np.ndarray, tuple[int, int]] | None]:
        """The first substitute for a train slot of this seed that can be fed, and what `take` gave
        for it; (-1, None) where none can."""
        for sample in substitutes(seed, len(self.index), self.draws):
            taken = self.take(sample, notes, into)
            if taken is not None:
                return sample, taken
        return -1, None

    def take(self, sample: int, notes: Notes, into: ReadArena | None = None, location: Location | None = None,
             read: Read | None = None) -> tuple[np.ndarray, tuple[int, int]] | None:
        """What DALI is fed for a sample, and its upright size; None, noted, where it cannot be used:
        known bad, or its bytes fail the check now (then known bad for the epoch, with the reason).
        `into`: the arena the bytes are read into (valid until the next batch); `location`: the
        sample's, where the batch's were looked up together (`locations`); `read`: its bytes and
        their check where a worker process read them."""
        if sample in self.bad:
            notes.skipped.append((sample, self.bad.why(sample)))
            return None
        if self.pixels is not None:
            return self.pixels.image(sample), tuple(self.pixels.shapes[self.pixels.rows[sample]].tolist())
        if read is None:
            location = location or self.location(sample)
            self.in_progress.begin("reading", location.name)
            try:
                data, screened = read_screened(location, self.max_pixels, into)
            except SourceError as error:
                self.failure = error
                raise
            finally:
                self.in_progress.end()
        else:
            data, screened = read
        if screened.problem is None and screened.format not in DALI_FORMATS:  # a GIF of a split not screened
            data, screened = self.transcoded(sample, screened.format or "unknown")
        if screened.problem:
            self.bad.found(sample, screened.problem)
            notes.skipped.append((sample, screened.problem))
            return None
        size = self.sizes.keep(sample, screened)
        if size.held is not None:
            _warn_resized(screened.path, size.held, size.now)
        if self.gpu is not None and (reason := cpu_decode_reason(screened.format, screened.coding, screened.sampling,
                                                                 self.gpu)) is not None:
            notes.on_cpu[reason] += 1
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
