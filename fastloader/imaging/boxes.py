"""The eval crop box both backends use, computed on the host from an image's size alone.

Why one function: the torch backend crops this box before it resizes, and the DALI backend passes
it to its resize with each batch; the two agree on the box because they share its arithmetic,
including torchvision's rounding (a truncated long side, the crop offset rounded half to even).
It is written over arrays, so that the DALI feed computes a whole batch's boxes without a Python
loop per sample; numpy's float64 arithmetic and rounding are Python's, so one image's box is the same.
"""
from __future__ import annotations

import math

import numpy as np


def centre_boxes(widths: np.ndarray, heights: np.ndarray, size: int, crop_pct: float) -> np.ndarray:
    """float64 [n, 4] (left, top, right, bottom) in source pixels, fractional: the region of each
    upright image that torchvision's Resize(floor(size / crop_pct)) then CenterCrop(size) keeps.

    Resizing this box straight to size x size samples the very positions that resizing the whole
    image and cropping would, without computing the pixels the crop throws away.
    """
    widths = np.asarray(widths, dtype=np.int64)
    heights = np.asarray(heights, dtype=np.int64)
    short = math.floor(size / crop_pct)
    portrait = widths <= heights
    long_side = np.where(portrait, short * heights, short * widths) / np.where(portrait, widths, heights)
    long_side = long_side.astype(np.int64)  # int(): truncated, as torchvision's Resize does
    resized_w = np.where(portrait, short, long_side)
    resized_h = np.where(portrait, long_side, short)
    sx, sy = widths / resized_w, heights / resized_h
    top = np.round((resized_h - size) / 2.0)  # half to even, as Python's round
    left = np.round((resized_w - size) / 2.0)
    return np.stack([left * sx, top * sy, (left + size) * sx, (top + size) * sy], axis=1)


def centre_box(width: int, height: int, size: int, crop_pct: float) -> tuple[float, float, float, float]:
    """One image's centre box (see centre_boxes)."""
    return tuple(centre_boxes(np.array([width]), np.array([height]), size, crop_pct)[0].tolist())
