"""Screen image files before a loader sees them: a cheap header check, and an optional full decode.

Why: one empty, truncated or mislabelled file stops a training run hours in (DALI fails the whole
batch, the torch backend raises in a worker). A header check finds nearly all of them, at about
35,000 files/s per core when the files are cached: it reads the first bytes (Pillow's `Image.open`
parses only the header) and the last `TAIL_BYTES` (for a JPEG's end-of-image marker), never the
pixels. `deep=True` also decodes every file with Pillow, which catches corrupt compressed data, at
decode speed (about 950 ImageNet-sized JPEGs/s per core).

Used by `fastloader check`; the loaders can call `screen_file` / `screen_files` on their inputs.
Worker processes are forked (see parallel.py), so they start without importing anything again.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from PIL import Image, ImageFile, UnidentifiedImageError

from ..errors import error_text
from ..imaging.jpeg_header import SWAPPED, read_header
from ..locations import ContainerChanged, Location, NotRegularFile, ReadArena, as_location
from ..parallel import available_cores, map_chunks
from ..schema import BOMB_PIXELS
from ..sources.reading import fetch_again, open_bytes, read_bytes
from .sizes import jpeg_stored_size, pillow_stored_size

DALI_FORMATS = frozenset({"JPEG", "PNG", "BMP", "TIFF", "PPM", "WEBP", "JPEG2000"})
"""Formats DALI's image decoder reads (by content, whatever the suffix; its documentation). The
torch backend reads all that Pillow does; for the others (GIF) the DALI backend reads a lossless
PNG copy (dali_loader/transcode.py), and `fastloader check` points them out."""

TAIL_BYTES = 512
"""How much of a file's end is read to find a JPEG's end-of-image marker or a PNG's IEND chunk;
padding or a short trailer after the marker (some cameras add one) is allowed within this window."""

SIGNATURES: tuple[tuple[int, bytes, str], ...] = (
    (0, b"\xff\xd8\xff", "JPEG"),
    (0, b"\x89PNG\r\n\x1a\n", "PNG"),
    (0, b"GIF87a", "GIF"),
    (0, b"GIF89a", "GIF"),
    (8, b"WEBP", "WEBP"),  # after b"RIFF" + size, checked below
    (0, b"BM", "BMP"),
    (0, b"II*\x00", "TIFF"),
    (0, b"MM\x00*", "TIFF"),
    (0, b"\x00\x00\x00\x0cjP  \r\n\x87\n", "JPEG2000"),
    (0, b"\xff\x4f\xff\x51", "JPEG2000"),
    (4, b"ftypavif", "AVIF"),
    (4, b"ftypheic", "HEIF"),
    (4, b"ftypmif1", "HEIF"),
)
"""(offset, magic bytes, format) of the formats worth naming, so that a file Pillow cannot parse
still says what it claims to be."""

SUFFIX_FORMATS = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".gif": "GIF", ".webp": "WEBP",
                  ".bmp": "BMP", ".tif": "TIFF", ".tiff": "TIFF", ".ppm": "PPM", ".pgm": "PPM",
                  ".pbm": "PPM", ".jp2": "JPEG2000", ".avif": "AVIF", ".heic": "HEIF"}
"""The format a file suffix promises (Pillow's format names)."""

_PILLOW_ALIASES = {"MPO": "JPEG"}  # a multi-picture JPEG is a JPEG to every decoder we use
_BOMB_MESSAGE = re.compile(r"\((\d+) pixels\)")


@dataclass(frozen=True, slots=True)
class Screened:
    """What screening learned about one file. `problem` is None for a usable file, else a short reason."""
    path: str
    format: str | None = None
    width: int | None = None
    height: int | None = None
    """As stored, before any EXIF orientation."""
    problem: str | None = None
    turned: bool = False
    """The EXIF orientation turns the image by 90 degrees: decoded upright, it is height x width."""
    warning: str | None = field(default=None, compare=False)
    """A full decode's warning (`check --deep`): what the decoder said of damage it concealed ('Corrupt
    JPEG data: ...'); the file decodes, into pixels that may be grey or smeared past the damage."""
    coding: int = field(default=0, compare=False)
    """A JPEG's frame marker where the marker walk read it (jpeg_header.JpegHeader.coding), else 0
    (not compared: two reads of one file agree whether or not the walk read its frame)."""
    sampling: str = field(default="", compare=False)
    """A JPEG's chroma subsampling (jpeg_header.SAMPLINGS: "4:2:0", "grey" ...), "" where not read."""

    @property
    def suffix_mismatch(self) -> bool:
        """The data is another format than the suffix says (a PNG named .JPEG). Not an error for our
        decoders, which go by the content, but other tools go by the name."""
        expected = SUFFIX_FORMATS.get(os.path.splitext(self.path)[1].lower())
        return self.format is not None and expected is not None and expected != self.format


def sniff(head: bytes) -> str | None:
    """The format named by a file's first bytes, or None."""
    for offset, magic, name in SIGNATURES:
        if head[offset:offset + len(magic)] == magic and (name != "WEBP" or head[:4] == b"RIFF"):
            return name
    if len(head) >= 3 and head[0:1] == b"P" and head[1:2] in b"1234567" and head[2:3].isspace():
        return "PPM"
    return None


def bomb_problem(width: int, height: int, max_pixels: int) -> str:
    """The one wording of an image refused for its size, at screening and at decode time alike."""
    return (f"decompression bomb: {width}x{height} = {width * height:,} pixels, "
            f"above dataset.max_pixels ({max_pixels:,})")


def screen_file(where: str | Location, max_pixels: int = BOMB_PIXELS) -> Screened:
    """The header check: existence, permissions, a regular file (a FIFO is named, never waited on),
    size, format, dimensions and (JPEG, PNG) the end marker, of a file or of a shard member (a Location)."""
    location = as_location(where)
    try:
        with open_bytes(location) as handle:
            size = os.fstat(handle.fileno()).st_size if location.whole_file else len(handle.getbuffer())
            return _screen_open(location.name, handle, size, max_pixels)
    except OSError as error:
        return Screened(location.name, problem=unreadable(location, error))


def read_screened(where: str | Location, max_pixels: int = BOMB_PIXELS, into: ReadArena | None = None
                  ) -> tuple[bytearray | memoryview | None, Screened]:
    """A file's (or shard member's) bytes and the header check of those very bytes, from one read:
    what a decoder is then handed is what was checked, even if the file changes meanwhile. A JPEG's
    size comes from its markers alone (10-20 us), as `screen_file` would read it; other formats and
    JPEGs the marker walk is not sure of go through Pillow's header parse, as in `screen_file`.
    The bytes are None where they cannot be read; `into`: read into that reused buffer (read_bytes)."""
    location = as_location(where)
    for _ in range(2):
        try:
            data = read_bytes(location, into, max_pixels)
        except OSError as error:
            return None, Screened(location.name, problem=unreadable(location, error))
        screened = screen_read(location.name, data, max_pixels)
        if screened.problem is None or not fetch_again(location, screened.problem):
            return data, screened  # else the node cache's copy may be what is damaged: read from a new one
    return data, screened


def screen_read(name: str, data: bytes | bytearray | memoryview, max_pixels: int = BOMB_PIXELS) -> Screened:
    """read_screened's check of bytes it read (or that were read as it reads them: reading.read_run)."""
    header = read_header(data)
    if header is None:
        return _screen_open(name, io.BytesIO(data), len(data), max_pixels)
    width, height, turned = header.width, header.height, header.exif_orientation in SWAPPED
    problem = bomb_problem(width, height, max_pixels) if width * height > max_pixels else None
    if problem is None and data[-2:] != b"\xff\xd9":  # nearly every JPEG ends with its EOI marker: no search
        problem = _tail_problem("JPEG", bytes(data[-TAIL_BYTES:]))
    return Screened(name, "JPEG", width, height, problem, turned, coding=header.coding, sampling=header.sampling)


def unreadable(location: Location, error: OSError) -> str:
    """Why a file or shard member could not be read, in the words of every check."""
    if isinstance(error, FileNotFoundError):
        if not location.whole_file:
            return f"its shard {location.file} is missing"
        return "missing (no such file)" if not os.path.islink(location.file) else "missing (broken symbolic link)"
    if isinstance(error, PermissionError):
        return "unreadable: permission denied"
    if isinstance(error, (NotRegularFile, ContainerChanged)):  # a FIFO is never opened blocking, nor read
        return error.strerror
    return f"unreadable: {error.strerror or error}"


def screen_bytes(name: str, data: bytes, max_pixels: int = BOMB_PIXELS) -> Screened:
    """The header check of bytes already read (what `fastloader pack` is about to write): the same
    checks as screen_file, on exactly those bytes."""
    return _screen_open(name, io.BytesIO(data), len(data), max_pixels)


def _screen_open(path: str, handle, size: int, max_pixels: int) -> Screened:
    """The header check of `size` bytes open in `handle` (a file, or bytes in memory): format,
    dimensions and the end marker."""
    if size == 0:
        return Screened(path, problem="empty file")
    head = handle.read(32)
    found = sniff(head)
    handle.seek(0)
    try:
        with Image.open(handle) as image:
            fmt = found or _PILLOW_ALIASES.get(image.format or "", image.format)
            height, width, turned = _stored_size(handle, image, fmt)
    except UnidentifiedImageError:
        return Screened(path, found, problem=_unidentified(found, head))
    except Image.DecompressionBombError as error:
        pixels = _BOMB_MESSAGE.search(str(error))
        count = f"{int(pixels.group(1)):,} pixels" if pixels else "too many pixels"
        return Screened(path, found, problem=f"decompression bomb: {count}, Pillow refuses it")
    except Exception as error:  # a plugin that chokes on a damaged header
        return Screened(path, found, problem=f"{found or 'image'} header does not parse: {error_text(error)}")
    if width * height > max_pixels:
        return Screened(path, fmt, width, height, bomb_problem(width, height, max_pixels))
    if fmt in ("JPEG", "PNG"):
        handle.seek(max(0, size - TAIL_BYTES))
        problem = _tail_problem(fmt, handle.read())
        if problem:
            return Screened(path, fmt, width, height, problem, turned)
    return Screened(path, fmt, width, height, turned=turned)


def _stored_size(handle, image: Image.Image, fmt: str | None) -> tuple[int, int, bool]:
    """(height, width, turned) of an opened image: a JPEG's from its markers (no EXIF parse by
    Pillow), else Pillow's. Kept with the screening result, so that no loader reads the header again."""
    if fmt == "JPEG":
        handle.seek(0)
        stored = jpeg_stored_size(handle)
        if stored is not None:
            return stored
    return pillow_stored_size(image)


def decode_file(where: str | Location, max_pixels: int = BOMB_PIXELS) -> Screened:
    """The header check, then a full decode to RGB, which also catches corrupt compressed data.

    Set `ImageFile.LOAD_TRUNCATED_IMAGES = False` (Pillow's default) in the calling process, else
    Pillow pads truncated files with grey instead of failing; `screen_files` does so in its workers.
    """
    screened = screen_file(where, max_pixels)
    if screened.problem:
        return screened
    try:
        with open_bytes(where) as handle, Image.open(handle) as image:
            image.convert("RGB")
    except Exception as error:
        return Screened(screened.path, screened.format, screened.width, screened.height,
                        f"decode failed: {error_text(error)}")
    return screened


_WORDS: list = []
"""This process's file that native decoders' stderr goes to while a file is decoded (native_words)."""


@contextlib.contextmanager
def native_words() -> Iterator[list[str]]:
    """What native code writes to the process's stderr meanwhile (libjpeg's 'Corrupt JPEG data: 453
    extraneous bytes before marker 0xd9', which Pillow neither raises nor returns), in the list it
    yields once the block ends. One file a process, emptied each time."""
    if not _WORDS:
        _WORDS.append(tempfile.TemporaryFile())
    capture = _WORDS[0].fileno()
    os.ftruncate(capture, 0)
    os.lseek(capture, 0, os.SEEK_SET)
    sys.stderr.flush()
    saved = os.dup(2)
    said: list[str] = []
    os.dup2(capture, 2)
    try:
        yield said
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.lseek(capture, 0, os.SEEK_SET)
        said.append(os.read(capture, 4096).decode("utf-8", "replace").strip().replace("\n", "; "))


def screen_files(paths: Iterable[str | Location], *, deep: bool | Callable = False, workers: int | None = None,
                 max_pixels: int = BOMB_PIXELS, chunk: int = 64, fork: bool = True,
                 on_progress: Callable[[int], None] | None = None) -> Iterator[Screened]:
    """Screen many files in parallel processes (one per core by default; `workers=0`: in this
    process), yielding results in the order of `paths`.

    Processes rather than threads even for the header check: with the file in the page cache it is
    Python code inside Pillow (about 35 us per file), so threads would share one core; processes
    scale with the cores and overlap I/O waits on network storage just as well. Paths go out in
    chunks with a bounded number in flight, so a list of a million paths is never copied whole.
    `on_progress(done)` is called after each chunk; `fork=False`: see parallel.map_chunks. `deep`:
    decode_file for each (True), or a check of the same signature (`fastloader check --deep`'s).
    """
    count = available_cores() if workers is None else workers
    return map_chunks(_screen_chunk, paths, (deep, max_pixels), workers=count, chunk=chunk, in_flight=4,
                      initializer=init_pillow_worker, fork=fork, on_progress=on_progress)


def quiet_pillow() -> None:
    """In a screening process: fail on truncated data, and keep Pillow's per-file warnings (large
    images, odd EXIF) off the console, since every problem is reported in the results."""
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    warnings.filterwarnings("ignore", module=r"PIL\.")


def init_pillow_worker() -> None:
    """In a worker process that opens images (screening, the cache's decoding). Ctrl-C goes to the
    whole process group: the parent stops the pool, the workers ignore it (rather than each printing
    a traceback)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    quiet_pillow()


def _screen_chunk(paths: list[str | Location], deep: bool | Callable, max_pixels: int) -> list[Screened]:
    check = deep if callable(deep) else decode_file if deep else screen_file
    return [check(path, max_pixels) for path in paths]


def _tail_problem(fmt: str, tail: bytes) -> str | None:
    """A JPEG must end with its EOI marker (FFD9) and a PNG with its IEND chunk; a file cut short
    (an interrupted download or copy) does not. Entropy-coded JPEG data cannot contain FFD9."""
    if fmt == "JPEG" and b"\xff\xd9" not in tail:
        return f"truncated JPEG: no end-of-image marker (FFD9) in its last {TAIL_BYTES} bytes"
    if fmt == "PNG" and b"IEND" not in tail:
        return f"truncated PNG: no IEND chunk in its last {TAIL_BYTES} bytes"
    return None


def _unidentified(found: str | None, head: bytes) -> str:
    """Why Pillow could not identify a file: a damaged header of a known format, or no image at all
    (often an HTML error page saved under an image's name). It says what the file is, never what it
    holds: a report must not print the contents of a file that may be private (a `passwd` named .jpg)."""
    if found:
        return f"{found} header does not parse (Pillow cannot identify the file)"
    start = head[:16]
    if start.strip() and all(32 <= byte < 127 or byte in b"\t\r\n" for byte in start):
        html = start.lstrip().lower().startswith((b"<!doctype html", b"<html", b"<head", b"<body", b"<?xml"))
        return f"not an image: {'an HTML or XML page' if html else 'text'}"
    return "not an image: unknown format"
