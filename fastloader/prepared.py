"""PreparedSplit: the one hand-off from preparation to a backend, made in one pass (prepare_split).

Preparing a split is the same work whichever backend reads it: what the config says of its order
and weights, read once and checked before anything is read (blocks.BlockPlan, weights.WeightPlan);
its index; either its uint8 cache (which lists the files it could not decode) or its files'
headers screened (which leaves out those no decoder can read); its blocks and draws over what is
left; what its order costs the node cache, the backend's read-ahead included; and what every batch
is made of (BatchPlan). The factory has it done once and hands the result to the chosen backend's
constructor, so a backend learns everything it needs from one object, and nothing is added to a
loader after it is built.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from .blocks import BlockPlan
from .cache import CachedPixels, open_split_cache
from .device_ops import BatchFinisher
from .distributed import RankInfo, cpu_workers_per_rank
from .draws import Augmenter
from .hooks import SplitHooks
from .order import BlockShuffle, EpochOrder, WeightedDraws
from .resolution import Resolution
from .samples import SampleIndex
from .schema import Config, SplitConfig
from .screening import screen_index
from .sources.formats import build_index, input_key
from .sources.protocol import forget_source
from .sources.stores import cache_limit, release_store
from .sources.urls import is_url
from .views import ViewFinisher, ViewPlan
from .weights import WeightPlan
from .words import containers_words

log = logging.getLogger("fastloader")


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


def prepare_split(config: Config, split: SplitConfig, workers: int, ranks: RankInfo, source: object | None = None,
                  hooks: SplitHooks = SplitHooks(), held_ahead: int = 0) -> PreparedSplit:
    """The split's index less its unusable files, and its pixel source: the uint8 cache when
    dataset.cache holds one for the split (it lists the files it could not decode, so no screening
    is needed), else the image files, screened; its block order where `shuffle: block`, its weighted
    draws where weights are set; its BatchPlan. `workers`: the backend's (worker_count); `held_ahead`:
    the batches it holds ahead of its trainer (Loader.depth_for), for what reading that far ahead
    costs the node cache."""
    blocks = BlockPlan(config, split)  # a `shuffle: block` without a budget, an epoch too small for the ranks,
    weights = WeightPlan(config, split, ranks)  # or a bad weights file fails at once, before the split is indexed
    index = build_index(config, split, source)  # dataset.remote's node cache opened where the split names a store
    store, reader = index.store, index.reader
    try:
        stored = index.ranges is not None and len(index.ranges.files) and is_url(index.ranges.files[0])
        limit = cache_limit(index.store) if stored else None  # the node cache's, for the block budget and the costs
        budget = blocks.budget(limit)
        if cost := blocks.uniform_cost(index, limit):
            log.warning(cost)
        cache = open_split_cache(config, split, index) if config.dataset.cache else None  # None: the image files
        if cache is not None:
            bad, index, found = index.unusable + tuple(cache.bad), cache.index, {"pixels": cache.pixels}
        elif config.dataset.screen:
            screened = screen_index(index, config.on_bad_image, config.dataset.max_pixels, input_key(split),
                                    workers=cpu_workers_per_rank(ranks, config.workers.max_workers))
            bad, index = index.unusable + tuple(screened.bad), screened.index
            found = {"needs_transcoding": screened.formats, "sizes": screened.sizes}
        else:
            bad, found = index.unusable, {}
        order = blocks.order(index, budget, limit)
        draws = weights.draws(index, [path for path, _ in bad])
        if cost := blocks.read_ahead_cost(index, order, held_ahead * split.batch_size * ranks.world_size):
            log.warning(cost)
        return PreparedSplit(index, bad, workers, **found, hooks=hooks, blocks=order, draws=draws,
                             batches=plan_batches(config, split, index, ranks, order, draws, hooks))
    except BaseException:
        release_store(store)
        forget_source(reader)  # the user's source, which no loader will close
        raise
