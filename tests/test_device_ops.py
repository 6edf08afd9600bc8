"""Random erasing, batched: timm's sampling rules, reproducible from the samples' seeds."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import base_config, identities, requires_cuda, write_numbered_dataset

from fastloader import build_loader
from fastloader.device_ops import erase_boxes, erasing_enabled, random_erasing
from fastloader.schema import TransformConfig

ERASE = TransformConfig(erase_prob=0.25, erase_area=(0.05, 0.3), erase_ratio=(0.5, 2.0), erase_count=(1, 3))


def test_boxes_follow_probability_area_ratio_and_count():
    seeds = np.arange(20000, dtype=np.int64) * 7919
    boxes = erase_boxes(seeds, 100, 120, ERASE)
    used = boxes[..., 2] > 0
    erased = used.any(axis=1)
    assert abs(erased.mean() - 0.25) < 0.02
    counts = used[erased].sum(axis=1)
    assert set(np.unique(counts)) == {1, 2, 3}
    top, left, height, width = (boxes[..., i][used] for i in range(4))
    per_box_area = height * width / (100 * 120)
    count_of_box = np.repeat(counts, counts)  # boxes are filled in slot order: slots < count
    scaled = per_box_area * count_of_box  # timm divides the drawn area among the boxes
    assert scaled.min() > 0.05 * 0.8 and scaled.max() < 0.3 * 1.2
    assert (height / width).min() > 0.5 * 0.8 and (height / width).max() < 2.0 * 1.25
    assert (top >= 0).all() and (left >= 0).all() and (top + height <= 100).all() and (left + width <= 120).all()


def test_boxes_replay_from_the_seeds_and_differ_between_seeds():
    seeds = np.array([5, 6, 7, 8] * 50, dtype=np.int64)
    first, again = erase_boxes(seeds, 64, 64, ERASE), erase_boxes(seeds, 64, 64, ERASE)
    assert np.array_equal(first, again)
    assert np.array_equal(first[:4], first[4:8])  # a box is a function of its sample's seed alone
    assert not np.array_equal(first[0], first[1]) or not np.array_equal(first[1], first[2])


@pytest.mark.parametrize("mode", ["const", "rand", "pixel"])
def test_modes_fill_inside_the_boxes_only(mode):
    config = dataclasses.replace(ERASE, erase_prob=1.0, erase_count=(1, 1), erase_mode=mode)
    seeds = np.arange(16, dtype=np.int64)
    images = torch.full((16, 3, 48, 48), 5.0)
    random_erasing(images, seeds, config)
    boxes = erase_boxes(seeds, 48, 48, config)
    for image, (top, left, height, width) in zip(images, boxes[:, 0]):
        inside = image[:, top:top + height, left:left + width]
        outside = image.clone()
        outside[:, top:top + height, left:left + width] = 5.0
        assert (outside == 5.0).all() and height > 0 and (inside != 5.0).all()
        if mode == "const":
            assert (inside == 0).all()
        elif mode == "rand":  # one colour per box
            assert (inside == inside[:, :1, :1]).all()
        else:
            assert inside.std() > 0.5
    if mode != "const":
        values = torch.cat([image[image != 5.0] for image in images])
        assert abs(float(values.mean())) < 0.3 and 0.7 < float(values.std()) < 1.3  # normal(0, 1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dtype_and_channels_last_are_kept(dtype):
    images = torch.ones(4, 3, 32, 32, dtype=dtype).contiguous(memory_format=torch.channels_last)
    out = random_erasing(images, np.arange(4), dataclasses.replace(ERASE, erase_prob=1.0, erase_mode="pixel"))
    assert out is images and out.dtype == dtype and out.is_contiguous(memory_format=torch.channels_last)
    assert (out != 1).any()


def test_erasing_is_for_train_mode_only():
    assert erasing_enabled(ERASE, "train") and not erasing_enabled(ERASE, "eval")
    assert not erasing_enabled(TransformConfig(), "train")  # off by default


@pytest.mark.parametrize("mode", ["rand", "pixel"])
def test_a_samples_colour_or_noise_is_its_own_in_any_batch_at_any_place(mode):
    """One generator a batch, seeded with its first sample's seed, gave a sample other noise in
    another batch (a resume at another batch, another batch size: issue 68). On the CPU."""
    config = dataclasses.replace(ERASE, erase_prob=1.0, erase_mode=mode)
    seeds = np.array([11, 12, 13, 14, 15, 16], dtype=np.int64)
    whole = random_erasing(torch.full((6, 3, 40, 40), 5.0), seeds, config)
    for rows in ([3, 0], [5, 1, 4, 2], [2]):
        part = random_erasing(torch.full((len(rows), 3, 40, 40), 5.0), seeds[rows], config)
        assert torch.equal(part, whole[rows])
    assert not torch.equal(whole[0], whole[1])


@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("mode", ["rand", "pixel"])
@pytest.mark.parametrize("dtype, channels_last", [(torch.float32, False), (torch.bfloat16, True)])
def test_erasing_on_the_gpu_fills_each_box_as_on_the_cpu(mode, dtype, channels_last):
    """The same boxes, colours and noise on either device. The GPU against the CPU."""
    config = dataclasses.replace(ERASE, erase_prob=0.6, erase_mode=mode)
    seeds = np.arange(32, dtype=np.int64) * 7919
    images = torch.randn(32, 3, 56, 56).to(dtype)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    on_cpu = random_erasing(images.clone(), seeds, config)
    on_gpu = random_erasing(images.cuda(), seeds, config)
    assert not torch.equal(on_cpu, images) and torch.equal(on_gpu.cpu(), on_cpu)


@pytest.mark.parametrize("backend", ["torch", "dali"])
def test_a_samples_erasing_noise_stays_with_another_batch_size(tmp_path, backend):
    """Each sample erased with its own noise whatever batch it lands in: batches of 4 and of 3
    give every sample the same pixels. The DALI backend's CPU flavour."""
    root = write_numbered_dataset(tmp_path, per_class=4)

    def epoch(batch_size, erase):
        transform = {"size": 24, "erase_prob": 1.0 if erase else 0.0, "erase_mode": "pixel"}
        cfg = base_config(root, backend=backend, workers={"num_workers": 1},
                          train={"batch_size": batch_size, "transform": transform})
        return torch.cat([images for images, _ in build_loader(cfg, "train")])
    assert identities(epoch(4, False)) == identities(epoch(3, False))  # the same samples in the same order
    fours, threes = epoch(4, True), epoch(3, True)
    assert len(fours) == 12 and torch.equal(fours, threes)
