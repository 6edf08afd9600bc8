"""DeiT III's 3-Augment and the ops it needs (issue 37): grey and Gaussian blur in the one op table,
timm's RandAugment `t` sections (3a, 3aw, weights), the `3a` / `three_augment` policy, colour jitter
kept with it, grayscale_prob and gaussian_blur_prob. Draws (host, no device) and pixels: the torch
workers' functions against DALI's CPU flavour, on made-up images and on the real photos.
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import REALPHOTOS, requires_realphotos

from fastloader.augment.ops import KIND_IDS
from fastloader.augment.policy import RAND_WEIGHTED_3A, parse_policy, policy_problem

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is installed on Linux x86_64 / aarch64 only")

from test_augment_pixels import OP_TOLERANCE, SIZE, augmenter, dali_runner, every_kind, one_op, photos, torch_apply  # noqa: E402  # noqa: E402

from dali_loader.augment import dali_arrays  # noqa: E402

NEW_OPS = [("grayscale", 0.0), ("gaussian_blur", 0.1), ("gaussian_blur", 0.7), ("gaussian_blur", 1.9),
           ("gaussian_blur", 4.0)]
POLICIES = ["3a", "three_augment", "rand-m9-n3-mstd0.5-t3a", "rand-m9-mstd0.5-inc1-t3aw", "rand-m7-tweights"]
SEEDS = np.arange(4000) * 104729 + 11


def test_grammar_takes_the_op_sets_and_3a_and_names_a_bad_set():
    assert parse_policy("rand-m9-n3-t3a").ops == ("SolarizeIncreasing", "Desaturate", "GaussianBlur")
    assert parse_policy("three_augment").sub_policies == parse_policy("3a").sub_policies
    assert parse_policy("rand-m9-t3aw").weights == tuple(float(w) for w in RAND_WEIGHTED_3A.values())
    reason, closest = policy_problem("rand-m9-t3b")
    assert "'t' must be one of the op sets 3a, 3aw, weights, got '3b'" in reason and closest == "rand-m9-t3a"


def test_3a_gives_each_image_one_of_solarize_128_grey_and_a_blur_of_sigma_in_0_1_to_2():
    spec = augmenter(auto_augment="3a")
    _, _, op, param = spec.draw_ops(SEEDS)
    kinds = op[:, 0]
    solarize, grey, blur = (kinds == KIND_IDS[k] for k in ("solarize", "color", "gaussian_blur"))
    assert (solarize | grey | blur).all() and all(abs(part.mean() - 1 / 3) < 0.03 for part in (solarize, grey, blur))
    assert (param[solarize, 0] == 128).all() and (param[grey, 0] == 0).all()  # Desaturate at level 10: grey
    assert 0.1 <= param[blur, 0].min() and param[blur, 0].max() <= 2.0 and np.ptp(param[blur, 0]) > 1.5


def test_3a_keeps_colour_jitter_after_it_as_timm_does_and_other_policies_do_not():
    spec = augmenter(auto_augment="three_augment", color_jitter=0.3)
    assert spec.slots == 5 and spec.jitter is not None and "colour jitter" in spec.describe()
    assert augmenter(auto_augment="rand-m9-mstd0.5-inc1", color_jitter=0.3).jitter is None


def test_a_weighted_set_draws_its_ops_without_replacement_in_proportion_to_the_weights():
    """timm's np.random.choice(ops, n, replace=False, p=weights): no op twice in an image; each
    op's share of the first slot follows its weight."""
    spec = augmenter(auto_augment="rand-m9-n3-p1.0-t3aw")
    _, _, op, _ = spec.draw_ops(SEEDS)
    assert all(len(set(row)) == 3 for row in op.tolist() if KIND_IDS["color"] not in row)  # 2 ops are colour
    first = op[:, 0]
    weights = np.array(list(RAND_WEIGHTED_3A.values()), dtype=float)
    for name, weight in (("Rotate", 3), ("Invert", 1)):
        share = (first == KIND_IDS[name.lower()]).mean()
        assert abs(share - weight / weights.sum()) < 0.02, (name, share)


def test_grayscale_prob_and_gaussian_blur_prob_add_one_slot_each_after_the_others():
    spec = augmenter(auto_augment="rand-m9-n2", grayscale_prob=0.2, gaussian_blur_prob=0.4)
    assert spec.slots == 4 and spec.slot_kinds[2] == (0, KIND_IDS["grayscale"])
    _, _, op, param = spec.draw_ops(SEEDS)
    assert abs((op[:, 2] == KIND_IDS["grayscale"]).mean() - 0.2) < 0.03
    blurred = op[:, 3] == KIND_IDS["gaussian_blur"]
    assert abs(blurred.mean() - 0.4) < 0.03 and ((param[blurred, 3] >= 0.1) & (param[blurred, 3] <= 2.0)).all()
    before = augmenter(auto_augment="rand-m9-n2").draw_ops(SEEDS)[2]
    assert np.array_equal(op[:, :2], before)  # turning them on leaves the policy's draws as they were


def test_grey_and_blur_give_the_same_pixels_on_torch_and_dali_cpu():
    """Each new kind at fixed parameters, within the ops' tolerance (docs/semantics.md)."""
    images = photos()
    spec = every_kind()
    cases = [one_op(len(images), kind, param) for kind, param in NEW_OPS]
    run = dali_runner(spec, images, [dali_arrays(d, spec) for d in cases])
    for (kind, param), draws in zip(NEW_OPS, cases):
        difference = np.abs(run().astype(int) - torch_apply(spec, images, draws).astype(int))
        assert difference.mean() <= OP_TOLERANCE[0] and difference.max() <= OP_TOLERANCE[1], (kind, param)


@pytest.mark.parametrize("text", POLICIES)
def test_the_3a_policies_give_the_same_pixels_on_torch_and_dali_cpu(text):
    spec = augmenter(auto_augment=text, color_jitter=0.3, grayscale_prob=0.2, gaussian_blur_prob=0.3)
    images = np.concatenate([photos()] * 4)
    draws = spec.draw(SEEDS[:len(images)], np.full((len(images), 2), SIZE))
    ours = dali_runner(spec, images, [dali_arrays(draws, spec)])().astype(int)
    theirs = torch_apply(spec, images, draws).astype(int)
    difference = np.abs(ours - theirs).reshape(len(images), -1)
    assert difference.mean(axis=1).max() <= 0.5 and ((difference > 2).mean(axis=1) <= 0.05).all(), text


@pytest.mark.parametrize("case", NEW_OPS)
@requires_realphotos
def test_grey_and_blur_on_the_real_photos_within_the_ops_tolerance(case):
    """Eight real ImageNet photos, centre crops of SIZE px: the same tolerance as the made-up images."""
    from PIL import Image
    files = sorted((REALPHOTOS / "val").rglob("*.JPEG"))[:8]
    images = []
    for path in files:
        with Image.open(path) as image:
            image = image.convert("RGB")
            side = min(image.size)
            left, top = (image.width - side) // 2, (image.height - side) // 2
            images.append(np.asarray(image.crop((left, top, left + side, top + side)).resize((SIZE, SIZE))))
    images = np.stack(images)
    spec = every_kind()
    draws = one_op(len(images), *case)
    ours = dali_runner(spec, images, [dali_arrays(draws, spec)])().astype(int)
    difference = np.abs(ours - torch_apply(spec, images, draws).astype(int))
    assert difference.mean() <= OP_TOLERANCE[0] and difference.max() <= OP_TOLERANCE[1], case


def test_the_loader_says_colour_jitter_is_off_only_where_it_is(tmp_path, caplog):
    """With a 3a policy colour jitter stays on (timm), so the 'off' line must not be logged."""
    from conftest import base_config, write_solid_dataset

    from fastloader import build_loader
    root = write_solid_dataset(tmp_path / "data", per_class=2)
    for policy, said in (("three_augment", False), ("rand-m9-mstd0.5-inc1", True)):
        caplog.clear()
        config = base_config(root, train={"transform": {"size": 32, "auto_augment": policy, "color_jitter": 0.3}})
        with caplog.at_level("INFO", logger="fastloader"), build_loader(config, "train"):
            pass
        assert any("color_jitter is off" in r.getMessage() for r in caplog.records) == said, policy
