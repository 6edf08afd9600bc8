"""Weighted and class-balanced sampling, and an epoch size: the draws alone (order.py), then through
both loaders on small generated images (CPU) and on the real photos, and every bad input refused at
load with its key and the fix."""
from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REALPHOTOS, base_config, cpu_only_env, identities, requires_realphotos, write_numbered_dataset
from PIL import Image
from test_order import global_order

from fastloader import build_loader
from fastloader.config import load_config
from fastloader.errors import ConfigError
from fastloader.order import SUBSTITUTE_TRIES, EpochOrder, Passes, WeightedDraws, substitutes, uniform_permutation

BACKENDS = ["torch", pytest.param("dali", marks=pytest.mark.skipif(
    not __import__("importlib").util.find_spec("nvidia.dali"), reason="NVIDIA DALI is not installed"))]
SIGMAS = 5
"""Drawn counts must lie within this many binomial standard deviations of their expectation."""


def within_binomial(counts: np.ndarray, probabilities: np.ndarray, draws: int) -> None:
    """Each count within SIGMAS standard deviations of draws x p (and 0 where p is 0)."""
    expected = draws * probabilities
    sigma = np.sqrt(draws * probabilities * (1 - probabilities))
    assert (counts[probabilities == 0] == 0).all(), "a sample of weight 0 was drawn"
    worst = np.abs(counts - expected) / np.maximum(sigma, 1e-12)
    assert worst.max() <= SIGMAS, (worst.max(), counts, expected)


# -- the draws alone ---------------------------------------------------------------------------------


def test_drawn_frequencies_follow_the_weights_within_binomial_bounds_over_many_epochs():
    weights = np.array([0, 1, 2, 3, 4, 0, 10, 0.5])
    draws = WeightedDraws(weights, size=1000)
    counts = sum(np.bincount(draws(11, epoch, len(weights)), minlength=len(weights)) for epoch in range(300))
    within_binomial(counts, weights / weights.sum(), 300 * 1000)
    long_tail = np.random.default_rng(0).pareto(1.2, 2000) + 0.01  # many samples, weights over 4 decades
    draws = WeightedDraws(long_tail, size=5000)
    counts = sum(np.bincount(draws(3, epoch, 2000), minlength=2000) for epoch in range(100))
    within_binomial(counts, long_tail / long_tail.sum(), 100 * 5000)


def test_draws_are_a_function_of_seed_and_epoch():
    draws = WeightedDraws(np.arange(1.0, 101.0), size=500)
    assert np.array_equal(draws(1, 4, 100), WeightedDraws(np.arange(1.0, 101.0), size=500)(1, 4, 100))
    assert not np.array_equal(draws(1, 4, 100), draws(1, 5, 100)) and not np.array_equal(draws(1, 4, 100),
                                                                                         draws(2, 4, 100))
    assert len(draws(1, 4, 100)) == 500 and draws(1, 4, 100).dtype == np.int64
    assert draws.digest != WeightedDraws(np.arange(2.0, 102.0), size=500).digest


def test_a_failed_files_substitutes_are_drawn_by_the_weights():
    """A train slot whose file fails at decode time is refilled from the slot's seed: by the weights
    where the split has them (a sample of weight 0 never fills it), uniformly where it has none."""
    weights = np.array([0, 1, 2, 3, 4, 0, 10, 0.5])
    draws = WeightedDraws(weights, size=100)
    tried = np.array([substitutes(seed, len(weights), draws) for seed in range(20_000)])
    assert tried.shape == (20_000, SUBSTITUTE_TRIES)
    within_binomial(np.bincount(tried.ravel(), minlength=8), weights / weights.sum(), tried.size)
    uniform = np.array([substitutes(seed, 8) for seed in range(20_000)])
    within_binomial(np.bincount(uniform.ravel(), minlength=8), np.full(8, 1 / 8), uniform.size)
    assert substitutes(5, 8, draws) == substitutes(5, 8, WeightedDraws(weights, size=7))  # the seed's, not the epoch's


def weighted_orders(world, batch=8, size=403, **kw):
    weights = np.r_[np.full(10, 5.0), np.ones(90)]
    kw = {"mode": "train", "shuffle": True, "drop_last": False, "seed": 3, **kw}
    return [EpochOrder(100, batch, rank=r, world_size=world, draws=WeightedDraws(weights, size), **kw)
            for r in range(world)]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_rank_yields_equal_batches_dealt_from_the_epochs_draws(world, drop_last):
    orders = weighted_orders(world, drop_last=drop_last)
    assert len({len(o) for o in orders}) == 1 and len({len(o.batches(1)) for o in orders}) == 1
    rows = global_order(orders, 1)
    drawn = orders[0].permutation(1)
    assert len(drawn) == 403 and orders[0].epoch_length == 403
    if drop_last:
        assert len(rows) == 403 // (8 * world) * 8 * world and np.array_equal(rows[:, 0], drawn[:len(rows)])
    else:
        assert np.array_equal(rows[:403, 0], drawn) and len(rows) - 403 == orders[0].padded < world


def test_every_draw_has_its_own_augmentation_seed_and_permutations_keep_theirs():
    rows = global_order(weighted_orders(2), 0)[:403]  # (then one position of padding: the first again)
    assert len(np.unique(rows[:, 0])) < len(rows) == len(np.unique(rows[:, 1]))  # repeated samples, distinct seeds
    plain = EpochOrder(100, 8, mode="train", shuffle=True, drop_last=False, seed=3)
    short = EpochOrder(100, 8, mode="train", shuffle=True, drop_last=False, seed=3, epoch_size=40)
    assert np.array_equal(global_order([short], 2), global_order([plain], 2)[:40])  # samples and seeds unchanged


def test_epoch_size_without_weights_is_passes_of_new_permutations():
    passes = Passes(uniform_permutation, 250)
    order = passes(5, 1, 100)
    assert np.array_equal(order[:100], uniform_permutation(5, 1, 100))  # the first pass: today's order
    for begin in (0, 100, 200):
        chunk = order[begin:begin + 100]
        assert len(np.unique(chunk)) == len(chunk)  # no sample twice within a pass
    assert not np.array_equal(order[100:200], order[:100])
    assert np.bincount(order, minlength=100).max() == 3 and np.bincount(order, minlength=100).min() == 2
    epoch = EpochOrder(100, 10, mode="train", shuffle=True, drop_last=True, seed=5, epoch_size=250)
    rows = global_order([epoch], 1)
    assert len(rows) == 250 and len(np.unique(rows[:, 1])) == 250  # a later pass's sample: another seed
    unshuffled = EpochOrder(10, 5, mode="train", shuffle=False, drop_last=True, seed=0, epoch_size=25)
    assert global_order([unshuffled])[:, 0].tolist() == list(range(10)) * 2 + list(range(5))


@pytest.mark.parametrize("drop_last", [False, True])
def test_resume_mid_epoch_and_re_shard_from_2_ranks_to_3(drop_last):
    before = global_order(weighted_orders(2, drop_last=drop_last), 2)[:3 * 8 * 2]
    for order in weighted_orders(2, drop_last=drop_last):  # the same ranks: each one's tail
        full = order.batches(2)
        tail = order.batches(2, position=3 * 16)
        assert len(tail) == len(full) - 3 and all(np.array_equal(a, b) for a, b in zip(full[3:], tail))
    after = weighted_orders(3, batch=5, drop_last=drop_last)
    assert len({len(o.batches(2, position=48)) for o in after}) == 1  # DDP stays in step
    rest = global_order(after, 2, position=48)
    whole = global_order(weighted_orders(1), 2)[:403]
    assert np.array_equal(before, whole[:48])
    if drop_last:
        assert np.array_equal(rest, whole[48:48 + len(rest)]) and 0 <= 403 - 48 - len(rest) < 15
    else:
        assert np.array_equal(rest[:403 - 48], whole[48:]) and len(rest) - (403 - 48) < 3


def test_repeated_augmentation_copies_a_drawn_sample_on_different_ranks():
    orders = weighted_orders(3, size=600, repeats=3, drop_last=True)
    rows = global_order(orders, 1)
    samples = rows[:, 0].reshape(-1, 3)
    assert (samples == samples[:, :1]).all()  # the copies of a draw side by side: on ranks p, p+1, p+2 mod 3
    assert np.array_equal(samples[:, 0], orders[0].permutation(1)[:len(samples)])
    assert len(np.unique(rows[:, 1])) == len(rows)  # every copy of every draw its own seed
    assert orders[0].epoch_length == 600 // 256 * 256 // 3 * 3  # timm's length, from the epoch size


@pytest.mark.parametrize("weights, message", [
    ([1, -1, 2], "finite and >= 0"), ([1, np.nan], "finite and >= 0"), ([1, np.inf], "finite and >= 0"),
    ([0, 0, 0], "must not all be 0")])
def test_the_draws_refuse_weights_they_cannot_draw_by(weights, message):
    with pytest.raises(ValueError, match=message):
        WeightedDraws(np.array(weights, dtype=float), 10)


def test_eval_orders_and_the_block_order_take_no_draws():
    draws = WeightedDraws(np.ones(10), 10)
    with pytest.raises(ValueError, match="eval mode reads every sample exactly once"):
        EpochOrder(10, 2, mode="eval", shuffle=False, drop_last=False, seed=0, draws=draws)
    with pytest.raises(ValueError, match="weighted draws are a random order"):
        EpochOrder(10, 2, mode="train", shuffle=False, drop_last=False, seed=0, draws=draws)


# -- class-balanced sampling through the loaders -----------------------------------------------------


def write_long_tail(root: Path, head: int = 100, tail: int = 5, classes: int = 10, size=(12, 10)) -> Path:
    """train/c0 with `head` images, c1..c9 with `tail` each: a long-tailed split of tiny solid PNGs."""
    for c in range(classes):
        folder = root / "train" / f"c{c}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(head if c == 0 else tail):
            Image.new("RGB", size, (20 * c, 7 * (i % 30), 90)).save(folder / f"i{i:03d}.png")
    return root


def drawn_labels(loader, epochs) -> np.ndarray:
    """The labels an epoch's plan draws (the order, without decoding), over several epochs."""
    return np.concatenate([loader.index.labels[np.concatenate(loader.order.batches(e))[:, 0]] for e in epochs])


@pytest.mark.parametrize("choice, shares", [("inverse", np.full(10, 0.1)),
                                            ("sqrt", np.r_[10.0, np.full(9, math.sqrt(5))] / (10 + 9 * math.sqrt(5)))])
def test_class_balanced_sampling_of_a_long_tailed_split(tmp_path, caplog, choice, shares):
    """1 class x 100 images, 9 classes x 5: `inverse` draws every class a tenth of the time, `sqrt`
    in proportion to the square root of its size; the labels delivered are those planned."""
    root = write_long_tail(tmp_path / "lt")
    caplog.set_level(logging.INFO, logger="fastloader")
    loader = build_loader(base_config(root, train={"class_weights": choice, "batch_size": 5}), "train")
    assert loader.num_samples == 145 and loader.order.length == 145
    within_binomial(np.bincount(drawn_labels(loader, range(200)), minlength=10), shares, 200 * 145)
    assert "expected class shares: c0 " in caplog.text and "drawn with replacement in proportion to " \
        f"train.class_weights: {choice}" in caplog.text
    delivered = [int(label) for _, labels in loader for label in labels]
    assert delivered == drawn_labels(loader, [0]).tolist()


@requires_realphotos
def test_class_balanced_sampling_of_a_long_tailed_split_of_real_photos(tmp_path):
    """The real photos as a long-tailed split: 100 photos in one class, 5 in each of 9 others (links
    to the photos); with class_weights: inverse each class is drawn about a tenth of the time, and
    the loader decodes and labels every drawn photo."""
    photos = sorted((REALPHOTOS / "train").glob("*/*"))
    assert len(photos) >= 145
    for c in range(10):
        folder = tmp_path / "lt" / "train" / f"c{c}"
        folder.mkdir(parents=True)
        for photo in photos[:100] if c == 0 else photos[100 + 5 * (c - 1):100 + 5 * c]:
            os.symlink(photo, folder / photo.name)
    config = base_config(tmp_path / "lt", train={"class_weights": "inverse", "batch_size": 29})
    loader = build_loader(config, "train")
    within_binomial(np.bincount(drawn_labels(loader, range(100)), minlength=10), np.full(10, 0.1), 100 * 145)
    labels = np.concatenate([labels.numpy() for _, labels in loader])
    assert np.array_equal(labels, drawn_labels(loader, [0])) and len(labels) == 145
    within_binomial(np.bincount(labels, minlength=10), np.full(10, 0.1), 145)


def test_class_weights_by_name_and_a_weights_file_multiply(tmp_path):
    root = write_numbered_dataset(tmp_path / "d", per_class=4, splits=("train",))
    names = sorted(str(p.relative_to(root)) for p in (root / "train").glob("*/*.png"))
    weights = tmp_path / "w.txt"
    weights.write_text("# name weight\n" + "".join(f"{name} {2 if name.endswith('00.png') else 1}\n"
                                                   for name in names))
    loader = build_loader(base_config(root, train={"weights": str(weights), "class_weights": {"c_blue": 0,
                                                                                               "a_red": 3}}), "train")
    p = loader.order.draws.probabilities
    expected = np.array([(2 if name.endswith("00.png") else 1) * {"a": 3, "b": 1, "c": 0}[name.split("/")[1][0]]
                         for name in names], dtype=float)
    assert np.allclose(p, expected / expected.sum())
    assert not (drawn_labels(loader, range(5)) == 2).any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_both_backends_deliver_the_planned_draws(tmp_path, backend):
    root = write_numbered_dataset(tmp_path / "d", per_class=6, splits=("train",))
    config = base_config(root, backend=backend, train={"class_weights": {"a_red": 6}, "epoch_size": 36,
                                                       "drop_last": False, "batch_size": 5})
    by_sample = [c for images, _ in build_loader({**config, "backend": "torch", "train": {
        "mode": "eval", "shuffle": False, "drop_last": False, "batch_size": 5, "transform": {"size": 32}}}, "train")
        for c in identities(images)]
    loader = build_loader(config, "train")
    for epoch in (0, 1):
        plan = np.concatenate(loader.order.batches(epoch))[:, 0]
        seen = [c for images, _ in loader for c in identities(images)]
        assert seen == [by_sample[i] for i in plan.tolist()] and len(seen) == 36
        assert len(set(plan.tolist())) < 36  # drawn with replacement


def weighted_epoch_with_broken_files(root: Path, backend: str) -> list[tuple[list[tuple], list[int]]]:
    """Two epochs of a split whose b_green and c_blue weigh 0 and half of whose a_red files became web
    pages after the loader was built: (identities, labels) per batch."""
    config = base_config(root, backend=backend, train={"class_weights": {"b_green": 0, "c_blue": 0}, "batch_size": 4,
                                                       "epoch_size": 24}, dali={"threads": 2})
    with build_loader(config, "train") as loader:
        for path in sorted((root / "train" / "a_red").glob("*.png"))[::2]:
            path.write_bytes(b"<!DOCTYPE html><html><body>Not Found</body></html>\n" * 8)
        return [(identities(images), labels.tolist()) for _ in range(2) for images, labels in loader]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_file_failing_under_weights_is_replaced_by_a_sample_the_weights_draw(tmp_path, backend):
    """Only a_red is drawn (the others weigh 0); half its files fail at decode time. Their slots were
    refilled uniformly from the split, so green and blue images (weight 0) came out; now every slot
    is refilled by the weights: 6 batches of 4 red images an epoch, the same on both backends."""
    root = write_numbered_dataset(tmp_path / "d", per_class=8, splits=("train",))
    batches = weighted_epoch_with_broken_files(root, backend)
    assert [len(labels) for _, labels in batches] == [4] * 12
    assert {label for _, labels in batches for label in labels} == {0}
    red = {colour for colours, _ in batches for colour in colours}
    assert len(red) <= 4  # the four red files that still decode, and nothing else
    if backend == "dali":  # the other backend on the same files, broken the same way
        again = write_numbered_dataset(tmp_path / "e", per_class=8, splits=("train",))
        assert weighted_epoch_with_broken_files(again, "torch") == batches


@pytest.mark.skipif(not __import__("importlib").util.find_spec("nvidia.dali"), reason="NVIDIA DALI is not installed")
def test_the_backends_agree_and_a_state_resumes_on_the_other(tmp_path):
    """Both backends: the same draws in the same batches (each image's colour names its file); a state
    saved by the torch backend after 2 batches resumes on DALI with the rest of the epoch."""
    root = write_numbered_dataset(tmp_path / "d", per_class=5, splits=("train",))
    config = base_config(root, train={"class_weights": "inverse", "epoch_size": 24})
    seen = {b: [identities(images) for images, _ in build_loader({**config, "backend": b}, "train")]
            for b in ("torch", "dali")}
    assert seen["torch"] == seen["dali"] and len(seen["torch"]) == 6
    torch_loader = build_loader({**config, "backend": "torch"}, "train")
    batches = iter(torch_loader)
    next(batches), next(batches)
    dali_loader = build_loader({**config, "backend": "dali"}, "train")
    dali_loader.load_state_dict(torch_loader.state_dict())
    assert [identities(images) for images, _ in dali_loader] == seen["torch"][2:]


def test_a_resume_on_2_ranks_then_3_delivers_the_rest_of_the_draws(tmp_path):
    root = write_numbered_dataset(tmp_path / "d", per_class=6, splits=("train",))
    config = base_config(root, train={"class_weights": "inverse", "epoch_size": 60, "drop_last": False})
    ranked = lambda r, w: {**config, "distributed": {"rank": r, "world_size": w}}  # noqa: E731
    whole = EpochOrder(18, 4, mode="train", shuffle=True, drop_last=False, seed=7,
                       draws=build_loader(config, "train").order.draws)
    consumed, state = [], None
    for rank in range(2):
        loader = build_loader(ranked(rank, 2), "train")
        batches = iter(loader)
        for _ in range(3):
            consumed.append(next(batches)[1])
        state = loader.state_dict()
    assert state["position"] == 24 and state["epoch_size"] == 60 and state["weights"]
    rest = []
    for rank in range(3):
        loader = build_loader(ranked(rank, 3), "train")
        loader.load_state_dict(state)
        rest.append(np.concatenate([labels.numpy() for _, labels in loader]))
    planned = build_loader(config, "train").index.labels[whole.permutation(0)]
    interleaved = [int(rest[r][k]) for k in range(len(rest[0])) for r in range(3)]
    assert interleaved[:60 - 24] == planned[24:].tolist()  # then the padding, from the start
    assert len({len(r) for r in rest}) == 1


def test_a_state_records_the_weights_and_refuses_others(tmp_path):
    root = write_numbered_dataset(tmp_path / "d", per_class=4, splits=("train",))
    for name in ("n_00.png", "n_01.png"):  # classes of 2, 4 and 4: inverse and sqrt weigh them apart
        (root / "train" / "a_red" / name).unlink()
    config = base_config(root, train={"class_weights": "inverse", "epoch_size": 20})
    state = build_loader(config, "train").state_dict()
    assert state["weights_from"] == "train.class_weights: inverse" and state["epoch_size"] == 20
    other = build_loader({**config, "train": {**config["train"], "class_weights": "sqrt"}}, "train")
    with pytest.raises(ValueError, match=r"loader state was saved with weights from train.class_weights: inverse "
                                         r"\(digest \w+\), this loader draws with weights from train.class_weights: "
                                         r"sqrt .* set train.class_weights: sqrt back as they were"):
        other.load_state_dict(state)
    unweighted = build_loader({**config, "train": {**config["train"], "class_weights": None}}, "train")
    with pytest.raises(ValueError, match="saved with weights from train.class_weights: inverse .* this loader draws "
                                         "with no weights"):
        unweighted.load_state_dict(state)
    longer = build_loader({**config, "train": {**config["train"], "epoch_size": 40}}, "train")
    with pytest.raises(ValueError, match="saved with train.epoch_size: 20, this loader has train.epoch_size: 40"):
        longer.load_state_dict(state)
    same = build_loader({**config, "train": {**config["train"], "class_weights": {"a_red": 2, "b_green": 1,
                                                                                   "c_blue": 1}}}, "train")
    same.load_state_dict(state)  # weights in the same proportions draw the same samples: the same digest
    old = {k: v for k, v in build_loader({**config, "train": {"batch_size": 4}}, "train").state_dict().items()
           if k not in ("weights", "weights_from", "epoch_size")}  # a state saved before weights
    build_loader({**config, "train": {"batch_size": 4}}, "train").load_state_dict(old)


# -- bad input ----------------------------------------------------------------------------------------


def weights_config(tmp_path, lines=None, **train):
    root = write_numbered_dataset(tmp_path / "d", per_class=3, splits=("train",))
    if lines is not None:
        (tmp_path / "w.txt").write_text("".join(f"{line}\n" for line in lines))
        train["weights"] = str(tmp_path / "w.txt")
    return base_config(root, train=train)


def every_line(tmp_path, weight="1", **replace):
    names = sorted(f"train/{p.parent.name}/{p.name}" for p in (tmp_path / "d" / "train").glob("*/*.png")) \
        if (tmp_path / "d").exists() else [f"train/{c}/n_{i:02d}.png" for c in ("a_red", "b_green", "c_blue")
                                           for i in range(3)]
    return [f"{name} {replace.get(name, weight)}" for name in names]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case, message", [
    ("negative", r"w.txt:2: the weight of 'train/a_red/n_01.png' is -2; a weight is a finite number >= 0 .*fix that"),
    ("nan", r"w.txt:2: the weight of 'train/a_red/n_01.png' is nan; a weight is a finite number >= 0"),
    ("infinite", r"w.txt:2: the weight of 'train/a_red/n_01.png' is inf; a weight is a finite number >= 0"),
    ("all zero", r"train.weights: every sample of split 'train' weighs 0, so none can be drawn; give some samples"),
    ("unknown name", r"train.weights: .*w.txt:10 names 'train/a_red/n_99.png', which split 'train' lacks \(1 name "
                     r"such\); names are as `fastloader check` writes them, relative to dataset.root"),
    ("missing sample", r"train.weights: .*w.txt gives no weight to 1 of the 9 samples of split 'train' \(the first: "
                       r"'train/c_blue/n_02.png'\); give every sample a line `name weight`"),
    ("not a number", r"w.txt:1: expected `name weight` \(a sample's name, then a number\)"),
    ("small epoch", r"train.epoch_size: 7 is below world_size x batch_size \(2 x 4 = 8\), so a rank would not get "
                    r"one whole batch an epoch; set train.epoch_size to at least 8"),
    ("unknown class", r"train.class_weights: 'c_bleu' is not a class of split 'train'; did you mean 'c_blue'\? Its "
                      r"classes: a_red, b_green, c_blue"),
    ("zero class weights", r"train.class_weights: every sample of split 'train' weighs 0"),
])
def test_bad_weights_fail_at_load_naming_the_key_and_the_fix(tmp_path, backend, case, message):
    lines = {"negative": every_line(tmp_path, **{"train/a_red/n_01.png": "-2"}),
             "nan": every_line(tmp_path, **{"train/a_red/n_01.png": "nan"}),
             "infinite": every_line(tmp_path, **{"train/a_red/n_01.png": "inf"}),
             "all zero": every_line(tmp_path, weight="0"),
             "unknown name": [*every_line(tmp_path), "train/a_red/n_99.png 1"],
             "missing sample": every_line(tmp_path)[:-1],
             "not a number": ["train/a_red/n_00.png heavy"]}.get(case)
    train = {"small epoch": {"epoch_size": 7}, "unknown class": {"class_weights": {"c_bleu": 2}},
             "zero class weights": {"class_weights": {"a_red": 0, "b_green": 0, "c_blue": 0}}}.get(case, {})
    config = weights_config(tmp_path, lines, **train)
    config.update(backend=backend, distributed={"rank": 0, "world_size": 2})
    with pytest.raises(ConfigError, match=message):
        build_loader(config, "train")


@pytest.mark.parametrize("scale", ["1e308", "5e-324"])
def test_weights_at_the_ends_of_the_float_range_draw_in_their_proportions(tmp_path, scale):
    """Every weight finite and >= 0, as the file's check wants, but 1e308 each summed to inf and 5e-324
    scaled by the sources' shares fell to 0: a bare ValueError that named no key (`check` called it
    an internal error). Weights are proportions: the draws are those of weights 1 and 2."""
    root = write_numbered_dataset(tmp_path / "d", per_class=3)
    names = [f"{split}/{c}/n_{i:02d}.png" for split in ("train", "val") for c in ("a_red", "b_green", "c_blue")
             for i in range(3)]
    double = {"1e308": "1.5e308", "5e-324": "1e-323"}[scale]  # about twice the other
    for sources in (None, [{"folder": "train", "weight": 1}, {"folder": "val", "weight": 3}]):
        listed = names if sources else names[:9]
        (tmp_path / "w.txt").write_text("".join(f"{name} {double if name.endswith('00.png') else scale}\n"
                                                for name in listed))
        train = {"weights": str(tmp_path / "w.txt"), "epoch_size": 30, **({"sources": sources} if sources else {})}
        p = build_loader(base_config(root, train=train), "train").order.draws.probabilities
        assert np.isfinite(p).all() and p.min() > 0 and np.isclose(p.sum(), 1)
        heavy = np.array([name.endswith("00.png") for name in listed])
        ratio = p[heavy].mean() / p[~heavy].mean()
        assert 1.4 < ratio < 2.1, ratio
        if sources:  # each source keeps its share, whatever its weights' scale
            assert np.isclose(p[:9].sum(), 0.25) and np.isclose(p[9:].sum(), 0.75)


def test_a_weights_file_may_name_the_files_the_split_left_out(tmp_path):
    """Bad files and dataset.exclude leave samples out; their lines in the weights file are fine."""
    config = weights_config(tmp_path, every_line(tmp_path))
    (tmp_path / "d" / "train" / "b_green" / "n_01.png").write_bytes(b"not an image")
    (tmp_path / "exclude.txt").write_text("train/c_blue/n_00.png\n")
    config["dataset"]["exclude"] = str(tmp_path / "exclude.txt")
    loader = build_loader(config, "train")
    assert loader.num_samples == 7 and len(loader.order.draws) == 7


@pytest.mark.parametrize("train, message", [
    ({"class_weights": {"a_red": -1}}, "train.class_weights: must be inverse, sqrt, or a mapping of class names to "
                                       "weights >= 0, got {a_red: -1.0}"),
    ({"class_weights": {"a_red": float("nan")}}, "train.class_weights.a_red: expected a finite number, got .nan"),
    ({"class_weights": {"a_red": float("inf")}}, "train.class_weights.a_red: expected a finite number, got .inf"),
    ({"class_weights": "inverted"}, "train.class_weights: expected one of 'inverse', 'sqrt' or a mapping"),
    ({"epoch_size": 0}, "train.epoch_size: must be an integer in [1, 4294967296], got 0"),
    ({"epoch_size": 2**40}, "train.epoch_size: must be an integer in [1, 4294967296], got 1099511627776"),
    ({"weights": "w.txt", "shuffle": False}, "train.shuffle: false reads the samples in index order, and "
                                             "train.weights draws them at random"),
    ({"class_weights": "inverse", "shuffle": "block", "block_size": "1GB"},
     "train.shuffle: block reads every shard once an epoch, and train.class_weights draw samples with replacement"),
])
def test_bad_weight_keys_fail_when_the_config_is_loaded(tmp_path, train, message):
    config = base_config(tmp_path, train=train)
    config["dataset"]["format"] = "webdataset" if train.get("shuffle") == "block" else "folder"
    with pytest.raises(ConfigError) as refused:
        load_config(config)
    assert message in str(refused.value)


@pytest.mark.parametrize("key, value", [("weights", "w.txt"), ("class_weights", "inverse"), ("epoch_size", 10)])
def test_eval_splits_refuse_weights_and_an_epoch_size(tmp_path, key, value):
    with pytest.raises(ConfigError, match=rf"val.{key}: applies only to train mode, and split 'val' has mode: eval: "
                                          rf"eval reads every sample exactly once, and {key} would draw some samples "
                                          rf"more than once and others never; remove val.{key}"):
        load_config(base_config(tmp_path, val={key: value}))


# -- check ---------------------------------------------------------------------------------------------


def test_check_reports_the_effective_class_distribution(tmp_path):
    root = write_long_tail(tmp_path / "lt", classes=12)
    config = tmp_path / "c.yaml"
    config.write_text(f"dataset: {{root: {root}}}\ntrain: {{class_weights: sqrt, epoch_size: 1000}}\n")
    result = subprocess.run([sys.executable, "-m", "fastloader.cli", "check", str(config)], capture_output=True,
                            text=True, env=cpu_only_env(tmp_path / "cache"), timeout=120)
    assert result.returncode == 0, result.stderr
    share = f"{100 * 10 / (10 + 11 * math.sqrt(5)):.1f}%"
    assert (f"  epoch: 1000 draws with replacement, by train.class_weights: sqrt; expected class shares: 12 classes, "
            f"8.3% each if balanced; most drawn: c0 {share}, ") in result.stdout
    assert "least drawn: c9 " in result.stdout
