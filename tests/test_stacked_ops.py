"""The photometric ops on a stack of images (torch_loader/stacked_ops.py, augment.apply_ops_stacked):
every image of a stack gets, pixel for pixel, what it gets alone, whichever ops its neighbours
drew. Device: CPU (the torch workers' ops)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fastloader import load_config
from fastloader.augment.ops import IDENTITY, KIND_IDS
from fastloader.draws import Augmenter
from torch_loader.augment import Context, apply_ops, apply_ops_stacked

SIZE = 40
DINO = {"color_jitter": [0.4, 0.4, 0.2, 0.1], "color_jitter_prob": 0.8, "grayscale_prob": 0.2,
        "gaussian_blur_prob": 0.5, "solarize_prob": 0.2}
"""DINOv2's per-view ops, with a blur and a solarize coin on every image."""


def photos(count: int, seed: int = 0) -> torch.Tensor:
    """uint8 [count, 3, SIZE, SIZE]: gradients, a disc and noise, each image its own."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:SIZE, 0:SIZE]
    images = []
    for i in range(count):
        base = np.stack([x * (3 + i % 5) % 256, y * 255 // SIZE, (x + y) * (1 + i % 3) % 200 + 30], 0).astype(float)
        base[:, (x - 15 - i % 7) ** 2 + (y - 20) ** 2 < 60 + 9 * i] = [[220], [40 + 7 * i % 200], [90]]
        images.append(np.clip(base * (0.4 + 0.05 * (i % 12)) + rng.normal(0, 14, base.shape), 0, 255))
    return torch.from_numpy(np.stack(images).astype(np.uint8))


def draws(keys: dict, count: int, seed: int = 7) -> tuple[np.ndarray, np.ndarray, Context]:
    transform = load_config({"dataset": {"root": "x"}, "train": {"transform": {"size": SIZE, **keys}}}
                            ).split("train").transform
    augmenter = Augmenter(transform, (0.485, 0.456, 0.406))
    _, _, op, param = augmenter.draw_ops(np.arange(seed, seed + count, dtype=np.int64))
    return op, param, Context(augmenter.fill, False)


@pytest.mark.parametrize("keys", [DINO, {"auto_augment": "rand-m9-mstd0.5-inc1", **DINO},
                                  {"auto_augment": "ta_wide"}, {"auto_augment": "original"}],
                         ids=["dinov2", "randaugment+dinov2", "trivial", "autoaugment"])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_stack_gives_each_image_what_it_gets_alone(keys, threads):
    """48 images, each with its own draw of the policy, through apply_ops_stacked at once and
    through apply_ops one by one: the same pixels, with one intra-op thread (a worker's) or two (a
    loader without workers)."""
    images = photos(48)
    op, param, context = draws(keys, len(images))
    assert len(np.unique(op)) > 4  # the stack mixes kinds in its slots
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        stacked = apply_ops_stacked(images.float(), op, param, context).to(torch.uint8)
        alone = torch.stack([apply_ops(image, o.tolist(), p.tolist(), context)
                             for image, o, p in zip(images, op, param)])
    finally:
        torch.set_num_threads(before)
    assert torch.equal(stacked, alone), (stacked.int() - alone.int()).abs().amax(dim=(1, 2, 3))
    changed, drew = (stacked != images).flatten(1).any(dim=1).numpy(), (op != IDENTITY).any(axis=1)
    assert not changed[~drew].any() and changed[drew].mean() > 0.7  # a neutral draw (rotate 0) may change nothing


def test_each_colour_op_in_a_stack_is_its_own_formula():
    """One stack, each image a different colour op: brightness scales, grey has equal channels and
    is the luma, contrast keeps the mean grey (within rounding), saturation 1 and hue 0 keep the
    image, solarize inverts what is at or above its threshold."""
    images = photos(7, seed=3)
    names = ["brightness", "grayscale", "contrast", "color", "hue", "solarize", "brightness"]
    op = np.array([[KIND_IDS[name]] for name in names])
    param = np.array([[1.5], [0], [0.5], [1.0], [0.0], [128], [1.0]], np.float32)
    out = apply_ops_stacked(images.float(), op, param, Context((0, 0, 0), False))
    x = images.float()
    assert torch.equal(out[0], (x[0] * 1.5).round().clamp(0, 255))
    luma = (0.299 * x[1, 0] + 0.587 * x[1, 1] + 0.114 * x[1, 2]).round()
    assert torch.equal(out[1, 0], out[1, 1]) and torch.equal(out[1, 1], out[1, 2])
    assert (out[1, 0] - luma).abs().max() <= 1
    grey_mean = (0.299 * x[2, 0] + 0.587 * x[2, 1] + 0.114 * x[2, 2]).mean()
    assert abs(float((0.299 * out[2, 0] + 0.587 * out[2, 1] + 0.114 * out[2, 2]).mean()) - float(grey_mean)) < 0.6
    assert torch.equal(out[3], x[3]) and torch.equal(out[4], x[4]) and torch.equal(out[6], x[6])
    assert torch.equal(out[5], torch.where(x[5] >= 128, 255 - x[5], x[5]))


@pytest.mark.parametrize("side", [1, 2, 3, 6])
def test_blur_and_sharpness_work_on_crops_smaller_than_their_window(side):
    """torch's reflect pad refuses a pad as wide as the image: a 13-pixel blur window on a 6 px crop,
    sharpness on 1 px, which the torch backend then took for undecodable files (issue 68). Reflected
    as often as the window needs, as DALI's reflect_101 border; a flat image stays flat. The CPU."""
    flat = torch.full((1, 3, side, side), 77, dtype=torch.uint8)
    image = photos(1)[:, :, :side, :side].contiguous()
    for kind, param in (("gaussian_blur", 2.0), ("gaussian_blur", 0.3), ("sharpness", 1.8)):
        op, value, ctx = np.array([[KIND_IDS[kind]]]), np.array([[param]], np.float32), Context((0, 0, 0), False)
        assert torch.equal(apply_ops(flat[0], op[0].tolist(), value[0].tolist(), ctx), flat[0])
        out = apply_ops(image[0], op[0].tolist(), value[0].tolist(), ctx)
        assert out.shape == image[0].shape and out.dtype == torch.uint8


def test_the_reflected_border_is_torchs_where_torch_pads_and_keeps_reflecting_past_it():
    from torch_loader.stacked_ops import reflect_padded
    x = torch.arange(2 * 3 * 5 * 4, dtype=torch.float32).view(2, 3, 5, 4)
    for pad in (1, 2, 3):
        assert torch.equal(reflect_padded(x, pad), torch.nn.functional.pad(x, (pad,) * 4, mode="reflect"))
    assert reflect_padded(x[..., :1, :3], 4)[0, 0].tolist() == [[0, 1, 2, 1, 0, 1, 2, 1, 0, 1, 2]] * 9
    assert reflect_padded(x[..., :2, :1], 2)[0, 0, :, 0].tolist() == [0, 4, 0, 4, 0, 4]
