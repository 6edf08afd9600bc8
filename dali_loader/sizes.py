"""The upright (height, width) of each eval image, read on the host for its centre box.

Why on the host: computing the box inside the DALI graph (peek_image_shape, then some twenty
arithmetic operators per batch) halved the GPU flavour's eval throughput (issue 16); the box is a
few float operations on two integers, so the feed computes it and passes it in with the batch.

Why a JPEG header walk of our own: Pillow's `Image.open` + `getexif` costs 60-70 us per file here,
which the feed would pay on its one thread for every image of an epoch. Walking the JPEG markers to
the frame header (and the EXIF orientation on the way) reads a few KB and takes a fraction of that.
Other formats, and JPEGs the walk does not understand, go to Pillow. Sizes are kept per sample,
so each file's header is read once per loader.
"""
from __future__ import annotations

import logging
import struct

import numpy as np
from PIL import Image

log = logging.getLogger("fastloader")

HEAD_BYTES = 4096
"""First read of a file; a segment beyond it (after a large EXIF thumbnail) is read where it lies."""
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM, RSTn: markers without a length
_ORIENTATION = 0x0112
_SWAPPED = frozenset({5, 6, 7, 8})  # EXIF orientations that turn the image by 90 degrees


class _Reader:
    """Bytes of an open file by absolute offset, re-reading only when a request leaves the buffer."""

    def __init__(self, handle):
        self.handle, self.base, self.buffer = handle, 0, handle.read(HEAD_BYTES)

    def bytes(self, start: int, count: int) -> bytes:
        if start < self.base or start + count > self.base + len(self.buffer):
            self.handle.seek(start)
            self.base, self.buffer = start, self.handle.read(max(count, HEAD_BYTES))
        return self.buffer[start - self.base:start - self.base + count]


def exif_orientation(tiff: bytes) -> int:
    """The Orientation tag of IFD0 in an EXIF block's TIFF data (after b"Exif\\0\\0"), else 1."""
    order = {b"II": "<", b"MM": ">"}.get(tiff[:2])
    if order is None or len(tiff) < 8:
        return 1
    ifd = struct.unpack_from(order + "I", tiff, 4)[0]
    if ifd + 2 > len(tiff):
        return 1
    count = struct.unpack_from(order + "H", tiff, ifd)[0]
    for entry in range(ifd + 2, min(ifd + 2 + 12 * count, len(tiff) - 11), 12):
        tag, kind = struct.unpack_from(order + "HH", tiff, entry)
        if tag == _ORIENTATION and kind == 3:  # SHORT
            return struct.unpack_from(order + "H", tiff, entry + 8)[0]
    return 1


def jpeg_size(handle, exif: bool) -> tuple[int, int] | None:
    """(height, width) of a JPEG as displayed (EXIF orientation applied when `exif`), from its
    markers; None where the walk does not reach a frame header (not a JPEG, damaged, unusual)."""
    reader = _Reader(handle)
    if reader.bytes(0, 2) != b"\xff\xd8":
        return None
    orientation, position = 1, 2
    while True:
        head = reader.bytes(position, 4)
        if len(head) < 2 or head[0] != 0xFF:
            return None
        marker = head[1]
        if marker == 0xFF:  # fill byte
            position += 1
            continue
        if marker in _STANDALONE:
            position += 2
            continue
        if len(head) < 4 or marker in (0xD9, 0xDA):  # end of image or scan data before any frame header
            return None
        length = (head[2] << 8) | head[3]
        if marker in _SOF:
            frame = reader.bytes(position + 5, 4)
            if len(frame) < 4:
                return None
            height, width = struct.unpack(">HH", frame)
            if not height or not width:  # height given later by a DNL marker: let Pillow decide
                return None
            return (width, height) if orientation in _SWAPPED else (height, width)
        if marker == 0xE1 and exif and orientation == 1:
            segment = reader.bytes(position + 4, length - 2)
            if segment[:6] == b"Exif\x00\x00":
                orientation = exif_orientation(segment[6:])
        position += 2 + length


def pillow_size(path: str, exif: bool) -> tuple[int, int]:
    """(height, width) as displayed, through Pillow: any format it reads."""
    with Image.open(path) as image:
        width, height = image.size
        orientation = image.getexif().get(_ORIENTATION, 1)
        if image.format == "TIFF" and orientation in _SWAPPED:  # Pillow gives a TIFF's size upright already
            width, height = height, width
    return (width, height) if exif and orientation in _SWAPPED else (height, width)


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
