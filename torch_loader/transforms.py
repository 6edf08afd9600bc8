"""Train and eval transforms on uint8: pick a crop box in source pixels, decode, crop+resize once.

Why this shape: the crop is chosen from the image's header size before any pixel is decoded, so
(1) the JPEG decoder can downscale by 2/4/8 in the DCT domain when the box is at least that much
larger than the output (Pillow's `draft`): fewer pixels decoded and resized, and (2) eval crops the
centre region and resizes it once, instead of resizing the whole image and throwing most away.
The geometry is torchvision's: RandomResizedCrop's sampling and Resize(floor(size / crop_pct)) +
CenterCrop(size), expressed as one box.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps

from fastloader.config import SplitConfig

RESAMPLE = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
            "nearest": Image.Resampling.NEAREST}
_EXIF_ORIENTATION = 0x0112
_TRANSPOSED_ORIENTATIONS = (5, 6, 7, 8)  # width and height swap when these are applied


@dataclass(frozen=True)
class Crop:
    """A region of the (upright) source image to resize to the output size, and whether to flip."""
    left: float
    top: float
    right: float
    bottom: float
    flip: bool = False

    def scaled(self, sx: float, sy: float) -> "Crop":
        return Crop(self.left * sx, self.top * sy, self.right * sx, self.bottom * sy, self.flip)


def random_resized_crop(width: int, height: int, rng: random.Random, scale: tuple[float, float],
                        ratio: tuple[float, float], hflip: float) -> Crop:
    """torchvision's RandomResizedCrop sampling (10 tries, then a centre crop), from our own rng."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = rng.randint(0, height - h)
            left = rng.randint(0, width - w)
            return Crop(left, top, left + w, top + h, rng.random() < hflip)
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        w, h = int(round(height * ratio[1])), height
    else:
        w, h = width, height
    top, left = (height - h) // 2, (width - w) // 2
    return Crop(left, top, left + w, top + h, rng.random() < hflip)


def center_crop(width: int, height: int, size: int, crop_pct: float) -> Crop:
    """The source box that Resize(floor(size / crop_pct)) then CenterCrop(size) would keep."""
    short = math.floor(size / crop_pct)
    if width <= height:
        resized_w, resized_h = short, int(short * height / width)
    else:
        resized_w, resized_h = int(short * width / height), short
    sx, sy = width / resized_w, height / resized_h
    top = int(round((resized_h - size) / 2.0))
    left = int(round((resized_w - size) / 2.0))
    return Crop(left * sx, top * sy, (left + size) * sx, (top + size) * sy)


class SampleTransform:
    """Path + per-sample seed -> uint8 HWC array of the split's output size (picklable for workers)."""

    def __init__(self, split: SplitConfig, exif_orientation: bool = True, use_draft: bool = True):
        t = split.transform
        self.train = split.mode == "train"
        self.size, self.scale, self.ratio, self.hflip, self.crop_pct = t.size, t.scale, t.ratio, t.hflip, t.crop_pct
        self.resample = RESAMPLE[t.interpolation]
        self.exif_orientation = exif_orientation
        self.use_draft = use_draft

    def crop_for(self, width: int, height: int, seed: int) -> Crop:
        if self.train:
            return random_resized_crop(width, height, random.Random(seed), self.scale, self.ratio, self.hflip)
        return center_crop(width, height, self.size, self.crop_pct)

    def __call__(self, path: str, seed: int) -> np.ndarray:
        with Image.open(path) as image:
            orientation = image.getexif().get(_EXIF_ORIENTATION, 1) if self.exif_orientation else 1
            if orientation not in (1, 2, 3, 4, 5, 6, 7, 8):
                orientation = 1
            if orientation != 1:  # rare: decode fully, turn upright, then crop in upright coordinates
                upright = ImageOps.exif_transpose(image)
                crop = self.crop_for(upright.width, upright.height, seed)
                return self._finish(upright, crop)
            crop = self.crop_for(image.width, image.height, seed)
            if self.use_draft and image.format == "JPEG":
                crop = self._draft(image, crop)
            return self._finish(image, crop)

    def _draft(self, image: Image.Image, crop: Crop) -> Crop:
        """Let the JPEG decoder shrink by 2/4/8 while the box stays at least `size` pixels wide and high."""
        box_w, box_h = crop.right - crop.left, crop.bottom - crop.top
        factor = min(box_w, box_h) / self.size
        if factor < 2:
            return crop
        full_w, full_h = image.size
        requested = (math.ceil(full_w / factor), math.ceil(full_h / factor))
        image.draft("RGB", requested)
        if image.size == (full_w, full_h):
            return crop
        return crop.scaled(image.width / full_w, image.height / full_h)

    def _finish(self, image: Image.Image, crop: Crop) -> np.ndarray:
        image = to_rgb_compatible(image)
        box = (crop.left, crop.top, crop.right, crop.bottom)
        out = image.resize((self.size, self.size), self.resample, box=box)
        if out.mode != "RGB":
            out = out.convert("RGB")
        if crop.flip:
            out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return np.asarray(out)


def to_rgb_compatible(image: Image.Image) -> Image.Image:
    """An image Pillow can resize and then convert to RGB with correct colours.

    RGB and L resize as they are (L becomes RGB after the resize, on fewer pixels). 16- and 32-bit
    greyscale is scaled to 8 bits (Pillow's own conversion would clip it to white). Every other mode
    (CMYK, YCbCr, P, RGBA, LA, 1, ...) is converted to RGB first.
    """
    if image.mode in ("RGB", "L"):
        return image
    if image.mode.startswith("I;16") or image.mode == "I":
        bits = 16 if image.mode.startswith("I;16") or np.asarray(image).max() > 255 else 8
        array = np.asarray(image).astype(np.uint32) >> (bits - 8)
        return Image.fromarray(array.astype(np.uint8), mode="L")
    if image.mode == "F":
        return Image.fromarray(np.clip(np.asarray(image), 0, 255).astype(np.uint8), mode="L")
    if image.mode in ("P", "PA") and "transparency" in image.info:
        image = image.convert("RGBA")
    return image.convert("RGB")
