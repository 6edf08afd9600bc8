"""Mixup, cutmix and soft targets (fastloader/mixing.py): timm's semantics, drawn from the samples'
seeds, the same on both backends and after a resume. Every test here runs on the CPU; the GPU's
whole-batch kernels are checked against the CPU's pair-by-pair path on CPU tensors."""
from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
import torch
from conftest import DEVICES, base_config, write_numbered_dataset, write_textured_dataset

from fastloader import build_loader
from fastloader.mixing import BatchMixer, beta_symmetric, mix_images, plan_mixing, soft_targets
from fastloader.order import seeded_uniform
from fastloader.schema import MixupConfig, SplitConfig

BACKENDS = ["torch", pytest.param("dali", marks=pytest.mark.skipif(
    not __import__("importlib").util.find_spec("nvidia.dali"), reason="NVIDIA DALI is not installed"))]
BOTH = {"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "prob": 0.8, "switch_prob": 0.5}


def ks_distance(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    a, b = np.sort(a), np.sort(b)
    x = np.concatenate([a, b])
    return float(np.abs(np.searchsorted(a, x, side="right") / len(a) - np.searchsorted(b, x, side="right") / len(b))
                 .max())


@pytest.mark.parametrize("alpha", [0.1, 0.2, 0.8, 1.0, 4.0])
def test_beta_draws_from_uniforms_follow_numpys_beta(alpha):
    n = 100_000
    ours = beta_symmetric(np.full(n, alpha), seeded_uniform(np.arange(n) * 7919 + 3, 11, 50))
    theirs = np.random.default_rng(0).beta(alpha, alpha, n)
    assert ks_distance(ours, theirs) < 0.01  # the 0.1% critical value at this size is 0.0087
    assert 0 <= ours.min() and ours.max() <= 1


@pytest.mark.parametrize("settings", [BOTH, {"cutmix_alpha": 1.0}, {"mixup_alpha": 0.2, "prob": 0.5},
                                      {"mixup_alpha": 0.4, "cutmix_minmax": (0.2, 0.8), "switch_prob": 0.7}])
def test_draws_follow_timms_mixup(settings):
    """Per element, as timm's Mixup draws them (seeded here): how often a sample is mixed, how often
    with cutmix, and the distribution of lam after the cutmix box's correction."""
    mixup = pytest.importorskip("timm.data.mixup")
    n, height, width = 8_000, 24, 32
    np.random.seed(0)
    timm_mix = mixup.Mixup(mode="elem", num_classes=10, label_smoothing=0.0, **{"mixup_alpha": 0.0, **settings})
    lam, cutmix = timm_mix._params_per_elem(n)
    lam = lam.astype(np.float64)
    for i in np.flatnonzero(cutmix & (lam < 1)):
        _, lam[i] = mixup.cutmix_bbox_and_lam((height, width), lam[i], ratio_minmax=timm_mix.cutmix_minmax,
                                              correct_lam=True)
    plan = plan_mixing(np.arange(n) * 31 + 1, height, width, MixupConfig(mode="elem", **settings))
    assert abs((plan.lam < 1).mean() - (lam < 1).mean()) < 0.025
    assert abs((plan.cutmix & (plan.lam < 1)).mean() - (cutmix & (lam < 1)).mean()) < 0.025
    assert ks_distance(plan.lam, lam) < 0.035  # the 0.1% critical value at this size is 0.031


def recover(out: torch.Tensor, own: torch.Tensor, partner: torch.Tensor) -> tuple[str, float]:
    """What happened to one image, read from its pixels alone: ('same', 1), ('mixup', lam) where
    out = lam x own + (1 - lam) x partner, or ('cutmix', lam) where a box holds the partner's pixels."""
    if torch.equal(out, own):
        return "same", 1.0
    took = (out == partner) & (out != own)
    if took.any():
        where = took.all(dim=0)
        rows, cols = where.any(dim=1).nonzero().flatten(), where.any(dim=0).nonzero().flatten()
        top, bottom, left, right = int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1
        expected = own.clone()
        expected[:, top:bottom, left:right] = partner[:, top:bottom, left:right]
        assert torch.equal(out, expected), "the pasted pixels are not one box"
        return "cutmix", 1 - (bottom - top) * (right - left) / (out.shape[1] * out.shape[2])
    difference = partner - own
    lam = 1 - float((out - own).flatten() @ difference.flatten() / (difference.flatten() @ difference.flatten()))
    assert torch.allclose(out, lam * own + (1 - lam) * partner, atol=1e-5), "neither a blend nor a box"
    return "mixup", lam


@pytest.mark.parametrize("size", [8, 7])
@pytest.mark.parametrize("mode", ["batch", "pair", "elem"])
def test_every_image_is_its_mix_and_every_target_matches_it(mode, size):
    """The issue's check: each image is lam x itself + (1 - lam) x its partner (B-1-i), or carries its
    partner's box with lam = 1 - box area / image area; its target is lam x its smoothed one-hot + (1 - lam)
    x its partner's. An odd batch's middle sample stays as it is, with its own target."""
    split = SplitConfig(name="train", mode="train", label_smoothing=0.1, mixup=MixupConfig(mode=mode, **BOTH))
    mixer = BatchMixer(split, num_classes=5)
    kinds = set()
    generator = torch.Generator().manual_seed(0)
    for draw in range(12):
        images = torch.randn(size, 3, 16, 20, generator=generator)
        labels = torch.randint(0, 5, (size,), generator=generator)
        out, targets = mixer(images.clone(), labels, np.arange(size) * 1000 + draw)
        assert targets.dtype == torch.float32 and targets.shape == (size, 5)
        assert torch.allclose(targets.sum(dim=1), torch.ones(size))
        smoothed = torch.full((size, 5), 0.1 / 5).scatter_(1, labels.view(-1, 1), 1 - 0.1 + 0.1 / 5)
        seen = []
        for i in range(size):
            j = size - 1 - i
            kind, lam = recover(out[i], images[i], images[j])
            kinds.add(kind)
            seen.append((kind, round(lam, 4)))
            assert torch.allclose(targets[i], lam * smoothed[i] + (1 - lam) * smoothed[j], atol=1e-5), (i, kind)
        if size % 2:
            assert seen[size // 2] == ("same", 1.0) and torch.allclose(targets[size // 2], smoothed[size // 2])
        if mode == "batch":  # one draw for the batch: the same kind and lam everywhere else
            assert len({s for i, s in enumerate(seen) if i != size // 2 or size % 2 == 0}) == 1
        if mode == "pair":  # i and B-1-i share theirs
            assert all(seen[i] == seen[size - 1 - i] for i in range(size))
    assert kinds == {"same", "mixup", "cutmix"}


@pytest.mark.parametrize("mode", ["batch", "pair", "elem"])
def test_the_gpus_whole_batch_kernels_give_the_cpus_pixels(mode):
    """On a GPU the batch is mixed against its flipped copy; on the CPU pair by pair: the same pixels."""
    for draw in range(8):
        plan = plan_mixing(np.arange(9) * 13 + draw, 20, 24, MixupConfig(mode=mode, **BOTH))
        images = torch.randn(9, 3, 20, 24)
        assert torch.equal(mix_images(images.clone(), plan, pairwise=True),
                           mix_images(images.clone(), plan, pairwise=False))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dtype_and_channels_last_are_kept(dtype):
    plan = plan_mixing(np.arange(6), 16, 16, MixupConfig(mode="elem", mixup_alpha=1.0, cutmix_alpha=1.0))
    for pairwise in (True, False):
        images = torch.randn(6, 3, 16, 16).to(dtype).contiguous(memory_format=torch.channels_last)
        before = images.clone()
        out = mix_images(images, plan, pairwise=pairwise)
        assert out is images and out.dtype == dtype and out.is_contiguous(memory_format=torch.channels_last)
        assert not torch.equal(out, before)


def test_label_smoothing_alone_gives_smoothed_one_hot_rows():
    targets = soft_targets(torch.tensor([2, 0, 1]), None, num_classes=4, smoothing=0.2)
    expected = [[0.05, 0.05, 0.85, 0.05], [0.85, 0.05, 0.05, 0.05], [0.05, 0.85, 0.05, 0.05]]
    assert targets.dtype == torch.float32 and torch.allclose(targets, torch.tensor(expected))


def test_the_draws_made_ahead_for_an_epoch_are_the_draws_made_per_batch():
    split = SplitConfig(name="train", mode="train", mixup=MixupConfig(**BOTH))
    mixer = BatchMixer(split, num_classes=10)
    batches = [np.stack([np.arange(16), np.arange(16) * 7 + 1000 * k], axis=1) for k in range(40)]
    mixer.start_epoch(batches)
    for batch in batches:
        ahead, fresh = mixer.plan(batch[:, 1], 224, 224), plan_mixing(batch[:, 1], 224, 224, mixer.mix)
        assert all(np.array_equal(getattr(ahead, f.name), getattr(fresh, f.name))
                   for f in dataclasses.fields(fresh))


def mixing_config(root, backend, device="cpu", **train):
    return base_config(root, backend=backend, output={"device": device}, train={
        "batch_size": 5, "drop_last": False, "aug_repeats": 2, "label_smoothing": 0.1,
        "mixup": {"mode": "elem", **BOTH}, "transform": {"size": 32}, **train})


def epoch(loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(images.clone(), targets.clone()) for images, targets in loader]


def test_both_backends_mix_the_same_batches_and_say_so(tmp_path, caplog):
    """Images of one solid colour each: whatever the crop, both backends' pixels are the same, so their
    mixed batches must be too (the draws come from the samples' seeds, not from a backend's RNG)."""
    if not __import__("importlib").util.find_spec("nvidia.dali"):
        pytest.skip("NVIDIA DALI is not installed")
    root = write_numbered_dataset(tmp_path / "d", per_class=4, splits=("train",))  # 12 images
    runs = {}
    for backend in ("torch", "dali"):
        with caplog.at_level(logging.INFO, logger="fastloader"):
            with build_loader(mixing_config(root, backend), "train") as loader:
                assert loader.num_classes == 3
                runs[backend] = epoch(loader)
    torch_run, dali_run = runs["torch"], runs["dali"]
    # torch workers erase and mix the pixels they wrote (the collate), the main process makes the
    # targets: the same batches as without workers
    config = mixing_config(root, "torch", transform={"size": 32, "erase_prob": 0.5})
    with build_loader(config, "train") as single, \
            build_loader({**config, "workers": {"num_workers": 2}}, "train") as workers:
        for (x, y), (wx, wy) in zip(epoch(single), epoch(workers), strict=True):
            assert torch.equal(x, wx) and torch.equal(y, wy)
    assert [len(t) for _, t in torch_run] == [5, 5, 2]  # 12 positions: 6 samples x 2 copies, a short last batch
    for (torch_images, torch_targets), (dali_images, dali_targets) in zip(torch_run, dali_run, strict=True):
        assert torch.allclose(torch_images, dali_images, atol=1e-5)
        assert torch.equal(torch_targets, dali_targets)
    one_hot = 1 - 0.1 + 0.1 / 3
    assert any((targets.max(dim=1).values < one_hot - 1e-4).any() for _, targets in torch_run)  # really mixed
    lines = [r.getMessage() for r in caplog.records if "epoch 0, rank 0:" in r.getMessage()]
    assert len(lines) == 2 and all(
        "mixup 0.8 + cutmix 1 (mode elem, prob 0.8, switch 0.5), label smoothing 0.1; "
        "repeated augmentation x2 (12 positions per epoch over 1 rank)" in line for line in lines)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_resumed_epoch_mixes_and_repeats_as_the_uninterrupted_run(tmp_path, backend):
    """Textured images: both backends replay their crops from the samples' seeds, and the mixing
    from the same seeds, so the resumed batches are identical, pixels and targets."""
    root = write_textured_dataset(tmp_path / "d", per_class=6, splits=("train",))  # 18 images
    config = mixing_config(root, backend, batch_size=4, drop_last=True, aug_repeats=3,
                           mixup={"mode": "batch", **BOTH})
    with build_loader(config, "train") as loader:
        reference = epoch(loader) + epoch(loader)
    with build_loader(config, "train") as loader:
        for step, _ in enumerate(loader):
            if step == 1:
                state = loader.state_dict()
                break
    assert state["position"] == 8 and state["aug_repeats"] == 3
    with build_loader(config, "train") as loader:
        loader.load_state_dict(state)
        resumed = epoch(loader) + epoch(loader)
    assert len(reference) == 2 * 4 and len(resumed) == len(reference) - 2  # 18 positions, batches of 4
    for (ref_images, ref_targets), (images, targets) in zip(reference[2:], resumed, strict=True):
        assert torch.equal(ref_targets, targets) and torch.equal(ref_images, images)
    other = mixing_config(root, backend, batch_size=4, aug_repeats=2)
    with build_loader(other, "train") as loader, pytest.raises(ValueError, match="train.aug_repeats: 3, this loader"):
        loader.load_state_dict(state)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
def test_mixed_batches_and_soft_targets_on_the_loaders_device(tmp_path, backend, device):
    """On the GPU, the batch is mixed by whole-batch kernels: the same pixels (to 1e-5) and targets as on
    the CPU, and the targets on the GPU. Solid-colour images, so that both backends' crops agree."""
    root = write_numbered_dataset(tmp_path / "d", per_class=4, splits=("train",))
    with build_loader(mixing_config(root, backend, device), "train") as loader, \
            build_loader(mixing_config(root, "torch"), "train") as reference:
        for (images, targets), (ref_images, ref_targets) in zip(loader, reference, strict=True):
            assert images.device.type == targets.device.type == device and targets.dtype == torch.float32
            assert torch.allclose(images.cpu(), ref_images, atol=1e-5)
            assert torch.allclose(targets.cpu(), ref_targets, atol=1e-6)  # a GPU's lerp may round differently
