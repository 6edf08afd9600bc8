"""The Loader contract both backends implement, and the behaviour they share.

Shared here, so that the backends cannot drift apart: which epoch a `for` loop runs, what `len`
means, the closed state, the (epoch, position) that a resume restarts from, the files skipped, the
batch finisher (random erasing, mixing, soft targets: one object each backend applies where it costs
the training thread least) and the start-up line that says what the loader is. The Loader is built
from pieces with one job each: loader_setup (what it is), epoch_cursor (which epoch, where),
skipped_files (bad_samples), shard_fetches (fetching ahead), loader_state (the saved state and
its checks), loader_words (what it says) and stats (what the consumer waited for).
"""
from __future__ import annotations

import abc
import time
from typing import Iterator

import torch

from .distributed import RankInfo
from .epoch_cursor import EpochCursor
from .errors import LoaderError
from .interfaces import Batch
from .loader_setup import LoaderSetup
from .loader_state import resume_point, saved_state
from .loader_words import announce, loader_repr, say_plan, say_stats
from .prepared import PreparedSplit
from .schema import Config, SplitConfig
from .shard_fetches import ShardFetches
from .skipped_files import SkippedFiles
from .sources.protocol import forget_source
from .sources.stores import release_store
from .sources.user_source import check_unchanged
from .stats import LoaderStats


class Loader(LoaderSetup, abc.ABC):
    """`for images, labels in loader`: images float [B, 3, H, W] normalized (with views, a list of
    one tensor per view group), labels int64 [B], or float32 soft targets [B, num_classes] where the
    split mixes or smooths labels (fastloader.interfaces.Batch says it all).

    Each `for` loop runs one epoch: the one given to `set_epoch`, else the one after the last
    started (0 first). Leaving a loop early with `break` is fine; the next loop starts afresh.
    """

    def __init__(self, config: Config, split: SplitConfig, prepared: PreparedSplit, ranks: RankInfo,
                 device: torch.device):
        super().__init__(config, split, prepared, ranks, device)
        self._cursor = EpochCursor()
        """Which epoch the next loop runs, where it starts, how far the newest loop has got."""
        self.stats = LoaderStats()
        """What the consumer of the latest `for` loop waited for (see fastloader.stats)."""
        self._skipped = SkippedFiles(self.backend, split.name, ranks.rank, split.mode == "train")
        """The files skipped under dataset.on_bad_image: skip, listed once, counted per epoch."""
        self.bad_samples: list[tuple[str, str]] = self._skipped.samples
        """(path, reason) of every file skipped so far under dataset.on_bad_image: skip: those the
        header check left out when the loader was built, then those that failed to decode."""
        for path, reason in prepared.bad:  # left out of the index when it was prepared (logged then)
            self._skipped.add(path, reason)
        self.prefetch_depth = self.depth_for(config, prepared.workers)
        """Batches the loader may hold prepared ahead of its consumer (a benchmark drains them):
        depth_for its workers."""
        self._closed = False
        self._fetches = ShardFetches(self.index, prepared.pixels is None and self.index.ranges is not None)
        """The shards the running loop reads, fetched ahead (shards in an object store)."""
        say_plan(self, weighted=prepared.draws is not None)

    # -- the contract ----------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._cursor.epoch

    @property
    def size(self) -> int:
        """The output side of the current epoch's images (progressive resolution: this epoch's size);
        with a size per batch (transform.sizes), the largest a batch may have: each batch's is its
        images' last dimension."""
        return self.resolution.epoch_size(self._cursor.epoch) if self.resolution else self.split.transform.size

    @property
    def next_epoch(self) -> int:
        """The epoch the next `for` loop runs: the one set (set_epoch, a loaded state), else the one
        after the last started."""
        return self._cursor.next_epoch

    @property
    def resume_position(self) -> int:
        """Where the next loop starts in its epoch's global order: a loaded state's position, else 0."""
        return self._cursor.resume_position

    def set_epoch(self, epoch: int) -> None:
        """Make the next `for` loop run this epoch (its order is a function of seed and epoch)."""
        self._cursor.choose(epoch)

    def __iter__(self) -> Iterator[Batch]:
        if self._closed:
            raise self._closed_error()
        check_unchanged(self.index)  # a user's source that grew, shrank or changed since it was indexed
        return self._run_epoch(*self._cursor.start_loop())

    def _run_epoch(self, epoch: int, start: int, loop: int) -> Iterator[Batch]:
        """One loop's batches, from `start` of the epoch's global order: the stats of each, the
        position moved (the newest loop only), an epoch that reads nothing refused."""
        global_batch = self.batch_size * self.ranks.world_size  # ranks step together (DDP)
        paired = self.order.paired  # a batch size per size: each step takes its own batch size on every rank
        stats = self.stats = LoaderStats(epoch=epoch)
        skipped, cursor, train = self._skipped, self._cursor, self.split.mode == "train"
        skipped.new_epoch()
        clock = time.perf_counter
        began = clock()  # the consumer asked for the first batch: generators start on the first next()
        planned = self.order.batches(epoch, start)
        fetches = self._fetches.start(planned, f"split '{self.split.name}', epoch {epoch}, rank {self.ranks.rank}")
        batches = iter(self._iter_batches(planned))
        try:
            while True:
                asked = clock()
                try:
                    images, labels = next(batches)
                except StopIteration:
                    break
                arrived = clock()
                stats.add(arrived - asked if stats.batches else arrived - began, arrived - began, len(labels))
                if not stats.images and train and skipped.in_epoch:
                    raise skipped.nothing_read(epoch)  # a train slot that stays empty: all its substitutes failed too
                if fetches is not None:  # the shards read up to here may go; what was fetched and waited for
                    fetches.reached(stats)
                cursor.advance(loop, len(planned[stats.batches - 1]) * self.ranks.world_size if paired
                               else global_batch)
                yield images, labels
        finally:
            if fetches is not None:
                fetches.cancel()
        if stats.batches and not stats.images and skipped.in_epoch:
            raise skipped.nothing_read(epoch)
        say_stats(self, stats)
        skipped.say_epoch(epoch)

    def _empty_batch(self, planned: int) -> Batch:
        """What a planned batch none of whose files decodes yields (eval; train where no substitute
        decodes either): no images, logged (a warning the first time; its files are named as they
        are found). Never left out, so that every rank yields len(loader) batches (DDP steps
        together) and the resume position counts planned batches."""
        self._skipped.say_empty_batch(planned, self.epoch)
        dtype = getattr(torch, self.config.output.dtype)
        if self.views is not None:
            return (self.views.empty(dtype, self.device, self.config.output.channels_last),
                    torch.empty(0, dtype=torch.int64, device=self.device))
        size = self.size
        memory_format = torch.channels_last if self.config.output.channels_last else torch.contiguous_format
        images = torch.empty((0, 3, size, size), dtype=dtype, device=self.device,
                             memory_format=memory_format)
        if self.finisher is not None and self.finisher.mixer is not None:
            return images, torch.empty((0, self.num_classes), dtype=torch.float32, device=self.device)
        return images, torch.empty(0, dtype=torch.int64, device=self.device)

    def state_dict(self) -> dict:
        """Where the trainer is: resuming from it yields exactly the batches not yet consumed.

        Plain ints and strings (JSON or torch.save). Ranks of a data-parallel job step together, so
        every rank's state is the same and rank 0's is enough to resume all of them.
        """
        return saved_state(self, self._cursor.epoch, self._cursor.position)

    def load_state_dict(self, state: dict, force_hooks: bool = False) -> None:
        """Make the next `for` loop continue the saved epoch after its last consumed batch.

        Another world size or batch size re-shards the rest of the epoch: the ranks together still
        get every remaining sample once (eval) or equal shares of it (train). A state saved with
        other hooks (their names or versions) is refused: their draws would not replay; force_hooks
        resumes anyway (the samples and the loader's own draws are the same).
        """
        self._cursor.restore(*resume_point(self, state, force_hooks))

    def close(self) -> None:
        """Stop workers / free the pipeline. Iterating afterwards raises an error."""
        if not self._closed:
            self._closed = True
            self._fetches.cancel()
            self._close()
            forget_source(self.index.reader)
            release_store(self.index.store)

    def _superseded(self) -> LoaderError:
        """What a paused loop says when it is resumed after a newer loop took the loader over (two
        loops never take batches in turn: each would get the other's); the loader's close ended it."""
        if self._closed:
            return self._closed_error()
        return LoaderError(f"a newer loop over the {self.backend} loader for split '{self.split.name}' started while "
                           f"this one was paused; finish or drop a loop before starting the next")

    def _closed_error(self) -> LoaderError:
        return LoaderError(f"this {self.backend} loader for split '{self.split.name}' is closed; "
                           f"build a new one with fastloader.build_loader(...)")

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        """A dropped loader lets go of its workers without waiting for anything: the cycle collector
        runs finalizers on whichever thread allocates (maybe a backend's own thread), a forked child
        inherits loaders whose threads stayed in the parent, and the interpreter may be shutting down."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        try:
            self._drop()
            forget_source(self.index.reader)
            release_store(self.index.store)
        except Exception:
            pass

    def _announce(self) -> None:
        """Once the backend has built itself: the start-up line (loader_words.announce)."""
        announce(self)

    def __repr__(self) -> str:
        """What the loader is doing, so that `print(loader)` answers "which backend, where, how wide"."""
        return loader_repr(self, self._parallelism(), self.size, self._closed)

    def _parallelism(self) -> str:
        """How it decodes in parallel, as `repr` shows it (workers, or DALI's flavour and threads)."""
        return ""

    # -- what a backend provides -----------------------------------------------------------------

    @abc.abstractmethod
    def _iter_batches(self, batches: list) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield (images, labels) on self.device for these batches of (sample index, sample seed),
        finished by self.finisher (erasing, mixing, soft targets) where it is not None, from the seeds
        of the samples delivered: one item per planned batch, whatever fails to decode (a train
        slot refilled from `order.substitutes`, an eval batch shorter, or `_empty_batch`)."""

    @abc.abstractmethod
    def _close(self) -> None:
        """Release workers, pipelines and memory."""

    def _drop(self) -> None:
        """What `_close` releases, for `__del__`: without waiting on any thread or process. A backend
        whose `_close` never waits keeps this default."""
        self._close()
