"""Any Pillow image mode as correct RGB: a leaf both the decoders and a source's decoded images use,
so that a 16-bit PNG gives the same pixels whether it comes as a file's bytes or as the PIL image a
source's read() returns."""
from __future__ import annotations

import numpy as np
from PIL import Image


def to_rgb(image: Image.Image) -> Image.Image:
    """Correct RGB from any mode. 16- and 32-bit greyscale is scaled to 8 bits (Pillow's own
    conversion would clip it to white); transparent palette images go through RGBA."""
    if image.mode == "RGB":
        return image
    return to_8_bits(image).convert("RGB")


def to_8_bits(image: Image.Image) -> Image.Image:
    """An image of 8-bit channels: 16- and 32-bit greyscale scaled to mode L (I;16 shifted by 8 bits,
    I by 8 where its values pass 255), float greyscale clipped, a transparent palette as RGBA; any
    other mode as it is."""
    if image.mode.startswith("I;16") or image.mode == "I":
        array = np.asarray(image)
        bits = 16 if image.mode.startswith("I;16") or array.max() > 255 else 8
        return Image.fromarray((array.astype(np.uint32) >> (bits - 8)).astype(np.uint8), mode="L")
    if image.mode == "F":
        return Image.fromarray(np.clip(np.asarray(image), 0, 255).astype(np.uint8), mode="L")
    if image.mode in ("P", "PA") and "transparency" in image.info:
        return image.convert("RGBA")
    return image
