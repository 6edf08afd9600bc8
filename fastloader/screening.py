"""Screen a split's files when its loader is built, so that broken files never reach a decoder.

Why here and not only at decode time: inside a DALI pipeline one failing file aborts the pipeline
for good (NVIDIA/DALI #3913), and a file that fails in a torch worker costs its batch a sample. The
header check of `fastloader.imaging.screen` finds empty, missing, unreadable, non-image, truncated and
bomb-sized files at about 35,000 files/s per core, without decoding; both backends then read the
same index, so they keep the same length and full batches.

The result is cached per dataset (its folder and fingerprint) under the fastloader cache folder, so the check runs
once per dataset and machine; ranks that start together wait for the first one's result (a file
lock) instead of repeating it. A file that changes after it was screened is still caught where it
is decoded (see `dataset.on_bad_image`).
"""
from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from .bad_input import refuse
from .errors import BadImageError
from .imaging.screen import DALI_FORMATS, screen_files
from .paths import screening_file
from .progress import Progress
from .samples import SampleIndex
from .schema import Config
from .words import plural

log = logging.getLogger("fastloader")

SCREEN_VERSION = 3
"""Raised when a cached result would read otherwise: 2, a bomb names dataset.max_pixels; 3, each
file's stored size and orientation are kept."""
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
    (fastloader.imaging.sizes), so that no loader reads a header again; None when not screened."""


def screen_index(config: Config, index: SampleIndex, workers: int | None = None) -> ScreenedIndex:
    """Leave the files that fail the header check out of `index`, per dataset.on_bad_image.

    raise: the first such file (in index order) stops the build with a BadImageError;
    skip: each is logged once and returned in `bad`.
    """
    if not config.dataset.screen:
        return ScreenedIndex(index)
    problems, formats, sizes = _cached_screen(index, config.dataset.max_pixels, workers)
    if not problems and not formats:
        return ScreenedIndex(index, sizes=sizes)
    positions = {relpath: i for i, relpath in enumerate(_relpaths(index)) if relpath in problems or relpath in formats}
    bad = sorted((positions[relpath], reason) for relpath, reason in problems.items())
    if bad and len(bad) == len(index) and config.dataset.on_bad_image == "skip":
        first, reason = bad[0]
        raise BadImageError(f"none of the {len(index)} files in {index.root} can be decoded (the first, "
                            f"{index.path(first)!r}: {reason}); check dataset.root and the split's folder")
    refuse(config, [(index.path(position), reason) for position, reason in bad])  # raises under raise
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
    order) from the cache, else screened now."""
    cache = screening_file(index, max_pixels)
    cache.parent.mkdir(parents=True, exist_ok=True)
    with _locked(cache.with_suffix(".lock")):
        cached = _read(cache)
        if cached is not None:
            return cached
        started = time.perf_counter()
        progress = Progress(len(index), "files") if len(index) >= PROGRESS_FROM else None
        problems, formats = {}, {}
        sizes = np.zeros((len(index), 3), dtype=np.int32)
        locations = (index.location(i) for i in range(len(index)))
        results = screen_files(locations, workers=workers if len(index) > IN_PROCESS_UP_TO else 0,
                               max_pixels=max_pixels, fork=False, on_progress=progress.update if progress else None)
        for position, (relpath, result) in enumerate(zip(_relpaths(index), results)):
            if result.problem:
                problems[relpath] = result.problem
                continue
            sizes[position] = result.height, result.width, result.turned
            if result.format not in DALI_FORMATS:
                formats[relpath] = result.format or "unknown"
        if progress:
            progress.finish()
        log.info("screened %s of %s in %.2fs: %d cannot be decoded (cached in %s)", plural(len(index), "file"),
                 index.root, time.perf_counter() - started, len(problems), cache)
        partial = cache.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps({"version": SCREEN_VERSION, "root": index.root, "files": len(index),
                                       "problems": problems, "formats": formats,
                                       "sizes": base64.b64encode(sizes.tobytes()).decode("ascii")}))
        os.replace(partial, cache)
        return problems, formats, sizes


def _read(cache: Path) -> tuple[dict[str, str], dict[str, str], np.ndarray] | None:
    """A cached result, or None when absent, unreadable or of another version (then screened again)."""
    try:
        data = json.loads(cache.read_text())
        if data.get("version") != SCREEN_VERSION:
            return None
        sizes = np.frombuffer(base64.b64decode(data["sizes"]), dtype=np.int32).reshape(data["files"], 3)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    log.debug("screening of %s read from %s", data.get("root"), cache)
    return data["problems"], data["formats"], sizes


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (created if needed), held while the body runs."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
