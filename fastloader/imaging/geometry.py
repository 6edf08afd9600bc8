"""Where to crop: torchvision's RandomResizedCrop sampling (vectorized over a batch) and
Resize + CenterCrop, as one box.

The box is chosen from the image's size alone, before any pixel is decoded, so that the decoder can
decode less (see decode.py) and eval resizes only the centre region instead of the whole image.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

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


CROP_ATTEMPTS = 10
"""torchvision's RandomResizedCrop: tries before the centre fallback (NVIDIA's DALI example uses 100)."""
CROP_UNIFORMS = 4 * CROP_ATTEMPTS
"""Uniform draws per sample that random_resized_boxes takes: area, log-aspect, top, left per try."""


def random_resized_boxes(uniforms: np.ndarray, sizes: np.ndarray, scale: tuple[float, float],
                         ratio: tuple[float, float]) -> np.ndarray:
    """torchvision's RandomResizedCrop sampling for a batch, without a Python loop: int64 [B, 4]
    boxes (left, top, right, bottom) in whole pixels of upright images of `sizes` (int64 [B, 2],
    height and width; [B, 3] shapes work too), from `uniforms` (float [B, CROP_UNIFORMS] in [0, 1)).

    Each try draws an area fraction in `scale` and a log-uniform aspect in `ratio`; the first try
    whose rounded box fits is taken, placed uniformly (torchvision's randint, both ends included);
    when none of the 10 fits, the centre crop clamped to `ratio` (torchvision's fallback). A row
    depends on its own uniforms and size only, so a sample gets its box whatever batch it is in.
    """
    sizes = np.asarray(sizes, dtype=np.int64).reshape(len(uniforms), -1)[:, :2]  # (h, w), or a cache's (h, w, c)
    rows = np.arange(len(sizes))
    height, width = sizes[:, 0], sizes[:, 1]
    tries = np.asarray(uniforms, dtype=np.float64).reshape(len(sizes), CROP_ATTEMPTS, 4)
    area = (height * width)[:, None] * (scale[0] + (scale[1] - scale[0]) * tries[..., 0])
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = np.exp(log_lo + (log_hi - log_lo) * tries[..., 1])
    w = np.rint(np.sqrt(area * aspect))  # half to even, as Python's round() in torchvision
    h = np.rint(np.sqrt(area / aspect))
    fits = (w > 0) & (w <= width[:, None]) & (h > 0) & (h <= height[:, None])
    first = fits.argmax(axis=1)  # the first try that fits, as torchvision's loop takes
    w, h, chosen = w[rows, first].astype(np.int64), h[rows, first].astype(np.int64), tries[rows, first]
    top = np.minimum(np.floor(chosen[:, 2] * (height - h + 1)).astype(np.int64), height - h)
    left = np.minimum(np.floor(chosen[:, 3] * (width - w + 1)).astype(np.int64), width - w)
    fallback = ~fits[rows, first]
    if fallback.any():
        in_ratio = width / height
        fw = np.where(in_ratio > ratio[1], np.rint(height * ratio[1]), width).astype(np.int64)
        fh = np.where(in_ratio < ratio[0], np.rint(width / ratio[0]), height).astype(np.int64)
        w, h = np.where(fallback, fw, w), np.where(fallback, fh, h)
        top = np.where(fallback, (height - h) // 2, top)
        left = np.where(fallback, (width - w) // 2, left)
    return np.stack([left, top, left + w, top + h], axis=1)


def center_crop(width: int, height: int, size: int, crop_pct: float) -> Crop:
    """The source box that Resize(floor(size / crop_pct)) then CenterCrop(size) would keep."""
    return Crop(*centre_box(width, height, size, crop_pct))
