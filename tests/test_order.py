"""The shared sampler: seeded permutations, sharding that keeps DDP in step, exactly-once eval."""
from __future__ import annotations

import numpy as np
import pytest

from fastloader.order import EpochOrder


def rank_orders(n, batch, world, **kw):
    return [EpochOrder(n, batch, rank=r, world_size=world, **kw) for r in range(world)]


def flat(order, epoch=0):
    batches = order.batches(epoch)
    return np.concatenate([b[:, 0] for b in batches]) if batches else np.array([], dtype=np.int64)


def test_same_seed_and_epoch_give_the_same_permutation_other_epochs_and_seeds_differ():
    a = EpochOrder(1000, 10, mode="train", shuffle=True, drop_last=True, seed=1)
    b = EpochOrder(1000, 10, mode="train", shuffle=True, drop_last=True, seed=1)
    c = EpochOrder(1000, 10, mode="train", shuffle=True, drop_last=True, seed=2)
    assert np.array_equal(flat(a, 0), flat(b, 0))
    assert not np.array_equal(flat(a, 0), flat(a, 1))
    assert not np.array_equal(flat(a, 0), flat(c, 0))
    assert sorted(flat(a, 3).tolist()) == list(range(1000))  # a true permutation, not a shuffle buffer


@pytest.mark.parametrize("n, batch, world", [(101, 8, 3), (17, 8, 2), (5, 4, 8), (64, 8, 4)])
def test_eval_yields_every_sample_exactly_once_across_ranks(n, batch, world):
    orders = rank_orders(n, batch, world, mode="eval", shuffle=False, drop_last=False, seed=0)
    seen = np.concatenate([flat(o) for o in orders])
    assert sorted(seen.tolist()) == list(range(n))
    for order in orders:
        sizes = [len(b) for b in order.batches(0)]
        assert len(sizes) == len(order) and all(s == batch for s in sizes[:-1]) and (not sizes or sizes[-1] <= batch)


@pytest.mark.parametrize("n, batch, world", [(101, 8, 3), (1000, 16, 4), (50, 4, 1)])
def test_train_drop_last_ranks_equal_disjoint_and_drop_less_than_a_global_batch(n, batch, world):
    orders = rank_orders(n, batch, world, mode="train", shuffle=True, drop_last=True, seed=3)
    per_rank = [flat(o) for o in orders]
    assert len({len(o) for o in orders}) == 1 and all(len(b) == batch for o in orders for b in o.batches(0))
    seen = np.concatenate(per_rank)
    assert len(set(seen.tolist())) == len(seen)  # disjoint
    assert 0 <= n - len(seen) < world * batch and orders[0].dropped == n - len(seen)


@pytest.mark.parametrize("n, batch, world", [(101, 8, 3), (10, 4, 4), (3, 8, 5)])
def test_train_without_drop_last_pads_so_ranks_stay_in_step_and_cover_everything(n, batch, world):
    orders = rank_orders(n, batch, world, mode="train", shuffle=True, drop_last=False, seed=3)
    assert len({len(o) for o in orders}) == 1
    assert len({len(flat(o)) for o in orders}) == 1
    seen = np.concatenate([flat(o) for o in orders])
    assert set(seen.tolist()) == set(range(n))
    assert len(seen) - n == orders[0].padded < max(world, 1) * (1 + (world - 1) // max(n, 1))


def test_dataset_smaller_than_a_batch():
    dropped = EpochOrder(3, 8, mode="train", shuffle=True, drop_last=True, seed=0)
    assert len(dropped) == 0 and dropped.batches(0) == [] and dropped.dropped == 3
    kept = EpochOrder(3, 8, mode="train", shuffle=True, drop_last=False, seed=0)
    assert len(kept) == 1 and sorted(kept.batches(0)[0][:, 0].tolist()) == [0, 1, 2]


@pytest.mark.parametrize("mode, drop_last", [("train", False), ("train", True), ("eval", False)])
@pytest.mark.parametrize("n, batch, world", [(100, 8, 1), (101, 8, 3), (64, 4, 4)])
def test_resume_at_k_global_batches_replays_each_ranks_tail(mode, drop_last, n, batch, world):
    orders = rank_orders(n, batch, world, mode=mode, shuffle=mode == "train", drop_last=drop_last, seed=5)
    for order in orders:
        full = order.batches(4)
        for k in (1, 2, len(full) - 1):
            tail = order.batches(4, position=k * batch * world)
            assert len(tail) == len(full) - k
            assert all(np.array_equal(a, b) for a, b in zip(full[k:], tail))


@pytest.mark.parametrize("mode, drop_last", [("train", False), ("train", True), ("eval", False)])
@pytest.mark.parametrize("n, batch, world, k, new_batch, new_world",
                         [(101, 8, 3, 2, 8, 2), (101, 8, 2, 3, 5, 4), (64, 4, 4, 1, 4, 1), (30, 4, 1, 5, 4, 3)])
def test_a_restart_on_another_number_of_ranks_re_shards_the_rest_of_the_epoch(
        mode, drop_last, n, batch, world, k, new_batch, new_world):
    kw = dict(mode=mode, shuffle=mode == "train", drop_last=drop_last, seed=9)
    before = np.concatenate([np.concatenate([b[:, 0] for b in o.batches(2)[:k]])
                             for o in rank_orders(n, batch, world, **kw)])
    after_orders = rank_orders(n, new_batch, new_world, **kw)
    after = [o.batches(2, position=k * batch * world) for o in after_orders]
    assert len({len(batches) for batches in after}) == 1 or mode == "eval"  # DDP stays in step
    rest = np.concatenate([b[:, 0] for batches in after for b in batches] or [np.array([], np.int64)])
    if mode == "eval" or drop_last:  # nothing consumed twice
        assert len(set(before.tolist()) | set(rest.tolist())) == len(before) + len(rest)
    if mode == "eval":  # every sample exactly once over the interrupted and the resumed job
        assert sorted(before.tolist() + rest.tolist()) == list(range(n))
    elif drop_last:  # whole global batches of the new job, dropping fewer than one of them
        assert all(len(b) == new_batch for batches in after for b in batches)
        assert 0 <= n - len(before) - len(rest) < new_batch * new_world
    else:  # everything covered, the new ranks padded to equal shares
        assert set(before.tolist()) | set(rest.tolist()) == set(range(n))
        assert len({sum(len(b) for b in batches) for batches in after}) == 1
    seeds = {int(i): int(s) for batches in after for b in batches for i, s in b}
    reference = {int(i): int(s) for b in EpochOrder(n, batch, **kw).batches(2) for i, s in b}
    assert all(reference[i] == s for i, s in seeds.items())  # a sample's augmentation seed is unchanged


def test_sample_seeds_depend_on_seed_epoch_and_sample_only():
    one = EpochOrder(100, 8, mode="train", shuffle=True, drop_last=False, seed=5)
    other_world = EpochOrder(100, 8, mode="train", shuffle=True, drop_last=False, seed=5, rank=1, world_size=4)
    seeds = {int(i): int(s) for b in one.batches(2) for i, s in b}
    for batch in other_world.batches(2):
        for index, seed in batch:
            assert seeds[int(index)] == int(seed)
    assert len(set(seeds.values())) == 100 and min(seeds.values()) >= 0
    next_epoch = {int(i): int(s) for b in one.batches(3) for i, s in b}
    assert all(next_epoch[i] != seeds[i] for i in seeds)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="drop_last must be false"):
        EpochOrder(10, 2, mode="eval", shuffle=False, drop_last=True, seed=0)
    with pytest.raises(ValueError, match=r"rank 2 not in \[0, 2\)"):
        EpochOrder(10, 2, mode="train", shuffle=False, drop_last=True, seed=0, rank=2, world_size=2)


# -- repeated augmentation ------------------------------------------------------------------------


def global_order(orders, epoch=0, position=0):
    """(sample, seed) rows of every rank interleaved back into the epoch's global order."""
    per_rank = [np.concatenate(o.batches(epoch, position) or [np.zeros((0, 2), np.int64)]) for o in orders]
    rows = [per_rank[r][k] for k in range(max(map(len, per_rank))) for r in range(len(orders)) if k < len(per_rank[r])]
    return np.array(rows, dtype=np.int64).reshape(-1, 2)


@pytest.mark.parametrize("n, repeats, world", [(300, 3, 1), (300, 3, 4), (1000, 4, 3), (50, 3, 2), (7, 3, 4)])
def test_repeats_give_timms_repeat_aug_sampler_order_and_length(n, repeats, world):
    """Unshuffled, each rank's samples are exactly those of timm's RepeatAugSampler (DeiT's RASampler for
    N >= 256): the same rounding of the epoch (floor(N // 256 * 256 / world)), the same dealing."""
    sampler = pytest.importorskip("timm.data.distributed_sampler").RepeatAugSampler
    for rank, order in enumerate(rank_orders(n, 8, world, mode="train", shuffle=False, drop_last=False, seed=0,
                                             repeats=repeats)):
        theirs = list(sampler(list(range(n)), num_replicas=world, rank=rank, shuffle=False, num_repeats=repeats))
        assert flat(order).tolist() == theirs and order.samples_per_rank == len(theirs)
        assert len(order) == -(-len(theirs) // 8)


def test_repeated_copies_are_consecutive_on_different_ranks_each_with_its_own_seed():
    orders = rank_orders(1000, 8, 4, mode="train", shuffle=True, drop_last=True, seed=3, repeats=3)
    rows = global_order(orders)
    assert len(rows) == 1000 // 256 * 256 // 4 // 8 * 8 * 4  # 768 positions: 256 distinct samples, 3 copies
    samples = rows[:, 0].reshape(-1, 3)
    assert (samples == samples[:, :1]).all() and len(np.unique(samples[:, 0])) == 256  # runs of 3 copies
    ranks = (np.arange(len(rows)) % 4).reshape(-1, 3)  # global position p is on rank p mod 4
    assert all(len(set(copies)) == 3 for copies in ranks.tolist())  # the 3 copies on 3 different ranks
    assert len(np.unique(rows[:, 1])) == len(rows)  # every copy its own augmentation seed
    plain = EpochOrder(1000, 8, mode="train", shuffle=True, drop_last=True, seed=3)
    first_copies = rows[::3]
    assert np.array_equal(first_copies[:, 1], plain.sample_seeds(0, first_copies[:, 0]))  # copy 0: the plain seed
    assert len({len(o) for o in orders}) == 1 and orders[0].dropped == 0


def test_repeats_work_in_one_process_and_differ_between_epochs():
    order = EpochOrder(600, 16, mode="train", shuffle=True, drop_last=True, seed=1, repeats=3)
    assert order.epoch_length == 512 and len(order) == 32
    epoch0, epoch1 = global_order([order], 0), global_order([order], 1)
    assert not np.array_equal(epoch0, epoch1) and len(np.unique(epoch0[:, 0])) == 512 // 3 + 1


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n, world, k", [(300, 2, 3), (1000, 4, 2), (50, 1, 2)])
def test_repeats_resume_mid_epoch_as_the_uninterrupted_run(drop_last, n, world, k):
    for order in rank_orders(n, 8, world, mode="train", shuffle=True, drop_last=drop_last, seed=5, repeats=3):
        full = order.batches(2)
        tail = order.batches(2, position=k * 8 * world)
        assert len(tail) == len(full) - k and all(np.array_equal(a, b) for a, b in zip(full[k:], tail))


@pytest.mark.parametrize("drop_last", [False, True])
def test_repeats_re_shard_from_2_ranks_to_3_delivering_the_rest_once(drop_last):
    """The global order does not depend on the world size, only its length does (timm's per-rank
    rounding: 256 positions on 2 ranks, 255 on 3), so 3 ranks resume at the 2 ranks' position."""
    kw = dict(mode="train", shuffle=True, drop_last=drop_last, seed=9, repeats=3)
    before = global_order(rank_orders(300, 8, 2, **kw))[:3 * 8 * 2]  # 3 batches on each of 2 ranks
    after_orders = rank_orders(300, 5, 3, **kw)
    assert len({len(o.batches(0, position=48)) for o in after_orders}) == 1  # DDP stays in step
    rest = global_order(after_orders, position=48)
    length = after_orders[0].epoch_length
    assert length == 255
    whole = global_order(rank_orders(300, 8, 1, **{**kw, "drop_last": False}))[:length]
    assert np.array_equal(before, whole[:48])  # what 2 ranks consumed is the start of the same order
    if drop_last:  # whole global batches of the new job, dropping fewer than one of them
        assert np.array_equal(rest, whole[48:48 + len(rest)]) and 0 <= length - 48 - len(rest) < 5 * 3
    else:  # every remaining (sample, copy) once, then padding to equal shares
        assert np.array_equal(rest[:length - 48], whole[48:]) and len(rest) - (length - 48) < 3


def test_eval_mode_refuses_repeats():
    with pytest.raises(ValueError, match="repeats must be >= 1, and 1 in eval mode"):
        EpochOrder(10, 2, mode="eval", shuffle=False, drop_last=False, seed=0, repeats=3)
