"""Decoding: each path (libjpeg-turbo, Pillow draft, Pillow) gives the same upright RGB pixels."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from torch_loader.decode import _pillow_pixels, jpeg_decoder, load_region
from torch_loader.geometry import Crop


def photo_like(width: int, height: int) -> Image.Image:
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 255 // width, y * 255 // height, ((x // 16 + y // 16) % 2) * 180], -1)
    return Image.fromarray(pixels.astype(np.uint8))


def whole(width, height):
    return Crop(0, 0, width, height)


def test_libjpeg_turbo_path_matches_pillow(tmp_path):
    name, decode = jpeg_decoder()
    assert name != "pillow" and decode is not None  # the fast path exists where torchvision is installed
    path = tmp_path / "x.jpg"
    photo_like(500, 375).save(path, quality=90)
    pixels, crop = load_region(str(path), whole, size=224)
    assert pixels.shape == (375, 500, 3) and pixels.dtype == torch.uint8 and crop == whole(500, 375)
    reference = _pillow_pixels(Image.open(path))
    assert (pixels.int() - reference.int()).abs().float().mean() < 1.0


def test_draft_decodes_a_large_jpeg_at_reduced_size_and_rescales_the_crop(tmp_path):
    path = tmp_path / "big.jpg"
    photo_like(1600, 1200).save(path, quality=90)
    pixels, crop = load_region(str(path), lambda w, h: Crop(100, 100, 1300, 1100), size=224)
    assert pixels.shape == (300, 400, 3)  # 1/4: the 1000 px box stays >= 224 px (250)
    assert crop == Crop(25, 25, 325, 275)
    full, _ = load_region(str(path), lambda w, h: Crop(100, 100, 1300, 1100), size=224, use_draft=False)
    assert full.shape == (1200, 1600, 3)


def test_exif_rotated_photo_is_upright_before_the_crop_is_chosen(tmp_path):
    image = photo_like(80, 40)
    exif = image.getexif()
    exif[0x0112] = 8
    image.save(tmp_path / "r.jpg", exif=exif.tobytes())
    sizes = []
    pixels, _ = load_region(str(tmp_path / "r.jpg"), lambda w, h: sizes.append((w, h)) or whole(w, h), 32)
    assert sizes == [(40, 80)] and pixels.shape == (80, 40, 3)
    pixels, _ = load_region(str(tmp_path / "r.jpg"), whole, 32, exif_orientation=False)
    assert pixels.shape == (40, 80, 3)


def test_truncated_jpeg_fails_with_pillows_reason(tmp_path):
    path = tmp_path / "cut.jpg"
    photo_like(300, 200).save(path, quality=90)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(OSError, match="truncated"):
        load_region(str(path), whole, size=64)
