"""The eval crop box both backends use, computed on the host from an image's size alone.

Why one function: the torch backend crops this box before it resizes, and the DALI backend passes
it to its resize with each batch; the two agree on the box because they share its arithmetic,
including torchvision's rounding (a truncated long side, the crop offset rounded half to even).
"""
from __future__ import annotations

import math


def centre_box(width: int, height: int, size: int, crop_pct: float) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) in source pixels, fractional: the region of the upright image
    that torchvision's Resize(floor(size / crop_pct)) then CenterCrop(size) keeps.

    Resizing this box straight to size x size samples the very positions that resizing the whole
    image and cropping would, without computing the pixels the crop throws away.
    """
    short = math.floor(size / crop_pct)
    if width <= height:
        resized_w, resized_h = short, int(short * height / width)
    else:
        resized_w, resized_h = int(short * width / height), short
    sx, sy = width / resized_w, height / resized_h
    top = int(round((resized_h - size) / 2.0))
    left = int(round((resized_w - size) / 2.0))
    return left * sx, top * sy, (left + size) * sx, (top + size) * sy
