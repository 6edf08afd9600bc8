"""Where to crop: torchvision's RandomResizedCrop sampling and Resize + CenterCrop, as one box.

The box is chosen from the image's size alone, before any pixel is decoded, so that the decoder can
decode less (see decode.py) and eval resizes only the centre region instead of the whole image.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .boxes import centre_box


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

    def pixel_box(self, width: int, height: int) -> tuple[int, int, int, int]:
        """(left, top, right, bottom) in whole pixels of a width x height image: the box rounded, kept
        inside the image and at least one pixel wide and high. The decoder decodes exactly this box and
        the resize crops exactly this box, so both see the same pixels."""
        left = min(max(0, round(self.left)), width - 1)
        top = min(max(0, round(self.top)), height - 1)
        right = max(left + 1, min(width, round(self.right)))
        bottom = max(top + 1, min(height, round(self.bottom)))
        return left, top, right, bottom


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
    return Crop(*centre_box(width, height, size, crop_pct))
