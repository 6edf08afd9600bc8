"""`shuffle: block`: shards shuffled, cut into blocks that fit a byte budget, samples shuffled within
each block. The order alone (order.py), then through both loaders on real tar shards (CPU)."""
from __future__ import annotations

import dataclasses
import logging
import re
import time

import numpy as np
import pytest
from conftest import base_config, identities, write_numbered_dataset
from shardfiles import pack_folder_split
from test_order import global_order, rank_orders

from fastloader import build_loader
from fastloader.blocks import BlockPlan
from fastloader.config import load_config
from fastloader.errors import ConfigError
from fastloader.order import BlockShuffle, Containers, EpochOrder, uniform_permutation

BACKENDS = ["torch", pytest.param("dali", marks=pytest.mark.skipif(
    not __import__("importlib").util.find_spec("nvidia.dali"), reason="NVIDIA DALI is not installed"))]


def layout(shards=30, seed=0, grouped=True):
    """(container of each sample, start, length): shards of 20..40 samples of 1..9 KB; `grouped`
    False lists the samples in a scrambled order, as an index of another container format might."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(20, 41, shards)
    container = np.repeat(np.arange(shards), counts).astype(np.int32)
    length = rng.integers(1000, 9000, len(container)).astype(np.int64)
    start = np.zeros(len(container), np.int64)
    for shard in range(shards):
        members = container == shard
        start[members] = 512 + np.cumsum(np.r_[0, length[members][:-1] + 512])
    if not grouped:
        scramble = rng.permutation(len(container))
        container, start, length = container[scramble], start[scramble], length[scramble]
    return container, start, length


def block_shuffle(budget=400_000, **kw) -> BlockShuffle:
    return BlockShuffle(Containers(*layout(**kw)), budget)


def orders(blocks, world, batch=8, **kw):
    kw = {"mode": "train", "drop_last": False, "seed": 3, **kw}
    return rank_orders(len(blocks), batch, world, shuffle="block", blocks=blocks, **kw)


@pytest.mark.parametrize("grouped", [True, False])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_sample_exactly_once_per_epoch_over_1_to_3_ranks(world, grouped):
    blocks = block_shuffle(grouped=grouped)
    n = len(blocks)
    for epoch in (0, 1):
        assert np.array_equal(np.sort(blocks(3, epoch, n)), np.arange(n))  # a permutation
        evaluated = np.concatenate([np.concatenate([b[:, 0] for b in o.batches(epoch)])
                                    for o in orders(blocks, world, mode="eval")])
        assert sorted(evaluated.tolist()) == list(range(n))  # eval: every sample exactly once
        trained = global_order(orders(blocks, world), epoch)[:, 0]
        assert sorted(trained[:n].tolist()) == list(range(n))  # train: once, then the padding rules
        assert len(trained) - n == orders(blocks, world)[0].padded


@pytest.mark.parametrize("grouped", [True, False])
def test_blocks_fit_the_budget_and_the_order_reads_them_one_after_the_other(grouped):
    container, start, length = layout(grouped=grouped)
    blocks = BlockShuffle(Containers(container, start, length), 400_000)
    extent = {c: int((start + length)[container == c].max()) for c in np.unique(container)}
    plan = [block.shards for block in blocks.blocks(3, 1)]
    assert sorted(np.concatenate(plan).tolist()) == sorted(extent)  # every shard in one block
    assert len(plan) > 3
    for shards in plan:  # within the budget, or one shard alone
        assert sum(extent[c] for c in shards.tolist()) <= 400_000 or len(shards) == 1
    for one, following in zip(plan, plan[1:]):  # greedy: the next block's first shard did not fit
        assert sum(extent[c] for c in one.tolist()) + extent[int(following[0])] > 400_000
    block_of = {c: k for k, shards in enumerate(plan) for c in shards.tolist()}
    epoch = global_order(orders(blocks, 2), 1)[:len(container), 0]  # (then padding from the start)
    read = np.array([block_of[c] for c in container[epoch].tolist()])
    assert (np.diff(read) >= 0).all()  # block after block, on every rank together
    batch_blocks = read[:len(read) // 16 * 16].reshape(-1, 16)  # global batches of 2 ranks x 8, blocks of 20+
    assert (batch_blocks.max(axis=1) - batch_blocks.min(axis=1) <= 1).all()  # a batch spans at most a boundary
    permutation, begin = blocks(3, 1, len(container)), 0
    for block in blocks.blocks(3, 1):  # where each block ends in the epoch's order: what a cache fetches ahead
        assert sorted(set(container[permutation[begin:block.end]].tolist())) == sorted(block.shards.tolist())
        begin = block.end
    assert begin == len(container)
    within = [container[permutation][read == k] for k in range(3)]
    assert any(len(set(shards[:10].tolist())) > 1 for shards in within)  # shuffled within a block, not shard by shard


def test_a_shard_larger_than_the_budget_is_a_block_of_its_own():
    blocks = block_shuffle(budget=9_000)
    plan = blocks.blocks(0, 0)
    assert all(len(block.shards) == 1 for block in plan) and len(plan) == 30
    assert len(blocks.oversized) == 30 and sorted(blocks(0, 0, len(blocks)).tolist()) == list(range(len(blocks)))


def test_the_order_is_a_function_of_seed_and_epoch_and_differs_across_epochs():
    one, again = block_shuffle(), block_shuffle()
    n = len(one)
    assert np.array_equal(one(3, 4, n), again(3, 4, n))
    assert not np.array_equal(one(3, 4, n), one(3, 5, n)) and not np.array_equal(one(3, 4, n), one(4, 4, n))
    assert [b.shards.tolist() for b in one.blocks(3, 4)] != [b.shards.tolist() for b in one.blocks(3, 5)]
    assert not np.array_equal(one(3, 4, n), uniform_permutation(3, 4, n))


@pytest.mark.parametrize("mode, drop_last", [("train", False), ("train", True), ("eval", False)])
def test_resume_mid_epoch_replays_each_ranks_tail(mode, drop_last):
    for order in orders(block_shuffle(), 2, mode=mode, drop_last=drop_last):
        full = order.batches(2)
        for k in (1, 3, len(full) - 1):
            tail = order.batches(2, position=k * 8 * 2)
            assert len(tail) == len(full) - k and all(np.array_equal(a, b) for a, b in zip(full[k:], tail))


@pytest.mark.parametrize("mode, drop_last", [("train", False), ("train", True), ("eval", False)])
def test_a_restart_on_3_ranks_re_shards_the_rest_of_2_ranks_epoch(mode, drop_last):
    blocks = block_shuffle()
    n, k = len(blocks), 4
    before = global_order(orders(blocks, 2, mode=mode, drop_last=drop_last), 1)[:k * 8 * 2]
    after_orders = orders(blocks, 3, batch=5, mode=mode, drop_last=drop_last)
    assert mode == "eval" or len({len(o.batches(1, position=k * 16)) for o in after_orders}) == 1  # DDP in step
    rest = global_order(after_orders, 1, position=k * 16)
    whole = global_order(orders(blocks, 1, mode="eval"), 1)  # the epoch's order, whatever the world size
    assert np.array_equal(before, whole[:k * 16])
    if mode == "eval":
        assert np.array_equal(rest, whole[k * 16:])
    elif drop_last:
        assert np.array_equal(rest, whole[k * 16:k * 16 + len(rest)]) and 0 <= n - k * 16 - len(rest) < 15
    else:
        assert np.array_equal(rest[:n - k * 16], whole[k * 16:]) and len(rest) - (n - k * 16) < 3


def test_repeated_augmentation_takes_whole_blocks_in_copies_on_different_ranks():
    """aug_repeats K keeps about N positions, so the epoch reads the first ~N / K samples of the block
    order: its first blocks whole, about 1 / K of the shards, each sample's K copies side by side."""
    blocks = block_shuffle(shards=60)
    container = layout(shards=60)[0]
    rows = global_order(orders(blocks, 3, repeats=3, drop_last=True), 2)
    samples = rows[:, 0].reshape(-1, 3)
    assert (samples == samples[:, :1]).all() and len(np.unique(rows[:, 1])) == len(rows)
    distinct = samples[:, 0]
    assert np.array_equal(distinct, blocks(3, 2, len(blocks))[:len(distinct)])
    plan = blocks.blocks(3, 2)
    read = set(container[distinct].tolist())
    whole = [set(block.shards.tolist()) <= read for block in plan]
    assert whole[:whole.index(False)] and not any(whole[whole.index(False) + 1:])  # first blocks, whole
    assert len(read) < 60 * 0.5


def test_drawing_an_epoch_at_imagenet_scale_costs_about_a_uniform_permutation():
    """1,281,167 samples in 1,000 shards, blocks of 4 GB (about 35 a epoch): the epoch's block order
    within a small factor of today's uniform permutation (best of 3, both timed here)."""
    rng = np.random.default_rng(0)
    n = 1_281_167
    container = np.sort(rng.integers(0, 1000, n)).astype(np.int32)
    length = rng.integers(50_000, 170_000, n)
    began = time.perf_counter()
    blocks = BlockShuffle(Containers(container, np.zeros(n, np.int64), np.cumsum(length)), 4 << 30)
    built = time.perf_counter() - began

    def best(draw) -> float:
        times = []
        for _ in range(3):
            began = time.perf_counter()
            draw()
            times.append(time.perf_counter() - began)
        return min(times)
    uniform = best(lambda: uniform_permutation(0, 1, n))
    block = best(lambda: blocks(0, 1, n))
    print(f"uniform {uniform * 1000:.0f} ms, block {block * 1000:.0f} ms, layout built once in {built * 1000:.0f} ms")
    assert block < 4 * uniform + 0.05, (block, uniform)


def test_an_order_refuses_blocks_it_cannot_use():
    blocks = block_shuffle()
    with pytest.raises(ValueError, match="shuffle 'block' needs the index's blocks"):
        EpochOrder(10, 2, mode="train", shuffle="block", drop_last=False, seed=0)
    with pytest.raises(ValueError, match="made for .* samples, not 10"):
        EpochOrder(10, 2, mode="train", shuffle="block", drop_last=False, seed=0, blocks=blocks)
    with pytest.raises(ValueError, match="shuffle must be true, false or 'block'"):
        EpochOrder(len(blocks), 2, mode="train", shuffle=True, drop_last=False, seed=0, blocks=blocks)


# -- the budget and the config ---------------------------------------------------------------------


def shard_config(tmp_path, per_shard=4, **train):
    root = write_numbered_dataset(tmp_path / "d", per_class=8)
    shards = {split: [str(p) for p in pack_folder_split(root / split, tmp_path / "s", split, per_shard)]
              for split in ("train", "val")}
    config = base_config("unused", train=train)
    config["dataset"] = {"format": "webdataset"}
    for split in ("train", "val"):
        config[split] = {**config[split], "shards": shards[split]}
    return config


def test_the_budget_is_block_size_else_half_the_node_cache_else_an_error(tmp_path, caplog):
    config = load_config(shard_config(tmp_path, shuffle="block", block_size="4GB"))
    assert BlockPlan(config, config.split("train")).budget() == 4 << 30
    assert BlockPlan(config, config.split("val")).budget() is None  # shuffle: false
    caplog.set_level(logging.WARNING, logger="fastloader")
    assert BlockPlan(config, config.split("train")).budget(cache_limit=6 << 30) == 4 << 30
    assert "train.block_size (4.0 GiB) is more than half of dataset.remote.cache_limit (6.0 GiB)" in caplog.text
    unset = load_config(shard_config(tmp_path, shuffle="block"))
    remote = dataclasses.replace(unset.split("train"), shards="s3://bucket/train-{000..005}.tar")  # a cache gives one
    assert BlockPlan(unset, remote).budget(cache_limit=50 << 30) == 25 << 30
    with pytest.raises(ConfigError, match=r"train.shuffle: block needs train.block_size, the most bytes of shards one "
                                          r"block holds: set e.g. train.block_size: 4GB"):
        BlockPlan(unset, unset.split("train"))  # local shards: no cache will give one, said before indexing
    with pytest.raises(ConfigError, match=r"train.shuffle: block needs train.block_size"):
        BlockPlan(unset, remote).budget()  # remote shards, and no node cache limit known


def test_a_missing_budget_fails_before_the_shards_are_indexed(tmp_path):
    config = shard_config(tmp_path, shuffle="block")
    config["train"]["shards"] = str(tmp_path / "nowhere-{000..009}.tar")
    with pytest.raises(ConfigError, match="train.shuffle: block needs train.block_size"):
        build_loader(config, "train")


@pytest.mark.parametrize("train, dataset, message", [
    ({"shuffle": True, "block_size": "4GB"}, {},
     "train.block_size: applies only with train.shuffle: block, and split 'train' has shuffle: true; remove "
     "train.block_size, or set train.shuffle: block"),
    ({"shuffle": "block", "block_size": "4096"}, {}, "train.block_size: must be a size with its unit, such as 4GB"),
    ({"shuffle": "block", "block_size": "lots"}, {}, "train.block_size: must be a size with its unit"),
    ({"shuffle": "blocks"}, {}, "train.shuffle: expected true or false or one of 'block', got 'blocks'"),
    ({"shuffle": "block", "block_size": "4GB"}, {"format": "folder"},
     "train.shuffle: block reads the split's tar shards block by block, and dataset.format: folder reads image "
     "files, which have no shards to group; set train.shuffle: true"),
])
def test_config_errors_name_the_key_and_the_fix(tmp_path, train, dataset, message):
    config = base_config(tmp_path, train=train)
    config["dataset"] = {**config["dataset"], **dataset}
    with pytest.raises(ConfigError) as refused:
        load_config(config)
    assert message in str(refused.value)


def test_what_a_uniform_order_costs_a_cache_smaller_than_the_shards(tmp_path):
    config = load_config(shard_config(tmp_path))
    index = build_loader(config, "train").index  # 24 samples in 6 shards of 4
    total = int(Containers.of(index.ranges).sizes.sum())
    plan = BlockPlan(config, config.split("train"))
    assert plan.uniform_cost(index, cache_limit=total) is None  # it fits
    text = plan.uniform_cost(index, cache_limit=total // 4)
    assert text.startswith("split 'train': train.shuffle: true reads samples in a uniform order, and its 6 shards")
    assert "each shard is fetched about 3 times an epoch (once per sample, less the 25% the cache keeps)" in text
    assert "Set train.shuffle: block to fetch each shard once an epoch" in text


# -- through the loaders ---------------------------------------------------------------------------


def colours(loader, **kw) -> list[tuple]:
    return [colour for images, _ in loader for colour in identities(images)]


def budget_of(config, shards=3) -> str:
    """A budget of about `shards` of the config's train shards (bytes, as a size key takes it)."""
    index = build_loader({**config, "train": {**config["train"], "shuffle": True, "block_size": None}}, "train").index
    return f"{int(Containers.of(index.ranges).sizes.max()) * shards}B"


@pytest.mark.parametrize("backend", BACKENDS)
def test_both_backends_read_the_block_order_on_real_shards(tmp_path, backend, caplog):
    config = shard_config(tmp_path, drop_last=False)
    config["backend"] = backend
    config["train"].update(shuffle="block", block_size=budget_of(config))
    caplog.set_level(logging.INFO, logger="fastloader")
    loader = build_loader(config, "train")
    assert "split 'train': shuffle: block, blocks of at most" in caplog.text and "6 tar shards of" in caplog.text
    assert re.search(r"\d+ blocks? in epoch 0\n", caplog.text) and "per epoch" not in caplog.text  # issue 41.18
    by_sample = colours(build_loader({**config, "train": {**config["train"], "mode": "eval", "shuffle": False,
                                                           "drop_last": False, "block_size": None}}, "train"))
    for epoch in (0, 1):
        order = np.concatenate([b[:, 0] for b in loader.order.batches(epoch)])
        assert colours(loader) == [by_sample[i] for i in order.tolist()]  # the planned samples, in order
        assert sorted(order.tolist()) == list(range(24))
        plan = loader.order.blocks.blocks(7, epoch)
        block_of = {c: k for k, block in enumerate(plan) for c in block.shards.tolist()}
        assert (np.diff([block_of[c] for c in loader.index.ranges.file[order].tolist()]) >= 0).all()
    assert loader.state_dict()["shuffle"] == "block"


def test_the_backends_agree_and_resume_mid_epoch_on_2_then_3_ranks(tmp_path):
    """Both backends the same samples in the same order; a state of 2 ranks after 2 batches resumed by
    3: the rest of the epoch, each sample once (eval) over the interrupted and the resumed job."""
    config = shard_config(tmp_path)
    config["train"].update(shuffle="block", block_size=budget_of(config))
    config["val"].update(shuffle="block", block_size=budget_of(config, 2))
    backends = [p if isinstance(p, str) else p.values[0] for p in BACKENDS]
    if __import__("importlib").util.find_spec("nvidia.dali"):
        seen = {b: colours(build_loader({**config, "backend": b}, "train")) for b in backends}
        assert seen["torch"] == seen["dali"]
    ranked = lambda r, w: {**config, "distributed": {"rank": r, "world_size": w}}  # noqa: E731
    consumed, state = [], None
    for rank in range(2):
        loader = build_loader(ranked(rank, 2), "val")
        batches = iter(loader)
        for _ in range(2):
            consumed += identities(next(batches)[0])
        state = loader.state_dict()
    rest = [c for rank in range(3) for c in colours(_resumed(build_loader(ranked(rank, 3), "val"), state))]
    everything = colours(build_loader(config, "val"))
    assert sorted(consumed + rest) == sorted(everything) and len(set(everything)) == 24


def _resumed(loader, state):
    loader.load_state_dict(state)
    return loader


def test_a_state_records_the_block_order_and_refuses_another_budget(tmp_path):
    config = shard_config(tmp_path)
    config["train"].update(shuffle="block", block_size=budget_of(config))
    loader = build_loader(config, "train")
    state = loader.state_dict()
    assert state["shuffle"] == "block" and state["block_size"] == loader.order.blocks.budget > 0
    other = build_loader({**config, "train": {**config["train"], "block_size": budget_of(config, 2)}}, "train")
    with pytest.raises(ValueError, match=rf"loader state was saved with train.block_size: {state['block_size']} bytes "
                                         rf"\(.*\), this loader's blocks hold .*; set train.block_size: "
                                         rf"{state['block_size']}B to resume the same order"):
        other.load_state_dict(state)
    uniform = build_loader({**config, "train": {**config["train"], "shuffle": True, "block_size": None}}, "train")
    with pytest.raises(ValueError, match="loader state was saved with train.shuffle: 'block', this loader has "
                                         "train.shuffle: True"):
        uniform.load_state_dict(state)
    assert uniform.state_dict()["block_size"] == 0


def test_a_shard_over_the_budget_is_named_in_a_warning(tmp_path, caplog):
    config = shard_config(tmp_path)
    config["train"].update(shuffle="block", block_size="100B")
    caplog.set_level(logging.INFO, logger="fastloader")
    loader = build_loader(config, "train")
    assert ("split 'train': 6 tar shards are larger than the block budget of 100 B (train.block_size, from <dict>), "
            "each read as a block of its own: train-000000.tar (") in caplog.text
    assert len(loader.order.blocks.blocks(7, 0)) == 6
