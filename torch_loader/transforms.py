"""The split's transform on uint8: decode the needed region, crop, resize, flip, then the
augmentation ops (auto_augment, color_jitter), every random parameter from the sample's seed
through the shared draws (fastloader.draws), as the DALI backend gets them.

Resizing runs on the uint8 tensor with torch's antialiased kernels, the ones
torchvision.transforms.v2's resize calls, which work on the decoder's HWC memory directly: 0.16 ms
per 224 px crop here, against 0.45 ms for Pillow's resize of the same box. The result is
[3, size, size] uint8 in HWC memory.
"""
from __future__ import annotations

from typing import NamedTuple, get_args

import numpy as np
import torch

from fastloader.augment.ops import KINDS
from fastloader.decoding.decode import allow_pixels, load_region
from fastloader.draws import Augmenter
from fastloader.errors import AugmentError, ConfigError, error_text
from fastloader.imaging.geometry import Crop, center_crop
from fastloader.locations import Location
from fastloader.schema import BOMB_PIXELS, Interpolation

from .augment import Context, apply_ops
from .live_iterator import uint8_resize_kernels

INTERPOLATIONS = get_args(Interpolation)
"""The transform's interpolation names, torchvision's InterpolationMode values."""


UINT8_KERNELS = uint8_resize_kernels()


class SampleOps(NamedTuple):
    """One sample's draws (fastloader.draws): the crop's size-free uniforms, the flips and
    each slot's op."""
    crop: np.ndarray
    hflip: bool
    vflip: bool
    op: list[int]
    param: list[float]


class SampleTransform:
    """(path, per-sample seed) -> uint8 [3, size, size]; picklable, so it travels to the workers."""

    def __init__(self, augmenter: Augmenter | None, size: int, crop_pct: float, interpolation: str,
                 exif_orientation: bool = True, use_draft: bool = True, max_pixels: int = BOMB_PIXELS):
        """`augmenter`: a train split's (its PreparedSplit's BatchPlan.augmentation, or a view
        group's); None in eval, which takes the centre box of `crop_pct`; `interpolation`: the
        transform's name of it (bilinear, bicubic, nearest...)."""
        self.train = augmenter is not None
        self.size, self.crop_pct = size, crop_pct
        if interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation {interpolation!r}: one of {', '.join(INTERPOLATIONS)}")
        self.interpolation = interpolation
        self.augmenter = augmenter
        self.context = Context(augmenter.fill, interpolation == "nearest") if self.train else None
        self.exif_orientation = exif_orientation
        self.use_draft = use_draft
        self.max_pixels = max_pixels
        allow_pixels(max_pixels)

    def sample_ops(self, seeds: np.ndarray, size: int | None = None) -> list[SampleOps | None]:
        """The draws of a batch's samples that need no image size, at once (None each in eval mode);
        `size`: the batch's output side, where a size schedule sets it."""
        if not self.train:
            return [None] * len(seeds)
        seeds = np.asarray(seeds, dtype=np.int64)
        hflip, vflip, op, param = self.augmenter.draw_ops(seeds, size)
        return [SampleOps(*row) for row in zip(self.augmenter.crop_uniforms(seeds), hflip.tolist(), vflip.tolist(),
                                                op.tolist(), param.tolist())]

    def crop_for(self, width: int, height: int, ops: SampleOps | None) -> Crop:
        """The train box from the sample's draws and the image's upright size; eval's centre box."""
        if ops is not None:
            box = self.augmenter.boxes(ops.crop[None], np.array([[height, width]]))[0].tolist()
            return Crop(*box, flip=ops.hflip)
        return center_crop(width, height, self.size, self.crop_pct)

    def __call__(self, where: str | Location, seed: int, ops: SampleOps | None = None,
                 size: int | None = None) -> torch.Tensor:
        """The sample's crop, from its file's path or its Location (a shard member), at `size`
        (default transform.size; a size schedule's: the batch's)."""
        size = size or self.size
        ops = ops or self.sample_ops([seed], size)[0]
        pixels, crop, _ = load_region(where, lambda w, h: self.crop_for(w, h, ops), size,
                                   exif_orientation=self.exif_orientation, use_draft=self.use_draft,
                                   max_pixels=self.max_pixels)
        return self.augment(self.resize(pixels, crop, size), ops)

    def from_pixels(self, pixels: np.ndarray, seed: int, ops: SampleOps | None = None,
                    size: int | None = None) -> torch.Tensor:
        """Already decoded upright HWC uint8 pixels (the cache's): the crop is chosen from their size."""
        size = size or self.size
        ops = ops or self.sample_ops([seed], size)[0]
        height, width = pixels.shape[:2]
        return self.augment(self.resize(torch.from_numpy(pixels), self.crop_for(width, height, ops), size), ops)

    def resize(self, pixels: torch.Tensor, crop: Crop, size: int | None = None) -> torch.Tensor:
        """Crop [H, W, 3] to the box (whole pixels, at least one) and resize it to size x size."""
        left, top, right, bottom = crop.pixel_box(pixels.shape[1], pixels.shape[0])
        out = resize_uint8(pixels[top:bottom, left:right].permute(2, 0, 1), size or self.size, self.interpolation)
        return out.flip(-1) if crop.flip else out

    def augment(self, image: torch.Tensor, ops: SampleOps | None) -> torch.Tensor:
        """The vertical flip and the ops, in timm's order: after the crop, resize and hflip."""
        if ops is None:
            return image
        if ops.vflip:
            image = image.flip(-2)
        if any(ops.op):
            try:
                image = apply_ops(image.contiguous(), ops.op, ops.param, self.context)
            except Exception as error:  # the op's failure, never the file's: not taken for a bad file
                raise AugmentError(op_failure(ops, image.shape, error)) from error
        return image


def op_failure(ops: SampleOps, shape: tuple, error: BaseException) -> str:
    """Words for ops that failed on a crop: which ops, what size, the error; fastloader's bug."""
    names = ", ".join(f"{KINDS[kind].name} {param:g}" for kind, param in zip(ops.op, ops.param) if kind)
    return (f"fastloader's augmentation ops ({names}) failed on a {shape[-2]}x{shape[-1]} crop: "
            f"{type(error).__name__}: {error_text(error)}. This is fastloader's bug, not the file's (nothing is "
            f"skipped for it): report it with the config's transform")


def torchvision_resize(interpolation: str, key: str = "transform.interpolation"):
    """torchvision's resize and its mode for `interpolation`, where torch has no uint8 kernel for
    it here (nearest, or bilinear without AVX2). The loader asks at build (torch_loader.loader's
    sample_transform), so that forked workers find it imported, and a torchvision that does not
    import (a build that does not match torch's, a folder that shadows it) is said once with the
    config `key` and the fix: met inside a worker it would look like a file that does not decode,
    sample after sample."""
    try:
        from torchvision.transforms.v2 import InterpolationMode, functional
    except Exception as error:  # a mismatched build raises ImportError, OSError or RuntimeError
        raise ConfigError(
            f"{key}: {interpolation} resizes through torchvision on this machine (torch has "
            f"no uint8 kernel for it here), and torchvision does not import ({error_text(error)}): reinstall it "
            f"(pip install --force-reinstall torchvision), or set interpolation: bicubic") from error
    return functional.resize, InterpolationMode(interpolation)


def resize_uint8(image: torch.Tensor, size: int, interpolation: str) -> torch.Tensor:
    """uint8 [3, h, w] -> [3, size, size], pixel for pixel what torchvision.transforms.v2.functional.resize
    gives (antialiased but nearest), in the same memory format: the same kernel, called without
    torchvision's and torch.nn.functional's Python on the way, which cost about 0.05 ms per image
    here, a sixth of the crop + resize stage (tests/test_torch_loader.py compares the two).
    torchvision itself is imported only where no such kernel serves (nearest, or bilinear without
    AVX2): importing it takes about 2 s (its models and ops import torch._dynamo), which every
    process that builds a torch loader would pay."""
    kernel = UINT8_KERNELS.get(interpolation)
    height, width = image.shape[1:]
    if (height, width) == (size, size):
        return image  # torchvision's resize returns an image of the size asked as it is
    if kernel is None:
        resize, mode = torchvision_resize(interpolation)
        return resize(image, [size, size], interpolation=mode, antialias=interpolation != "nearest")
    batch = image.reshape(1, 3, height, width)
    if batch.is_contiguous(memory_format=torch.channels_last) and batch.stride(0) != batch.numel():
        # HWC memory: a batch stride of the whole image tells torch that the output is channels_last
        # too, as torchvision arranges (pytorch/pytorch#68430), which spares a repack
        batch = batch.as_strided(batch.shape, (batch.numel(), *batch.stride()[1:]))
    return kernel(batch, [size, size], False)[0]
