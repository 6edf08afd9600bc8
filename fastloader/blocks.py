"""The block order's settings (`<split>.shuffle: block`): its byte budget, from `<split>.block_size` or
the node cache's limit; its blocks, made from the split's index and logged; and what a uniform order
costs a cache smaller than the shards, for the loader to say.

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


def check_budget(config: Config, split: SplitConfig) -> None:
    """Before the split is indexed: a `shuffle: block` with no budget to be had (no block_size, and no
    shards in an object store, whose node cache would give one) fails at once, not after indexing."""
    patterns = [split.shards, split.files] + [pattern for source in split.sources or () for pattern in
                                              (source.shards, source.files)]
    names = [name for pattern in patterns if pattern for name in ((pattern,) if isinstance(pattern, str) else pattern)]
    if not any(is_remote(name) for name in names):
        block_budget(config, split)


def block_budget(config: Config, split: SplitConfig, cache_limit: int | None = None) -> int | None:
    """The most bytes of shards one block of the split holds, or None where its order is not `block`.

    `<split>.block_size` when set; else half of `cache_limit` (the node cache's limit in bytes, where
    there is one): the next block is fetched while the current one trains, so two blocks must fit.
    Neither: a ConfigError that names the key and the fix (see check_budget, which says so before the
    split is indexed)."""
    if split.shuffle != "block":
        return None
    key = f"{split.name}.block_size"
    if split.block_size is None:
        if cache_limit is None:
            raise ConfigError(f"{config.origin(f'{split.name}.shuffle')}: {split.name}.shuffle: block needs {key}, the "
                              f"most bytes of shards one block holds: set e.g. {key}: 4GB (two blocks, the one read "
                              f"and the next, should fit the disk or memory that holds the shards; with remote shards "
                              f"it defaults to half of {CACHE_KEY})")
        return max(1, cache_limit // 2)
    budget = parse_size(split.block_size, f"{config.origin(key)}: {key}")
    if cache_limit is not None and budget > cache_limit // 2:
        log.warning("%s: %s (%s) is more than half of %s (%s): the next block cannot be fetched while the current "
                    "one trains without evicting it, so shards are fetched more than once per epoch; set %s to at "
                    "most %s, or leave it out (half the cache)", config.origin(key), key, human_bytes(budget),
                    CACHE_KEY, human_bytes(cache_limit), key, human_bytes(cache_limit // 2))
    return budget


def block_order(config: Config, split: SplitConfig, index: SampleIndex, budget: int | None,
                cache_limit: int | None = None) -> BlockShuffle | None:
    """The split's block order over its (prepared) index, logged with its blocks; None without a budget
    (the split's order is not `block`). A shard larger than the budget is a block of its own, said in
    a warning with the fix that works: with shards in an object store (`cache_limit`, the node
    cache's), a block can be fetched while the one before it trains only where two fit the cache."""
    if budget is None:
        return None
    if index.ranges is None:
        raise ConfigError(f"{config.origin(f'{split.name}.shuffle')}: {split.name}.shuffle: block reads the split's "
                          f"shards block by block, and its samples are files of their own; set {split.name}.shuffle: "
                          f"true, or pack the split into shards with `fastloader pack`")
    shuffle = BlockShuffle(Containers.of(index.ranges), budget)
    containers, why = shuffle.containers, _budget_from(config, split)
    total = int(containers.sizes.sum())
    noun = container_noun(index.ranges.files[0]) if len(index.ranges.files) else "shard"
    log.info("split '%s': shuffle: block, blocks of at most %s (%s): %s of %s, %s in epoch 0", split.name,
             human_bytes(budget), why, plural(len(containers.number), noun), human_bytes(total),
             plural(len(shuffle.blocks(config.seed, 0)), "block"))
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
                f"{config.origin(f'{split.name}.shuffle')}: {split.name}.shuffle: block: "
                f"{plural(len(oversized), noun)} of the object store larger than half the node cache "
                f"({CACHE_KEY}: {human_bytes(cache_limit)}; {named}{', ...' if len(oversized) > 3 else ''}). The cache "
                f"cannot hold such a shard and the next one, so each would be fetched many times an epoch (10x "
                f"measured). Raise {CACHE_KEY} to at least {human_bytes(2 * largest)}, or repack into shards of at "
                f"most {human_bytes(cache_limit // 2)} (`fastloader pack --shard-size "
                f"{max(1, cache_limit // 2 >> 20)}MB`), or set {split.name}.shuffle: true")
        fix = f"raise {split.name}.block_size above the largest to keep every block within it"
        log.warning("split '%s': %s larger than the block budget of %s (%s), each read as a block of its own: %s%s; "
                    "%s", split.name, plural(len(oversized), noun) + (" is" if len(oversized) == 1 else " are"),
                    human_bytes(budget), why, named, " ..." if len(oversized) > 3 else "", fix)
    return shuffle


def _budget_from(config: Config, split: SplitConfig) -> str:
    """Where the budget came from, for the log."""
    key = f"{split.name}.block_size"
    return f"{key}, from {config.origin(key)}" if split.block_size is not None else f"half of {CACHE_KEY}"


def uniform_cost(config: Config, split: SplitConfig, index: SampleIndex, cache_limit: int | None) -> str | None:
    """What `shuffle: true` costs where the split's shards do not fit the node cache, and how to choose
    `block`; None where they fit, or the order is not uniform.

    In a uniform order, a shard's next sample comes after about as many reads as there are shards; an
    LRU cache holding a fraction f of the shards still holds it with probability about f (those reads
    touch 1 - e^-x of the shards, below f for x < -ln(1 - f), which happens with probability f). So a
    shard of m samples is fetched about 1 + (m - 1)(1 - f) times an epoch."""
    if split.shuffle is not True or cache_limit is None or index.ranges is None:
        return None
    containers = Containers.of(index.ranges)
    total = int(containers.sizes.sum())
    if total <= cache_limit or not len(containers.number):
        return None
    kept = cache_limit / total
    per_shard = float(containers.counts.mean())
    fetched = 1 + (per_shard - 1) * (1 - kept)
    return (f"split '{split.name}': {split.name}.shuffle: true reads samples in a uniform order, and its "
            f"{plural(len(containers.number), 'shard')} ({human_bytes(total)}) do not fit {CACHE_KEY} "
            f"({human_bytes(cache_limit)}): each shard is fetched about {fetched:,.0f} times an epoch (once per "
            f"sample, less the {kept:.0%} the cache keeps), {human_bytes(int(total * fetched))} in all. Set "
            f"{split.name}.shuffle: block to fetch each shard once an epoch: blocks of half the cache "
            f"({human_bytes(cache_limit // 2)}) by default, {split.name}.block_size to choose (docs/semantics.md, "
            f"the block order)")


def read_ahead_cost(config: Config, split: SplitConfig, index: SampleIndex, blocks: BlockShuffle | None,
                    ahead: int) -> str | None:
    """What reading `ahead` samples (all ranks together) ahead of the trainer costs a block order over
    shards in an object store whose blocks hold fewer samples; None where they hold more, or the
    shards are local (reading them ahead costs nothing).

    The node cache holds two blocks: the one the trainer reads and the next, fetched while it trains.
    Workers that read further ahead reach a third block, whose shards are fetched outside that plan
    and evicted before the trainer gets there: fetched twice an epoch, or more."""
    if blocks is None or index.ranges is None or not len(index.ranges.files) or not is_remote(index.ranges.files[0]):
        return None
    ends = [block.end for block in blocks.blocks(config.seed, 0)]
    if len(ends) < 3:
        return None
    smallest = min(b - a for a, b in zip([0] + ends[:-1], ends))
    if ahead <= smallest:
        return None
    key = f"{split.name}.block_size" if split.block_size is not None else CACHE_KEY
    return (f"split '{split.name}': the loader reads up to {ahead:,} samples ahead of the trainer (prefetch depth x "
            f"batch size x ranks), more than the smallest of its blocks holds ({smallest:,} samples): shards of the "
            f"blocks after the next are fetched before the cache can keep them, so some are fetched twice an epoch. "
            f"Raise {key} (blocks of more samples), or lower workers.num_workers or workers.prefetch_factor")
