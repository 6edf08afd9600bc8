"""A split held out of another (`val: {held_out: {of: train, fraction: 0.1}}`): which samples it takes.

Class by class, each sample of the other split gets a key drawn from the holdout's seed and the
sample's name (a CRC of its name, so the same in every process: Python's hash() is salted); the
holdout takes the class's samples of lowest key, the other split the rest. So the choice is a pure
function of (seed, names, labels): the same on every rank, on both backends (both read the split's
index from build_index) and in a resumed run, and a file added to a class moves no other class's
choice. Several holdouts of one split choose in the config's order, each from what the earlier
left, so they are disjoint too. Every class keeps at least one sample in the other split.
"""
from __future__ import annotations

import logging
import zlib
from typing import NamedTuple

import numpy as np

from ..order import seeded_uniform
from ..samples import SampleIndex
from ..words import plural

log = logging.getLogger("fastloader")

_HOLDOUT_SALT = 0x401D0
"""The holdout's own stream of seeded_uniform, apart from every draw of the samples' augmentations."""


class Holdout(NamedTuple):
    """One split's `held_out`, as values (the config is read where it is made, sources/formats.py)."""
    name: str
    """The split held out."""
    of: str
    """The split it is held out of."""
    fraction: float | None
    count: int | None
    seed: int
    """Its own seed, else the config's."""
    own_seed: bool
    """Whether `seed` is the holdout's own (`held_out.seed`) rather than the config's."""


def held_out(holdouts: list[Holdout], of: str, index: SampleIndex, announce: str = "") -> dict[str, np.ndarray]:
    """Each split held out of split `of` (`holdouts`: those of the config, in its order, the order
    they choose in) -> the positions in `of`'s whole index it takes (sorted). `announce`: the split
    whose choice is logged (the holdout being built; its train split says nothing)."""
    taken = np.zeros(len(index), dtype=bool)
    sizes = index.class_counts()
    chosen: dict[str, np.ndarray] = {}
    names = _name_hashes(index)
    for holdout in (holdout for holdout in holdouts if holdout.of == of):
        seed = holdout.seed
        left = np.bincount(index.labels[~taken], minlength=len(sizes))
        wanted = _wanted(holdout, sizes)
        share = np.minimum(wanted, np.maximum(left - 1, 0))  # a class keeps one sample in `of`
        keys = seeded_uniform(names ^ np.uint64(seed), _HOLDOUT_SALT, 1)[:, 0]
        free = np.flatnonzero(~taken)
        ranked = free[np.lexsort((free, keys[free], index.labels[free]))]  # by class, then key, then place
        labels = index.labels[ranked]
        starts = np.searchsorted(labels, np.arange(len(sizes)))
        rank_in_class = np.arange(len(ranked)) - starts[labels]
        positions = np.sort(ranked[rank_in_class < share[labels]])
        taken[positions] = True
        chosen[holdout.name] = positions
        if holdout.name == announce:
            _announce(holdout, index, wanted, share, len(positions))
    return chosen


def _name_hashes(index: SampleIndex) -> np.ndarray:
    """uint64 [n]: the CRC-32 of each sample's name relative to the split's root (where the dataset is
    mounted changes nothing), the same in every process."""
    raw, offsets = memoryview(index.path_bytes), index.offsets.tolist()
    return np.array([zlib.crc32(raw[start:end]) for start, end in zip(offsets[:-1], offsets[1:])], dtype=np.uint64)


def _wanted(holdout: Holdout, sizes: np.ndarray) -> np.ndarray:
    """Samples of each class the holdout asks for: its count, or its fraction of the class rounded
    (at least one of a class of two or more, so that a small class is not left out of it)."""
    if holdout.count is not None:
        return np.full(len(sizes), holdout.count, dtype=np.int64)
    rounded = np.floor(sizes * holdout.fraction + 0.5).astype(np.int64)
    return np.where(sizes >= 2, np.maximum(rounded, 1), 0)


def _announce(holdout: Holdout, index: SampleIndex, wanted: np.ndarray, share: np.ndarray, total: int) -> None:
    """The log's word on the choice, and a WARNING where a class could not give what was asked."""
    asked = f"{holdout.fraction:g}" if holdout.fraction is not None else plural(holdout.count, "sample")
    whose = "" if holdout.own_seed else ", the config's"
    log.info("split '%s': %s held out of split '%s' (%s of each class, seed %d%s), which reads the other %d",
             holdout.name, plural(total, "sample"), holdout.of, asked, holdout.seed, whose, len(index) - total)
    short = np.flatnonzero((share < wanted) & (index.class_counts() > 0))
    if len(short):
        named = ", ".join(f"{index.classes[c]!r} ({share[c]} of {wanted[c]})" for c in short[:5])
        log.warning("split '%s': %s of split '%s' %s too few samples to hold out what %s.held_out asks and keep one "
                    "in '%s': %s%s", holdout.name, plural(len(short), "class"), holdout.of,
                    "has" if len(short) == 1 else "have", holdout.name, holdout.of, named,
                    " ..." if len(short) > 5 else "")


def part_of(holdouts: list[Holdout], split: str, whole: SampleIndex) -> SampleIndex:
    """The samples of held-out split `split`: its share of its `of` split's whole index."""
    [holdout] = [holdout for holdout in holdouts if holdout.name == split]
    return whole.take(held_out(holdouts, holdout.of, whole, announce=split)[split])


def rest_of(holdouts: list[Holdout], split: str, whole: SampleIndex) -> SampleIndex:
    """Split `split`'s samples less those held out of it (itself where no split is held out of it)."""
    if not any(holdout.of == split for holdout in holdouts):
        return whole
    chosen = held_out(holdouts, split, whole)
    keep = np.ones(len(whole), dtype=bool)
    for positions in chosen.values():
        keep[positions] = False
    return whole.take(np.flatnonzero(keep))
