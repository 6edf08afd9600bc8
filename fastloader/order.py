"""The sampler both backends share: which samples, in which order, on which rank, in which batch.

Everything is a pure function of (seed, epoch, rank, world size), so an epoch can be replayed
exactly: by another backend, after a restart (resume from a batch offset), with another number of
workers. Each sample also gets its own augmentation seed from (seed, epoch, sample index), so
random crops do not depend on which worker decodes the sample.

Train mode: every rank yields the same number of batches (DDP must not hang). With drop_last the
epoch keeps the largest multiple of world_size x batch_size (drops fewer than that many samples);
without it, the order is padded by wrapping around so that every rank gets ceil(N / world) samples.
Eval mode: rank r takes samples r, r + world, ...; every sample exactly once, partial last batch.

Files that fail at decode time never change the number of batches (DDP must not hang): a train slot
is refilled with a substitute drawn from its seed (`substitutes`), an eval batch comes out shorter,
empty where none of its files decodes.

A resume names a position in the epoch's global order (samples consumed by all ranks together), not a
rank's batch count, so the rest of an epoch can be replayed on the same ranks or re-sharded over others.

Repeated augmentation (`repeats` K > 1, train mode) follows DeiT's RASampler and timm's RepeatAugSampler:
the epoch's global order is the permutation with each sample repeated K times in a row, so that ranks
dealt round-robin get the K copies of a sample on K different ranks when world_size >= K. Each copy has
its own augmentation seed, from (seed, epoch, sample, copy). The epoch keeps about N samples in all,
timm's default (equal to DeiT's for N >= 256): floor(N // 256 * 256 / world) per rank, or ceil(N / world)
when N < 256 (where DeiT's formula would give an empty epoch), at most ceil(N x K / world). So an epoch
sees about N / K distinct samples, K times each, and a schedule written for the recipe keeps its steps.

The epoch's order is one of five strategies, each a pure function of (seed, epoch): the samples in
index order (`shuffle` false), a uniform permutation (true), the block order ("block", `BlockShuffle`):
the containers (tar shards) shuffled, cut into consecutive blocks whose bytes fit a budget, the
samples shuffled within each block (every rank deals from the same permutation, so all ranks read
the same block at the same time, and a cache of two blocks fetches each shard once per epoch);
`Passes` (`epoch_size` without weights): consecutive passes of one of the first two, cut to the
epoch's size; `WeightedDraws` (weights, class weights, weighted sources): `epoch_size` draws with
replacement in proportion to each sample's weight. A sample an order holds more than once (a later
pass, another draw) gets another augmentation seed at each place, from its draw number, as a copy
of repeated augmentation does; a permutation's seeds are those of (seed, epoch, sample) alone.
"""
from __future__ import annotations

import hashlib
import math
from typing import Callable, NamedTuple

import numpy as np

_MASK63 = np.uint64(0x7FFF_FFFF_FFFF_FFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_BLOCK_SALT = 0xB10C
"""Keeps the block order's random stream apart from the uniform permutation's (0xF457)."""
_DRAW_SALT = 0xD4A3
"""Keeps the weighted draws' random stream apart from the permutations'."""
_PASS_MIX = np.uint64(0xA0761D6478BD642F)
"""Mixes a pass number into the seed of that pass's order (Passes)."""
_DRAW_MIX = np.uint64(0xC2B2AE3D27D4EB4F)
"""Mixes a draw number into a sample's augmentation seed, apart from the copy number's (_GOLDEN)."""
REPEAT_ROUND = 256
"""DeiT's RASampler keeps floor(N // 256 * 256 / world) samples per rank (timm's selected_round)."""
SUBSTITUTE_TRIES = 8
"""Train mode: how many substitutes a slot whose file fails at decode time tries before it is left
empty (each fails only where it too cannot be decoded)."""
_SUBSTITUTE_SALT = 0x5B5717


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """A strong 64-bit mixer: nearby inputs give unrelated outputs."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def seeded_uniform(seeds: np.ndarray, salt: int, count: int) -> np.ndarray:
    """`count` uniform floats in [0, 1) per seed (float64 [len(seeds), count]): a pure function of
    (seed, salt), so augmentations drawn from it replay exactly, batched, without a Python loop."""
    base = _splitmix64(seeds.astype(np.uint64) ^ _splitmix64(np.full(1, salt, dtype=np.uint64)))
    with np.errstate(over="ignore"):
        streams = base[:, None] + np.arange(1, count + 1, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03)
    return (_splitmix64(streams) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def derived_seeds(seeds: np.ndarray, salt: int, count: int) -> np.ndarray:
    """`count` new seeds per seed (int64 [count, len(seeds)], each in [0, 2**63)): a pure function of
    (seed, salt, index), unrelated to the seed's own draws (a sample's views, fastloader.views)."""
    keys = _splitmix64(np.full(count, salt, dtype=np.uint64) + np.arange(count, dtype=np.uint64))
    mixed = _splitmix64(np.asarray(seeds, dtype=np.int64).astype(np.uint64)[None, :] ^ keys[:, None])
    return (mixed >> np.uint64(1)).astype(np.int64)


def substitutes(seed: int, num_samples: int, draws: WeightedDraws | None = None) -> list[int]:
    """The samples that may take a train slot's place, in the order they are tried, when the slot's
    file cannot be decoded: drawn from the slot's augmentation seed, so that both backends, every
    rank and a resumed run fill it alike; uniformly from the split, or by the split's weighted
    `draws` where it has them (so a sample of weight 0 never fills a slot, and the classes keep the
    shares the weights give). The substitute keeps the slot's seed (its crop, flips, ops, erasing and
    mixing are the slot's), so a batch keeps its size and its draws; only the sample, and so the
    pixels and label, change."""
    uniform = seeded_uniform(np.array([seed], dtype=np.int64), _SUBSTITUTE_SALT, SUBSTITUTE_TRIES)[0]
    if draws is not None:
        return draws.pick(uniform).tolist()
    return np.minimum((uniform * num_samples).astype(np.int64), num_samples - 1).tolist()


def output_size(batch: np.ndarray, default: int) -> int:
    """A planned batch's output size: its third column where a size schedule planned it
    (fastloader.resolution), else `default` (the transform's size)."""
    return int(batch[0, 2]) if batch.ndim == 2 and batch.shape[1] > 2 and len(batch) else default


def in_index_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """`shuffle: false`: the samples as the index lists them (int64 [n])."""
    return np.arange(n, dtype=np.int64)


def uniform_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """`shuffle: true`: a new uniform permutation every epoch (int64 [n])."""
    return np.random.default_rng([seed, epoch, 0xF457]).permutation(n).astype(np.int64, copy=False)


class Containers:
    """The samples of an index grouped by container (tar shard): which containers hold samples, how
    many each, and each one's bytes: its extent in the index, up to the end of its last sample's byte
    range, so that the same shards measure the same wherever they are stored. A few numpy passes."""

    def __init__(self, container: np.ndarray, start: np.ndarray, length: np.ndarray):
        container = np.asarray(container, dtype=np.int64)
        grouped = bool(np.all(container[1:] >= container[:-1]))  # tar shards: samples in shard order
        self.members = None if grouped else np.argsort(container, kind="stable")
        """The samples grouped by container (None: they already are, in index order)."""
        ordered = container if grouped else container[self.members]
        ends = np.asarray(start, dtype=np.int64) + np.asarray(length, dtype=np.int64)
        ends = ends if grouped else ends[self.members]
        first = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if len(ordered) else np.zeros(0, np.int64)
        self.number = ordered[first]
        """The containers holding samples, by number (ByteRanges.files)."""
        self.first = first
        """Where each container's samples begin among the grouped samples."""
        self.counts = np.diff(np.r_[first, len(ordered)]).astype(np.int64)
        """Samples in each container."""
        self.sizes = np.maximum.reduceat(ends, first) if len(first) else np.zeros(0, np.int64)
        """Bytes of each container: up to the end of its last sample (`of` takes the whole file's)."""
        self.num_samples = len(container)
        self.file_of: np.ndarray | None = None
        """Each container's file (ByteRanges.files) where containers are row groups (`_row_groups`);
        None: the containers are the files."""

    @classmethod
    def of(cls, ranges) -> "Containers":
        """The containers of an index's byte ranges (samples.ByteRanges: any container format). Where
        the index knows each container's file (its identity: local or in an object store alike), a
        container's bytes are the whole file's, as a node cache holds it: tar headers, label members
        and padding too, which small shards' budgets must count or the next block does not fit."""
        table_row = getattr(ranges, "table_row", None)
        if table_row is not None and np.any(table_row):
            return cls._row_groups(ranges, table_row)
        containers = cls(ranges.file, ranges.start, ranges.length)
        if getattr(ranges, "identities", None) is not None and len(containers.number):
            whole = np.array([identity.size for identity in ranges.identities], dtype=np.int64)
            containers.sizes = np.maximum(containers.sizes, whole[containers.number])
        return containers

    @classmethod
    def _row_groups(cls, ranges, table_row: np.ndarray) -> "Containers":
        """Parquet rows read with their row group (compressed pages): each row group is a container of
        its image column chunk's bytes, so that a block reads each row group once; rows read by byte
        range are grouped by file. `file_of` gives each container's file."""
        file = np.asarray(ranges.file, dtype=np.int64)
        chunk = np.where(table_row > 0, ranges.start, -1)
        new = np.r_[True, (file[1:] != file[:-1]) | (chunk[1:] != chunk[:-1])] if len(file) else np.zeros(0, bool)
        group = np.cumsum(new) - 1
        ends = np.where(table_row > 0, ranges.length, ranges.start + ranges.length)
        containers = cls(group, np.zeros_like(ends), ends)
        containers.file_of = file[new]
        return containers


class Block(NamedTuple):
    shards: np.ndarray
    """The containers (by number, ByteRanges.files) the block reads."""
    end: int
    """Where the block ends in the epoch's permutation: its samples are the positions before this one
    and after the previous block's end (with aug_repeats K, positions of the repeated order / K)."""


class BlockShuffle:
    """`shuffle: block`: the containers shuffled, cut into consecutive blocks of at most `budget` bytes
    (a container larger than the budget is a block of its own), the samples shuffled within each block.
    Containers holding no sample of the index are left out. Each epoch's order costs a shuffle of the
    containers, a Python step per block and one shuffle of the samples.
    """

    def __init__(self, containers: Containers, budget: int):
        if budget < 1:
            raise ValueError(f"the block budget must be at least 1 byte, got {budget}")
        self.containers, self.budget = containers, int(budget)

    def __len__(self) -> int:
        return self.containers.num_samples

    @property
    def oversized(self) -> np.ndarray:
        """The containers larger than the budget (by number): each a block of its own."""
        return self.containers.number[self.containers.sizes > self.budget]

    def blocks(self, seed: int, epoch: int) -> list[Block]:
        """The epoch's blocks, in the order they are read: what a cache fetches ahead, and when."""
        shuffled, ends = self._cut(np.random.default_rng([seed, epoch, _BLOCK_SALT]))
        last = np.cumsum(self.containers.counts[shuffled])[ends - 1] if len(ends) else ends
        return [Block(self.containers.number[shuffled[a:b]], int(end))
                for a, b, end in zip(np.r_[0, ends[:-1]], ends, last)]

    def __call__(self, seed: int, epoch: int, n: int) -> np.ndarray:
        """The epoch's permutation of the samples (int64 [n]): block by block, shuffled within each."""
        if n != len(self):
            raise ValueError(f"the block order was made for {len(self)} samples, not {n}")
        rng = np.random.default_rng([seed, epoch, _BLOCK_SALT])
        shuffled, ends = self._cut(rng)
        counts = self.containers.counts[shuffled]
        begins = np.cumsum(counts) - counts  # where each container's samples go in the epoch's order
        order = np.repeat(self.containers.first[shuffled] - begins, counts) + np.arange(n, dtype=np.int64)
        if self.containers.members is not None:
            order = self.containers.members[order]
        bounds = np.r_[0, np.cumsum(counts)[ends - 1]] if len(ends) else np.zeros(1, np.int64)
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            rng.shuffle(order[a:b])
        return order

    def _cut(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(the containers' positions, shuffled; the end of each block among them): greedily, a
        block takes the next containers while their bytes fit the budget, and at least one."""
        shuffled = rng.permutation(len(self.containers.number))
        total = np.cumsum(self.containers.sizes[shuffled])
        ends, at, before = [], 0, 0
        while at < len(shuffled):
            at = max(at + 1, int(np.searchsorted(total, before + self.budget, side="right")))
            ends.append(at)
            before = int(total[at - 1])
        return shuffled, np.array(ends, dtype=np.int64)


Permutation = Callable[[int, int, int], np.ndarray]
"""(seed, epoch, samples) -> the epoch's order of the samples, before sharding (int64). A strategy
with a `size` gives that many positions (an epoch size); one with `draw_numbers` may hold a sample
more than once, and numbers each place for its augmentation seed."""


def _pass_seed(seed: int, number: int) -> int:
    """The seed of pass `number` > 0 of Passes: unrelated to the run's seed and to other passes'."""
    with np.errstate(over="ignore"):
        mixed = _splitmix64(np.array([seed], dtype=np.uint64) ^ (np.uint64(number) * _PASS_MIX))
    return int(mixed[0] & _MASK63)


class Passes:
    """`<split>.epoch_size` without weights: `size` positions of consecutive passes over the samples,
    each pass a fresh order of `base` (torch's RandomSampler with num_samples and no replacement):
    every sample at most ceil(size / n) times an epoch. The first pass is `base`'s own order, so an
    epoch_size below the split's size reads the first positions of today's order, with today's seeds."""

    def __init__(self, base: Permutation, size: int):
        if size < 1:
            raise ValueError(f"an epoch size must be at least 1, got {size}")
        self.base, self.size = base, int(size)

    def __call__(self, seed: int, epoch: int, n: int) -> np.ndarray:
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        passes = -(-self.size // n)
        orders = [self.base(seed if number == 0 else _pass_seed(seed, number), epoch, n) for number in range(passes)]
        return np.concatenate(orders)[:self.size]

    def draw_numbers(self, places: np.ndarray, n: int) -> np.ndarray:
        """Each place's pass: 0 keeps a sample's seed of the plain order."""
        return places // max(n, 1)


class WeightedDraws:
    """Weighted sampling with replacement: `size` draws an epoch, sample i with probability w_i / sum(w).

    The draws are sorted uniforms (exponential spacings, summed) located in the weights' cumulative
    sum by one search, then shuffled: the same law as independent draws, but the search walks the
    cumulative sum in order instead of jumping about it (at 10M samples, 0.9 s instead of 16 s;
    docs/performance.md). Kept between epochs: the cumulative sum, 8 bytes a sample.
    """

    def __init__(self, weights: np.ndarray, size: int, origin: str = "weights"):
        weights = np.asarray(weights, dtype=np.float64)
        if weights.ndim != 1 or not len(weights):
            raise ValueError("weighted draws need one weight per sample, and at least one sample")
        if not np.isfinite(weights).all() or (weights < 0).any():
            raise ValueError("sample weights must be finite and >= 0")
        if size < 1:
            raise ValueError(f"an epoch size must be at least 1, got {size}")
        self.cumulative = np.cumsum(weights)
        """float64 [n]: the weights' running sum; sample i owns [cumulative[i-1], cumulative[i])."""
        self.total = float(self.cumulative[-1])
        if not self.total > 0 or not np.isfinite(self.total):
            raise ValueError("sample weights must not all be 0, and their sum must be finite")
        self.last = int(np.flatnonzero(weights)[-1])
        """The last sample with a weight above 0: where a draw rounded up to the total goes."""
        self.size = int(size)
        self.origin = origin
        """The config keys that set the weights, for messages."""
        digest = hashlib.blake2b(np.ascontiguousarray(self.cumulative).data, digest_size=8)
        self.digest = digest.hexdigest()
        """What a loader state records, so that a resume with other weights is refused."""

    def __len__(self) -> int:
        return len(self.cumulative)

    @property
    def probabilities(self) -> np.ndarray:
        """float64 [n]: each sample's chance per draw."""
        return np.diff(self.cumulative, prepend=0.0) / self.total

    def __call__(self, seed: int, epoch: int, n: int) -> np.ndarray:
        if n != len(self):
            raise ValueError(f"the weights were made for {len(self)} samples, not {n}")
        rng = np.random.default_rng([seed, epoch, _DRAW_SALT])
        spacing = rng.standard_exponential(self.size + 1)
        np.cumsum(spacing, out=spacing)
        targets = spacing[:-1]
        targets *= self.total / spacing[-1]
        drawn = np.searchsorted(self.cumulative, targets, side="right").astype(np.int64, copy=False)
        np.minimum(drawn, self.last, out=drawn)
        rng.shuffle(drawn)
        return drawn

    def pick(self, uniform: np.ndarray) -> np.ndarray:
        """int64: the sample each uniform float in [0, 1) lands on, in proportion to the weights."""
        picked = np.searchsorted(self.cumulative, uniform * self.total, side="right").astype(np.int64)
        return np.minimum(picked, self.last)

    def draw_numbers(self, places: np.ndarray, n: int) -> np.ndarray:
        """Each place's draw, from 1: every draw its own augmentation seed."""
        return places + 1


def choose_permutation(shuffle: bool | str, blocks: BlockShuffle | None, draws: WeightedDraws | None = None,
                       epoch_size: int | None = None) -> Permutation:
    """The order `shuffle` names: false, true or "block" (which needs the index's `blocks`); weighted
    `draws` instead (with shuffle true); passes of it cut to `epoch_size` where that is set."""
    if draws is not None:
        if shuffle is not True or blocks is not None:
            raise ValueError(f"weighted draws are a random order: they take shuffle true, without blocks; got "
                             f"shuffle {shuffle!r}{' with blocks' if blocks is not None else ''}")
        if epoch_size is not None and epoch_size != draws.size:
            raise ValueError(f"the weighted draws make {draws.size} positions an epoch, not epoch_size {epoch_size}")
        return draws
    if shuffle == "block":
        if blocks is None:
            raise ValueError("shuffle 'block' needs the index's blocks (BlockShuffle): which container each sample "
                             "is in, and the budget")
        if epoch_size is not None:
            raise ValueError("the block order reads every sample once an epoch: it takes no epoch_size")
        return blocks
    if blocks is not None or not isinstance(shuffle, bool):
        raise ValueError(f"shuffle must be true, false or 'block' (with blocks), got {shuffle!r}"
                         f"{' with blocks' if blocks is not None else ''}")
    base = uniform_permutation if shuffle else in_index_order
    return Passes(base, epoch_size) if epoch_size is not None else base


def repeated_length(length: int, repeats: int, world_size: int) -> int:
    """Positions of an epoch's global order before it is cut or padded to equal shares: `length`
    without repeated augmentation; with K = `repeats` > 1, about `length` in all (timm's
    RepeatAugSampler: REPEAT_ROUND), at most length x K."""
    if repeats == 1:
        return length
    if length >= REPEAT_ROUND:
        per_rank = length // REPEAT_ROUND * REPEAT_ROUND // world_size
    else:
        per_rank = math.ceil(length / world_size)
    return min(per_rank, math.ceil(length * repeats / world_size)) * world_size


def sample_seeds(seed: int, epoch: int, indices: np.ndarray, copies: np.ndarray | None = None,
                 draws: np.ndarray | None = None) -> np.ndarray:
    """Per-sample augmentation seeds (int64, non-negative) from (seed, epoch, sample index); for the
    copies of repeated augmentation after the first, the copy number; for a place of an order that
    may hold a sample twice (Passes after the first pass, WeightedDraws), its draw number."""
    key = _splitmix64(np.full(len(indices), seed, dtype=np.uint64))
    with np.errstate(over="ignore"):
        key = _splitmix64(key ^ np.uint64(epoch))
        key = _splitmix64(key ^ indices.astype(np.uint64))
        if draws is not None and draws.any():
            drawn = _splitmix64(key ^ (draws.astype(np.uint64) * _DRAW_MIX))
            key = np.where(draws > 0, drawn, key)
        if copies is not None and copies.any():
            copied = _splitmix64(key ^ (copies.astype(np.uint64) * _GOLDEN))
            key = np.where(copies > 0, copied, key)
    return (key & _MASK63).astype(np.int64)


class SizedSteps:
    """With a batch size per output size (`<split>.batch_sizes`): an epoch's steps, each as many
    samples per rank as its size's batch size, made from each rank's share (Resolution.steps), and
    where a resume at a global position continues them."""

    def __init__(self, resolution, epoch_length: int, drop_last: bool, world_size: int):
        self.resolution, self.epoch_length = resolution, epoch_length
        self.drop_last, self.world_size = drop_last, world_size

    def planned(self, epoch: int, world_size: int) -> tuple[np.ndarray, np.ndarray]:
        """The epoch's steps on `world_size` ranks, as (output size, batch size) per step."""
        length = self.epoch_length
        share = length // world_size if self.drop_last else math.ceil(length / world_size)
        return self.resolution.steps(epoch, share, self.drop_last)

    def after(self, epoch: int, position: int, world_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The epoch's steps after global position `position`, as (output size, batch size) per
        step, on these ranks (or `world_size`).

        A position the epoch's steps reach (a state saved by the same ranks) continues them. Another
        (saved by other ranks) falls inside a step: the rest of that step comes first, as many
        positions as it has left cut to whole rows of ranks (drop_last: the fewer than `world_size`
        over are left out; else rounded up, positions past the epoch's end wrap around as padding
        does), then the epoch's later steps. So the rest never has more steps than len(loader), and
        a state saved after it lands at an offset of fewer than `world_size` positions from the
        steps' ends, where the same rule continues it exactly (no rest of a step then)."""
        world = world_size or self.world_size
        empty = np.zeros(0, dtype=np.int64)
        if position >= self.epoch_length:
            return empty, empty
        sizes, counts = self.planned(epoch, world)
        reached = world * np.concatenate([[0], np.cumsum(counts)])
        step = int(np.searchsorted(reached, position, side="right")) - 1  # the step `position` is in
        if step >= len(counts):  # past the last step: what drop_last leaves out
            return empty, empty
        sizes, counts = sizes[step:], counts[step:].copy()
        gap = int(reached[step + 1]) - position  # the positions of that step not yet consumed
        counts[0] = gap // world if self.drop_last else -(-gap // world)
        return (sizes[1:], counts[1:]) if counts[0] == 0 else (sizes, counts)


class RankShares:
    """How an epoch's global order is dealt to the ranks and cut into batches: rank r takes global
    positions r, r + world, ...; in train mode every rank the same number of batches (DDP must not
    hang), the order cut (drop_last) or padded to get there; what a resume at a position leaves."""

    def __init__(self, epoch_length: int, cycle: int, batch_size: int, *, mode: str, drop_last: bool, rank: int,
                 world_size: int, steps: SizedSteps | None):
        self.epoch_length, self.batch_size = epoch_length, batch_size
        self.cycle = cycle
        """Positions of the (repeated) order before padding wraps around to its start."""
        self.mode, self.drop_last, self.rank, self.world_size = mode, drop_last, rank, world_size
        self.steps = steps
        """The steps of a batch size per output size (`paired`), else None: batch_size throughout."""
        if mode == "eval":
            self.samples_per_rank = len(range(rank, epoch_length, world_size))
        elif drop_last:
            self.samples_per_rank = (epoch_length // (world_size * batch_size)) * batch_size
        else:
            self.samples_per_rank = math.ceil(epoch_length / world_size)
        if drop_last:
            self.num_batches = self.samples_per_rank // batch_size
        else:
            self.num_batches = math.ceil(self.samples_per_rank / batch_size)
        if steps is not None:
            counts = steps.planned(0, world_size)[1]
            self.num_batches, self.samples_per_rank = len(counts), int(counts.sum())

    @property
    def padded(self) -> int:
        """Samples repeated this epoch (train mode without drop_last) so that ranks stay in step:
        positions past the end of the (repeated) permutation, which wrap around to its start."""
        if self.mode == "eval" or self.drop_last:
            return 0
        return max(0, self.samples_per_rank * self.world_size - self.cycle)

    @property
    def dropped(self) -> int:
        """Positions of the epoch's order left out, summed over ranks (train mode with drop_last)."""
        if self.mode == "eval" or not self.drop_last:
            return 0
        return self.epoch_length - self.samples_per_rank * self.world_size

    def shared_after(self, position: int, epoch: int = 0, world_size: int | None = None,
                     batch_size: int | None = None) -> int:
        """How many positions of the epoch's global order the ranks share once the first `position`
        are consumed: what is left, cut to whole global batches (drop_last) or padded to equal shares
        (with batch sizes per size: the rest of the epoch's steps, `epoch`'s). On these ranks and
        batch size, or on others' (`world_size`, `batch_size`: what a saved run would read)."""
        world, batch = world_size or self.world_size, batch_size or self.batch_size
        if self.steps is not None:
            return world * int(self.steps.after(epoch, position, world)[1].sum())
        left = max(0, self.epoch_length - position)
        if self.mode == "eval":
            return left
        if self.drop_last:
            return left // (world * batch) * world * batch
        return math.ceil(left / world) * world

    def advance(self, epoch: int, position: int, steps: int) -> int:
        """The global position `steps` batches (of every rank) after `position` in the epoch."""
        if self.steps is not None:
            return position + self.world_size * int(self.steps.after(epoch, position)[1][:steps].sum())
        return position + steps * self.batch_size * self.world_size

    def positions(self, epoch: int, position: int) -> np.ndarray:
        """This rank's global positions (int64) after the first `position`, in the order it yields
        them; past the (repeated) order's end they wrap around to its start (tiling a tiny dataset)."""
        shared = self.shared_after(position, epoch)
        if shared == 0 or self.cycle == 0:
            return np.zeros(0, dtype=np.int64)
        return np.arange(position + self.rank, position + shared, self.world_size, dtype=np.int64) % self.cycle


class LastBatches:
    """The last epoch's batches asked for, by (epoch, position): the DALI feed reads ahead into the
    next epoch's first batches as one ends, and the loop that then starts asks again (0.17 s for
    ImageNet's 1.28M samples on one rank)."""

    def __init__(self):
        self.asked: tuple[int, int] | None = None
        self.batches: list[np.ndarray] = []

    def get(self, epoch: int, position: int) -> list[np.ndarray] | None:
        return list(self.batches) if self.asked == (epoch, position) else None

    def keep(self, epoch: int, position: int, batches: list[np.ndarray]) -> None:
        self.asked, self.batches = (epoch, position), batches


class EpochOrder:
    """A split's sampler on one rank: the epoch's order (`choose_permutation`), dealt to the ranks
    and cut into batches (`RankShares`, with `SizedSteps` where batch sizes go by size), each sample
    with its augmentation seed (`sample_seeds`). The shares' figures read through as properties."""

    def __init__(self, num_samples: int, batch_size: int, *, mode: str, shuffle: bool | str, drop_last: bool,
                 seed: int, rank: int = 0, world_size: int = 1, repeats: int = 1,
                 blocks: BlockShuffle | None = None, draws: WeightedDraws | None = None,
                 epoch_size: int | None = None, resolution=None):
        if mode not in ("train", "eval"):
            raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
        if mode == "eval" and drop_last:
            raise ValueError("eval mode reads every sample exactly once; drop_last must be false")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} not in [0, {world_size})")
        if repeats < 1 or (mode == "eval" and repeats != 1):
            raise ValueError(f"repeats must be >= 1, and 1 in eval mode; got {repeats} in {mode} mode")
        if mode == "eval" and (draws is not None or epoch_size is not None):
            raise ValueError("eval mode reads every sample exactly once: it takes no weighted draws nor epoch_size")
        if blocks is not None and len(blocks) != num_samples:
            raise ValueError(f"the block order was made for {len(blocks)} samples, not {num_samples}")
        if draws is not None and len(draws) != num_samples:
            raise ValueError(f"the weights were made for {len(draws)} samples, not {num_samples}")
        self._permute = choose_permutation(shuffle, blocks, draws, epoch_size)
        self.blocks = blocks
        """The block order's containers and budget (shuffle: block), else None."""
        self.draws = draws
        """The weighted draws (weights, class weights, weighted sources), else None."""
        self.resolution = resolution
        """A size schedule (fastloader.resolution.Resolution, not fixed), else None: each batch then
        carries its output size as a third column, drawn from its global step."""
        self.num_samples, self.shuffle, self.seed, self.repeats = num_samples, shuffle, seed, repeats
        self.length = getattr(self._permute, "size", num_samples)
        """Positions of the epoch's order before repeats: the split's size, or its epoch_size."""
        epoch_length = repeated_length(self.length, repeats, world_size)
        paired = resolution is not None and resolution.batch_sizes is not None
        steps = SizedSteps(resolution, epoch_length, drop_last, world_size) if paired else None
        self.shares = RankShares(epoch_length, self.length * repeats, batch_size, mode=mode, drop_last=drop_last,
                                 rank=rank, world_size=world_size, steps=steps)
        """How the epoch's global order is dealt to the ranks and cut into batches."""
        self._last = LastBatches()

    def __len__(self) -> int:
        """Batches this rank yields per epoch."""
        return self.shares.num_batches

    # -- the shares' figures, as the loaders read them ----------------------------------------------

    @property
    def epoch_length(self) -> int:
        """Positions in the epoch's global order before it is cut or padded to equal shares: the
        order's length without repeats (repeated_length)."""
        return self.shares.epoch_length

    @property
    def samples_per_rank(self) -> int:
        return self.shares.samples_per_rank

    @property
    def num_batches(self) -> int:
        return self.shares.num_batches

    @property
    def padded(self) -> int:
        return self.shares.padded

    @property
    def dropped(self) -> int:
        return self.shares.dropped

    @property
    def paired(self) -> bool:
        """A batch size per output size (`<split>.batch_sizes`): the steps' sizes come from the
        resolution's make-up of each rank's share (SizedSteps), not from batch_size."""
        return self.shares.steps is not None

    @property
    def batch_size(self) -> int:
        return self.shares.batch_size

    @property
    def mode(self) -> str:
        return self.shares.mode

    @property
    def drop_last(self) -> bool:
        return self.shares.drop_last

    @property
    def rank(self) -> int:
        return self.shares.rank

    @property
    def world_size(self) -> int:
        return self.shares.world_size

    # -- the epoch's order and batches --------------------------------------------------------------

    def permutation(self, epoch: int) -> np.ndarray:
        """The whole epoch's order, before sharding (int64 [length]: the split's size, or epoch_size)."""
        return self._permute(self.seed, epoch, self.num_samples)

    def shared_after(self, position: int, epoch: int = 0, world_size: int | None = None,
                     batch_size: int | None = None) -> int:
        """RankShares.shared_after: positions the ranks share once the first `position` are consumed."""
        return self.shares.shared_after(position, epoch, world_size, batch_size)

    def steps_after(self, epoch: int, position: int, world_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """With batch sizes per size: the epoch's steps after global position `position` (SizedSteps.after)."""
        return self.shares.steps.after(epoch, position, world_size)

    def advance(self, epoch: int, position: int, steps: int) -> int:
        """The global position `steps` batches (of every rank) after `position` in the epoch."""
        return self.shares.advance(epoch, position, steps)

    def rank_positions(self, epoch: int, position: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """This rank's (sample indices, copy numbers) for the epoch, in the order they are yielded, after
        the first `position` positions of the epoch's global order (those all ranks consumed before a restart).

        Rank r takes global positions r, r + world, ...: after k batches on every rank, the ranks
        together have consumed exactly the first k x batch x world positions, whatever the world size.
        That is why a restart may re-shard the rest of an epoch over another number of ranks. Global
        position p holds copy p mod K of sample order[p // K]; positions past L x K (padding; L the
        order's length) wrap around to the start (tiling if the dataset is tiny).
        """
        indices, copies, _ = self._rank_places(epoch, position)
        return indices, copies

    def _rank_places(self, epoch: int, position: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """rank_positions, and each one's draw number where the order may hold a sample twice (else None)."""
        positions = self.shares.positions(epoch, position)
        if not len(positions):
            return positions, positions, None
        places = positions // self.repeats
        numbered = getattr(self._permute, "draw_numbers", None)
        draws = numbered(places, self.num_samples) if numbered is not None else None
        return self.permutation(epoch)[places], positions % self.repeats, draws

    def sample_seeds(self, epoch: int, indices: np.ndarray, copies: np.ndarray | None = None,
                     draws: np.ndarray | None = None) -> np.ndarray:
        """This order's seeds for the samples at `indices` (the module's sample_seeds)."""
        return sample_seeds(self.seed, epoch, indices, copies, draws)

    def batches(self, epoch: int, position: int = 0) -> list[np.ndarray]:
        """The epoch's batches after global position `position`: int64 arrays [k, 2] of
        (sample index, sample seed), or [k, 3] with each batch's output size where a size schedule
        is set. Position 0 is the whole epoch; k batches in, it is k x batch x world.

        A batch's size is a function of its global step, position // (batch x world) + its number
        here: the same on every rank, and the same after a resume at that position. With a batch
        size per size (`paired`), the batches are the epoch's steps (steps_after): each as long as
        its step's batch size. The arrays are read-only: they are kept for the next ask of the same
        epoch and position."""
        kept = self._last.get(epoch, position)
        if kept is not None:
            return kept
        indices, copies, draws = self._rank_places(epoch, position)
        columns = [indices, self.sample_seeds(epoch, indices, copies, draws)]
        batch, world = self.shares.batch_size, self.shares.world_size
        ends = range(batch, len(indices), batch)  # where each batch but the last ends
        if self.paired:
            sizes, counts = self.steps_after(epoch, position)
            columns.append(np.repeat(sizes, counts))
            ends = np.cumsum(counts)[:-1]
        elif self.resolution is not None:
            first = position // (batch * world)
            steps = first + np.arange(len(indices), dtype=np.int64) // batch
            columns.append(self.resolution.step_sizes(epoch, np.arange(first, first + len(indices) // batch
                                                                       + 1))[steps - first])
        pairs = np.stack(columns, axis=1)
        pairs.flags.writeable = False
        batches = np.split(pairs, list(ends)) if len(pairs) else []
        self._last.keep(epoch, position, batches)
        return list(batches)
