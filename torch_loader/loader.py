"""The torch backend: DataLoader workers decode to uint8, fast_collate stacks, the prefetcher
copies and normalizes on the device. Wired into the shared Loader contract.
"""
from __future__ import annotations

import atexit
import itertools
import logging
import multiprocessing.connection
import signal
import weakref
from collections import deque
from typing import Iterator

import numpy as np
import torch
import torch.utils.data

from fastloader.contract import Loader
from fastloader.distributed import RankInfo
from fastloader.errors import BadImageError
from fastloader.imaging.decode import describe as describe_decoders
from fastloader.order import EpochOrder
from fastloader.parallel import fork_context
from fastloader.prepared import PreparedSplit
from fastloader.schema import Config, SplitConfig
from fastloader.sources.reading import keep_open

from .collate import BatchPool, NormalizingCollate, fast_collate
from .dataset import ImageDataset
from .prefetch import Normalizer, prefetch_to_cuda
from .transforms import SampleTransform

log = logging.getLogger("fastloader")


def _epochs_after(order: EpochOrder, epoch: int) -> Iterator:
    """The batches of every epoch after `epoch`, from their start. A function of the order alone:
    the feed must not hold the loader, or a dropped loader would live on until the garbage
    collector finds the cycle, and stopping its workers from there takes seconds."""
    while True:
        epoch += 1
        yield from order.batches(epoch)


_PERSISTENT: weakref.WeakSet = weakref.WeakSet()
"""The live loaders whose workers outlast a loop; a loader leaves it when it is collected."""


@atexit.register
def _stop_persistent_workers() -> None:
    """Stop persistent workers before the interpreter exits. Left running, they are killed by
    multiprocessing's own exit hook (registered earlier, so run later) while the pin-memory thread
    still reads their queues, and that thread prints a traceback at the end of a clean script (seen
    on a GPU machine). One hook for all loaders, so that building many adds nothing at exit."""
    for loader in list(_PERSISTENT):
        loader._shutdown()


class _BatchFeed(torch.utils.data.Sampler):
    """The DataLoader's batch sampler: the batches the Loader planned, then its guess at the next
    epochs, without end. One DataLoader iterator then lives across epochs, so the workers decode the
    next epoch's first batches while the trainer finishes this one (no gap at the epoch boundary).
    `sent` holds the batches handed to the workers and not yet received, in order."""

    def __init__(self):
        self.upcoming: Iterator = iter(())
        self.sent: deque = deque()

    def __iter__(self):
        while (batch := next(self.upcoming, None)) is not None:
            self.sent.append(batch)
            yield batch

    def __len__(self) -> int:  # the DataLoader only reports it; the stream has no end
        return 0


def _in_flight_prefix(sent: deque, batches: list) -> int:
    """How many of the batches in flight are this loop's first ones, sample for sample."""
    matched = 0
    for in_flight, wanted in zip(sent, batches):
        if not np.array_equal(in_flight, wanted):
            break
        matched += 1
    return matched


class TorchLoader(Loader):
    backend = "torch"

    def __init__(self, config: Config, split: SplitConfig, prepared: PreparedSplit, ranks: RankInfo,
                 device: torch.device):
        super().__init__(config, split, prepared, ranks, device)
        workers = config.workers
        num_workers = self.num_workers = prepared.workers
        pin = device.type == "cuda" if workers.pin_memory == "auto" else workers.pin_memory
        self._feed = _BatchFeed()
        self._persistent = workers.persistent and num_workers > 0
        self._live = None  # the DataLoader iterator that outlives each loop (persistent workers)
        self._newest = None  # the loop that owns the live iterator
        if self._persistent:
            _PERSISTENT.add(self)
        transform = SampleTransform(split, exif_orientation=config.dataset.exif_orientation,
                                    max_pixels=config.dataset.max_pixels, mean=config.normalize.mean)
        self._normalizer = Normalizer(config.normalize, config.output, device)
        on_cuda = device.type == "cuda"
        # CPU output: float batches, written into buffers the main process dropped (see collate.py).
        # A worker's buffers: those in flight (prefetch_factor), the trainer's, one not yet swept.
        size = split.transform.size
        soft_targets = self.finisher is not None and self.finisher.mixer is not None
        self._pool = None if on_cuda else BatchPool(num_workers, workers.prefetch_factor + 2,
                                                    (split.batch_size, 3, size, size), self._normalizer.dtype,
                                                    config.output.channels_last,
                                                    classes=self.num_classes if soft_targets else 0)
        if prepared.index.ranges is not None and prepared.pixels is None:
            keep_open(prepared.index.ranges.files)  # opened here, shared by the forked workers: one open a shard
        self._dataloader = torch.utils.data.DataLoader(
            ImageDataset(prepared.index, transform, prepared.pixels, skip_bad=config.dataset.on_bad_image == "skip",
                         source=config.source),
            batch_sampler=self._feed,
            collate_fn=fast_collate if on_cuda else NormalizingCollate(self._normalizer, self._pool, self.finisher),
            num_workers=num_workers,
            pin_memory=pin and torch.cuda.is_available(),
            prefetch_factor=workers.prefetch_factor if num_workers > 0 else None,
            multiprocessing_context=fork_context() if num_workers > 0 else None,  # never re-runs the script
        )
        self._announce()
        if prepared.pixels is None:
            log.info("torch loader decoders: %s", describe_decoders())
        if self._persistent and len(self):
            # Persistent workers start now, on the first epoch, while the trainer builds its model: their
            # start (forking, some 0.2 s of the training thread's time) is not paid inside the first
            # `next(loader)`, and the first batches are ready sooner. A first loop that wants other
            # batches (load_state_dict, set_epoch) drops these, as after a `break`.
            self._start_workers(self.order.batches(self._epoch))

    def describe(self) -> dict:
        return {**super().describe(), "workers": self.num_workers}

    @property
    def prefetch_depth(self) -> int:
        """Batches this loader may hold prepared ahead of its consumer: each worker's prefetch_factor,
        plus the one the CUDA prefetcher converts ahead (what a benchmark must drain before timing)."""
        ahead = self.num_workers * self.config.workers.prefetch_factor
        return ahead + (1 if self.device.type == "cuda" else 0)

    def _parallelism(self) -> str:
        normalize = "on the device" if self.device.type == "cuda" else "in the workers"
        return f"workers={self.num_workers} (normalizing {normalize})"

    def _iter_batches(self, batches: list) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if not batches:
            return iter(())
        delivered = self._record_skipped(self._stream(batches), batches)
        if self.device.type == "cuda":  # workers give uint8; the GPU normalizes and finishes on a side stream
            if self.finisher is not None:  # launched from the training thread: what can be drawn, drawn now
                self.finisher.start_epoch(batches)
            return prefetch_to_cuda(delivered, self._normalizer, self.finisher)
        # on the CPU the workers normalized and finished the batches already (NormalizingCollate)
        return ((images, labels) for images, labels, _ in delivered)

    def _record_skipped(self, batches: Iterator, planned: list) -> Iterator:
        """(images, labels, seeds of the delivered samples) of every planned batch, recording each file
        that failed (its slot refilled in train mode, left out in eval); a batch none of whose files
        decodes comes out empty (logged), never left out: every rank yields len(loader) batches."""
        for (images, labels, skipped), plan in zip(batches, planned):
            seeds = plan[:, 1]  # a substitute keeps its slot's seed
            if skipped:
                keep = np.ones(len(plan), dtype=bool)
                for position, record, filled in skipped:
                    keep[position] = filled
                    self._skip_sample(record.path, record.reason)
                seeds = seeds[keep]
            if images is None:
                images, labels = self._empty_batch(len(plan))
                if self.device.type == "cuda":  # as the workers give it: the prefetcher normalizes and finishes it
                    images, labels = torch.empty((0, *images.shape[1:]), dtype=torch.uint8), torch.empty(0).long()
            yield images, labels, seeds

    def _start_workers(self, batches: list) -> None:
        """A new live DataLoader iterator: its workers fork and start on these batches."""
        self._feed.sent.clear()
        self._feed.upcoming = itertools.chain(batches, self._next_epochs())
        self._live = iter(self._dataloader)

    def _next_epochs(self) -> Iterator:
        """What the next loops will most likely ask for: the epochs after this one, from their start."""
        if not self._persistent or not len(self):
            return iter(())
        return _epochs_after(self.order, self.epoch)

    def _stream(self, batches: list) -> Iterator[tuple]:
        """This loop's (images, labels, skipped) from the live DataLoader iterator. Batches already in
        flight are kept when they are the ones this loop wants (the usual next epoch), else received
        and dropped (after a `break`, set_epoch or load_state_dict), as a new iterator would wait for
        them too."""
        feed, loop = self._feed, object()
        self._newest = loop
        if self._live is not None and not self._workers_alive():  # one died between loops: start afresh
            self._shutdown()
        if self._live is None or not self._persistent:
            self._start_workers(batches)
        else:
            matched = _in_flight_prefix(feed.sent, batches)
            if matched == len(feed.sent):  # what is in flight starts this loop: feed the rest of it
                feed.upcoming = itertools.chain(batches[matched:], self._next_epochs())
            elif matched < len(batches):  # in flight for another loop: drop it, feed this one
                feed.upcoming = itertools.chain(batches, self._next_epochs())
                self._receive(len(feed.sent))
            # else this whole loop is in flight, and the feed already goes on after it
        for _ in batches:
            if self._newest is not loop:
                raise RuntimeError(f"a newer loop over the torch loader for split '{self.split.name}' started "
                                   f"while this one was paused; finish or drop a loop before starting the next")
            yield self._receive(1)

    def _receive(self, count: int) -> tuple | None:
        """The next `count` batches of the live iterator; the last one. An error (a worker's, an
        interrupt) ends the live iterator, since what is in flight is then unknown."""
        received = None
        try:
            for _ in range(count):
                images, labels, skipped, slot, targets = next(self._live)
                self._feed.sent.popleft()
                labels = torch.from_numpy(labels if targets is None else targets)
                if slot >= 0:
                    images, in_slot = self._pool.batch(slot, len(labels))
                    labels = labels if in_slot is None else in_slot
                received = images, labels, skipped
        except BaseException as error:
            # A worker killed while it hands over a batch's shared memory breaks that hand-over
            # (EOFError, connection reset) before torch's own check names the dead worker.
            died = self._dead_worker() if isinstance(error, (EOFError, ConnectionError)) else None
            self._shutdown()
            if died is not None:
                raise self._worker_died(died) from error
            if isinstance(error, RuntimeError) and not isinstance(error, BadImageError) and \
                    "DataLoader worker (pid" in str(error):
                raise self._worker_died(error) from error
            raise
        return received

    def _worker_died(self, error: RuntimeError) -> RuntimeError:
        """A worker that died (the DataLoader notices within seconds) as an error that says what to do;
        the next loop starts new workers."""
        return RuntimeError(
            f"a decoding worker of the torch loader for split '{self.split.name}' died: {error}. Killed by "
            f"signal 9 (SIGKILL) most often means the kernel's out-of-memory killer (see `dmesg`): lower "
            f"workers.num_workers or workers.prefetch_factor. A segmentation fault (signal 11) is a crash in "
            f"a native decoder: `fastloader check CONFIG --deep` finds the file that causes it")

    def _dead_worker(self, grace: float = 2.0) -> RuntimeError | None:
        """torch's words for a worker that has died, or None if all live for `grace` seconds.
        A dying worker's pipes close a moment before it can be reaped: wait for both."""
        workers = {worker.sentinel: worker for worker in getattr(self._live, "_workers", ())}
        for sentinel in multiprocessing.connection.wait(list(workers), timeout=grace):
            worker = workers[sentinel]
            worker.join(timeout=grace)
            code = worker.exitcode or 0
            how = f"is killed by signal: {signal.strsignal(-code)}" if code < 0 else "exited unexpectedly"
            return RuntimeError(f"DataLoader worker (pid {worker.pid}) {how}")
        return None

    def _workers_alive(self) -> bool:
        return all(worker.is_alive() for worker in getattr(self._live, "_workers", ()))

    def _shutdown(self) -> None:
        if self._live is not None and hasattr(self._live, "_shutdown_workers"):
            self._live._shutdown_workers()
        self._live = None
        self._feed.sent.clear()
        if self._pool is not None:
            self._pool.forget()

    def _close(self) -> None:
        self._shutdown()
        self._dataloader = None
