"""What a loader says of itself, in the same words for both backends: its repr, the start-up line,
what its build found about the split's plan, and each epoch's stats line.
"""
from __future__ import annotations

import logging

from .loader_setup import LoaderSetup
from .stats import LOG_LEVELS, LoaderStats
from .weights import class_shares
from .words import plural

log = logging.getLogger("fastloader")


def say_plan(loader: LoaderSetup, weighted: bool) -> None:
    """At the build: what of the split's plan a user may not expect (colour jitter off under a
    policy, no batch per epoch, samples repeated to even the ranks, an epoch_size's passes; not
    `weighted`: its draws were said when the split was prepared)."""
    config, split, index, ranks, order = loader.config, loader.split, loader.index, loader.ranks, loader.order
    policy = loader.augmentation.policy if loader.augmentation else None
    if policy and not policy.keeps_color_jitter and split.transform.color_jitter is not None:
        log.info("%s: %s.transform.color_jitter is off because %s.transform.auto_augment is set, as in timm",
                 config.source, split.name, split.name)
    if order.num_batches == 0:
        key = f"{split.name}.batch_size{'s (their smallest)' if split.batch_sizes else ''}"
        log.warning("%s: split '%s' yields no batch per epoch on rank %d: %d samples, batch_size %d x "
                    "world_size %d with drop_last: true; lower %s or set %s.drop_last: false",
                    config.source, split.name, ranks.rank, len(index),
                    min(split.batch_sizes or [split.batch_size]), ranks.world_size, key, split.name)
    if order.padded:
        log.info("split '%s': %s repeated per epoch so that %d ranks yield equal batches",
                 split.name, plural(order.padded, "sample"), ranks.world_size)
    if split.epoch_size is not None and not weighted:
        log.info("split '%s': %s.epoch_size %d: %s, %.3g passes over its %s, each in a new order",
                 split.name, split.name, split.epoch_size, describe_draws(loader),
                 split.epoch_size / max(1, len(index)), plural(len(index), "sample"))


def describe_draws(loader: LoaderSetup) -> str:
    """What an epoch draws, for the epoch's line: weighted draws and the class shares they give, or
    passes of an epoch_size; empty for a plain permutation."""
    draws = loader.order.draws
    if draws is not None:
        return (f"{plural(draws.size, 'weighted draw')} an epoch ({draws.origin}; expected class shares: "
                f"{class_shares(loader.index, draws.probabilities)})")
    if loader.split.epoch_size is not None:
        return f"{loader.order.length} positions an epoch"
    return ""


def say_stats(loader: LoaderSetup, stats: LoaderStats) -> None:
    """An epoch's stats line, at the level config.stats.log_level asks (none: not said)."""
    level = LOG_LEVELS.get(loader.config.stats.log_level)
    if level is not None and stats.batches:
        log.log(level, "%s loader, split '%s', epoch %d, rank %d: %s%s", loader.backend, loader.split.name,
                stats.epoch, loader.ranks.rank, stats.summary(), recipe_words(loader, stats.epoch))


def recipe_words(loader: LoaderSetup, epoch: int | None = None) -> str:
    """'; size ...; mixing ..., repeated augmentation ...' when they are on, for the epoch's line."""
    mixer = loader.finisher.mixer if loader.finisher is not None else None
    resolution, order = loader.resolution, loader.order
    words = [resolution.describe(epoch)] if resolution and not resolution.fixed else []
    words += [mixer.describe()] if mixer is not None else []
    draws = describe_draws(loader)
    if draws:
        words.append(draws)
    if order.repeats > 1:
        words.append(f"repeated augmentation x{order.repeats} ({order.epoch_length} positions "
                     f"per epoch over {plural(loader.ranks.world_size, 'rank')})")
    return "".join(f"; {w}" for w in words)


def announce(loader: LoaderSetup) -> None:
    """Once the backend has built itself: log the repr, the one line that says what this loader
    is and where its pixels come from (both backends, the same words)."""
    augmentation, views = loader.augmentation, loader.views
    ops = f"; augmentation: {augmentation.describe()}" if augmentation and augmentation.slots else ""
    hooks = "".join(f"; {hook.label}" for hook in loader.hooks.all())
    if views is not None:  # each group on a line of its own: one line of them all ran to 1,200 characters
        ops = ""
    log.info("%r; ranks: %s%s%s", loader, loader.ranks.source, ops, hooks)
    for g in views.groups if views is not None else ():
        log.info("split '%s': views %s: %d x %d px, scale %s, augmentation: %s", loader.split.name, g.name, g.count,
                 g.size, list(g.split.transform.scale), g.augmenter.describe())


def loader_repr(loader: LoaderSetup, parallelism: str, size: int, closed: bool) -> str:
    """What the loader is doing, so that `print(loader)` answers "which backend, where, how wide":
    `parallelism` in the backend's words, `size` the current epoch's."""
    split = loader.split
    sizes = loader.resolution and loader.resolution.per_batch
    shape = f"sizes={split.transform.sizes!r}" if sizes else f"size={size}"
    if split.batch_sizes:
        shape += f", batch_sizes={split.batch_sizes!r}"
    shape = f"views=[{loader.views.describe()}]" if loader.views else shape
    return (f"{type(loader).__name__}(split={split.name!r}, backend={loader.backend!r}, {parallelism}, "
            f"device={str(loader.device)!r}, {shape}, samples={loader.num_samples}, batches={len(loader)} of "
            f"{loader.batch_size}, rank={loader.ranks.rank}/{loader.ranks.world_size}, pixels from "
            f"{loader.pixels_from}{_ops_words(loader)}{', closed' if closed else ''})")


def _ops_words(loader: LoaderSetup) -> str:
    """The policy (or colour jitter) a train split applies, for repr."""
    t = loader.split.transform
    if not loader.augmentation or not loader.augmentation.slots or loader.views:
        return ""
    return f", auto_augment={t.auto_augment!r}" if t.auto_augment else f", color_jitter={t.color_jitter!r}"
