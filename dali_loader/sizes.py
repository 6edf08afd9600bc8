"""The upright (height, width) of each eval image, read on the host for its centre box.

Why on the host: computing the box inside the DALI graph (peek_image_shape, then some twenty
arithmetic operators per batch) halved the GPU flavour's eval throughput (issue 16); the box is a
few float operations on two integers, so the feed computes it and passes it in with the batch.

Why a JPEG header walk (fastloader/imaging/jpeg_header.py, shared with the torch backend):
Pillow's `Image.open` + `getexif` costs 60-70 us per file here, which the feed would pay on its one
thread for every image of an epoch. The walk reads a few KB and takes a fraction of that. DALI
turns an image by its EXIF orientation only, so that is the one used here. Other formats, and JPEGs
the walk is not sure of, go to Pillow. Sizes are kept per sample, so each file's header is read once
per loader.
"""
from __future__ import annotations

import logging
import struct

import numpy as np
from PIL import Image

from fastloader.imaging.jpeg_header import ORIENTATION, SWAPPED, read_header_from

log = logging.getLogger("fastloader")


def jpeg_size(handle, exif: bool) -> tuple[int, int] | None:
    """(height, width) of a JPEG as DALI decodes it (EXIF orientation applied when `exif`), from
    its markers; None where the walk is not sure of the header (not a JPEG, damaged, unusual)."""
    header = read_header_from(handle)
    if header is None:
        return None
    turned = exif and header.exif_orientation in SWAPPED
    return (header.width, header.height) if turned else (header.height, header.width)


def pillow_size(path: str, exif: bool) -> tuple[int, int]:
    """(height, width) as displayed, through Pillow: any format it reads."""
    with Image.open(path) as image:
        width, height = image.size
        orientation = image.getexif().get(ORIENTATION, 1)
        if image.format == "TIFF" and orientation in SWAPPED:  # Pillow gives a TIFF's size upright already
            width, height = height, width
    return (width, height) if exif and orientation in SWAPPED else (height, width)


def upright_size(path: str, exif: bool) -> tuple[int, int] | None:
    """(height, width) of the image as decoded with adjust_orientation=`exif`; None when the file
    cannot be read (DALI then fails on it, and the loader's recovery names it)."""
    try:
        with open(path, "rb") as handle:
            size = jpeg_size(handle, exif)
        return size or pillow_size(path, exif)
    except (OSError, ValueError, struct.error, Image.DecompressionBombError) as error:
        log.debug("cannot read the size of %s for its eval box: %s", path, error)
        return None


class SizeTable:
    """Sample -> upright (height, width), each read once on first use."""

    def __init__(self, count: int, exif: bool):
        self.exif = exif
        self.sizes = np.zeros((count, 2), dtype=np.int64)  # 0: not read yet

    def of(self, samples: np.ndarray, path_of) -> np.ndarray:
        """[len(samples), 2] sizes; `path_of(sample)` names the file DALI reads for a sample.
        A file that cannot be read gets 1 x 1 for this batch (any box will do: DALI fails on it)."""
        for sample in samples[self.sizes[samples, 0] == 0].tolist():
            self.sizes[sample] = upright_size(path_of(sample), self.exif) or (0, 0)
        sizes = self.sizes[samples]
        return np.where(sizes == 0, 1, sizes)
