"""File -> upright RGB uint8 pixels (HWC tensor), decoding as few pixels as the crop allows.

The header is read first (Pillow, a few KB) so that the caller can choose its crop from the image
size. Then the cheapest decoder that gives correct RGB is used, measured on 2 cores (ms/image,
500x375 ImageNet JPEGs): libjpeg-turbo through torchvision's `decode_jpeg` 0.95; Pillow 1.0 plus
0.2-0.3 to copy its pixels out. Pillow stays in charge of every other case: JPEGs that the crop
lets the decoder shrink by 2/4/8 (`draft`, DCT-domain scaling), CMYK/YCCK JPEGs, EXIF-rotated photos,
PNG, WEBP, GIF, BMP, TIFF, 16-bit and palette images.
"""
from __future__ import annotations

import functools
import io
import logging
import math
import warnings
from typing import Callable

import numpy as np
import torch
from PIL import Image, ImageOps

from fastloader.screen import BOMB_PIXELS

from .geometry import Crop

log = logging.getLogger("fastloader")
_EXIF_ORIENTATION = 0x0112
# torchvision 0.29 deprecates its decoders in favour of TorchCodec and warns on every call; we pick
# the available one below and say so once, rather than once per image.
warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision",
                        category=DeprecationWarning)


@functools.lru_cache(maxsize=None)
def jpeg_decoder() -> tuple[str, Callable[[torch.Tensor], torch.Tensor] | None]:
    """(name, bytes tensor -> RGB uint8 [3, H, W]) of the libjpeg-turbo decoder at hand, else (pillow, None)."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
        return "torchvision.io.decode_jpeg", functools.partial(decode_jpeg, mode=ImageReadMode.RGB)
    except (ImportError, OSError) as error:
        reason = f"torchvision.io.decode_jpeg unavailable ({error})"
    try:
        from torchcodec.decoders import decode_jpeg as torchcodec_decode_jpeg
        return "torchcodec.decoders.decode_jpeg", functools.partial(torchcodec_decode_jpeg, mode="RGB")
    except (ImportError, OSError, RuntimeError) as error:
        reason += f"; torchcodec unavailable ({error})"
    log.warning("JPEGs are decoded with Pillow, about 25%% slower: %s", reason)
    return "pillow", None

def allow_pixels(max_pixels: int) -> None:
    """Let Pillow open images up to `max_pixels` when the config allows more than Pillow's default
    (its check would refuse them first); our own check in load_region stays the limit."""
    if Image.MAX_IMAGE_PIXELS is not None and max_pixels > 2 * Image.MAX_IMAGE_PIXELS:
        Image.MAX_IMAGE_PIXELS = max_pixels // 2 + 1

ChooseCrop = Callable[[int, int], Crop]
"""(width, height) of the upright image -> the region to keep."""


def load_region(path: str, choose_crop: ChooseCrop, size: int, *, exif_orientation: bool = True,
                use_draft: bool = True, max_pixels: int = BOMB_PIXELS) -> tuple[torch.Tensor, Crop]:
    """The decoded image as uint8 [H, W, 3] and the chosen crop in its pixel coordinates.

    An image of more than `max_pixels` is refused from its header, before its pixels are allocated.
    """
    with open(path, "rb") as handle:
        data = bytearray(handle.read())
    with Image.open(io.BytesIO(data)) as image:
        if image.width * image.height > max_pixels:
            raise ValueError(f"decompression bomb: {image.width}x{image.height} = {image.width * image.height:,} "
                             f"pixels, above dataset.max_pixels ({max_pixels:,})")
        orientation = image.getexif().get(_EXIF_ORIENTATION, 1) if exif_orientation else 1
        if orientation in (2, 3, 4, 5, 6, 7, 8):  # rare: decode fully, turn upright, crop upright
            upright = ImageOps.exif_transpose(image)
            return _pillow_pixels(upright), choose_crop(upright.width, upright.height)
        crop = choose_crop(image.width, image.height)
        if image.format == "JPEG" and image.mode in ("RGB", "L"):
            factor = min(crop.right - crop.left, crop.bottom - crop.top) / size
            if use_draft and factor >= 2:
                return _drafted(image, crop, factor)
            decode = jpeg_decoder()[1]
            if decode is not None:
                try:
                    return decode(torch.frombuffer(data, dtype=torch.uint8)).permute(1, 2, 0), crop
                except RuntimeError:  # a JPEG that libjpeg-turbo refuses here: Pillow tries, and explains
                    pass
        return _pillow_pixels(image), crop


def _drafted(image: Image.Image, crop: Crop, factor: float) -> tuple[torch.Tensor, Crop]:
    """Let the JPEG decoder shrink by 2/4/8 while the crop stays at least `size` pixels on each side."""
    full_w, full_h = image.size
    image.draft("RGB", (math.ceil(full_w / factor), math.ceil(full_h / factor)))
    crop = crop.scaled(image.width / full_w, image.height / full_h)
    return _pillow_pixels(image), crop


def _pillow_pixels(image: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.array(to_rgb(image)))


def to_rgb(image: Image.Image) -> Image.Image:
    """Correct RGB from any mode. 16- and 32-bit greyscale is scaled to 8 bits (Pillow's own
    conversion would clip it to white); transparent palette images go through RGBA."""
    if image.mode == "RGB":
        return image
    if image.mode.startswith("I;16") or image.mode == "I":
        array = np.asarray(image)
        bits = 16 if image.mode.startswith("I;16") or array.max() > 255 else 8
        image = Image.fromarray((array.astype(np.uint32) >> (bits - 8)).astype(np.uint8), mode="L")
    elif image.mode == "F":
        image = Image.fromarray(np.clip(np.asarray(image), 0, 255).astype(np.uint8), mode="L")
    elif image.mode in ("P", "PA") and "transparency" in image.info:
        image = image.convert("RGBA")
    return image.convert("RGB")
