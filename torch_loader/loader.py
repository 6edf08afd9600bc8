"""The torch backend: DataLoader workers decode to uint8, fast_collate stacks, the prefetcher
copies and normalizes on the device. Wired into the shared Loader contract.
"""
from __future__ import annotations

import functools
import itertools
import logging
import multiprocessing.connection
import os
import signal
import time
import weakref
from collections import deque
from typing import Iterator

import numpy as np
import torch
import torch.utils.data

from fastloader import exits
from fastloader.contract import Loader
from fastloader.decoding.decode import describe as describe_decoders
from fastloader.distributed import RankInfo
from fastloader.draws import Augmenter
from fastloader.errors import BadImageError, ConfigError, FastloaderError, HookError, LoaderError, SourceError
from fastloader.machine import resource_problem
from fastloader.order import output_size
from fastloader.parallel import die_with, fork_context, in_main_thread
from fastloader.prepared import PreparedSplit
from fastloader.read_ahead import epochs_after, in_flight_prefix
from fastloader.schema import IMAGENET_MEAN, Config, SplitConfig
from fastloader.sources.protocol import opened
from fastloader.sources.reading import keep_open

from . import live_iterator
from . import views as torch_views
from .ahead import Ahead
from .collate import BatchPool, NormalizingCollate, fast_collate
from .dataset import ImageDataset
from .prefetch import Normalizer, convert_on_stream, hand_over, prefetch_stream
from .transforms import UINT8_KERNELS, SampleTransform, torchvision_resize
from .views import ViewsCollate, ViewsTransform

log = logging.getLogger("fastloader")

POLL_S = 5.0
"""How often a wait for a batch looks at the workers (one that died is named within this): torch's own
interval. Each look costs the training thread some 0.4 ms, while it waits for a batch anyway."""
FIRST_BATCH_TIMES = 3
"""The first batch after the workers start may take this many times workers.timeout: they fork,
open their decoders and read files no cache holds yet, on a machine whose other ranks do the same."""
_LEFT_FOR_A_NEW_LOOP = object()
"""TorchLoader._loop while a new loop waits for the last one's producer to end (_stop_producer)."""


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
        self._ahead = Ahead(f"fastloader-torch-{split.name}", depth=1 if num_workers else 0)  # as depth_for counts
        """The thread that receives, converts and finishes each loop's batches, one ahead (ahead.py);
        none without workers, where everything runs on the trainer's thread, as a DataLoader's would."""
        self._loop = None  # the loop that owns the live iterator
        reads = {"exif_orientation": config.dataset.exif_orientation, "max_pixels": config.dataset.max_pixels}
        if self.views is not None:  # every view of a sample from one decode
            groups = [sample_transform(g.split, g.augmenter, use_draft=False, **reads) for g in self.views.groups]
            transform = ViewsTransform(self.views, groups, **reads,
                                       # a sample hook takes each view finished: the ops in the sample's call
                                       stacked_ops=self.views.stacks_ops(torch_views.STACKS_BY_DEFAULT)
                                       and prepared.hooks.sample is None)
        else:
            transform = sample_transform(split, self.augmentation, **reads)
        self._normalizer = normalizer_of(config, device)
        on_cuda = device.type == "cuda"
        self._side_stream = prefetch_stream(device) if on_cuda else None  # one for the loader's life
        # CPU output: float batches, written into buffers the main process dropped (see collate.py).
        # A worker's buffers: those in flight (prefetch_factor), the one the producer holds ready (ahead.py),
        # the trainer's, one not yet swept.
        size = self.resolution.largest if self.resolution else split.transform.size  # a size schedule's largest
        soft_targets = self.finisher is not None and self.finisher.mixer is not None
        slots = workers.prefetch_factor + 3
        self._pool = None if on_cuda or self.views else BatchPool(num_workers, slots, (split.batch_size, 3, size, size),
                                                                  self._normalizer.dtype, config.output.channels_last,
                                                                  classes=self.num_classes if soft_targets else 0)
        self._view_pools = [] if on_cuda or not self.views else [  # one pool per view group's tensor
            BatchPool(num_workers, slots, (group.count * split.batch_size, 3, group.size, group.size),
                      self._normalizer.dtype, config.output.channels_last) for group in self.views.groups]
        context = fork_context()
        if num_workers > 0 and (context is None or context.get_start_method() != "fork"):  # spawned: all pickled
            why = f"workers.num_workers: {num_workers} workers start by spawn here"
            prepared.hooks.check_picklable(why)
            check_source_picklable(prepared.index, why)
        if prepared.index.ranges is not None and prepared.pixels is None:
            keep_open(prepared.index.ranges.files)  # opened here, shared by the forked workers: one open a shard
        self._dataloader = torch.utils.data.DataLoader(
            ImageDataset(prepared.index, transform, prepared.pixels, skip_bad=config.dataset.on_bad_image == "skip",
                         source=config.source, draws=prepared.draws, sample_hook=prepared.hooks.sample),
            batch_sampler=self._feed,
            collate_fn=self._collate(on_cuda, transform),
            num_workers=num_workers,
            pin_memory=pin and torch.cuda.is_available(),
            prefetch_factor=workers.prefetch_factor if num_workers > 0 else None,
            multiprocessing_context=context if num_workers > 0 else None,  # never re-runs the script
            timeout=min(POLL_S, workers.timeout) if num_workers > 0 else 0,  # a wait is a loop (_next_batch)
            # each loop's workers' base seed drawn from a generator of the loader's own, not the trainer's global one
            generator=torch.Generator().manual_seed(config.seed),
        )
        if self._persistent:  # once built: a loader whose build raised has nothing to stop, nor all it would stop
            exits.stop_at_exit(self, _stop_at_exit)
        self._fresh = False  # the workers have just started: the next batch may take longer
        self._announce()
        if prepared.pixels is None:
            log.info("torch loader decoders: %s", describe_decoders())
        if self._persistent and len(self):
            # Persistent workers start now, on the first epoch, while the trainer builds its model: their
            # start (forking, some 0.2 s of the training thread's time) is not paid inside the first
            # `next(loader)`, and the first batches are ready sooner. A first loop that wants other
            # batches (load_state_dict, set_epoch) drops these, as after a `break`.
            self._start_workers(self.order.batches(self.epoch))

    def _collate(self, on_cuda: bool, transform: SampleTransform | ViewsTransform):
        """uint8 batches for the device to normalize, or batches normalized and finished in the workers."""
        if self.views is not None:
            return ViewsCollate(self.views, transform=transform) if on_cuda else ViewsCollate(
                self.views, self._normalizer, self.finisher, self._view_pools, transform)
        return fast_collate if on_cuda else NormalizingCollate(self._normalizer, self._pool, self.finisher)

    def describe(self) -> dict:
        return {**super().describe(), "workers": self.num_workers}

    @classmethod
    def depth_for(cls, config: Config, workers: int) -> int:
        """Each worker's prefetch_factor, plus the one batch its producer thread holds ready (ahead.py;
        none without workers)."""
        return workers * config.workers.prefetch_factor + (1 if workers else 0)

    def _parallelism(self) -> str:
        if self.device.type == "cuda":
            normalize = "on the device"
        else:  # the collate normalizes where it runs: no workers, no producer thread (ahead.py)
            normalize = "in the workers" if self.num_workers else "on the training thread"
        return f"workers={self.num_workers} (normalizing {normalize})"

    def _iter_batches(self, batches: list) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This loop's batches from its producer thread (ahead.py): the loop is set up here, on the
        trainer's thread (workers started, batches in flight kept or dropped), then every batch is
        received, converted and finished on the producer's, one ahead; the trainer only takes it."""
        if not batches:
            return iter(())
        self._stop_producer(new_loop=True)  # an older loop's, paused or left: the workers answer one thread at a time
        self._begin(batches)
        self._loop = loop = object()
        on_cuda = self.device.type == "cuda"
        if on_cuda and self.finisher is not None:  # what can be drawn for the epoch, drawn now
            self.finisher.start_epoch(batches)
        if not self._ahead.depth:  # no workers: on this thread
            produced = self._produce(batches, loop)
            return (hand_over(item) for item in produced) if on_cuda else produced
        return self._ahead.run(functools.partial(self._produce, batches, loop), hand_over if on_cuda else None,
                               self._superseded)

    def _produce(self, batches: list, loop: object) -> Iterator[tuple]:
        """On the producer thread: each planned batch received from the workers and, with a GPU,
        normalized and finished on the side stream (workers give uint8); on the CPU the workers
        normalized and finished it already (NormalizingCollate)."""
        delivered = self._record_skipped(self._received(batches, loop), batches)
        if self.device.type == "cuda":
            return convert_on_stream(delivered, self._normalizer, self._side_stream, self.finisher)
        return ((images, labels) for images, labels, _ in delivered)

    def _received(self, batches: list, loop: object) -> Iterator[tuple]:
        """This loop's batches from the live iterator, while no newer loop has taken it over."""
        for _ in batches:
            if self._loop is not loop:
                raise self._superseded()
            try:
                received = self._receive(1)
            except LoaderError as error:
                if self._loop is _LEFT_FOR_A_NEW_LOOP:  # nobody else hears of it
                    log.warning("%s", error)
                raise
            yield received

    def _stop_producer(self, new_loop: bool = False) -> None:
        """The current loop's producer ended. For a `new_loop`, one receiving a slow batch gets it: the
        wait is the producer's own, which names and kills a worker silent for workers.timeout, and a
        producer stuck past that elsewhere is let go of by killing the workers (logged). On close and
        at exit, nothing waits for a batch: the workers are killed after POLL_S, ending the wait."""
        self._loop = _LEFT_FOR_A_NEW_LOOP if new_loop else None  # then an error of its last batch is logged
        patience = self.config.workers.timeout * (FIRST_BATCH_TIMES if self._fresh else 1) + 2 * POLL_S
        if self._ahead.stop(timeout=patience if new_loop else POLL_S):
            return
        live = self._live
        if live is not None:
            if new_loop:
                log.warning("the last loop of the torch loader for split '%s' did not end within %.0f s of a new "
                            "loop: its workers are stopped, and new ones start", self.split.name, patience)
            live_iterator.stop_unreaped(live_iterator.workers(live), os.getpid())
        self._ahead.stop()

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
                    self._skipped.skip(record.path, record.reason)
                seeds = seeds[keep]
            if images is None:
                images, labels = self._empty_batch(len(plan))
                if self.device.type == "cuda":  # as the workers give it: the prefetcher normalizes and finishes it
                    images = ([torch.empty((0, *group.shape[1:]), dtype=torch.uint8) for group in images]
                              if isinstance(images, list) else torch.empty((0, *images.shape[1:]), dtype=torch.uint8))
                    labels = torch.empty(0).long()
            yield images, labels, seeds

    def _start_workers(self, batches: list) -> None:
        """A new live DataLoader iterator: its workers fork and start on these batches. Each dies with
        this process (fastloader.parallel.die_with). torch's SIGCHLD handler is told to leave them
        alone: it would raise its bare error wherever the trainer is when one dies (in the middle of
        its own code); the loader names a dead worker, and what to do, when the trainer next asks for
        a batch (_receive), or when the next loop starts (_stream)."""
        self._feed.sent.clear()
        self._feed.upcoming = itertools.chain(batches, self._next_epochs())
        self._dataloader.worker_init_fn = functools.partial(die_with, os.getpid(),
                                                            forked_by_main_thread=in_main_thread())
        try:
            self._live = iter(self._dataloader)
        except OSError as error:  # /dev/shm full (the queues' semaphores), the descriptor limit
            live_iterator.quiet_half_built(error)
            problem = resource_problem(error, "the torch backend's workers")
            if problem is None:
                raise
            raise ConfigError(f"the torch loader for split '{self.split.name}' cannot start its workers: "
                              f"{problem}") from None
        stop = weakref.finalize(self._live, live_iterator.stop_unreaped, live_iterator.workers(self._live),
                                os.getpid())
        stop.atexit = False  # at exit the workers die with this process (fastloader.parallel.die_with)
        self._fresh = True
        live_iterator.release_sigchld(self._live)

    def _next_epochs(self) -> Iterator:
        """What the next loops will most likely ask for: the epochs after this one, from their start."""
        if not self._persistent or not len(self):
            return iter(())
        return epochs_after(self.order, self.epoch)

    def _begin(self, batches: list) -> None:
        """Set the live DataLoader iterator on this loop's batches. Batches already in flight are kept
        when they are the ones this loop wants (the usual next epoch), else received and dropped
        (after a `break`, set_epoch or load_state_dict), as a new iterator would wait for them too."""
        feed = self._feed
        if self._live is not None and (died := self._dead_worker(grace=0)) is not None:  # between loops
            log.warning("%s; starting new workers", self._worker_died(died))
            self._shutdown()
        if self._live is None or not self._persistent:
            self._start_workers(batches)
            return
        matched = in_flight_prefix(feed.sent, batches)
        if matched == len(feed.sent):  # what is in flight starts this loop: feed the rest of it
            feed.upcoming = itertools.chain(batches[matched:], self._next_epochs())
        elif matched < len(batches):  # in flight for another loop: drop it, feed this one
            feed.upcoming = itertools.chain(batches, self._next_epochs())
            try:
                self._receive(len(feed.sent))
            except LoaderError as error:  # a left loop's batch stuck past workers.timeout, or its worker died
                log.warning("%s", error)
                self._start_workers(batches)
        # else this whole loop is in flight, and the feed already goes on after it

    def _receive(self, count: int) -> tuple | None:
        """The next `count` batches of the live iterator; the last one. An error (a worker's, an
        interrupt) ends the live iterator, since what is in flight is then unknown."""
        received = None
        try:
            for _ in range(count):
                images, labels, skipped, slot, targets = self._next_batch()
                planned = self._feed.sent.popleft()
                labels = torch.from_numpy(labels if targets is None else targets)
                if isinstance(slot, tuple):  # views: each group's tensor in its pool's slot, or sent (-1)
                    images = [pool.batch(s, group.count * len(labels))[0] if s >= 0 else sent for pool, s, sent, group
                              in zip(self._view_pools, slot, images, self.views.groups)]
                elif slot >= 0:
                    side = output_size(planned, self.split.transform.size)
                    images, in_slot = self._pool.batch(slot, len(labels), side)
                    labels = labels if in_slot is None else in_slot
                received = images, labels, skipped
        except BaseException as error:
            # A worker killed while it hands over a batch's shared memory breaks that hand-over
            # (EOFError, connection reset) before torch's own check names the dead worker; torch's
            # check says "exited unexpectedly", the worker's exit status says how.
            died = None
            if isinstance(error, (EOFError, ConnectionError)) or (
                    not isinstance(error, BadImageError) and live_iterator.reports_dead_worker(error)):
                died = self._dead_worker() or error
            self._shutdown()
            if died is not None:
                raise self._worker_died(died) from error
            if isinstance(error, USER_ERRORS) and (own := live_iterator.worker_error_message(error)) is not None:
                raise type(error)(own) from None  # the sentence, not torch's frames of its worker
            own_words = isinstance(error, FastloaderError)  # a store's full disk is not /dev/shm's
            if isinstance(error, (OSError, RuntimeError)) and not own_words and (problem := resource_problem(
                    error, "the torch backend's workers")) is not None:  # a fresh shared batch, a queue
                raise LoaderError(f"the torch loader for split '{self.split.name}' stopped: {problem}") from error
            raise
        return received

    def _next_batch(self) -> tuple:
        """The live iterator's next batch. torch waits POLL_S at a time (and names a worker that
        died); a worker that is alive but sends nothing for workers.timeout is named and killed."""
        timeout = self.config.workers.timeout * (FIRST_BATCH_TIMES if self._fresh else 1)
        started = time.monotonic()
        while True:
            try:
                batch = next(self._live)
            except RuntimeError as error:
                if not live_iterator.is_poll_timeout(error):
                    raise
                if time.monotonic() - started >= timeout:
                    raise self._silent_worker(time.monotonic() - started) from None
                continue
            self._fresh = False
            return batch

    def _silent_worker(self, waited: float) -> LoaderError:
        """The worker whose batch the trainer waits for, killed (SIGTERM cannot end a stopped process),
        as an error that names it, its state and what to do."""
        live = self._live
        everyone = live_iterator.workers(live)
        workers = live_iterator.awaited_workers(live)
        states = {worker.pid: _state(worker.pid) for worker in workers}
        # A worker stopped while it sent a batch holds the result queue's lock, so the awaited one, idle,
        # cannot hand its batch over: the stopped one is the cause, named first.
        stopped = {worker.pid: _state(worker.pid) for worker in everyone if worker not in workers}
        stopped = {pid: state for pid, state in stopped.items() if state.startswith("is stopped")}
        workers = [worker for worker in everyone if worker.pid in stopped] + workers
        states = {**stopped, **states}
        for worker in workers:
            if worker.is_alive():
                os.kill(worker.pid, signal.SIGKILL)
        batch = self._feed.sent[0] if self._feed.sent else ()
        files = ", ".join(self.index.relpath(int(sample)) for sample in batch[:3, 0]) if len(batch) else ""
        files += ", ..." if len(batch) > 3 else ""
        timeout = self.config.workers.timeout
        in_workers = (self.hooks.sample, self.hooks.batch if self.device.type == "cpu" else None)
        hooks = [hook.label for hook in in_workers if hook is not None]
        return LoaderError(
            f"the torch loader for split '{self.split.name}' waited {waited:.0f} s for a batch from "
            + "; ".join(f"its decoding worker (pid {pid}), which {state}" for pid, state in states.items())
            + (" (a worker stopped while it hands over a batch holds up the others' too)" if stopped else "")
            + (f". The workers run your {' and '.join(hooks)} too: a hook that hangs stops them so" if hooks else "")
            + (f". That batch holds {len(batch)} samples: {files}" if files else "")
            + f". The workers were stopped; the next loop starts new ones. A batch may take workers.timeout "
            f"({timeout:g} s; the first after the workers start {FIRST_BATCH_TIMES}x that): raise it if batches are "
            f"this slow")

    def _worker_died(self, error: BaseException) -> LoaderError:
        """A worker that died (the DataLoader notices within seconds) as an error that says what to do;
        the next loop starts new workers."""
        return LoaderError(
            f"a decoding worker of the torch loader for split '{self.split.name}' died: {error}. Killed by "
            f"signal 9 (SIGKILL) most often means the kernel's out-of-memory killer (see `dmesg`): lower "
            f"workers.num_workers or workers.prefetch_factor. A segmentation fault (signal 11) is a crash in "
            f"a native decoder: `fastloader check CONFIG --deep` finds the file that causes it")

    def _dead_worker(self, grace: float = 2.0) -> RuntimeError | None:
        """torch's words for a worker that has died, or None if all live for `grace` seconds.
        A dying worker's pipes close a moment before it can be reaped: wait for both."""
        workers = {worker.sentinel: worker for worker in live_iterator.workers(self._live)}
        for sentinel in multiprocessing.connection.wait(list(workers), timeout=grace):
            worker = workers[sentinel]
            worker.join(timeout=grace)
            code = worker.exitcode or 0
            how = f"is killed by signal: {signal.strsignal(-code)}" if code < 0 else "exited unexpectedly"
            return RuntimeError(f"DataLoader worker (pid {worker.pid}) {how}")
        return None

    def _shutdown(self) -> None:
        if self._live is not None:
            live_iterator.shut_down(self._live)
        self._live = None
        self._feed.sent.clear()
        for pool in ([self._pool] if self._pool is not None else []) + self._view_pools:
            pool.forget()

    def _close(self) -> None:
        self._stop_producer()
        self._shutdown()
        self._dataloader = None
        exits.forget(self)

    def _drop(self) -> None:
        """For `__del__`, which may run on the producer thread itself: the producer is told to stop
        and the workers are killed, nothing waited for."""
        self._ahead.signal()
        live, self._live = self._live, None
        if live is not None:
            live_iterator.stop_unreaped(live_iterator.workers(live), os.getpid())
        self._dataloader = None
        exits.forget(self)


def sample_transform(split: SplitConfig, augmenter: Augmenter | None = None,
                     mean: tuple[float, float, float] = IMAGENET_MEAN, **options) -> SampleTransform:
    """A split's SampleTransform: with `augmenter` (a train split's plan's) or, in train mode, one
    drawn from its transform (its fill from `mean`); `options`: SampleTransform's (exif_orientation,
    use_draft, max_pixels). The one place the torch backend's transform reads the split's keys."""
    t = split.transform
    if split.mode != "train":
        augmenter = None
    elif augmenter is None:
        augmenter = Augmenter(t, mean)
    if t.interpolation not in UINT8_KERNELS:
        torchvision_resize(t.interpolation, f"{split.name}.transform.interpolation")
    return SampleTransform(augmenter, t.size, t.crop_pct, t.interpolation, **options)


def normalizer_of(config: Config, device: torch.device) -> Normalizer:
    """normalize and output (dtype, channels_last) as the torch backend's Normalizer on `device`."""
    return Normalizer(config.normalize.mean, config.normalize.std, config.output.dtype, config.output.channels_last,
                      device)


def _stop_at_exit(loader: TorchLoader) -> None:
    """Stop a loader's persistent workers before the interpreter exits. Left running, they are killed
    by multiprocessing's own exit hook while the pin-memory thread still reads their queues, and that
    thread prints a traceback at the end of a clean script (seen on a GPU machine)."""
    loader._stop_producer()
    loader._shutdown()


USER_ERRORS = (HookError, SourceError, BadImageError)
"""Errors a worker raises with words of their own (the user's hook, source, or a file under
on_bad_image: raise): the trainer gets those words, not torch's wrapper."""


def check_source_picklable(index, why: str) -> None:
    """Where workers are spawned, a user's source travels to each pickled (ImageDataset): one that
    cannot (an open mmap, a connection) is refused at build, named with the reason, rather than
    every sample failing in the workers."""
    if not index.reader:
        return
    import pickle

    source = opened(index.reader)
    try:
        pickle.dumps(source)
    except Exception as error:  # PicklingError, TypeError ("cannot pickle 'mmap.mmap' object"), AttributeError
        raise ConfigError(f"the source {source.name!r} cannot be pickled ({type(error).__name__}: {error}), and "
                          f"{why}: each worker gets the source pickled. Give it __getstate__/__setstate__ that leave "
                          f"out what cannot travel (open files, mmaps, connections) and open it again on the first "
                          f"read, or set workers.num_workers: 0, or backend: dali") from None


def _state(pid: int) -> str:
    """What a silent worker is doing, from its process state, and what to do about it."""
    import psutil

    try:
        status = psutil.Process(pid).status()
    except psutil.Error:
        return "is no longer running"
    if status == psutil.STATUS_STOPPED:
        return (f"is stopped (SIGSTOP: job control or a tool aimed at that process alone; a SIGCONT, "
                f"`kill -CONT {pid}`, would have resumed it)")
    if status == psutil.STATUS_TRACING_STOP:
        return "is stopped by a debugger attached to it; detach it, or raise workers.timeout while you debug"
    if status == psutil.STATUS_DISK_SLEEP:
        return ("is alive but silent, waiting on storage (state D): the file system holding the dataset stopped "
                "answering or is this slow")
    return (f"is alive but silent ({status}): a decoder stuck on a file of that batch, or a machine too loaded "
            f"to decode a batch in time; `py-spy dump --pid {pid}` shows where it is")
