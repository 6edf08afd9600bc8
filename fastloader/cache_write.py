"""Writes the uint8 cache that `dataset.cache` reads (the format is described in cache.py): every
image of a split decoded once. `fastloader cache` (commands/cache.py) runs it.

Why a separate step: building takes a full decode of the split (about a core-second per 1,000
ImageNet JPEGs), which belongs in a job that runs once before training, not in every rank's first
epoch. Images are decoded in forked processes, in order, and appended to one file by this process;
the folder gets its final name only when everything is written, so a killed build leaves a
`.<split>.partial-<host>-<pid>` folder that no loader reads, and the next build on that host removes
it (a build on another host may be running: the folder may sit on storage that hosts share). The decoding
processes die with the build (parallel.die_with), and a build stopped by an error, Ctrl-C or
SIGTERM (`fastloader cache`) removes its partial folder itself. Free space is checked before
writing, and a disk that fills up while writing stops the build with a DiskFullError.

numpy, torch and the decoders are imported where they are used, so that the command line, which
imports this module's defaults, starts without them.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import socket
import sys
import time
from typing import TYPE_CHECKING, Iterator

from .cache_format import (
    FILES,
    FORMAT,
    LABELS,
    MANIFEST,
    OFFSETS,
    PARTIAL,
    PIXELS,
    SHAPES,
    VERSION,
    build_checksums,
    split_folder,
)
from .errors import DiskFullError
from .locations import Location, as_location
from .sources.reading import size_and_mtime

if TYPE_CHECKING:
    import numpy as np

    from .samples import SampleIndex
    from .schema import Config, SplitConfig

log = logging.getLogger("fastloader")

CHUNK = 16
"""Images per task sent to a worker: large enough to amortize the pipe, small enough to stream."""
SPACE_SAMPLE = 256
"""Files whose headers estimate the size of a cache before it is written (every file of a smaller split)."""
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def build_split_cache(config: Config, split: SplitConfig, index: SampleIndex, cache_dir: str, short_side: int,
                      workers: int | None = None) -> dict:
    """Decode the split's distinct files into cache_dir/<split>; returns what was written."""
    import numpy as np

    from .progress import Progress

    started = time.perf_counter()
    files = _distinct_files(index)
    os.makedirs(cache_dir, exist_ok=True)
    remove_stale_partials(cache_dir)
    needed, estimate = space_needed(index, files, short_side)
    disk = shutil.disk_usage(cache_dir)
    if disk.total and needed > disk.free:  # a file system that reports no size at all (some FUSE) is not judged
        raise DiskFullError(_no_space(cache_dir, split.name, needed, estimate))
    partial = os.path.join(cache_dir, PARTIAL.format(split=split.name) + f"{socket.gethostname()}-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    count = len(files)
    sizes, mtimes = np.zeros(count, np.int64), np.zeros(count, np.int64)
    rows = np.full(count, -1, np.int64)
    offsets, shapes, labels, bad = [0], [], [], []
    progress = Progress(count, unit="images")
    try:
        with open(os.path.join(partial, PIXELS), "wb") as pixels:
            paths = (index.location(int(sample)) for sample in files)
            shrunk = decode_and_shrink_all(paths, short_side, config.dataset.exif_orientation,
                                           config.dataset.max_pixels, workers)
            for file, decoded in enumerate(shrunk):
                sizes[file], mtimes[file] = decoded.size, decoded.mtime_ns
                if decoded.problem:  # raises under dataset.on_bad_image: raise, and nothing is kept
                    config.on_bad_image.refuse([(decoded.path, decoded.problem)], "found while building the cache")
                    bad.append((index.relpath(int(files[file])), decoded.problem))
                else:
                    pixels.write(decoded.pixels)
                    rows[file] = len(shapes)
                    offsets.append(offsets[-1] + len(decoded.pixels))
                    shapes.append(decoded.shape)
                    labels.append(index.label(int(files[file])))
                progress.update(file + 1)
        progress.finish()
        np.save(os.path.join(partial, OFFSETS), np.array(offsets, np.int64))
        np.save(os.path.join(partial, SHAPES), np.array(shapes, np.int32).reshape(-1, 2))
        np.save(os.path.join(partial, LABELS), np.array(labels, np.int64))
        cached = index.take(files)
        np.savez(os.path.join(partial, FILES), path_bytes=cached.path_bytes, path_offsets=cached.offsets,
                 labels=cached.labels, rows=rows, size=sizes, mtime_ns=mtimes)
        manifest = {"format": FORMAT, "version": VERSION, "split": split.name, "source_root": index.root,
                    "classes": list(index.classes), "short_side": short_side,
                    "resize": "shorter side at most short_side, aspect kept, never enlarged; bilinear, antialiased",
                    "images": len(shapes), "files": count, "bytes": offsets[-1], "bad": bad,
                    "built_by": " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]]), "built_at": time.time()}
        manifest["checksums"] = build_checksums(partial)
        with open(os.path.join(partial, MANIFEST), "w", encoding="utf-8") as handle:
            json.dump(manifest, handle, indent=1)
        _replace(partial, split_folder(cache_dir, split.name))
    except BaseException as error:
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(error, OSError) and error.errno in NO_SPACE:
            raise DiskFullError(_no_space(cache_dir, split.name, needed, estimate, error)) from error
        raise
    return {"folder": split_folder(cache_dir, split.name), "images": len(shapes), "bytes": offsets[-1],
            "bad": bad, "seconds": time.perf_counter() - started}


def space_needed(index: SampleIndex, files: np.ndarray, short_side: int) -> tuple[int, str]:
    """(bytes, how they were found): the cache's size from the stored sizes in the headers of the
    files (an even sample of SPACE_SAMPLE of them in a larger split; a file whose header cannot be
    read counts as the others), plus the index arrays and the manifest."""
    from .decoding.sizes import stored_size

    sample = files[::max(1, len(files) // SPACE_SAMPLE)][:SPACE_SAMPLE]
    sizes = [size for size in (stored_size(index.location(int(file))) for file in sample) if size is not None]
    pixels = [3 * height * width for height, width in (_shrunk(h, w, short_side) for h, w, _ in sizes)]
    per_file = sum(pixels) / len(pixels) if pixels else 0
    how = "from the headers of its files" if len(sample) == len(files) else \
        f"from the headers of {len(sample)} of its {len(files)} files"
    return int(per_file * len(files)) + 96 * len(files) + index.path_bytes.nbytes + 2 ** 16, how


def _shrunk(height: int, width: int, short_side: int) -> tuple[int, int]:
    """The size `shrink` gives an image (torchvision's Resize(int) rounding)."""
    short, long = sorted((height, width))
    if short <= short_side:
        return height, width
    long = int(short_side * long / short)
    return (short_side, long) if height <= width else (long, short_side)


def _no_space(cache_dir: str, split: str, needed: int, estimate: str, error: OSError | None = None) -> str:
    """Where, how much is needed and how much is free, what to do; `error`: the disk filled up while writing."""
    from .machine import human_bytes

    free = human_bytes(shutil.disk_usage(cache_dir).free)
    if error is None:
        what = f"no room for the cache of split '{split}' in {cache_dir}"
        free = f"{free} are free"
    else:
        full = "the disk quota" if error.errno == errno.EDQUOT else "the disk"
        what = f"{full} filled up while the cache of split '{split}' was written to {cache_dir} ({error.strerror})"
        free = f"{free} are free now that the unfinished cache is removed (another process may be writing there)"
    old = split_folder(cache_dir, split)
    replaced = ""
    if os.path.isdir(old):
        size = sum(entry.stat().st_size for entry in os.scandir(old) if entry.is_file())
        replaced = (f"; the present cache of the split ({human_bytes(size)}) is replaced only once the new one is "
                    f"complete: delete {old} first to reuse its space")
    return (f"{what}: it needs about {human_bytes(needed)} ({estimate}) and {free}{replaced}. Nothing was "
            f"{'written' if error is None else 'kept'}. Free space there, write the cache elsewhere (--out DIR), or "
            f"make it smaller (a lower --short-side)")


def remove_stale_partials(cache_dir: str) -> None:
    """Remove the unfinished folders of this host's builds that were killed (their pid no longer runs),
    logged: a killed build cannot clean up after itself. Another host's are left alone."""
    from .machine import human_bytes
    from .parallel import running

    pattern = re.compile(re.escape(PARTIAL).replace(r"\{split\}", ".+") + r"(?:(.+)-)?(\d+)(\.old)?")
    for entry in os.scandir(cache_dir):
        found = pattern.fullmatch(entry.name)
        if found is None or found.group(1) not in (None, socket.gethostname()) or \
                not entry.is_dir(follow_symlinks=False) or running(int(found.group(2))):
            continue
        size = sum(file.stat().st_size for file in os.scandir(entry.path) if file.is_file(follow_symlinks=False))
        shutil.rmtree(entry.path, ignore_errors=True)
        log.warning("removed %s (%s): an unfinished cache left by a build (pid %s) that was killed",
                    entry.path, human_bytes(size), found.group(2))


def _distinct_files(index: SampleIndex) -> np.ndarray:
    """The first sample of every distinct relative path, in index order (an index names each file once
    today: file lists and sources refuse a file twice; this stays the guard of one cache row a file)."""
    import numpy as np

    seen: dict[bytes, int] = {}
    for sample in range(len(index)):
        seen.setdefault(index.path_bytes[index.offsets[sample]:index.offsets[sample + 1]].tobytes(), sample)
    return np.fromiter(seen.values(), np.int64, len(seen))


def _replace(partial: str, final: str) -> None:
    """Put the finished build in place; an older cache of the split is moved aside first, then deleted."""
    old = None
    if os.path.exists(final):
        old = f"{partial}.old"
        os.rename(final, old)
    os.rename(partial, final)
    if old:
        shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Decoding, in forked processes
# ---------------------------------------------------------------------------------------------


class ShrunkFile:
    """One file: its size and mtime as read, then its shrunk pixels (HWC uint8 bytes) or why it is bad."""
    __slots__ = ("path", "size", "mtime_ns", "shape", "pixels", "problem")

    def __init__(self, path: str, size: int = 0, mtime_ns: int = 0, shape: tuple[int, int] = (0, 0),
                 pixels: bytes = b"", problem: str | None = None):
        self.path, self.size, self.mtime_ns, self.shape, self.pixels, self.problem = (
            path, size, mtime_ns, shape, pixels, problem)


def decode_and_shrink_all(paths, short_side: int, exif_orientation: bool, max_pixels: int,
                          workers: int | None = None) -> Iterator[ShrunkFile]:
    """decode_and_shrink over many paths in parallel processes (one per core by default; 0: here), in order."""
    from torchvision.transforms.v2 import functional  # noqa: F401

    from .decoding import decode  # noqa: F401  imported before the fork, not once per worker
    from .decoding.screen import init_pillow_worker
    from .parallel import available_cores, map_chunks
    count = available_cores() if workers is None else workers
    return map_chunks(_decode_and_shrink_chunk, paths, (short_side, exif_orientation, max_pixels), workers=count,
                      chunk=CHUNK, in_flight=2, initializer=init_pillow_worker)


def _decode_and_shrink_chunk(paths: list[str], short_side: int, exif_orientation: bool,
                             max_pixels: int) -> list[ShrunkFile]:
    return [decode_and_shrink(path, short_side, exif_orientation, max_pixels) for path in paths]


def decode_and_shrink(where: str | Location, short_side: int, exif_orientation: bool, max_pixels: int) -> ShrunkFile:
    """The upright RGB image with its shorter side shrunk to at most short_side, or the problem; with
    the size and mtime of the file that holds it (a shard's, for a shard member).

    The torch backend's own decoder and resize (libjpeg-turbo, torch's antialiased bilinear kernel)
    make the pixels, so the cache holds what that backend would have computed from the file.
    """
    from .decoding.screen import screen_file
    from .errors import error_text

    location = as_location(where)
    path = location.name
    try:
        size, mtime_ns = size_and_mtime(location)
    except OSError as error:
        return ShrunkFile(path, problem=f"unreadable: {error.strerror or error}")
    screened = screen_file(location, max_pixels)
    if screened.problem:
        return ShrunkFile(path, size, mtime_ns, problem=screened.problem)
    try:
        pixels = shrink(_decode(location, exif_orientation), short_side)
    except Exception as error:
        return ShrunkFile(path, size, mtime_ns, problem=f"decode failed: {error_text(error)}")
    height, width = pixels.shape[:2]
    return ShrunkFile(path, size, mtime_ns, (height, width), pixels.numpy().tobytes())


def _decode(where: str | Location, exif_orientation: bool):
    from .decoding.decode import load_region  # the torch backend's decoder: the same pixels
    from .imaging.geometry import Crop

    pixels, _, _ = load_region(where, lambda w, h: Crop(0, 0, w, h), 1, exif_orientation=exif_orientation,
                               use_draft=False)
    return pixels


def shrink(pixels, short_side: int):
    """HWC uint8 tensor -> HWC uint8 tensor whose shorter side is at most short_side (aspect kept,
    torchvision's Resize(int) rounding, antialiased bilinear); smaller images come back unchanged."""
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2 import functional as F

    if min(pixels.shape[:2]) <= short_side:
        return pixels.contiguous()
    resized = F.resize(pixels.permute(2, 0, 1), [short_side], interpolation=InterpolationMode.BILINEAR,
                       antialias=True)
    return resized.permute(1, 2, 0).contiguous()
