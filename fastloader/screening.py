"""Screen a split's files when its loader is built, so that broken files never reach a decoder.

Why here and not only at decode time: inside a DALI pipeline one failing file aborts the pipeline
for good (NVIDIA/DALI #3913), and a file that fails in a torch worker costs its batch a sample. The
header check of `fastloader.decoding.screen` finds empty, missing, unreadable, non-image, truncated and
bomb-sized files at about 35,000 files/s per core, without decoding; both backends then read the
same index, so they keep the same length and full batches.

The result is cached per dataset (its folder and fingerprint) under the fastloader cache folder, so the check runs
once per dataset and machine; ranks that start together wait for the first one's result (a file
lock) instead of repeating it. Each file's result is kept with the file's stamp (inode, size, mtime,
ctime: `file_stamps`), and a file whose stamp changed since (replaced, rewritten, copied over with
`cp -p`) is screened again when a loader is built: a cached result is never trusted for another
file under the same name. A file that changes while a loader runs is caught where it is decoded
(see `dataset.on_bad_image`). Shards in an object store are not screened: that would download every
shard when the loader is built; their members are checked where they are decoded (both backends do).
"""
from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import logging
import os
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from .bad_input import OnBadImage
from .decoding.screen import DALI_FORMATS, screen_files
from .errors import BadImageError
from .locations import path_stamp
from .paths import screening_file
from .progress import Progress
from .samples import SampleIndex
from .sources.reading import is_remote
from .words import plural

log = logging.getLogger("fastloader")

SCREEN_VERSION = 4
"""Raised when a cached result would read otherwise: 2, a bomb names dataset.max_pixels; 3, each
file's stored size and orientation are kept; 4, each file's stamp."""
PROGRESS_FROM = 20_000
"""Screening this many files or more shows a progress bar (about a second of work per core)."""
IN_PROCESS_UP_TO = 4_000
"""Up to this many files are screened in this process (about 0.1 s), with no worker processes to start."""


@dataclass
class ScreenedIndex:
    """A split's index less the files that cannot be used, and why each was left out."""
    index: SampleIndex
    bad: list[tuple[str, str]] = field(default_factory=list)
    """(path, reason) of the files left out, in index order."""
    formats: dict[int, str] = field(default_factory=dict)
    """Sample (in `index`) -> format, for the files whose format DALI cannot decode."""
    sizes: np.ndarray | None = None
    """int32 [len(index), 3]: each sample's stored (height, width, turned) as screening read it
    (fastloader.decoding.sizes), so that no loader reads a header again; None when not screened."""


def screen_index(index: SampleIndex, on_bad_image: OnBadImage, max_pixels: int, check: str,
                 workers: int | None = None) -> ScreenedIndex:
    """Leave the files that fail the header check (dataset.max_pixels among them) out of `index`,
    per dataset.on_bad_image; `check`: what to check where none can be used (formats.input_key).

    raise: the first such file (in index order) stops the build with a BadImageError;
    skip: each is logged once and returned in `bad`.
    """
    if index.ranges is not None and len(index.ranges.files) and is_remote(index.ranges.files[0]):
        log.info("the %s of %s are in an object store: their members are not screened when the loader is built "
                 "(that would download every shard first); a member that cannot be decoded is found where it is "
                 "decoded, and follows dataset.on_bad_image (docs/bad-input.md)",
                 plural(len(index.ranges.files), "shard"), index.root)
        return ScreenedIndex(index)
    if index.reader:
        log.info("the %s of the source %s are not screened when the loader is built (that would read every one "
                 "through its read(), a blob service's whole dataset, with no timeout in this process); a sample that "
                 "cannot be decoded is found where it is decoded, and follows dataset.on_bad_image (docs/sources.md)",
                 plural(len(index), "sample"), index.root)
        return ScreenedIndex(index)
    problems, formats, sizes = _cached_screen(index, max_pixels, workers)
    if not problems and not formats:
        return ScreenedIndex(index, sizes=sizes)
    positions = {relpath: i for i, relpath in enumerate(_relpaths(index)) if relpath in problems or relpath in formats}
    bad = sorted((positions[relpath], reason) for relpath, reason in problems.items())
    if bad and len(bad) == len(index) and on_bad_image.action == "skip":
        first, reason = bad[0]
        what = "samples" if index.ranges is not None else "files"
        raise BadImageError(f"none of the {len(index)} {what} in {index.root} can be decoded (the first, "
                            f"{index.path(first)!r}: {reason}); check {check}")
    on_bad_image.refuse([(index.path(position), reason) for position, reason in bad])  # raises under raise
    if bad:
        log.warning("%d of %s in %s cannot be decoded and %s left out; %s listed in loader.bad_samples",
                    len(bad), plural(len(index), "file"), index.root, *(("is", "it is") if len(bad) == 1 else
                                                                         ("are", "they are")))
    dropped = [position for position, _ in bad]
    keep = np.ones(len(index), dtype=bool)
    keep[dropped] = False
    new_position = np.cumsum(keep) - 1
    kept_formats = {int(new_position[positions[relpath]]): fmt for relpath, fmt in formats.items()
                    if relpath not in problems}
    kept = index.without(dropped) if dropped else index
    bad_paths = [(index.path(position), reason) for position, reason in bad]
    return ScreenedIndex(kept, bad_paths, kept_formats, sizes[keep])


def _relpaths(index: SampleIndex) -> Iterator[str]:
    return (index.relpath(i) for i in range(len(index)))


def _cached_screen(index: SampleIndex, max_pixels: int,
                   workers: int | None) -> tuple[dict[str, str], dict[str, str], np.ndarray]:
    """({relpath: problem}, {relpath: format DALI cannot decode}, stored sizes int32 [n, 3] in index
    order) from the cache for the files unchanged since, screened now for the others."""
    cache = screening_file(index.root, index.fingerprint, max_pixels)
    cache.parent.mkdir(parents=True, exist_ok=True)
    stamps = file_stamps(index)  # before the lock: each rank stats the files at once
    with _locked(cache.with_suffix(".lock")):
        cached = _read(cache, len(index))
        if cached is None:
            problems, formats, sizes = {}, {}, np.zeros((len(index), 3), dtype=np.int32)
            changed = np.arange(len(index))
        else:
            problems, formats, sizes, then = cached
            changed = np.flatnonzero((stamps != then).any(axis=1))
            if not len(changed):
                return problems, formats, sizes
        started = time.perf_counter()
        progress = Progress(len(changed), "files") if len(changed) >= PROGRESS_FROM else None
        locations = (index.location(i) for i in changed.tolist())
        results = screen_files(locations, workers=workers if len(changed) > IN_PROCESS_UP_TO else 0,
                               max_pixels=max_pixels, fork=False, on_progress=progress.update if progress else None)
        for position, result in zip(changed.tolist(), results):
            relpath = index.relpath(position)
            problems.pop(relpath, None)
            formats.pop(relpath, None)
            sizes[position] = 0
            if result.problem:
                problems[relpath] = result.problem
                continue
            sizes[position] = result.height, result.width, result.turned
            if result.format not in DALI_FORMATS:
                formats[relpath] = result.format or "unknown"
        if progress:
            progress.finish()
        bad = sum(relpath in problems for relpath in map(index.relpath, changed.tolist()))
        if cached is None:
            log.info("screened %s of %s in %.2fs: %d cannot be decoded (cached in %s)", plural(len(index), "file"),
                     index.root, time.perf_counter() - started, bad, cache)
        else:
            log.info("screened %s of %s again, changed since they were screened (inode, size, mtime or "
                     "ctime), in %.2fs: %d of them cannot be decoded (cached in %s)", plural(len(changed), "file"),
                     index.root, time.perf_counter() - started, bad, cache)
        partial = cache.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps({"version": SCREEN_VERSION, "root": index.root, "files": len(index),
                                       "problems": problems, "formats": formats, "sizes": _b64(sizes),
                                       "stamps": _b64(stamps)}))
        os.replace(partial, cache)
        return problems, formats, sizes


def file_stamps(index: SampleIndex) -> np.ndarray:
    """int64 [n, 4]: each sample's file's stamp (sources.reading.stat_stamp; a shard member: its
    shard's), zeros where it cannot be stat'ed. One stat a file (a few microseconds), one a shard."""
    if index.ranges is not None:
        per_shard = np.array([path_stamp(path) for path in index.ranges.files], dtype=np.int64).reshape(-1, 4)
        return per_shard[index.ranges.file]
    stamps = array("q")
    root, names, ends = os.fsencode(index.root), index.path_bytes.tobytes(), index.offsets.tolist()
    for start, end in zip(ends, ends[1:]):  # bytes paths, joined as path() joins them: no decoding per file
        stamps.extend(path_stamp(os.path.join(root, names[start:end])))
    return np.frombuffer(stamps, dtype=np.int64).reshape(-1, 4)


def _b64(values: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(values).tobytes()).decode("ascii")


def _read(cache: Path, files: int) -> tuple[dict[str, str], dict[str, str], np.ndarray, np.ndarray] | None:
    """A cached result (problems, formats, sizes, stamps), or None when absent, unreadable or of
    another version (then screened again)."""
    try:
        data = json.loads(cache.read_text())
        if data.get("version") != SCREEN_VERSION or data.get("files") != files:
            return None
        sizes = np.frombuffer(base64.b64decode(data["sizes"]), dtype=np.int32).reshape(files, 3).copy()
        stamps = np.frombuffer(base64.b64decode(data["stamps"]), dtype=np.int64).reshape(files, 4)
        problems, formats = dict(data["problems"]), dict(data["formats"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    log.debug("screening of %s read from %s", data.get("root"), cache)
    return problems, formats, sizes, stamps


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (created if needed), held while the body runs."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
