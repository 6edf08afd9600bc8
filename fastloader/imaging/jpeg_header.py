"""A JPEG's size, colour components and orientation from its markers, without decoding it.

Why: Pillow's `Image.open` + `getexif` cost 40-110 us per file here. The torch backend's workers
pay that per image to choose the crop before decoding; the DALI feed pays it on its one thread per
eval file. Walking the markers over bytes already read costs 10-20 us.

Why strict: the torch backend picks each image's decoder from this header, and its pixels must be
those Pillow's reading of the header led to. So the walk answers only where Pillow would read the
same size, mode and orientation: a file that starts like a JPEG, well-formed segments up to the
scan, one frame of 8-bit samples, at most one EXIF block whose first directory is plain, no MPO
index. Anything else (another format, fill bytes or junk between markers, a second frame or EXIF
block, a segment running past the file, a table or marker Pillow refuses) gives None: ask Pillow.
"""
from __future__ import annotations

import os
import re
import struct
from typing import NamedTuple

HEAD_BYTES = 4096
"""First read of a file; a segment beyond it (after a large EXIF thumbnail) is read where it lies."""
ORIENTATION = 0x0112
"""The EXIF Orientation tag."""
SWAPPED = frozenset({5, 6, 7, 8})
"""Orientations that turn the image by 90 degrees: the upright size is (height, width) swapped."""

_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_READ_PAST = frozenset({0xC4, 0xCC, 0xDD, 0xFE})  # DHT, DAC, DRI, COM: Pillow skips them too
_SOS, _DQT, _APP0, _APP1, _APP2, _APP13, _APP14 = 0xDA, 0xDB, 0xE0, 0xE1, 0xE2, 0xED, 0xEE
_EXIF, _XMP = b"Exif\x00\x00", b"http://ns.adobe.com/xap/1.0/\x00"
_TIFF_BYTE_ORDER = {b"II*\x00": "<", b"MM\x00*": ">"}
_TIFF_UNIT = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4, 16: 8}
"""Bytes per value of each TIFF type Pillow reads; it skips entries of other types."""
_XMP_ORIENTATION = re.compile(rb'tiff:Orientation(="|>)([0-9])')  # Pillow's pattern, Image.getexif


class JpegHeader(NamedTuple):
    width: int
    height: int
    """As stored, before any orientation."""
    components: int
    """1: greyscale (Pillow's mode L), 3: colour (RGB), 4: CMYK or YCCK."""
    exif_orientation: int | None
    """The Orientation tag of the EXIF block's first directory; None without one."""
    xmp_orientation: int | None
    """tiff:Orientation in the XMP packet; None without one."""

    @property
    def orientation(self) -> int:
        """The orientation Pillow's `getexif()` gives: EXIF's, else XMP's, else 1."""
        if self.exif_orientation is not None:
            return self.exif_orientation
        return 1 if self.xmp_orientation is None else self.xmp_orientation


class _NotSure(Exception):
    """The walk met something Pillow may read otherwise."""


class _Source:
    """Bytes by absolute offset: from memory, or from a file read HEAD_BYTES at a time."""

    def __init__(self, buffer, size: int, handle=None):
        self.buffer, self.base, self.size, self.handle = buffer, 0, size, handle

    def at(self, start: int, count: int):
        if self.handle is not None and (start < self.base or start + count > self.base + len(self.buffer)):
            self.handle.seek(start)
            self.base, self.buffer = start, self.handle.read(max(count, HEAD_BYTES))
        return self.buffer[start - self.base:start - self.base + count]


def read_header(data: bytes | bytearray) -> JpegHeader | None:
    """The header of a JPEG file's bytes in memory; None: not a JPEG, or ask Pillow."""
    return _walk(_Source(memoryview(data), len(data)))


def read_header_from(handle) -> JpegHeader | None:
    """The header of an open JPEG file (or an in-memory one: a shard member), reading only the
    header's bytes; None: ask Pillow."""
    start = handle.tell()
    size = handle.seek(0, os.SEEK_END) - start
    handle.seek(start)
    return _walk(_Source(handle.read(HEAD_BYTES), size, handle))


def _walk(source: _Source) -> JpegHeader | None:
    if source.at(0, 3) != b"\xff\xd8\xff":
        return None
    try:
        return _segments(source)
    except (_NotSure, struct.error, IndexError):
        return None


def _segments(source: _Source) -> JpegHeader | None:
    """Every segment from the start of image to the start of scan, as Pillow's JpegImageFile reads them."""
    position, frame, exif, xmp = 2, None, None, None
    while True:
        head = source.at(position, 4)
        if len(head) < 4 or head[0] != 0xFF:
            raise _NotSure  # junk, fill bytes or the end of the file where a marker belongs
        marker, length = head[1], (head[2] << 8) | head[3]
        end = position + 2 + length
        if length < 2 or end > source.size:
            raise _NotSure
        if marker == _SOS:
            break
        if marker in _SOF:
            if frame is not None:
                raise _NotSure  # Pillow keeps the last frame header, decoders the first
            frame = _frame(source.at(position + 4, length - 2))
        elif marker == _DQT:
            _check_tables(source.at(position + 4, length - 2))
        elif 0xE0 <= marker <= 0xEF:
            body = source.at(position + 4, length - 2)
            if marker == _APP1 and body[:6] == _EXIF:
                if exif is not None:
                    raise _NotSure  # Pillow joins the blocks
                exif = body
            elif marker == _APP1 and body[:len(_XMP)] == _XMP:
                xmp = body[len(_XMP):]  # the last one counts, as in Pillow
            else:
                _check_other_app(marker, body)
        elif marker not in _READ_PAST:
            raise _NotSure  # DNL, DHP, EXP, JPGn, RSTn, EOI: rare, and read otherwise by Pillow
        position = end
    if frame is None:
        raise _NotSure
    width, height, components = frame
    exif_orientation = None if exif is None else _exif_orientation(exif[6:])
    xmp_orientation = None
    if xmp is not None and (match := _XMP_ORIENTATION.search(xmp)):
        xmp_orientation = int(match[2])
    return JpegHeader(width, height, components, exif_orientation, xmp_orientation)


def _frame(body) -> tuple[int, int, int]:
    """(width, height, components) of a frame header Pillow accepts."""
    if len(body) < 6 or body[0] != 8:
        raise _NotSure  # Pillow refuses samples other than 8 bits
    height, width = struct.unpack_from(">HH", body, 1)
    components = body[5]
    if components not in (1, 3, 4) or not height or not width:
        raise _NotSure  # other layer counts Pillow refuses; height 0 comes later in a DNL marker
    return width, height, components


def _check_tables(body) -> None:
    """Quantization tables as Pillow parses them: it refuses a segment that ends inside one."""
    offset = 0
    while offset < len(body):
        table = 1 + 64 * (1 if body[offset] < 16 else 2)
        if offset + table > len(body):
            raise _NotSure
        offset += table


def _check_other_app(marker: int, body) -> None:
    """The application segments that make Pillow refuse a file, or read it as another format."""
    if marker == _APP2 and body[:4] == b"MPF\x00":
        raise _NotSure  # an MPO index: Pillow may open the file as an MPO
    if marker == _APP2 and body[:12] == b"ICC_PROFILE\x00" and len(body) < 14:
        raise _NotSure
    if (marker == _APP0 and body[:4] == b"JFIF" or marker == _APP14 and body[:5] == b"Adobe") and len(body) < 7:
        raise _NotSure  # Pillow reads a version there
    if marker == _APP13 and body[:14] == b"Photoshop 3.0\x00":
        _check_photoshop(body)


def _check_photoshop(body) -> None:
    """Pillow walks the resource blocks: a block name past the segment's end makes it fail (IndexError)."""
    offset = 14
    try:
        while body[offset:offset + 4] == b"8BIM":
            offset += 6  # signature, resource code
            struct.unpack_from(">H", body, offset - 2)
            offset += 1 + body[offset]  # the name, Pascal string
            offset += offset & 1
            (size,) = struct.unpack_from(">I", body, offset)
            offset += 4 + size
            offset += offset & 1
    except struct.error:  # Pillow stops here quietly
        pass


def _exif_orientation(tiff) -> int | None:
    """IFD0's Orientation in the EXIF block's TIFF data, where Pillow would read the same; None
    where there is none."""
    order = _TIFF_BYTE_ORDER.get(bytes(tiff[:4]))
    if order is None or len(tiff) < 8:
        raise _NotSure  # Pillow would strip a second "Exif" prefix, or fail, or read a BigTIFF
    (ifd,) = struct.unpack_from(order + "I", tiff, 4)
    (count,) = struct.unpack_from(order + "H", tiff, ifd)
    if ifd < 8 or ifd + 2 + 12 * count + 4 > len(tiff):
        raise _NotSure  # Pillow stops at the end of the data and keeps what it read
    orientation, out_of_line = None, 0
    for entry in range(ifd + 2, ifd + 2 + 12 * count, 12):
        tag, kind, number = struct.unpack_from(order + "HHI", tiff, entry)
        unit = _TIFF_UNIT.get(kind)
        if unit is None:
            continue  # Pillow skips types it does not know
        if tag == ORIENTATION:
            if orientation is not None or kind != 3 or number != 1:
                raise _NotSure
            (orientation,) = struct.unpack_from(order + "H", tiff, entry + 8)
        elif unit * number > 4:  # the value lies elsewhere: Pillow stops or skips where it runs out
            (offset,) = struct.unpack_from(order + "I", tiff, entry + 8)
            out_of_line += unit * number
            if offset + unit * number > len(tiff) or out_of_line > len(tiff):
                raise _NotSure
    return orientation
