"""The block order's settings (`<split>.shuffle: block`): its byte budget, from `<split>.block_size` or
the node cache's limit; its blocks, made from the split's index and logged; and what a uniform order
costs a cache smaller than the shards, for the loader to say. One BlockPlan a split, read from the
config once.

The order itself is order.py's BlockShuffle; this module only turns config keys into its budget and
says what the choice means, and what a loader reading further ahead than a block costs.
"""
from __future__ import annotations

import logging
import os

from .errors import ConfigError
from .machine import human_bytes
from .order import BlockShuffle, Containers
from .samples import SampleIndex
from .schema import Config, SplitConfig
from .sources.reading import is_remote
from .units import parse_size
from .words import container_noun, plural

log = logging.getLogger("fastloader")

CACHE_KEY = "dataset.remote.cache_limit"
"""The node cache's limit, which gives the default budget where the shards are remote."""


class BlockPlan:
    """A split's block-order settings, read from the config once, before its index is built (a
    `shuffle: block` with no budget to be had fails then), and applied to the prepared index later:
    the budget (`budget`), the blocks (`order`), and what an order costs the node cache (`uniform_cost`,
    `read_ahead_cost`)."""

    def __init__(self, config: Config, split: SplitConfig):
        self.name, self.seed, self.shuffle = split.name, config.seed, split.shuffle
        self.shuffle_origin = config.origin(f"{split.name}.shuffle")
        key = self.size_key = f"{split.name}.block_size"
        self.size_origin = config.origin(key)
        self.block_size = (parse_size(split.block_size, f"{self.size_origin}: {key}")
                           if split.block_size is not None and split.shuffle == "block" else None)
        """The budget `<split>.block_size` sets, in bytes; None where unset (or the order is not block)."""
        patterns = [split.shards, split.files] + [pattern for source in split.sources or () for pattern in
                                                  (source.shards, source.files)]
        names = [name for pattern in patterns if pattern
                 for name in ((pattern,) if isinstance(pattern, str) else pattern)]
        if not any(is_remote(name) for name in names):  # no node cache will give a budget: say so now
            self.budget()

    def budget(self, cache_limit: int | None = None) -> int | None:
        """The most bytes of shards one block of the split holds, or None where its order is not `block`.

        `<split>.block_size` when set; else half of `cache_limit` (the node cache's limit in bytes, where
        there is one): the next block is fetched while the current one trains, so two blocks must fit.
        Neither: a ConfigError that names the key and the fix (before the split is indexed, where its
        shards are local)."""
        if self.shuffle != "block":
            return None
        key = self.size_key
        if self.block_size is None:
            if cache_limit is None:
                raise ConfigError(f"{self.shuffle_origin}: {self.name}.shuffle: block needs {key}, the most bytes of "
                                  f"shards one block holds: set e.g. {key}: 4GB (two blocks, the one read and the "
                                  f"next, should fit the disk or memory that holds the shards; with remote shards it "
                                  f"defaults to half of {CACHE_KEY})")
            return max(1, cache_limit // 2)
        budget = self.block_size
        if cache_limit is not None and budget > cache_limit // 2:
            log.warning("%s: %s (%s) is more than half of %s (%s): the next block cannot be fetched while the "
                        "current one trains without evicting it, so shards are fetched more than once per epoch; set "
                        "%s to at most %s, or leave it out (half the cache)", self.size_origin, key,
                        human_bytes(budget), CACHE_KEY, human_bytes(cache_limit), key, human_bytes(cache_limit // 2))
        return budget

    def order(self, index: SampleIndex, budget: int | None, cache_limit: int | None = None) -> BlockShuffle | None:
        """The split's block order over its (prepared) index, logged with its blocks; None without a budget
        (the split's order is not `block`). A shard larger than the budget is a block of its own, said in
        a warning with the fix that works: with shards in an object store (`cache_limit`, the node
        cache's), a block can be fetched while the one before it trains only where two fit the cache."""
        if budget is None:
            return None
        name = self.name
        if index.ranges is None:
            raise ConfigError(f"{self.shuffle_origin}: {name}.shuffle: block reads the split's shards block by block, "
                              f"and its samples are files of their own; set {name}.shuffle: true, or pack the split "
                              f"into shards with `fastloader pack`")
        shuffle = BlockShuffle(Containers.of(index.ranges), budget)
        containers = shuffle.containers
        why = f"{self.size_key}, from {self.size_origin}" if self.block_size is not None else f"half of {CACHE_KEY}"
        total = int(containers.sizes.sum())
        noun = container_noun(index.ranges.files[0]) if len(index.ranges.files) else "shard"
        log.info("split '%s': shuffle: block, blocks of at most %s (%s): %s of %s, %s in epoch 0", name,
                 human_bytes(budget), why, plural(len(containers.number), noun), human_bytes(total),
                 plural(len(shuffle.blocks(self.seed, 0)), "block"))
        oversized = shuffle.oversized
        if len(oversized):
            sizes = dict(zip(containers.number.tolist(), containers.sizes.tolist()))
            files = containers.file_of if containers.file_of is not None else containers.number
            file_of = dict(zip(containers.number.tolist(), files.tolist()))
            named = ", ".join(f"{os.path.basename(index.ranges.files[file_of[c]])} ({human_bytes(sizes[c])})"
                              for c in oversized[:3].tolist())
            largest = max(sizes[c] for c in oversized.tolist())
            if cache_limit is not None and 2 * largest > cache_limit:  # a larger block_size cannot help here
                raise ConfigError(
                    f"{self.shuffle_origin}: {name}.shuffle: block: "
                    f"{plural(len(oversized), noun)} of the object store larger than half the node cache "
                    f"({CACHE_KEY}: {human_bytes(cache_limit)}; {named}{', ...' if len(oversized) > 3 else ''}). The "
                    f"cache cannot hold such a shard and the next one, so each would be fetched many times an epoch "
                    f"(10x measured). Raise {CACHE_KEY} to at least {human_bytes(2 * largest)}, or repack into shards "
                    f"of at most {human_bytes(cache_limit // 2)} (`fastloader pack --shard-size "
                    f"{max(1, cache_limit // 2 >> 20)}MB`), or set {name}.shuffle: true")
            fix = f"raise {name}.block_size above the largest to keep every block within it"
            log.warning("split '%s': %s larger than the block budget of %s (%s), each read as a block of its own: "
                        "%s%s; %s", name, plural(len(oversized), noun) + (" is" if len(oversized) == 1 else " are"),
                        human_bytes(budget), why, named, " ..." if len(oversized) > 3 else "", fix)
        return shuffle

    def uniform_cost(self, index: SampleIndex, cache_limit: int | None) -> str | None:
        """What `shuffle: true` costs where the split's shards do not fit the node cache, and how to choose
        `block`; None where they fit, or the order is not uniform.

        In a uniform order, a shard's next sample comes after about as many reads as there are shards; an
        LRU cache holding a fraction f of the shards still holds it with probability about f (those reads
        touch 1 - e^-x of the shards, below f for x < -ln(1 - f), which happens with probability f). So a
        shard of m samples is fetched about 1 + (m - 1)(1 - f) times an epoch."""
        if self.shuffle is not True or cache_limit is None or index.ranges is None:
            return None
        containers = Containers.of(index.ranges)
        total = int(containers.sizes.sum())
        if total <= cache_limit or not len(containers.number):
            return None
        kept = cache_limit / total
        per_shard = float(containers.counts.mean())
        fetched = 1 + (per_shard - 1) * (1 - kept)
        name = self.name
        return (f"split '{name}': {name}.shuffle: true reads samples in a uniform order, and its "
                f"{plural(len(containers.number), 'shard')} ({human_bytes(total)}) do not fit {CACHE_KEY} "
                f"({human_bytes(cache_limit)}): each shard is fetched about {fetched:,.0f} times an epoch (once per "
                f"sample, less the {kept:.0%} the cache keeps), {human_bytes(int(total * fetched))} in all. Set "
                f"{name}.shuffle: block to fetch each shard once an epoch: blocks of half the cache "
                f"({human_bytes(cache_limit // 2)}) by default, {name}.block_size to choose (docs/semantics.md, "
                f"the block order)")

    def read_ahead_cost(self, index: SampleIndex, blocks: BlockShuffle | None, ahead: int) -> str | None:
        """What reading `ahead` samples (all ranks together) ahead of the trainer costs a block order over
        shards in an object store whose blocks hold fewer samples; None where they hold more, or the
        shards are local (reading them ahead costs nothing).

        The node cache holds two blocks: the one the trainer reads and the next, fetched while it trains.
        Workers that read further ahead reach a third block, whose shards are fetched outside that plan
        and evicted before the trainer gets there: fetched twice an epoch, or more."""
        ranges = index.ranges
        if blocks is None or ranges is None or not len(ranges.files) or not is_remote(ranges.files[0]):
            return None
        ends = [block.end for block in blocks.blocks(self.seed, 0)]
        if len(ends) < 3:
            return None
        smallest = min(b - a for a, b in zip([0] + ends[:-1], ends))
        if ahead <= smallest:
            return None
        key = self.size_key if self.block_size is not None else CACHE_KEY
        return (f"split '{self.name}': the loader reads up to {ahead:,} samples ahead of the trainer (prefetch depth "
                f"x batch size x ranks), more than the smallest of its blocks holds ({smallest:,} samples): shards of "
                f"the blocks after the next are fetched before the cache can keep them, so some are fetched twice an "
                f"epoch. Raise {key} (blocks of more samples), or lower workers.num_workers or "
                f"workers.prefetch_factor")
