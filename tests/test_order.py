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
