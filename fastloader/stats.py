"""Stall accounting: how long the trainer waited for each batch, measured where it waits.

The time a `for` loop spends blocked in the loader's `__next__` is the time the GPU (or the CPU
model) could not work for lack of data. Every loader records it per batch, so "is my GPU waiting
for data?" is a number, not a guess. The first batch is reported on its own (worker start-up,
pipeline build, first decode) and left out of the stall fraction, which describes the steady state.
"""
from __future__ import annotations

import logging
from array import array
from dataclasses import dataclass, field

LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


@dataclass
class LoaderStats:
    """One `for` loop over a loader (an epoch, or its part after a resume or before a `break`)."""

    epoch: int = 0
    batches: int = 0
    images: int = 0
    time_to_first_batch_s: float = float("nan")
    """From the loop asking for its first batch to getting it."""
    wait_s: float = 0.0
    """Time blocked in `__next__` for the batches after the first."""
    elapsed_s: float = 0.0
    """From the loop asking for its first batch to getting its last one."""
    batch_wait_s: array = field(default_factory=lambda: array("d"), repr=False)
    """Per batch: the time blocked in `__next__` for it."""
    batch_done_s: array = field(default_factory=lambda: array("d"), repr=False)
    """Per batch: when it arrived, in seconds since the loop asked for its first batch."""
    network_wait_s: float = 0.0
    """Shards in an object store: the time readers (the DALI feed, the torch workers) waited for shards
    to arrive from the store during the loop, summed over readers."""
    fetched_bytes: int = 0
    """Shards in an object store: bytes downloaded into the node cache during the loop (ahead or on demand)."""
    fetched_shards: int = 0
    cpu_decoded: dict[str, int] = field(default_factory=dict)
    """The DALI backend's GPU flavour: images its decoders left to DALI's CPU decoder in the loop, by
    why (PNG files, arithmetic-coded JPEGs, regions of 4:2:0 JPEGs with interpolated chroma below nvJPEG
    13.2 ...: nvImageCodec's rule, dali_loader.stack.cpu_decode_reason); every JPEG nvJPEG decodes stays
    out of it. The CPU flavour decodes everything on the CPU by design and counts nothing here."""

    def add(self, wait: float, at: float, images: int) -> None:
        if self.batches == 0:
            self.time_to_first_batch_s = wait
        else:
            self.wait_s += wait
        self.batches += 1
        self.images += images
        self.elapsed_s = at
        self.batch_wait_s.append(wait)
        self.batch_done_s.append(at)

    @property
    def steady_s(self) -> float:
        """Time after the first batch arrived."""
        return self.elapsed_s - (self.time_to_first_batch_s if self.batches else 0.0)

    @property
    def images_per_second(self) -> float:
        """Images delivered per second of the loop, first batch included."""
        return self.images / self.elapsed_s if self.elapsed_s > 0 else float("nan")

    @property
    def stall_fraction(self) -> float:
        """Share of the time after the first batch that the consumer spent waiting for data."""
        return self.wait_s / self.steady_s if self.steady_s > 0 else float("nan")

    def summary(self) -> str:
        """One line for the log. A loop of one batch has no time after its first batch, so no stall to
        report (it would read 'nan%'): the line says so instead."""
        stall, first = self.stall_fraction, self.time_to_first_batch_s
        waited = (f"waited for data {stall:.1%} of the time after the first batch, which took {first:.2f} s"
                  if stall == stall else f"its one batch took {first:.2f} s (no later batch to measure a wait for)")
        fetched = (f"; fetched {self.fetched_shards} shard{'s' if self.fetched_shards != 1 else ''} "
                   f"({self.fetched_bytes / 1e6:.1f} MB) from the object store, readers waited "
                   f"{self.network_wait_s:.2f} s for shards" if self.fetched_shards or self.network_wait_s else "")
        on_cpu = sum(self.cpu_decoded.values())
        cpu = f"; {on_cpu} decoded on the CPU, not with nvJPEG (loader.stats.cpu_decoded)" if on_cpu else ""
        return (f"{self.images} images in {self.batches} batch{'es' if self.batches != 1 else ''}, "
                f"{self.elapsed_s:.2f} s: {self.images_per_second:.0f} images/s; {waited}{fetched}{cpu}")
