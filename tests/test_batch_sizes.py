"""A batch size per output size (`<split>.batch_sizes` with `transform.sizes`, timm's
batch_size_choices; issue 57.14): each step takes one (size, batch size) pair on every rank; an
epoch has as many steps of each pair whatever its number (timm's sample budget), so `len(loader)`
holds; every sample at most once an epoch, the ranks' shares disjoint; a resume replays the rest
of the epoch exactly, and one on another number of ranks reads the rest once. Both backends, the
same batches and labels. Device: CPU (DALI's CPU flavour; the GPU flavour is the same graph)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from conftest import base_config, identities, write_numbered_dataset, write_textured_dataset

from fastloader import build_loader, load_config
from fastloader.errors import ConfigError
from fastloader.order import EpochOrder
from fastloader.resolution import Resolution

BACKENDS = ["torch", pytest.param("dali", marks=pytest.mark.skipif(
    __import__("importlib").util.find_spec("nvidia.dali") is None, reason="NVIDIA DALI is not installed"))]
PAIRS = {16: 6, 32: 3}
"""Output size -> batch size: the small images in larger batches (the same memory a step)."""
PAIRED = {"batch_size": 6, "batch_sizes": list(PAIRS.values()), "transform": {"size": 32, "sizes": list(PAIRS)}}
"""The train section of the loaders here."""


def paired_order(n: int, world: int = 1, rank: int = 0, drop_last: bool = True, pairs=None) -> EpochOrder:
    pairs = pairs or PAIRS
    split = load_config({"dataset": {"root": "x"}, "train": {
        "batch_sizes": list(pairs.values()), "transform": {"size": max(pairs), "sizes": list(pairs)}}}).split("train")
    return EpochOrder(n, split.batch_size, mode="train", shuffle=True, drop_last=drop_last, seed=7, rank=rank,
                      world_size=world, resolution=Resolution(split.transform, 7, split.batch_sizes))


def steps(batches) -> list[tuple[int, int]]:
    """(output size, batch size) of each planned batch."""
    return [(int(b[0, 2]), len(b)) for b in batches]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_textured_dataset(tmp_path_factory.mktemp("batch-sizes") / "data", per_class=10)


# -- the plan ----------------------------------------------------------------------------------------

def test_each_step_has_its_pair_on_every_rank_and_every_epoch_as_many_steps():
    """100 samples on 2 ranks: a share of 50 each; 5 steps of each pair take 45, one more of 3 fits,
    2 are left out. Every rank has the same steps (DDP's shapes agree); the shares are disjoint; the
    next epoch takes the same steps in another order."""
    orders = [paired_order(100, world=2, rank=rank) for rank in range(2)]
    plans = [order.batches(0) for order in orders]
    assert steps(plans[0]) == steps(plans[1])
    assert all(PAIRS[size] == count for size, count in steps(plans[0]))
    assert sorted(steps(plans[0])) == [(16, 6)] * 5 + [(32, 3)] * 6
    assert len(orders[0]) == 11 and orders[0].samples_per_rank == 48 and orders[0].dropped == 4
    samples = np.concatenate([b[:, 0] for plan in plans for b in plan])
    assert len(samples) == 96 == len(set(samples.tolist()))  # each sample at most once, on one rank
    later = orders[0].batches(1)
    assert sorted(steps(later)) == sorted(steps(plans[0])) and steps(later) != steps(plans[0])


def test_without_drop_last_the_rest_is_a_last_smaller_step_at_the_smallest_batch_size():
    order = paired_order(100, drop_last=False)
    plan = steps(order.batches(0))
    assert plan[-1] == (32, 1) and sum(count for _, count in plan) == 100 == order.samples_per_rank
    assert sorted(plan[:-1]) == [(16, 6)] * 11 + [(32, 3)] * 11
    assert sorted(np.concatenate([b[:, 0] for b in order.batches(0)]).tolist()) == list(range(100))


def test_a_resume_on_the_same_ranks_continues_the_steps_and_on_other_ranks_reads_the_rest_once():
    orders = [paired_order(100, world=2, rank=rank) for rank in range(2)]
    whole = orders[1].batches(3)
    position = orders[1].advance(3, 0, 4)
    assert position == 2 * sum(len(b) for b in whole[:4])
    assert [b.tolist() for b in orders[1].batches(3, position)] == [b.tolist() for b in whole[4:]]
    consumed = {int(s) for order in orders for b in order.batches(3)[:4] for s in b[:, 0]}
    three = [paired_order(100, world=3, rank=rank) for rank in range(3)]
    rest = [order.batches(3, position) for order in three]
    assert steps(rest[0]) == steps(rest[1]) == steps(rest[2])
    taken = [int(s) for plan in rest for b in plan for s in b[:, 0]]
    assert len(taken) == len(set(taken)) and not consumed & set(taken)
    left = 100 - position
    assert left - 3 * min(PAIRS.values()) < len(taken) <= left  # what no step of every rank fits is left out
    assert three[0].shared_after(position, 3) == len(taken)


@pytest.mark.parametrize("drop_last", [True, False])
def test_a_resume_of_a_re_sharded_resume_continues_it_exactly(drop_last):
    """Issue 68.4: an epoch begun on 2 ranks, resumed on 1 from their state, and that run's state
    resumed again on 1: the second resume yields exactly what the first resumed run had left, at
    every pair of stopping points (it planned the rest afresh: 5 steps / 24 samples where 4 / 22
    were left)."""
    for n in (40, 60, 61):
        two, one = paired_order(n, world=2, drop_last=drop_last), paired_order(n, drop_last=drop_last)
        for k in range(1, len(two)):
            first = two.advance(0, 0, k)
            rest = one.batches(0, first)
            for j in range(1, len(rest)):
                again = one.batches(0, one.advance(0, first, j))
                assert [b.tolist() for b in again] == [b.tolist() for b in rest[j:]], (n, k, j)


WIDE = {16: 12, 24: 8, 32: 4}
"""The issue's pairs: the rest of a step is rows of 4, 8 or 12 positions on 3 ranks."""


@pytest.mark.parametrize("drop_last", [True, False])
def test_a_re_sharded_resume_never_yields_more_batches_than_len_and_reads_the_rest_once(drop_last):
    """Issue 68.5: 2 ranks to 3 with [12, 8, 4] yielded 7 batches where len(loader) was 5 (Lightning
    ends the epoch at len: 16 samples a rank never trained). At every stopping point, for 45 to
    150 samples: every rank's rest has the same steps, no more than len(loader); the samples of the
    two runs are each read once, and what is left out (drop_last) is fewer than a row of 3 ranks
    past what the 3 ranks' own plan leaves out; without drop_last every sample is read."""
    for n in range(45, 151, 7):
        two = [paired_order(n, world=2, rank=rank, drop_last=drop_last, pairs=WIDE) for rank in range(2)]
        three = [paired_order(n, world=3, rank=rank, drop_last=drop_last, pairs=WIDE) for rank in range(3)]
        for k in range(1, len(two[0])):
            position = two[0].advance(0, 0, k)
            before = [int(s) for order in two for b in order.batches(0)[:k] for s in b[:, 0]]
            rests = [order.batches(0, position) for order in three]
            assert steps(rests[0]) == steps(rests[1]) == steps(rests[2]), (n, k)
            assert len(rests[0]) <= len(three[0]), (n, k, len(rests[0]), len(three[0]))
            after = [int(s) for rest in rests for b in rest for s in b[:, 0]]
            if drop_last:
                assert len(before + after) == len(set(before + after)), (n, k)
                assert n - len(before + after) < three[0].dropped + 3, (n, k)
            else:
                assert set(before + after) == set(range(n)), (n, k)
                assert len(before + after) < n + three[0].padded + 3, (n, k)


# -- both backends -------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_each_batch_has_its_planned_size_and_count_and_the_backends_agree(root, backend):
    """Two epochs with a worker (the torch backend's buffers hold the largest batch at the largest
    size; DALI's pipeline its largest batch): each batch as planned, len(loader) each epoch, the
    labels the plan's samples'."""
    config = base_config(root, backend=backend, workers={"num_workers": 1},
                         train=PAIRED)
    with build_loader(config, "train") as loader:
        assert "batch_sizes=(6, 3)" in repr(loader) and loader.batch_size == 6
        for epoch in range(2):
            loader.set_epoch(epoch)
            planned = loader.order.batches(epoch)
            got = [(images.shape, labels.tolist()) for images, labels in loader]
            assert len(got) == len(planned) == len(loader)
            assert [shape for shape, _ in got] == [(len(b), 3, int(b[0, 2]), int(b[0, 2])) for b in planned]
            assert [labels for _, labels in got] == [loader.index.labels[b[:, 0]].tolist() for b in planned]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_resume_mid_epoch_replays_the_rest_exactly(root, backend):
    config = base_config(root, backend=backend,
                         train=PAIRED)
    with build_loader(config, "train") as loader:
        loader.set_epoch(1)
        reference = [x for x, _ in loader]
        loader.set_epoch(1)
        batches = iter(loader)
        taken = [next(batches) for _ in range(3)]
        state = loader.state_dict()
        assert len(taken) == 3
        del batches
    with build_loader(config, "train") as resumed:
        resumed.load_state_dict(state)
        rest = [x for x, _ in resumed]
    assert [x.shape for x in rest] == [x.shape for x in reference[3:]]
    assert all(torch.equal(a, b) for a, b in zip(rest, reference[3:], strict=True))


@pytest.fixture(scope="module")
def numbered(tmp_path_factory):
    return write_numbered_dataset(tmp_path_factory.mktemp("numbered"), per_class=26, splits=("train",))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_re_sharded_resume_and_its_resume_yield_at_most_len_batches_each_image_once(numbered, backend):
    """Issues 68.4 and 68.5 on real loaders: 78 images begun on 2 ranks (a step each), resumed on 3
    (a step each), resumed again on 3 to the epoch's end. Each rank's rest fits in len(loader) (it
    yielded 4 where len was 3); every image is read once, fewer than a step of the smallest batch
    on every rank (and a row of ranks) left out."""
    config = base_config(numbered, backend=backend, train={"batch_size": 12, "batch_sizes": list(WIDE.values()),
                                                                "transform": {"size": 32, "sizes": list(WIDE)}})

    def ranked(rank: int, world: int):
        return build_loader({**config, "distributed": {"rank": rank, "world_size": world}}, "train")

    seen, state = [], None
    for world, take in ((2, 1), (3, 1), (3, None)):
        for rank in range(world):
            with ranked(rank, world) as loader:
                if state is not None:
                    loader.load_state_dict(state)
                rest = len(loader.order.batches(loader.next_epoch, loader.resume_position))
                assert rest <= len(loader)
                got = [images for images, _ in itertools.islice(loader, take)]
                assert len(got) == (take or rest)
                seen += [colour for images in got for colour in identities(images)]
                saved = loader.state_dict()
        state = saved
    assert len(seen) == len(set(seen)) > 78 - 3 * min(WIDE.values()) - 3


# -- the keys ------------------------------------------------------------------------------------

@pytest.mark.parametrize("train, message", [
    ({"batch_sizes": [6, 3]}, "train.batch_sizes: pairs a batch size with each of train.transform.sizes, which is not "
                              "set"),
    ({"batch_sizes": [6], "transform": {"sizes": [16, 32]}}, "train.batch_sizes: has 1 batch size and "
                                                             "train.transform.sizes 2 sizes"),
    ({"batch_size": 3, "batch_sizes": [6, 3], "transform": {"sizes": [16, 32]}},
     "train.batch_size: 3 is not the largest of train.batch_sizes (6), which is what the loader's buffers hold; set "
     "train.batch_size: 6"),
    ({"batch_sizes": [6, 0], "transform": {"sizes": [16, 32]}}, "train.batch_sizes"),
])
def test_a_bad_batch_size_schedule_fails_at_load_naming_the_key_and_the_fix(train, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config({"dataset": {"root": "x"}, "train": train})


def test_batch_sizes_is_a_train_key_and_batch_size_follows_it():
    with pytest.raises(ConfigError, match="val.batch_sizes: applies only to train mode"):
        load_config({"dataset": {"root": "x"}, "val": {"batch_sizes": [4, 2]}})
    split = load_config({"dataset": {"root": "x"}, "train": {"batch_sizes": [4, 8], "transform": {
        "sizes": [32, 16]}}}).split("train")
    assert split.batch_size == 8


def test_timms_batch_size_choices_become_batch_sizes(root):
    from timm import data as timm_data

    from fastloader.timm import create_loader
    dataset = timm_data.create_dataset("", root=str(root / "train"))
    loader = create_loader(dataset, input_size=(3, 32, 32), batch_size=4, is_training=True, num_workers=0,
                           device=torch.device("cpu"), input_size_choices=[16, 32], batch_size_choices=[6, 3],
                           overrides={"backend": "torch"})
    shapes = {tuple(images.shape) for images, _ in loader}
    assert shapes == {(6, 3, 16, 16), (3, 3, 32, 32)}
    loader.close()
