"""The output size of each train batch: the transform's size, a ramp over the epochs
(`progressive`, FFCV's start_ramp / end_ramp), or one size drawn per batch (`sizes`, timm's
--train-img-sizes), with a batch size of its own where `<split>.batch_sizes` pairs one with each
(timm's batch_size_choices: the same memory a step). A pure function of (config, seed, epoch,
step), so that every rank, both backends and a resumed run give a batch the same size; the sampler
carries it with each batch (fastloader.order: a third column of the planned batch) to whichever
backend decodes it.
"""
from __future__ import annotations

import numpy as np

from .order import seeded_uniform
from .schema import TransformConfig

_SIZE_SALT = 0x512E5
_MIX = (0x9E3779B1, 0x85EBCA77)
_MAKEUP_SALT = 0xBA7C5
_STEP_ORDER_SALT = 0x57E95


def ramp_size(epoch: int, min_size: int, size: int, start_epoch: int, end_epoch: int, multiple: int) -> int:
    """FFCV's ramp: min_size up to start_epoch, size from end_epoch, linear between them, rounded down
    to `multiple` (never below min_size, never above size)."""
    if epoch <= start_epoch:
        return min_size
    if epoch >= end_epoch:
        return size
    linear = min_size + (size - min_size) * (epoch - start_epoch) / (end_epoch - start_epoch)
    return int(min(size, max(min_size, linear // multiple * multiple)))


class Resolution:
    """A train split's size schedule (TransformConfig's size, progressive, sizes)."""

    def __init__(self, transform: TransformConfig, seed: int, batch_sizes: tuple[int, ...] | None = None):
        self.size, self.ramp, self.choices = transform.size, transform.progressive, transform.sizes
        self.seed = int(seed)
        self.batch_sizes = batch_sizes
        """One batch size per size of `choices` (a split's batch_sizes), else None: one batch size."""

    @property
    def fixed(self) -> bool:
        """Every batch at transform.size: no column of sizes travels with the batches."""
        return self.ramp is None and self.choices is None

    @property
    def per_batch(self) -> bool:
        return self.choices is not None

    @property
    def largest(self) -> int:
        """The largest size any batch gets: what buffers are sized for."""
        return max(self.choices) if self.choices else self.size

    def epoch_size(self, epoch: int) -> int:
        """The size of the epoch's batches; with a size per batch, the largest they may have."""
        if self.ramp is not None:
            r = self.ramp
            return ramp_size(epoch, r.min_size, self.size, r.start_epoch, r.end_epoch, r.multiple)
        return self.largest

    def step_sizes(self, epoch: int, steps: np.ndarray) -> np.ndarray:
        """int64 [len(steps)]: the size of each global step of the epoch (a step: one batch on every
        rank, so all ranks draw the same size for it)."""
        steps = np.asarray(steps, dtype=np.int64)
        if self.choices is None:
            return np.full(len(steps), self.epoch_size(epoch), dtype=np.int64)
        salt = (self.seed * _MIX[0] + int(epoch) * _MIX[1] + _SIZE_SALT) % (1 << 63)
        u = seeded_uniform(steps, salt, 1)[:, 0]
        choice = np.minimum(np.floor(u * len(self.choices)), len(self.choices) - 1).astype(np.int64)
        return np.asarray(self.choices, dtype=np.int64)[choice]

    def steps(self, epoch: int, budget: int, drop_last: bool) -> tuple[np.ndarray, np.ndarray]:
        """With batch sizes paired with the sizes: the steps that take `budget` samples of each rank,
        as (output size, batch size) per step, int64 arrays in the order the epoch takes them.

        The steps' make-up is timm's sample budget: each pair has as many steps as the others
        (budget // the sum of the batch sizes), and what is left is filled with steps of pairs that
        still fit, drawn from the seed; fewer samples than the smallest batch size are left out
        (drop_last), or, without drop_last, make one last, smaller step at the smallest batch's size.
        The make-up depends on (seed, budget) only, so every epoch has as many steps; their order is
        a permutation drawn from (seed, epoch), the same on every rank (the budget is)."""
        sizes, batch = np.asarray(self.choices, dtype=np.int64), np.asarray(self.batch_sizes, dtype=np.int64)
        counts = np.full(len(batch), budget // int(batch.sum()), dtype=np.int64)
        left = budget - int((counts * batch).sum())
        rng = np.random.default_rng([self.seed, budget, _MAKEUP_SALT])
        while (fit := np.flatnonzero(batch <= left)).size:
            pick = int(fit[rng.integers(fit.size)])
            counts[pick] += 1
            left -= int(batch[pick])
        pairs = np.repeat(np.arange(len(batch)), counts)
        order = np.random.default_rng([self.seed, int(epoch), 0, _STEP_ORDER_SALT])  # 0: the orders drawn so far
        pairs = pairs[order.permutation(pairs.size)]
        step_sizes, step_batches = sizes[pairs], batch[pairs]
        if left and not drop_last:
            smallest = int(np.argmin(batch))
            step_sizes, step_batches = np.append(step_sizes, sizes[smallest]), np.append(step_batches, left)
        return step_sizes, step_batches

    def describe(self, epoch: int | None = None) -> str:
        """For logs: 'size 160 px', or the schedule."""
        if self.batch_sizes is not None:
            pairs = ", ".join(f"{size} px x {batch}" for size, batch in zip(self.choices, self.batch_sizes))
            return f"a size and batch size per step from {pairs} (every rank alike)"
        if self.choices is not None:
            return f"a size per batch from {', '.join(map(str, self.choices))} px (drawn per step, every rank alike)"
        if self.ramp is None:
            return f"size {self.size} px"
        r = self.ramp
        now = f"size {self.epoch_size(epoch)} px; " if epoch is not None else ""
        return (f"{now}progressive {r.min_size} px up to epoch {r.start_epoch}, {self.size} px from epoch "
                f"{r.end_epoch}, multiples of {r.multiple} between")

    def key(self) -> str:
        """What a loader state records: another schedule would replay other sizes."""
        if self.batch_sizes is not None:
            return "sizes " + ",".join(f"{size}x{batch}" for size, batch in zip(self.choices, self.batch_sizes))
        if self.choices is not None:
            return "sizes " + ",".join(map(str, self.choices))
        if self.ramp is None:
            return f"size {self.size}"
        r = self.ramp
        return f"progressive {r.min_size}-{self.size} e{r.start_epoch}-e{r.end_epoch} /{r.multiple}"
