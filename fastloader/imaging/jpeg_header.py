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
"""First read of a file; where a segment needs more (a large EXIF thumbnail), the file is read on."""
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
    coding: int = 0xC0
    """The frame's marker, which says how it is coded: 0xC0 baseline, 0xC1 extended and 0xC2
    progressive (Huffman), 0xC3 lossless, 0xC5-0xC7 hierarchical, 0xC9-0xCF arithmetic."""
    sampling: str = ""
    """The chroma subsampling its components' factors make (SAMPLINGS: "4:2:0", "grey" ...)."""

    @property
    def orientation(self) -> int:
        """The orientation Pillow's `getexif()` gives: EXIF's, else XMP's, else 1."""
        if self.exif_orientation is not None:
            return self.exif_orientation
        return 1 if self.xmp_orientation is None else self.xmp_orientation


class _NotSure(Exception):
    """The walk met something Pillow may read otherwise."""


class _Short(Exception):
    """The walk over a file's first bytes needs more of them: up to `needed`."""

    def __init__(self, needed: int):
        super().__init__(needed)
        self.needed = needed


SAMPLINGS = ("", "4:4:4", "4:2:2", "4:2:0", "4:4:0", "4:1:1", "4:1:0", "4:1:0 vertical", "grey", "other")
"""Every chroma subsampling a JPEG's frame can name, as nvImageCodec's JPEG parser tells them apart
("" where it was not read, "other": any layout outside its list, CMYK's four components among them).
Decoders treat them differently: nvJPEG below 13.2 decodes no region of one other than 4:4:4 and
grey with interpolated chroma (dali_loader.stack.cpu_decode_reason)."""
_LUMA_FACTORS = {(1, 1): "4:4:4", (2, 1): "4:2:2", (2, 2): "4:2:0", (1, 2): "4:4:0", (4, 1): "4:1:1",
                 (4, 2): "4:1:0", (2, 4): "4:1:0 vertical"}


def chroma_sampling(factors: list[tuple[int, int]]) -> str:
    """The subsampling of a frame's components' (horizontal, vertical) sampling factors: luma's over
    the chroma's, which must share theirs and divide luma's."""
    if len(factors) == 1:
        return "grey"
    if len(factors) != 3:
        return "other"
    low_h, low_v = min(h for h, _ in factors), min(v for _, v in factors)
    if not low_h or not low_v or any(h % low_h or v % low_v for h, v in factors):
        return "other"
    (luma_h, luma_v), chroma_b, chroma_r = [(h // low_h, v // low_v) for h, v in factors]
    if chroma_b != chroma_r or chroma_b != (1, 1):
        return "other"
    return _LUMA_FACTORS.get((luma_h, luma_v), "other")


_MARKER = struct.Struct(">BBH")
"""A segment's start: 0xFF, the marker, the length (which counts itself)."""


def read_header(data: bytes | bytearray | memoryview) -> JpegHeader | None:
    """The header of a JPEG file's bytes in memory; None: not a JPEG, or ask Pillow."""
    return _walk(memoryview(data), len(data))


def read_header_from(handle) -> JpegHeader | None:
    """The header of an open JPEG file (or an in-memory one: a shard member), reading only the
    file's first bytes, as many as its segments before the scan take; None: ask Pillow."""
    start = handle.tell()
    size = handle.seek(0, os.SEEK_END) - start
    handle.seek(start)
    head = handle.read(HEAD_BYTES)
    while True:
        try:
            return _walk(memoryview(head), size)
        except _Short as short:  # a segment past what was read (a large EXIF thumbnail): read on to it
            more = handle.read(max(short.needed, 2 * len(head)) - len(head))
            if not more:
                return None  # the file shrank since its size was taken
            head += more


def _walk(view: memoryview, size: int) -> JpegHeader | None:
    """The header from `view`, the first bytes of a file of `size` bytes (all of them, for bytes in
    memory); _Short where more are needed."""
    if view[:3] != b"\xff\xd8\xff":
        return None
    try:
        return _segments(view, size)
    except (_NotSure, struct.error, IndexError):
        return None


def _segments(view: memoryview, size: int) -> JpegHeader | None:
    """Every segment from the start of image to the start of scan, as Pillow's JpegImageFile reads
    them. One loop over the bytes themselves, no call per marker: it runs once per sample on the DALI
    feed's thread and in every torch worker."""
    position, frame, coding, exif, xmp, have = 2, None, 0, None, None, len(view)
    while True:
        if position + 4 > have:
            if position + 4 > size:
                raise _NotSure  # the end of the file where a marker belongs
            raise _Short(position + HEAD_BYTES)
        fill, marker, length = _MARKER.unpack_from(view, position)
        end = position + 2 + length
        if fill != 0xFF or length < 2 or end > size:
            raise _NotSure  # junk or fill bytes where a marker belongs, or a segment past the end
        if marker == _SOS:
            break
        if end > have and marker not in _READ_PAST:
            raise _Short(end + HEAD_BYTES)
        if marker in _SOF:
            if frame is not None:
                raise _NotSure  # Pillow keeps the last frame header, decoders the first
            frame, coding = _frame(view[position + 4:end]), marker
        elif marker == _DQT:
            _check_tables(view[position + 4:end])
        elif 0xE0 <= marker <= 0xEF:
            body = view[position + 4:end]
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
    width, height, components, sampling = frame
    exif_orientation = None if exif is None else _exif_orientation(exif[6:])
    xmp_orientation = None
    if xmp is not None and (match := _XMP_ORIENTATION.search(xmp)):
        xmp_orientation = int(match[2])
    return JpegHeader(width, height, components, exif_orientation, xmp_orientation, coding, sampling)


def _frame(body) -> tuple[int, int, int, str]:
    """(width, height, components, chroma sampling) of a frame header Pillow accepts."""
    if len(body) < 6 or body[0] != 8:
        raise _NotSure  # Pillow refuses samples other than 8 bits
    height, width = struct.unpack_from(">HH", body, 1)
    components = body[5]
    if components not in (1, 3, 4) or not height or not width or len(body) < 6 + 3 * components:
        raise _NotSure  # other layer counts Pillow refuses; height 0 comes later in a DNL marker
    factor_bytes = bytes(body[7:6 + 3 * components:3])  # each component's (horizontal << 4 | vertical)
    sampling = _SAMPLING_OF.get(factor_bytes)
    if sampling is None:
        sampling = _sampling_of(factor_bytes)
    return width, height, components, sampling


_SAMPLING_OF: dict[bytes, str] = {}
"""chroma_sampling by a frame's factor bytes, as met: a dataset has a handful of layouts, and the
walk runs once per sample on the DALI feed's thread, where working the factors out each time cost
a tenth of val's feed rate (docs/performance.md)."""
_SAMPLINGS_KEPT = 64
"""At most this many layouts remembered: a crafted dataset of many distinct ones only goes slower."""


def _sampling_of(factor_bytes: bytes) -> str:
    sampling = chroma_sampling([(byte >> 4, byte & 15) for byte in factor_bytes])
    if len(_SAMPLING_OF) < _SAMPLINGS_KEPT:
        _SAMPLING_OF[factor_bytes] = sampling
    return sampling


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
    if marker == _APP2:
        if body[:4] == b"MPF\x00":
            raise _NotSure  # an MPO index: Pillow may open the file as an MPO
        if len(body) < 14 and body[:12] == b"ICC_PROFILE\x00":
            raise _NotSure
    elif marker == _APP0 or marker == _APP14:
        if len(body) < 7 and (body[:4] == b"JFIF" if marker == _APP0 else body[:5] == b"Adobe"):
            raise _NotSure  # Pillow reads a version there
    elif marker == _APP13 and body[:14] == b"Photoshop 3.0\x00":
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
