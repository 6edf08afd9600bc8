"""PreparedSplit: the one hand-off from preparation to a backend.

Preparing a split is the same work whichever backend reads it: index its files, then either open
its uint8 cache (which lists the files it could not decode) or screen the files' headers (which
leaves out those no decoder can read). The factory does it once and hands the result to the chosen
backend's constructor, so a backend learns everything it needs from one object, and nothing is
added to a loader after it is built.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from .cache import CachedPixels
from .device_ops import BatchFinisher
from .distributed import RankInfo, cpu_workers_per_rank
from .draws import Augmenter
from .hooks import SplitHooks
from .order import BlockShuffle, EpochOrder, WeightedDraws
from .resolution import Resolution
from .samples import SampleIndex
from .schema import Config, SplitConfig
from .views import ViewFinisher, ViewPlan
from .words import containers_words


@dataclass(frozen=True)
class BatchPlan:
    """What every batch of a split is made of, decided once with its index: the order over it (this
    rank's share, its blocks or weighted draws), the size schedule, the augmentation spec, the views
    and the finisher. Both backends take it as it is (the contract's Loader), never from the config again."""
    order: EpochOrder
    resolution: Resolution | None
    """The train split's size schedule (fastloader.resolution); None in eval."""
    augmentation: Augmenter | None
    """The train split's augmentation spec: what each sample's seed draws; None in eval."""
    views: ViewPlan | None
    """A train split's view groups: each sample's images are several views; None without views."""
    finisher: BatchFinisher | ViewFinisher | None
    """The batch hook, random erasing, mixing and soft targets of each batch, or None."""


def plan_batches(config: Config, split: SplitConfig, index: SampleIndex, ranks: RankInfo,
                 blocks: BlockShuffle | None, draws: WeightedDraws | None, hooks: SplitHooks) -> BatchPlan:
    """The split's BatchPlan over its prepared index."""
    train = split.mode == "train"
    resolution = Resolution(split.transform, config.seed, split.batch_sizes) if train else None
    order = EpochOrder(len(index), split.batch_size, mode=split.mode, shuffle=split.shuffle,
                       drop_last=split.drop_last, seed=config.seed, rank=ranks.rank, world_size=ranks.world_size,
                       repeats=split.aug_repeats, blocks=blocks, draws=draws,
                       epoch_size=split.epoch_size if draws is None else None,
                       resolution=resolution if resolution and not resolution.fixed else None)
    views = ViewPlan(split, config.normalize.mean) if split.views else None
    finisher = (ViewFinisher.for_views(views, hooks.batch) if views else
                BatchFinisher.for_split(split, len(index.classes), hooks.batch))
    return BatchPlan(order, resolution, Augmenter(split.transform, config.normalize.mean) if train else None,
                     views, finisher)


@dataclass(frozen=True)
class PreparedSplit:
    index: SampleIndex
    """The split's samples, less the files known to be unusable."""
    bad: tuple[tuple[str, str], ...]
    """(path, reason) of the files left out of `index`, already logged: those the header check
    refused, or those the cache lists as bad. A loader starts its `bad_samples` with them."""
    workers: int
    """The backend's parallelism (see worker_count): DataLoader workers, or DALI's CPU threads."""
    batches: BatchPlan
    """What every batch is made of (plan_batches), decided with the index."""
    pixels: CachedPixels | None = None
    """The pixel source: the uint8 cache's pixels, or None to decode the image files."""
    needs_transcoding: Mapping[int, str] = field(default_factory=dict)
    """Sample -> format of each file in a format DALI's decoder cannot read (GIF), which the DALI
    backend reads through a PNG copy (dali_loader/transcode.py); the torch backend reads all."""
    sizes: np.ndarray | None = None
    """int32 [len(index), 3]: each sample's stored (height, width, turned), read by screening
    (fastloader.decoding.sizes.upright gives the decoded size); None where the split was not screened."""
    blocks: BlockShuffle | None = None
    """The block order over `index` (its shards and the byte budget) where the split's shuffle is
    `block`, else None."""
    draws: WeightedDraws | None = None
    """The weighted draws over `index` where the split weighs its samples (weights, class_weights, the
    sources' weights), else None."""
    hooks: SplitHooks = field(default_factory=SplitHooks)
    """The user's own transforms for the split (fastloader.hooks), imported and named."""

    @property
    def pixels_from(self) -> str:
        """Where the pixels come from, in the words of the loader's repr and log line."""
        if self.pixels is not None:
            return f"the cache {self.pixels.folder}"
        if self.index.reader:
            return f"the source {self.index.root}"
        ranges = self.index.ranges
        if ranges is None:
            return "the image files"
        return containers_words(ranges.files)


def worker_count(config: Config, backend: str, ranks: RankInfo) -> int:
    """How wide the backend decodes: dali.threads for DALI when set, else workers.num_workers (DALI
    needs at least one thread; torch's 0 decodes in the main process), else this rank's share of
    the CPU cores, capped by workers.max_workers."""
    if backend == "dali" and config.dali.threads != "auto":
        return config.dali.threads
    workers = config.workers.num_workers
    if workers != "auto":
        return max(1, workers) if backend == "dali" else workers
    return cpu_workers_per_rank(ranks, config.workers.max_workers)
