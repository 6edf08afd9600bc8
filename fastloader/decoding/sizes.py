"""Each image's size as decoded: stored (height, width) and whether its EXIF orientation turns it.

Why here: the DALI backend computes every crop box on the host from the image's upright size, and
the screening pass that runs when a loader is built already opens every file's header. So the size
is read there, once, in parallel, and kept with the screening result (fastloader/screening.py); a
loader then needs no header read of its own. Where a loader has no screening result (dataset.screen:
false), it reads the header here on first use.

Why a JPEG header walk (fastloader/imaging/jpeg_header.py): Pillow's `getexif` costs 40-110 us per
file, the walk 10-20 us. DALI turns an image by its EXIF orientation only, so that is the one used.
Other formats, and JPEGs the walk is not sure of, go to Pillow.
"""
from __future__ import annotations

import logging
import struct

import numpy as np
from PIL import Image

from ..imaging.jpeg_header import ORIENTATION, SWAPPED, read_header_from
from ..locations import Location, as_location
from ..sources.reading import open_bytes

log = logging.getLogger("fastloader")

UNKNOWN = (0, 0, 0)
"""The stored size of a file whose header could not be read."""


def jpeg_stored_size(handle) -> tuple[int, int, bool] | None:
    """(height, width, turned) of an open JPEG from its markers; None where the walk is not sure."""
    header = read_header_from(handle)
    if header is None:
        return None
    return header.height, header.width, header.exif_orientation in SWAPPED


def pillow_stored_size(image: Image.Image) -> tuple[int, int, bool]:
    """(height, width, turned) of an image Pillow has opened (its header parsed, pixels not loaded)."""
    width, height = image.size
    if image.format == "PNG" and "exif" not in image.info:
        turned = False  # getexif would decode the whole image, looking for an eXIf chunk after the pixels
    else:
        turned = image.getexif().get(ORIENTATION, 1) in SWAPPED
    if image.format == "TIFF" and turned:  # Pillow gives a TIFF's size upright already
        width, height = height, width
    return height, width, turned


def stored_size(where: str | Location) -> tuple[int, int, bool] | None:
    """(height, width, turned) of the file, any format; None when it cannot be read (the decoder
    then fails on it, and the loader names it)."""
    try:
        with open_bytes(where) as handle:
            size = jpeg_stored_size(handle)
            if size is not None:
                return size
            handle.seek(0)
            with Image.open(handle) as image:
                return pillow_stored_size(image)
    except (OSError, ValueError, struct.error, Image.DecompressionBombError) as error:
        log.debug("cannot read the size of %s: %s", as_location(where).name, error)
        return None


def upright(sizes: np.ndarray, exif: bool) -> np.ndarray:
    """int64 [n, 2] (height, width) as decoded with adjust_orientation=`exif`, from int [n, 3]
    stored (height, width, turned) rows."""
    sizes = np.asarray(sizes, dtype=np.int64).reshape(-1, 3)
    if not exif:
        return sizes[:, :2].copy()
    return np.where(sizes[:, 2:3] != 0, sizes[:, 1::-1], sizes[:, :2])


def upright_size(where: str | Location, exif: bool) -> tuple[int, int] | None:
    """(height, width) of the image as decoded with adjust_orientation=`exif`; None when unreadable
    (NVIDIA's example's eval box, in benchmarks/peer_loaders.py, is made from it)."""
    size = stored_size(where)
    return None if size is None else tuple(upright(np.array([size]), exif)[0].tolist())
