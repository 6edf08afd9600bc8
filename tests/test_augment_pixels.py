"""The ops' pixels on both backends: the torch workers' functions (torch_loader/augment.py) against
DALI's CPU flavour (dali_loader/augment.py, in a small standalone pipeline fed by an external
source, as the loader's graph will feed it), per op at fixed magnitudes and for whole policies
drawn from the shared spec. Device: CPU (DALI's CPU flavour; the GPU flavour runs the same graph).
"""
from __future__ import annotations

import collections
import re

import numpy as np
import pytest
import torch
from test_augment import EXTREME_STRINGS, ISSUE_STRINGS

from fastloader import load_config
from fastloader.augment.ops import KIND_IDS, KINDS
from fastloader.draws import Augmenter

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is installed on Linux x86_64 / aarch64 only")

from nvidia.dali import fn, pipeline_def, types  # noqa: E402

from dali_loader.augment import DALI_OPS, augment_images, dali_arrays, feed_arrays, feed_inputs  # noqa: E402
from torch_loader.augment import TORCH_OPS, Context, apply_ops  # noqa: E402

SIZE = 96
OP_CASES = [("rotate", 20.0), ("rotate", -7.5), ("shear_x", 0.2), ("shear_y", -0.25), ("translate_x", 0.3),
            ("translate_y", -0.2), ("posterize", 2), ("solarize", 100), ("solarize_add", 60), ("color", 1.6),
            ("color", 0.3), ("contrast", 1.5), ("contrast", 0.4), ("brightness", 1.4), ("brightness", 0.5),
            ("sharpness", 1.8), ("sharpness", 0.2), ("auto_contrast", 0), ("equalize", 0), ("invert", 0),
            ("hue", 0.1), ("hue", -0.3)]
"""Each kind at one or two magnitudes (both sides of neutral for the blends)."""
OP_TOLERANCE = (0.3, 1)
"""Mean and max absolute difference per op, in grey levels (docs/semantics.md: measured 0.25 and 1)."""


def photos(count: int = 6) -> np.ndarray:
    """Photo-like uint8 [count, SIZE, SIZE, 3]: gradients, a few edges, noise, a dark and a bright one."""
    rng = np.random.default_rng(3)
    y, x = np.mgrid[0:SIZE, 0:SIZE]
    images = []
    for i in range(count):
        base = np.stack([x * (2 + i) % 256, y * 255 // SIZE, (x + y) * (i + 1) % 200 + 30], -1).astype(float)
        base[(x - 40) ** 2 + (y - 50) ** 2 < 300 + 100 * i] = [220, 40 + 30 * i, 90]
        base = base * (0.4 + 0.15 * i) + rng.normal(0, 12, base.shape)
        images.append(np.clip(base, 0, 255).astype(np.uint8))
    return np.stack(images)


def augment_pipeline(augmenter: Augmenter, source, batch_size: int, nearest: bool = False):
    """augment_images in a built CPU pipeline, fed (images, *feed arrays but the crop) by `source`."""
    inputs = feed_inputs(augmenter)[2:]  # the flips and ops; the crop inputs are the decoder's
    names = [name for name, _ in inputs]

    @pipeline_def(enable_conditionals=True)
    def graph():
        nodes = fn.external_source(source, num_outputs=1 + len(names), batch=True,
                                   layout=["HWC"] + [""] * len(names),
                                   dtype=[types.UINT8] + [dtype for _, dtype in inputs])
        return augment_images(nodes[0], dict(zip(names, nodes[1:])), augmenter, nearest)

    pipe = graph(batch_size=batch_size, num_threads=1, device_id=None, seed=1)
    pipe.build()
    return pipe


def dali_runner(augmenter: Augmenter, images: np.ndarray, batches, nearest: bool = False):
    """Run augment_images in a CPU pipeline over `batches` of feed arrays (one per run): the outputs."""
    feed = iter(batches)
    pipe = augment_pipeline(augmenter, lambda: (images, *next(feed)[2:]), len(images), nearest)
    return lambda: np.array(pipe.run()[0].as_tensor())


def torch_apply(augmenter: Augmenter, images: np.ndarray, draws, nearest: bool = False) -> np.ndarray:
    """What the torch workers do after the resize: the flips, then the slots."""
    context = Context(augmenter.fill, nearest)
    out = []
    for i, image in enumerate(images):
        x = torch.from_numpy(image).permute(2, 0, 1)
        x = x.flip(-1) if draws.hflip[i] else x
        x = x.flip(-2) if draws.vflip[i] else x
        out.append(apply_ops(x.contiguous(), draws.op[i].tolist(), draws.param[i].tolist(), context).permute(1, 2, 0))
    return torch.stack(out).numpy()


def one_op(batch: int, kind: str, param: float):
    """Draws that give every sample of a batch the one op, no flip."""
    from fastloader.draws import Draws
    return Draws(np.zeros((batch, 4), np.int64), np.zeros(batch, bool), np.zeros(batch, bool),
                 np.full((batch, 1), KIND_IDS[kind], np.int32), np.full((batch, 1), param, np.float32))


def augmenter(**keys) -> Augmenter:
    t = load_config({"dataset": {"root": "x"}, "train": {"transform": {"size": SIZE, **keys}}}).split("train").transform
    return Augmenter(t, (0.485, 0.456, 0.406))


def every_kind(**keys) -> Augmenter:
    """A one-slot spec whose graph has a branch for every kind, so that each op can be fed alone,
    whichever policy draws it (no single policy draws them all: hue is colour jitter's)."""
    spec = augmenter(auto_augment="rand-m9-n1", **keys)
    spec.slot_kinds = (tuple(range(len(KINDS))),)
    return spec


def test_every_kind_has_one_function_on_each_backend():
    assert list(TORCH_OPS) == list(DALI_OPS) == [kind.name for kind in KINDS]


def test_each_op_gives_the_same_pixels_on_torch_and_dali_cpu():
    """Per op at fixed magnitudes, on the same images: within OP_TOLERANCE (the mean is of all pixels)."""
    images = photos()
    spec = every_kind()
    batch = len(images)

    cases = [one_op(batch, kind, param) for kind, param in OP_CASES]
    run = dali_runner(spec, images, [dali_arrays(d, spec) for d in cases])
    worst = {}
    for (kind, param), draws in zip(OP_CASES, cases):
        ours, theirs = run().astype(int), torch_apply(spec, images, draws).astype(int)
        difference = np.abs(ours - theirs)
        worst[f"{kind}({param})"] = (difference.mean(), difference.max())
        assert not np.array_equal(theirs, images) or kind == "identity"  # the op did something
    too_far = {case: d for case, d in worst.items() if d[0] > OP_TOLERANCE[0] or d[1] > OP_TOLERANCE[1]}
    assert not too_far, too_far


def test_nearest_sampling_warps_the_same_on_torch_and_dali_cpu():
    """interpolation: nearest: a source point on a pixel boundary takes the same pixel on both;
    near-ties in a rotation may pick the neighbour in at most 0.1% of pixels."""
    images = photos()
    spec = every_kind(interpolation="nearest")
    cases = [("rotate", 20.0), ("shear_x", 0.2), ("shear_y", -0.3), ("translate_x", 0.3)]
    draws = [one_op(len(images), kind, param) for kind, param in cases]
    run = dali_runner(spec, images, [dali_arrays(d, spec) for d in draws], nearest=True)
    for case, d in zip(cases, draws):
        difference = np.abs(run().astype(int) - torch_apply(spec, images, d, nearest=True).astype(int))
        assert (difference > 0).mean() <= 0.001, case


@pytest.mark.parametrize("text", ISSUE_STRINGS + EXTREME_STRINGS[:3] + ("colour jitter",))
def test_every_policy_gives_the_same_pixels_on_torch_and_dali_cpu(text):
    """A batch drawn from the shared spec (mixed ops per sample, routed by DALI's select): every
    sample within 0.5 grey levels on average. A one-level rounding difference of one op grows in
    the next where it steepens (equalize after a warp or a blend, a blend by 5x): at most 5% of an
    image's pixels differ by more than 2 levels (docs/semantics.md)."""
    spec = augmenter(color_jitter=[0.4, 0.4, 0.4, 0.1], vflip=0.5) if text == "colour jitter" else \
        augmenter(auto_augment=text, vflip=0.5)
    images = np.concatenate([photos()] * 4)
    seeds = np.arange(len(images)) * 7919 + len(text)
    draws = spec.draw(seeds, np.full((len(images), 2), SIZE))
    ours = dali_runner(spec, images, [dali_arrays(draws, spec)])().astype(int)
    theirs = torch_apply(spec, images, draws).astype(int)
    difference = np.abs(ours - theirs).reshape(len(images), -1)
    assert difference.mean(axis=1).max() <= 0.5, draws.op
    assert ((difference > 2).mean(axis=1) <= 0.05).all()
    assert len({tuple(row) for row in draws.op.tolist()}) > 3  # the batch mixes ops


def operators(pipe) -> collections.Counter:
    """How many operators of each type a built pipeline holds (DALI names them __Type_N)."""
    return collections.Counter(re.sub(r"^_+|_\d+$", "", op.name) for op in pipe._ops)


@pytest.mark.parametrize("keys, absent", [
    ({"color_jitter": [0.4, 0.4, 0.4, 0.1]}, ("WarpAffine", "Equalize", "Filter")),
    ({"auto_augment": "original"}, ("Hue",))])
def test_each_slot_of_the_graph_holds_only_the_ops_its_policy_can_draw(keys, absent):
    """Colour jitter's 4 slots draw brightness, contrast, colour and hue: no warp, equalize or
    sharpness filter in the graph (with all 17 kinds per slot it held 738 operators, 20 warps, and
    took 4.5 s to build here); AutoAugment's slots only their sub-policies' ops. Device: CPU
    flavour (the GPU flavour builds the same graph)."""
    spec = augmenter(**keys)
    held = operators(augment_pipeline(spec, lambda: None, 4))
    assert not any(held[name] for name in absent), held
    assert sum(held.values()) < 200, sum(held.values())
    everything = augmenter(**keys)
    everything.slot_kinds = (tuple(range(len(KINDS))),) * everything.slots
    assert sum(operators(augment_pipeline(everything, lambda: None, 4)).values()) > 1.8 * sum(held.values())


def test_a_draw_the_graph_has_no_branch_for_is_refused_not_routed_to_another_op():
    spec = augmenter(color_jitter=[0.4, 0.4, 0.4, 0.1])
    draws = spec.draw(np.arange(4), np.full((4, 2), SIZE))
    draws.op[2, 1] = KIND_IDS["rotate"]
    with pytest.raises(ValueError, match="slot 1 drew rotate, which its policy cannot draw"):
        dali_arrays(draws, spec)


def test_the_feed_arrays_match_the_declared_inputs_and_the_crop_they_encode():
    """What the DALI feed passes: one dense array per declared input, [B, ...], its DALI dtype;
    the crop box as (x, y) anchor and (width, height) shape slices what the torch backend crops."""
    spec = augmenter(auto_augment="rand-m9-mstd0.5-inc1")
    seeds, sizes = np.arange(5), np.array([[300, 400], [50, 60], [500, 200], [64, 64], [1000, 10]])
    arrays = feed_arrays(spec, seeds, sizes)
    numpy_of = {types.FLOAT: np.float32, types.INT32: np.int32}
    assert [name for name, _ in feed_inputs(spec)] == ["crop_anchor", "crop_shape", "hflip", "aug_op", "aug_param"]
    for (name, dtype), array in zip(feed_inputs(spec), arrays, strict=True):
        assert array.dtype == numpy_of[dtype] and len(array) == 5, name
    assert arrays[3].shape == (5, 2) and arrays[4].shape == (5, 2, 2)
    # a flip is fed only where the split can draw it (no input DALI would warn is unused)
    assert [name for name, _ in feed_inputs(augmenter())] == ["crop_anchor", "crop_shape", "hflip"]
    assert [name for name, _ in feed_inputs(augmenter(vflip=0.5))] == ["crop_anchor", "crop_shape", "hflip", "vflip"]
    assert [name for name, _ in feed_inputs(augmenter(hflip=0.0))] == ["crop_anchor", "crop_shape"]
    both = augmenter(vflip=0.5)
    flips = feed_arrays(both, seeds, sizes)[2:4]
    draws = both.draw(seeds, sizes)
    assert np.array_equal(flips[0], draws.hflip) and np.array_equal(flips[1], draws.vflip)
    boxes = spec.crops(seeds, sizes)
    assert np.array_equal(arrays[0], boxes[:, :2]) and np.array_equal(arrays[1], boxes[:, 2:] - boxes[:, :2])


@pytest.mark.parametrize("sigma", [0.1, 0.5, 1.0, 1.7, 2.0])
def test_the_torch_blur_is_torchvisions_gaussian_within_one_level(sigma):
    """Device: CPU. The torch backend's blur (a row pass, then a column pass) against torchvision's
    gaussian_blur (the 2-D kernel) at the same window: the same filter, float rounding apart; on a
    crop in HWC memory (as the crops come) and in CHW memory."""
    from torchvision.transforms.v2 import functional as F

    from torch_loader.stacked_ops import blur_window
    gaussian_blur = TORCH_OPS["gaussian_blur"]
    window = blur_window(sigma)
    image = torch.from_numpy(np.random.default_rng(4).integers(0, 256, size=(40, 56, 3), dtype=np.uint8))
    for layout in (image.permute(2, 0, 1), image.permute(2, 0, 1).contiguous()):
        ours, theirs = gaussian_blur(layout, sigma, None), F.gaussian_blur(layout, [window, window], [sigma, sigma])
        assert ours.dtype == torch.uint8 and ours.shape == theirs.shape
        difference = (ours.int() - theirs.int()).abs()
        assert difference.max() <= 1 and difference.float().mean() < 0.01
