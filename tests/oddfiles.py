"""The odd and broken files real datasets hold, made here with Pillow and byte surgery.

Every decodable file shows one known colour (`COLOUR`, or a grey for greyscale), so a test can
check that a loader decoded it to the right RGB; every broken file says why it cannot be used.
"""
from __future__ import annotations

import io
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image

COLOUR = (200, 120, 40)
GREY = (128, 128, 128)


@dataclass(frozen=True)
class Odd:
    name: str
    """File name, suffix included (the suffix is sometimes a lie on purpose)."""
    write: Callable[[Path], None]
    colour: tuple[int, int, int] | None
    """The RGB a correct decoder gives (for the image's interior), or None: not decodable."""
    reason: str = ""
    """For a broken file: a regular expression the loader's reason (lower-cased) must match."""


def _jpeg_bytes(image: Image.Image, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=95, **options)
    return buffer.getvalue()


def _save(data: bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(data)


def _rgb(size=(64, 48)) -> Image.Image:
    return Image.new("RGB", size, COLOUR)


def _cmyk_jpeg() -> bytes:
    """A CMYK JPEG (Adobe marker, as Photoshop writes them) of COLOUR."""
    return _jpeg_bytes(_rgb().convert("CMYK"))


def _ycck_jpeg() -> bytes:
    """An Adobe YCCK JPEG: the CMYK file with its colour transform set to 2 (YCCK) and its first three
    channels stored as the YCbCr of (255 - C, 255 - M, 255 - Y), as libjpeg's YCCK encoding does."""
    cmyk = np.asarray(_rgb().convert("CMYK"), dtype=np.float64)
    r, g, b = 255 - cmyk[..., 0], 255 - cmyk[..., 1], 255 - cmyk[..., 2]
    y = 0.299 * r + 0.587 * g + 0.114 * b
    cb = 128 - 0.168736 * r - 0.331264 * g + 0.5 * b
    cr = 128 + 0.5 * r - 0.418688 * g - 0.081312 * b
    stored = np.stack([y, cb, cr, cmyk[..., 3]], axis=-1).round().clip(0, 255).astype(np.uint8)
    data = bytearray(_jpeg_bytes(Image.fromarray(stored, mode="CMYK")))
    marker = data.find(b"Adobe") - 4  # FF EE, two length bytes, then "Adobe"
    assert marker >= 0 and data[marker:marker + 2] == b"\xff\xee", "Pillow wrote no Adobe marker"
    length = struct.unpack(">H", data[marker + 2:marker + 4])[0]
    data[marker + 2 + length - 1] = 2  # the transform byte ends the APP14 segment
    return bytes(data)


def _sof_patched(precision: int | None = None, marker: int | None = None) -> bytes:
    """A baseline JPEG whose frame header claims another sample precision or coding process."""
    data = bytearray(_jpeg_bytes(_rgb()))
    sof = data.index(b"\xff\xc0")
    if marker is not None:
        data[sof + 1] = marker
    if precision is not None:
        data[sof + 4] = precision
    return bytes(data)


def _garbage_in_entropy_data() -> bytes:
    """A JPEG whose compressed scan data is overwritten with random bytes (markers escaped)."""
    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 255, size=(96, 128, 3), dtype=np.uint8)
    data = bytearray(_jpeg_bytes(Image.fromarray(pixels)))
    start = data.index(b"\xff\xda") + 12
    end = len(data) - 2
    noise = rng.integers(0, 255, size=end - start, dtype=np.uint8)
    noise[noise == 0xFF] = 0xFE  # no accidental markers: the file still ends with its EOI
    data[start + (end - start) // 4:end] = noise[(end - start) // 4:].tobytes()
    return bytes(data)


def marker_in_scan_data() -> bytes:
    """A JPEG whose scan data holds random bytes, markers among them: Pillow's libjpeg stops at the
    first unknown marker ("broken data stream"), libjpeg-turbo's decoders (nvImageCodec, DALI)
    conceal the damage and decode it."""
    rng = np.random.default_rng(0)
    data = bytearray(_jpeg_bytes(Image.fromarray(rng.integers(0, 255, (300, 400, 3), dtype=np.uint8))))
    start = data.index(b"\xff\xda")
    middle = (start + len(data)) // 2
    data[middle:middle + 256] = np.random.default_rng(0).integers(0, 256, 256, dtype=np.uint8).tobytes()
    return bytes(data)


def _bomb_header() -> bytes:
    """A small JPEG whose frame header declares 65535 x 65535 pixels."""
    data = bytearray(_jpeg_bytes(_rgb((16, 16))))
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", 65535, 65535)
    return bytes(data)


def _png(image: Image.Image, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", **options)
    return buffer.getvalue()


def _encoded(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def _exif_rotated() -> bytes:
    """Stored 48 wide x 64 high, top half COLOUR; EXIF orientation 6 (rotate 90 clockwise to view)."""
    image = Image.new("RGB", (64, 48), COLOUR)
    exif = Image.Exif()
    exif[0x0112] = 6
    return _jpeg_bytes(image, exif=exif)


def _grey16_png() -> bytes:
    return _png(Image.fromarray(np.full((48, 64), GREY[0] * 257, dtype=np.uint16)))


def _palette_png() -> bytes:
    return _png(_rgb().quantize(colors=4))


def _rgba_png() -> bytes:
    rgba = Image.new("RGBA", (64, 48), (*COLOUR, 255))
    return _png(rgba)


def _unreadable(path: Path) -> None:
    path.write_bytes(_jpeg_bytes(_rgb()))
    path.chmod(0)


ODD_FILES: tuple[Odd, ...] = (
    Odd("grey.JPEG", _save(_jpeg_bytes(Image.new("L", (64, 48), GREY[0]))), GREY),
    Odd("cmyk.JPEG", _save(_cmyk_jpeg()), COLOUR),
    Odd("ycck.JPEG", _save(_ycck_jpeg()), COLOUR),
    Odd("progressive.JPEG", _save(_jpeg_bytes(_rgb(), progressive=True)), COLOUR),
    Odd("precision12.JPEG", _save(_sof_patched(precision=12)), None, "header does not parse"),
    Odd("lossless.JPEG", _save(_sof_patched(marker=0xC3)), None, "broken data stream|dali cannot decode it"),
    Odd("grey16.png", _save(_grey16_png()), GREY),
    Odd("rgba.png", _save(_rgba_png()), COLOUR),
    Odd("palette.png", _save(_palette_png()), COLOUR),
    Odd("anim.gif", _save(_encoded(_rgb(), "GIF")), COLOUR),
    Odd("photo.webp", _save(_encoded(_rgb(), "WEBP", lossless=True)), COLOUR),
    Odd("exif_rotated.JPEG", _save(_exif_rotated()), COLOUR),
    Odd("png_named.JPEG", _save(_png(_rgb())), COLOUR),
    Odd("webp_named.JPEG", _save(_encoded(_rgb(), "WEBP", lossless=True)), COLOUR),
    Odd("tiny_1x1.JPEG", _save(_jpeg_bytes(_rgb((1, 1)))), COLOUR),
    Odd("strip_1x1000.png", _save(_png(_rgb((1, 1000)))), COLOUR),
    Odd("cut_in_half.JPEG", lambda p: p.write_bytes(_jpeg_bytes(_rgb((256, 192)))[:600]), None, "truncated"),
    Odd("garbage_scan.JPEG", _save(_garbage_in_entropy_data()), None),
    Odd("empty.JPEG", _save(b""), None, "empty"),
    Odd("random_bytes.jpg", _save(np.random.default_rng(1).bytes(4000)), None, "not an image"),
    Odd("bomb.JPEG", _save(_bomb_header()), None, "decompression bomb"),
    Odd("unreadable.JPEG", _unreadable, None, "permission"),
    Odd("deleted_later.JPEG", _save(_jpeg_bytes(_rgb())), None, "no such file"),
)
"""Every odd file of the bad-input issue. `deleted_later` is written, then removed by the test
after the loader has indexed (and screened) it."""

DECODABLE = tuple(odd for odd in ODD_FILES if odd.colour is not None)
BROKEN = tuple(odd for odd in ODD_FILES if odd.colour is None)


def write_odd_files(folder: Path, only: tuple[str, ...] | None = None) -> dict[str, Odd]:
    """Write the odd files (or those named in `only`) into `folder`; {file name: Odd}."""
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for odd in ODD_FILES:
        if only is None or odd.name in only:
            odd.write(folder / odd.name)
            written[odd.name] = odd
    return written


def running_as_root() -> bool:
    """chmod 0 does not stop root from reading a file."""
    return hasattr(os, "geteuid") and os.geteuid() == 0
