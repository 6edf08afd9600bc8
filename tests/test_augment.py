"""The shared augmentation spec (fastloader/augment/): the policy grammar, the draws (a pure
function of each sample's seed and size, whatever its batch), their frequencies against the spec,
and the torch workers drawing what the spec draws. Host only: no device is involved."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fastloader import load_config
from fastloader.augment.ops import IDENTITY, KIND_IDS, KINDS, TIMM_OPS, TRIVIAL_OPS
from fastloader.augment.policy import RAND_INCREASING_OPS, RAND_OPS, SUB_POLICIES, parse_policy, policy_problem
from fastloader.draws import Augmenter
from fastloader.errors import ConfigError

ISSUE_STRINGS = ("rand-m9-mstd0.5-inc1", "rand-m7-mstd0.5-inc1", "rand-m9-mstd0.5", "original", "v0", "ta_wide")
"""The policies the issue names (DeiT, ResNet strikes back A1, timm's closest on Pillow 13,
AutoAugment's ImageNet policies, torchvision's recipe)."""
EXTREME_STRINGS = ("rand-m0", "rand-m30-mmax30", "rand-m9-n4-mstd101-p1", "rand-m10-mstd3-inc1-p1",
                   "rand-m15-mmax20-inc0-p1", "original-mstd2", "v0r", "originalr")
"""Strings whose magnitudes reach past the ops' ranges: they must clamp, not fail."""


def transform(**keys):
    return load_config({"dataset": {"root": "x"}, "train": {"transform": keys}}).split("train").transform


def augmenter(**keys) -> Augmenter:
    return Augmenter(transform(**keys), (0.485, 0.456, 0.406))


SEEDS = (np.arange(4000, dtype=np.int64) * 2654435761) % (1 << 62)
SIZES = np.stack([200 + SEEDS % 300, 150 + SEEDS % 257], axis=1)


@pytest.mark.parametrize("text", ISSUE_STRINGS + EXTREME_STRINGS)
def test_every_policy_string_parses_into_its_family(text):
    policy = parse_policy(text)
    assert policy.family == {"r": "rand", "o": "auto", "v": "auto", "t": "trivial"}[text[0]]
    assert text in policy.describe()


@pytest.mark.parametrize("text, closest", [
    ("rand-m9-mst0.5-inc1", "rand-m9-mstd0.5-inc1"), ("rnd-m9-mstd0.5", "rand-m9-mstd0.5"),
    ("rand-m9-inc", "rand-m9-inc1"), ("rand-m9-n0", "rand-m9-n2"), ("orignal", "original"),
    ("ta_wide-m9", "ta_wide"), ("Rand-M9", "rand-m9"), ("rand-m9-x3", "rand-m9"),
    # the papers' names (issue 41.17: 'randaugment' was offered 'three_augment', the closest by its letters)
    ("randaugment", "rand-m9-mstd0.5-inc1"), ("RandAugment-m7", "rand-m7"), ("auto_augment", "original"),
    ("trivial_augment", "ta_wide")])
def test_a_malformed_policy_fails_at_load_with_the_key_the_grammar_and_the_closest_valid_form(text, closest):
    with pytest.raises(ConfigError) as error:
        transform(auto_augment=text)
    message = str(error.value)
    assert "train.transform.auto_augment" in message and "rand-m{M}[-n{N}]" in message and "ta_wide" in message
    assert f"closest valid form: {closest!r}" in message
    assert policy_problem(closest)[0] == ""


def test_policy_keys_are_train_mode_only_and_colour_jitter_is_checked():
    with pytest.raises(ConfigError, match="val.transform.auto_augment: applies only to train mode"):
        load_config({"dataset": {"root": "x"}, "val": {"transform": {"auto_augment": "v0"}}})
    with pytest.raises(ConfigError, match=r"train.transform.color_jitter: must be .*hue in \[0, 0.5\]"):
        transform(color_jitter=[0.4, 0.4, 0.4, 0.6])
    with pytest.raises(ConfigError, match="train.transform.vflip: must be a probability"):
        transform(vflip=1.5)


def test_a_row_is_drawn_the_same_whatever_batch_it_is_in():
    """Crop, flips, ops and parameters of a sample depend on its seed and size only: drawn in one
    batch, in reverse, one at a time, or in a batch of strangers, the rows are identical."""
    aug = augmenter(auto_augment="rand-m9-mstd0.5-inc1", vflip=0.5)
    whole = aug.draw(SEEDS[:64], SIZES[:64])
    backwards = aug.draw(SEEDS[:64][::-1], SIZES[:64][::-1])
    mixed = aug.draw(np.concatenate([SEEDS[100:110], SEEDS[5:6]]), np.concatenate([SIZES[100:110], SIZES[5:6]]))
    for field in ("crop", "hflip", "vflip", "op", "param"):
        assert np.array_equal(getattr(backwards, field)[::-1], getattr(whole, field))
        assert np.array_equal(getattr(mixed, field)[-1], getattr(whole, field)[5])
        for row in (0, 17, 63):
            alone = aug.draw(SEEDS[row:row + 1], SIZES[row:row + 1])
            assert np.array_equal(getattr(alone, field)[0], getattr(whole, field)[row])


def test_crops_follow_torchvisions_sampling_and_fall_back_to_the_centre():
    aug = augmenter(scale=[0.08, 1.0])
    boxes = aug.crops(SEEDS, SIZES)
    assert np.array_equal(aug.crops(SEEDS, np.concatenate([SIZES, np.full((len(SIZES), 1), 3)], axis=1)), boxes)
    width, height = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    assert (boxes[:, :2] >= 0).all() and (boxes[:, 2] <= SIZES[:, 1]).all() and (boxes[:, 3] <= SIZES[:, 0]).all()
    area = width * height / (SIZES[:, 0] * SIZES[:, 1])
    assert 0.079 <= area.min() and area.max() <= 1
    assert (0.74 < width / height).all() and (width / height < 1.34).all()
    # the distribution is torchvision's: its own get_params on the same sizes
    from torchvision.transforms import RandomResizedCrop
    torch.manual_seed(0)
    theirs = np.array([RandomResizedCrop.get_params(torch.empty(1, h, w), [0.08, 1.0], [3 / 4, 4 / 3])
                       for h, w in SIZES.tolist()])  # top, left, height, width
    their_area = theirs[:, 2] * theirs[:, 3] / (SIZES[:, 0] * SIZES[:, 1])
    assert abs(area.mean() - their_area.mean()) < 0.02 and abs(np.median(area) - np.median(their_area)) < 0.03
    assert abs(np.log(width / height).mean() - np.log(theirs[:, 3] / theirs[:, 2]).mean()) < 0.02
    left_share = boxes[:, 0] / np.maximum(1, SIZES[:, 1] - width)
    assert abs(left_share.mean() - 0.5) < 0.03
    # a 1000 x 10 strip fits no 3/4..4/3 box: every sample takes torchvision's fallback, the
    # centre box clamped to the widest ratio, 13 x 10
    strip = aug.crops(SEEDS[:50], np.tile([[10, 1000]], (50, 1)))
    assert (strip == [493, 0, 506, 10]).all()


def test_randaugment_op_frequencies_match_the_spec():
    """rand-m9-mstd0.5-inc1: in each of 2 slots, 1 - p identity, else each of the 15 ops equally
    (with replacement); the level is normal around 9 (std 0.5) clipped to [0, 10]."""
    aug = augmenter(auto_augment="rand-m9-mstd0.5-inc1")
    _, _, op, param = aug.draw_ops(np.arange(60000))
    assert op.shape == (60000, 2)
    expected = {IDENTITY: 0.5}
    for name in RAND_INCREASING_OPS:
        kind = TIMM_OPS[name].kind_id
        expected[kind] = expected.get(kind, 0) + 0.5 / 15
    assert_frequencies(op.ravel(), expected)
    rotations = np.abs(param[op == KIND_IDS["rotate"]])
    assert abs(rotations.mean() - 27.0) < 0.3 and rotations.max() <= 30.0 and 1.0 < rotations.std() * 2 < 3.5
    signs = np.sign(param[op == KIND_IDS["shear_x"]])
    assert abs(signs.mean()) < 0.08
    bits = param[op == KIND_IDS["posterize"]]
    assert set(np.unique(bits)) <= {1.0, 2.0} and (bits == 1).mean() > 0.99  # 4 - int(level * 0.4): 0 clamps to 1


def test_autoaugment_and_trivialaugment_frequencies_match_the_spec():
    ops = augmenter(auto_augment="original").draw_ops(np.arange(50000))[2]
    expected: dict[int, float] = {}
    for sub in SUB_POLICIES["original"]:
        for name, prob, _ in sub:
            kind = TIMM_OPS[name].kind_id
            expected[kind] = expected.get(kind, 0) + prob / len(SUB_POLICIES["original"]) / 2
            expected[IDENTITY] = expected.get(IDENTITY, 0) + (1 - prob) / len(SUB_POLICIES["original"]) / 2
    assert_frequencies(ops.ravel(), expected)

    _, _, ops, params = augmenter(auto_augment="ta_wide").draw_ops(np.arange(50000))
    expected = {}
    for trivial in TRIVIAL_OPS:
        expected[trivial.kind_id] = expected.get(trivial.kind_id, 0) + 1 / len(TRIVIAL_OPS)
    assert_frequencies(ops.ravel(), expected)
    rotations = np.abs(params[ops == KIND_IDS["rotate"]])
    assert abs(rotations.mean() - 67.5) < 2.5 and rotations.max() <= 135.0
    assert set(np.unique(params[ops == KIND_IDS["posterize"]])) == {2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0}


def test_colour_jitter_draws_each_factor_in_its_range_in_a_random_order():
    aug = augmenter(color_jitter=[0.4, 0.3, 0.2, 0.1])
    _, _, op, param = aug.draw_ops(np.arange(24000))
    assert op.shape == (24000, 4)
    for kind, (low, high) in zip(("brightness", "contrast", "color", "hue"), aug.jitter):
        chosen = op == KIND_IDS[kind]
        assert (chosen.sum(axis=1) == 1).all()  # each once per sample
        assert_frequencies(np.argmax(chosen, axis=1), dict.fromkeys(range(4), 0.25))  # at each position equally
        assert low <= param[chosen].min() and param[chosen].max() <= high and np.ptp(param[chosen]) > 0.9 * (high - low)
    off = augmenter(color_jitter=[0.4, 0.0, 0.4])  # contrast and hue off: identity in their slots
    assert ((off.draw_ops(np.arange(100))[2] == IDENTITY).sum(axis=1) == 2).all()
    assert augmenter(color_jitter=0.4, auto_augment="v0").jitter is None  # off with a policy, as in timm


def test_colour_jitter_with_a_probability_and_solarize_are_drawn_on_their_own_coins():
    """color_jitter_prob: the four jitter slots all identity on the coin's no, else as before
    (p 1 draws exactly as without the key); solarize_prob: one slot after the blur, threshold 128."""
    seeds = np.arange(20000)
    always = augmenter(color_jitter=[0.4, 0.4, 0.2, 0.1]).draw_ops(seeds)
    sometimes = augmenter(color_jitter=[0.4, 0.4, 0.2, 0.1], color_jitter_prob=0.8).draw_ops(seeds)
    off = (sometimes[2] == IDENTITY).all(axis=1)
    assert abs(off.mean() - 0.2) < 0.01
    assert np.array_equal(sometimes[2][~off], always[2][~off]) and np.array_equal(sometimes[3][~off], always[3][~off])
    assert augmenter(color_jitter=0.4, color_jitter_prob=0.0).jitter is None
    spec = augmenter(gaussian_blur_prob=0.5, solarize_prob=0.2)
    assert spec.extra_slots == ("gaussian_blur", "solarize") and spec.slot_kinds[1] == (IDENTITY, KIND_IDS["solarize"])
    _, _, op, param = spec.draw_ops(seeds)
    solarized = op[:, 1] == KIND_IDS["solarize"]
    assert abs(solarized.mean() - 0.2) < 0.01 and (param[solarized, 1] == 128).all()
    assert np.array_equal(op[:, 0], augmenter(gaussian_blur_prob=0.5).draw_ops(seeds)[2][:, 0])  # the blur as before


@pytest.mark.parametrize("text", ISSUE_STRINGS + EXTREME_STRINGS)
def test_every_parameter_lies_in_its_kinds_valid_range(text):
    _, _, op, param = augmenter(auto_augment=text).draw_ops(np.arange(5000))
    for kind_id, kind in enumerate(KINDS):
        values = param[op == kind_id]
        assert ((kind.low <= values) & (values <= kind.high)).all(), kind.name
        if kind.name == "posterize":
            assert (values == np.round(values)).all()


@pytest.mark.parametrize("keys", [{"auto_augment": text} for text in ISSUE_STRINGS + EXTREME_STRINGS]
                         + [{"color_jitter": [0.4, 0.4, 0.4, 0.1]}, {"color_jitter": [0.4, 0.0, 0.4]}])
def test_each_slot_draws_only_the_kinds_it_declares_and_every_one_of_them(keys):
    """slot_kinds is what a backend builds a branch for (DALI's graph): a draw outside it would have
    none; a kind in it that is never drawn is a wasted branch (4000 samples draw every kind here)."""
    spec = augmenter(**keys)
    _, _, op, _ = spec.draw_ops(SEEDS)
    assert len(spec.slot_kinds) == spec.slots == op.shape[1]
    for slot, kinds in enumerate(spec.slot_kinds):
        drawn = set(op[:, slot].tolist())
        assert drawn == set(kinds), (slot, drawn ^ set(kinds))
    assert len(augmenter(color_jitter=[0.4, 0.4, 0.4, 0.1]).slot_kinds[0]) == 4  # of 17 kinds


def test_the_level_mapping_is_timms():
    """A few of timm's LEVEL_TO_ARG values, written out (timm/data/auto_augment.py, level 9)."""
    level, plus = np.array([9.0]), np.array([1.0])
    assert TIMM_OPS["Rotate"].params(level, -plus)[0] == pytest.approx(-27.0)
    assert TIMM_OPS["ShearX"].params(level, plus)[0] == pytest.approx(0.27)
    assert TIMM_OPS["TranslateXRel"].params(level, plus)[0] == pytest.approx(0.405)
    assert TIMM_OPS["Color"].params(level, plus)[0] == pytest.approx(1.72)
    assert TIMM_OPS["ContrastIncreasing"].params(level, -plus)[0] == pytest.approx(0.19)
    expected = {"Posterize": 3, "PosterizeOriginal": 7, "PosterizeIncreasing": 1, "Solarize": 230,
                "SolarizeIncreasing": 26, "SolarizeAdd": 99}
    assert {name: TIMM_OPS[name].params(level, plus)[0] for name in expected} == expected
    assert set(RAND_OPS) | set(RAND_INCREASING_OPS) <= set(TIMM_OPS)


def assert_frequencies(values: np.ndarray, expected: dict[int, float]) -> None:
    """Observed counts against expected probabilities: every category within 5 standard errors,
    and nothing outside them."""
    assert math.isclose(sum(expected.values()), 1.0)
    counts = np.bincount(values, minlength=max(expected) + 1)
    assert set(np.flatnonzero(counts)) <= set(expected)
    n = len(values)
    for category, probability in expected.items():
        error = math.sqrt(n * probability * (1 - probability))
        assert abs(counts[category] - n * probability) <= 5 * error + 1, (category, counts[category], n * probability)


def test_the_torch_worker_draws_a_batch_as_each_sample_alone_would(textured_root):
    """ImageDataset.__getitems__ draws the batch's ops at once; __getitem__ draws one sample's:
    the pixels are identical (and differ from the unaugmented ones)."""
    from fastloader.sources.formats import build_index
    from torch_loader.dataset import ImageDataset
    from torch_loader.loader import sample_transform
    config = load_config({"dataset": {"root": str(textured_root)}, "train": {"transform": {
        "size": 32, "auto_augment": "rand-m9-n3-mstd0.5-inc1-p1", "vflip": 0.5}}})
    split = config.split("train")
    index = build_index(config, split)
    dataset = ImageDataset(index, sample_transform(split))
    pairs = np.array([[i, 1000 + 7 * i] for i in range(len(index))][:8])
    batch = dataset.__getitems__(pairs)
    plain = ImageDataset(index, sample_transform(load_config(
        {"dataset": {"root": str(textured_root)}, "train": {"transform": {"size": 32}}}).split("train")))
    changed = 0
    for pair, (image, label, seed) in zip(pairs, batch):
        alone, alone_label, alone_seed = dataset[pair]
        assert torch.equal(image, alone) and label == alone_label and seed == alone_seed == pair[1]
        changed += not torch.equal(image, plain[pair][0])
    assert changed >= 6


def test_the_loader_names_its_policy_in_repr_and_its_start_up_line(solid_root, caplog):
    """Device: CPU (torch backend). The repr names the string, the log line the parsed policy,
    and a colour jitter that the policy turns off is logged."""
    import logging

    from fastloader import build_loader
    caplog.set_level(logging.INFO, logger="fastloader")
    config = {"dataset": {"root": str(solid_root)}, "backend": "torch", "workers": {"num_workers": 0},
              "train": {"batch_size": 4, "transform": {"size": 16, "auto_augment": "v0", "color_jitter": 0.4}}}
    with build_loader(config, "train") as loader:
        assert "auto_augment='v0'" in repr(loader)
        images, _ = next(iter(loader))
        assert images.shape == (4, 3, 16, 16)
    messages = [record.getMessage() for record in caplog.records]
    assert any("augmentation: v0: AutoAugment, 1 of 25 sub-policies of 2 ops" in m for m in messages)
    assert any("train.transform.color_jitter is off because train.transform.auto_augment is set" in m
               for m in messages)


TINY = [(6, {"gaussian_blur_prob": 1.0}), (3, {"auto_augment": "3a"}), (1, {"auto_augment": "rand-m9-mstd0.5-inc1"}),
        (1, {"auto_augment": "ta_wide"})]


@pytest.mark.parametrize("backend", ["torch", "dali"])
@pytest.mark.parametrize("size, transform", TINY, ids=lambda v: str(v))
def test_tiny_sizes_deliver_every_good_file_on_both_backends(textured_root, backend, size, transform):
    """At sizes below an op's window the torch backend's reflect pad raised, and the error was
    taken for the file's: good files listed as "cannot be decoded" and skipped (issue 68; DALI
    delivered them all). The DALI backend's CPU flavour."""
    from conftest import base_config

    from fastloader import build_loader
    config = base_config(textured_root, backend=backend, dataset={"on_bad_image": "skip"},
                         train={"batch_size": 5, "transform": {"size": size, **transform}})
    loader = build_loader(config, "train")
    shapes = [tuple(images.shape) for images, _ in loader]
    assert loader.bad_samples == [] and shapes == [(5, 3, size, size)] * (len(loader.index) // 5)


def test_an_ops_failure_stops_the_run_naming_the_op_never_the_file(textured_root, monkeypatch):
    """An op's exception is fastloader's bug, never the file's: not skipped under on_bad_image:
    skip, and named with the op, the crop's size and the sample. torch backend, CPU, no workers
    (the op replaced in this process by one that raises)."""
    from conftest import base_config

    from fastloader import build_loader
    from fastloader.errors import AugmentError
    from torch_loader import augment

    def broken(images, sigma):
        raise RuntimeError("an op's own bug")
    stacked = list(augment._STACKED_BY_ID)
    stacked[KIND_IDS["gaussian_blur"]] = broken
    monkeypatch.setattr(augment, "_STACKED_BY_ID", stacked)
    config = base_config(textured_root, dataset={"on_bad_image": "skip"},
                         train={"batch_size": 5, "transform": {"size": 24, "gaussian_blur_prob": 1.0}})
    loader = build_loader(config, "train")
    with pytest.raises(AugmentError, match=r"sample '\S+\.png': fastloader's augmentation ops \(gaussian_blur \S+\) "
                                           r"failed on a 24x24 crop: RuntimeError: an op's own bug\. This is "
                                           r"fastloader's bug, not the file's"):
        next(iter(loader))
    assert loader.bad_samples == []
