"""The decoded uint8 cache: read pixels through np.memmap instead of decoding image files.

Why: on a CPU-bound host the JPEG decode is about half the cost of every sample, paid again every
epoch. `fastloader cache` (cache_write.py) decodes each image once, shrinks it so that its shorter
side is at most `short_side`, and stores all images back to back; a loader then reads the bytes a
crop needs straight from the page cache, shared by every worker and every rank, with no copy.

Layout of `dataset.cache: DIR` (one folder per split, so that one key serves every split):

    DIR/<split>/manifest.json   format version, source root, classes, short side, bad files
    DIR/<split>/files.npz       per source file: relative path (bytes + offsets), size, mtime_ns,
                                row in the pixel file (-1 for a bad file); arrays, not JSON, because
                                a million files would be 150 MB of Python objects to compare
    DIR/<split>/offsets.npy     int64 [rows + 1]: image r is pixels.u8[offsets[r]:offsets[r + 1]]
    DIR/<split>/shapes.npy      int32 [rows, 2]: its (height, width); 3 channels, HWC
    DIR/<split>/labels.npy      int64 [rows]: its label when built (the loaders use the index's)
    DIR/<split>/pixels.u8       every image's HWC uint8 pixels, back to back

A build writes `DIR/.<split>.partial-<host>-<pid>` and renames it to `DIR/<split>` only when complete, so
a folder named after the split is always a finished cache. Nothing here writes: the cache may sit
on a read-only file system, shared by all ranks.

Nothing in the folder is trusted as it stands (a copy cut short, a file from another build, a
hand-edited manifest): opening checks the manifest's keys and types, every array's dtype, shape and
range, that the offsets and shapes agree and the pixel file is exactly as long as they say, and two
checksums the build wrote: of the index arrays, and of the first and last bytes of up to
`SAMPLED_IMAGES` images in the pixel file. A cache that fails is refused with its folder and the
command that rebuilds it.
"""
from __future__ import annotations

import glob
import json
import logging
import os
import shlex
import time
import zipfile
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .cache_format import (
    DEFAULT_SHORT_SIDE,
    FILE_ARRAYS,
    FILES,
    FORMAT,
    LABELS,
    MANIFEST,
    MANIFEST_KEYS,
    OFFSETS,
    PARTIAL,
    PIXELS,
    SHAPES,
    VERSION,
    index_checksum,
    pixel_checksum,
    split_folder,
)
from .config_dump import override_options
from .errors import CacheError
from .locations import open_regular
from .samples import SampleIndex
from .schema import Config, SplitConfig
from .sources.reading import size_and_mtime
from .words import plural

log = logging.getLogger("fastloader")

EXAMPLES_SHOWN = 3


def rebuild_command(config: Config, split: str, short_side: int, cache_dir: str) -> str:
    """The `fastloader cache` command that builds this split's cache for this config: its overrides
    kept (`--set`, the index must match; dataset.cache is --out), and `--short-side` only where it is
    not the command's default."""
    source = shlex.quote(config.source) if config.source != "<dict>" else "CONFIG"
    side = f" --short-side {short_side}" if short_side != DEFAULT_SHORT_SIDE else ""
    overrides = "".join(f" {option}" for option in override_options(config, skip=("dataset.cache",)))
    return f"fastloader cache {source} --split {split}{side} --out {shlex.quote(cache_dir)}{overrides}"


def required_short_side(split: SplitConfig) -> int:
    """The smallest cached shorter side that this split's transform never has to enlarge."""
    return _largest_asked(split)[0]


def _largest_asked(split: SplitConfig) -> tuple[int, str]:
    """The smallest cached shorter side that none of the split's output sizes enlarges, and what
    asks for it, in words. Eval resizes the shorter side to floor(size / crop_pct); train crops at
    most the whole image, at every size it may ask for: its size (a progressive ramp ends at it),
    each of `sizes` and each view group's (a 40 px cache served 96 px batches of
    `sizes: [32, 96]` and 96 px views, enlarged: issue 68)."""
    t = split.transform
    if split.mode == "eval":
        return int(t.size // t.crop_pct), f"size {t.size}"
    asked = [(t.size, f"size {t.size}")]
    if t.sizes:
        asked.append((max(t.sizes), f"sizes {list(t.sizes)}"))
    for k, view in enumerate(split.views or ()):
        asked.append((view.transform.size, f"view group {view.name or f'view{k}'} of size {view.transform.size}"))
    return max(asked, key=lambda pair: pair[0])


def suggested_short_side(split: SplitConfig) -> int:
    """The --short-side a build for this split should use: the command's default where it is enough."""
    return max(required_short_side(split), DEFAULT_SHORT_SIDE)


def read_manifest(folder: str) -> dict:
    """The folder's manifest.json as a dict; CacheError saying what is wrong with it."""
    path = os.path.join(folder, MANIFEST)
    try:
        with open(open_regular(path), encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise CacheError(f"{folder} is not a complete cache: it has no {MANIFEST}") from None
    except (OSError, ValueError) as error:
        raise CacheError(f"the cache {folder} is damaged: {MANIFEST} cannot be read ({error})") from None
    if not isinstance(data, dict):
        raise CacheError(f"the cache {folder} is damaged: {MANIFEST} is a JSON {type(data).__name__}, not an object")
    return data


class CachedPixels:
    """Sample i of the (final) index -> its cached HWC uint8 pixels, as a view of the memmap.

    Picklable and cheap to pickle: the memmap is opened on first use in each process (copy-on-write
    mode: writable views for torch, yet pages stay shared with the page cache, and the file is opened
    read-only). Forked workers inherit the small offset arrays without copying them.
    """

    def __init__(self, folder: str, rows: np.ndarray, offsets: np.ndarray, shapes: np.ndarray, rebuild: str = ""):
        self.folder, self.rows, self.offsets, self.shapes = folder, rows, offsets, shapes
        self.rebuild = rebuild
        """The command that rebuilds the cache, for the error when the pixel file changes under a run."""
        self._data: np.ndarray | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_data": None}

    @property
    def nbytes(self) -> int:
        return int(self.offsets[-1])

    def image(self, sample: int) -> np.ndarray:
        if self._data is None:  # once per process; checked, as a file cut short since would misread
            data = np.memmap(os.path.join(self.folder, PIXELS), dtype=np.uint8, mode="c")
            if len(data) != self.nbytes:
                raise CacheError(f"dataset.cache: {os.path.join(self.folder, PIXELS)} holds {len(data):,} bytes, "
                                 f"its index says {self.nbytes:,}: it changed since the cache was opened. Rebuild "
                                 f"it with `{self.rebuild}`")
            self._data = data
        row = self.rows[sample]
        height, width = self.shapes[row]
        return self._data[self.offsets[row]:self.offsets[row + 1]].reshape(height, width, 3)


@dataclass
class OpenedCache:
    """What the factory needs: the index less the bad files, their (path, reason), the pixels."""
    index: SampleIndex
    bad: list[tuple[str, str]]
    pixels: CachedPixels
    short_side: int


def open_split_cache(config: Config, split: SplitConfig, index: SampleIndex) -> OpenedCache | None:
    """The split's cache checked against the dataset (dataset.cache is set: the caller asks only
    then), or None (logged) where it holds no cache for this split. A stale or unfinished cache is
    an error that says how to rebuild."""
    cache_dir = config.dataset.cache
    if not os.path.isdir(cache_dir):
        build = rebuild_command(config, split.name, suggested_short_side(split), cache_dir)
        raise CacheError(f"{config.origin('dataset.cache')}: dataset.cache: folder {cache_dir!r} does not exist; "
                         f"build it with `{build}` or remove the key")
    folder = split_folder(cache_dir, split.name)
    if not os.path.isdir(folder):
        unfinished = glob.glob(os.path.join(cache_dir, PARTIAL.format(split=split.name) + "*"))
        command = rebuild_command(config, split.name, suggested_short_side(split), cache_dir)
        if unfinished:
            raise CacheError(f"dataset.cache: the cache of split '{split.name}' in {cache_dir} was never finished "
                             f"({unfinished[0]} is a build that was killed or is still running); "
                             f"run `{command}` to completion")
        log.warning("dataset.cache: no cache for split '%s' in %s, so it reads the image files; to cache it "
                    "run `%s`", split.name, cache_dir, command)
        return None
    started = time.perf_counter()
    opened = _check_and_open(config, split, index, folder, cache_dir)
    log.info("split '%s' reads decoded pixels from the cache %s: %s, %.1f GB, short side %d "
             "(checked against %s in %.2f s)", split.name, folder, plural(len(opened.index), "image"),
             opened.pixels.nbytes / 1e9, opened.short_side, plural(len(index), "file"), time.perf_counter() - started)
    return opened


def _check_and_open(config: Config, split: SplitConfig, index: SampleIndex, folder: str,
                    cache_dir: str) -> OpenedCache:
    needed = required_short_side(split)
    try:
        data = read_manifest(folder)
    except CacheError as error:
        command = rebuild_command(config, split.name, suggested_short_side(split), cache_dir)
        raise CacheError(f"dataset.cache: {error}. Rebuild it with `{command}`") from None
    built = data.get("short_side")
    command = rebuild_command(config, split.name, built if isinstance(built, int) and built >= needed else
                              suggested_short_side(split), cache_dir)

    def stale(reason: str) -> CacheError:
        return CacheError(f"dataset.cache: the cache {folder} does not match split '{split.name}' of the dataset "
                          f"({index.root}): {reason}. Rebuild it with `{command}`")

    def damaged(reason: str) -> CacheError:
        return CacheError(f"dataset.cache: the cache {folder} is damaged: {reason}. Rebuild it with `{command}`")

    if data.get("format") != FORMAT or data.get("version") != VERSION:
        raise stale(f"it is {data.get('format')} version {data.get('version')}, this fastloader reads "
                    f"{FORMAT} version {VERSION}")
    _check_manifest(data, damaged)
    if tuple(data["classes"]) != tuple(index.classes):
        raise stale(f"classes {data['classes'][:5]} then, {list(index.classes[:5])} now")
    if data["short_side"] < needed:
        command = rebuild_command(config, split.name, suggested_short_side(split), cache_dir)
        raise stale(f"it was built with --short-side {data['short_side']}, and split '{split.name}' "
                    f"({split.mode}, {_largest_asked(split)[1]}) needs at least {needed} not to enlarge images")
    files, offsets, shapes = _checked_arrays(folder, data, damaged)
    cached = SampleIndex(root=data["source_root"], classes=index.classes, path_bytes=files["path_bytes"],
                         offsets=files["path_offsets"], labels=files["labels"])
    file_of_sample = _match_files(index, cached, stale)
    _check_unchanged(index, file_of_sample, files["size"], files["mtime_ns"], stale)
    rows = files["rows"][file_of_sample]  # row in the pixel file of every sample; -1: bad file
    bad_samples = np.flatnonzero(rows < 0)
    bad = _bad_files(config, index, bad_samples, dict(data["bad"]), folder)
    kept = index.without(bad_samples) if len(bad_samples) else index
    pixels = CachedPixels(folder, rows[rows >= 0].copy(), offsets, shapes, rebuild=command)
    return OpenedCache(kept, bad, pixels, data["short_side"])


def _check_manifest(data: dict, damaged: Callable[[str], CacheError]) -> None:
    """Every key a loader reads, of its type (a bool is not a number here)."""
    for key, kind in MANIFEST_KEYS.items():
        value = data.get(key)
        if not isinstance(value, kind) or (kind is int and (isinstance(value, bool) or value < 0)):
            raise damaged(f"{MANIFEST} has {key}: {json.dumps(value)[:40]}, expected "
                          f"{'a count' if kind is int else 'a JSON ' + kind.__name__}")
    if not all(isinstance(name, str) for name in data["classes"]):
        raise damaged(f"{MANIFEST}: classes must be names (strings)")
    if not all(isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)
               for item in data["bad"]):
        raise damaged(f"{MANIFEST}: bad must be a list of [path, reason] pairs")
    if not all(isinstance(data["checksums"].get(name), str) for name in ("index", "pixels")):
        raise damaged(f"{MANIFEST}: checksums must hold 'index' and 'pixels'")


def _checked_arrays(folder: str, data: dict, damaged: Callable[[str], CacheError]
                    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """files.npz's arrays, offsets and shapes, each checked against the manifest and one another,
    the pixel file's length against them, and both checksums."""
    images, count = data["images"], data["files"]
    try:
        with np.load(os.path.join(folder, FILES), allow_pickle=False) as npz:
            files = {name: npz[name] for name in FILE_ARRAYS}
        offsets = np.load(os.path.join(folder, OFFSETS), allow_pickle=False)
        shapes = np.load(os.path.join(folder, SHAPES), allow_pickle=False)
        labels = np.load(os.path.join(folder, LABELS), allow_pickle=False)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
        raise damaged(f"{type(error).__name__}: {error}") from None
    expected = {**{name: (dtype, (count + (name == "path_offsets"),)) for name, dtype in FILE_ARRAYS.items()},
                OFFSETS: (np.int64, (images + 1,)), SHAPES: (np.int32, (images, 2)), LABELS: (np.int64, (images,))}
    expected["path_bytes"] = (np.uint8, files["path_bytes"].shape[:1] or (-1,))  # any length, one dimension
    for name, array in {**files, OFFSETS: offsets, SHAPES: shapes, LABELS: labels}.items():
        dtype, shape = expected[name]
        if array.dtype != dtype or array.shape != shape:
            raise damaged(f"{name} is {array.dtype} {list(array.shape)}, expected {np.dtype(dtype)} {list(shape)} "
                          f"(the manifest counts {images} images of {count} files)")
    rows, paths = files["rows"], files["path_offsets"]
    kept = rows[rows >= 0]
    if (rows < -1).any() or len(kept) != images or len(np.unique(kept)) != images or (kept >= images).any():
        raise damaged(f"the rows of {FILES} are not each image once (the manifest counts {images})")
    if paths[0] != 0 or (np.diff(paths) < 0).any() or paths[-1] != len(files["path_bytes"]):
        raise damaged(f"the path offsets of {FILES} do not fit its path bytes")
    if offsets[0] != 0 or (np.diff(offsets) != shapes.astype(np.int64).prod(axis=1) * 3).any() or \
            offsets[-1] != data["bytes"]:
        raise damaged(f"{OFFSETS} and {SHAPES} disagree (each image is height x width x 3 bytes, "
                      f"{data['bytes']:,} in all)")
    pixels = os.path.join(folder, PIXELS)
    try:
        length = os.stat(pixels).st_size
    except OSError as error:
        raise damaged(f"{PIXELS}: {error.strerror or error}") from None
    if length != offsets[-1]:
        raise damaged(f"{PIXELS} holds {length:,} bytes, its index says {int(offsets[-1]):,} (a copy cut short?)")
    if index_checksum(files, offsets, shapes, labels) != data["checksums"]["index"]:
        raise damaged("the checksum of its index arrays is not the one the build wrote (a file from another build, "
                      "or edited)")
    if pixel_checksum(pixels, offsets) != data["checksums"]["pixels"]:
        raise damaged(f"the checksum of sampled images in {PIXELS} is not the one the build wrote (a pixel file "
                      f"from another build, or images moved)")
    return files, offsets, shapes


def _match_files(index: SampleIndex, cached: SampleIndex, stale) -> np.ndarray:
    """Position in the cache's file list of every sample; the same set of files, or a stale error."""
    if np.array_equal(index.offsets, cached.offsets) and np.array_equal(index.path_bytes, cached.path_bytes):
        return np.arange(len(index))  # the usual case: the same scan, the same order
    position = {cached.relpath(i): i for i in range(len(cached))}
    found = np.fromiter((position.get(index.relpath(i), -1) for i in range(len(index))), np.int64, len(index))
    added = [index.relpath(i) for i in np.flatnonzero(found < 0)]
    removed = np.setdiff1d(np.arange(len(cached)), found)
    if added:
        raise stale(f"{plural(len(added), 'file')} {'are' if len(added) > 1 else 'is'} not in the cache, e.g. "
                    f"{', '.join(added[:EXAMPLES_SHOWN])}")
    if len(removed):
        names = [cached.relpath(int(i)) for i in removed[:EXAMPLES_SHOWN]]
        raise stale(f"{plural(len(removed), 'cached file')} {'are' if len(removed) > 1 else 'is'} no longer in the "
                    f"split, e.g. {', '.join(names)}")
    return found


def _check_unchanged(index: SampleIndex, file_of_sample: np.ndarray, sizes: np.ndarray, mtimes: np.ndarray,
                     stale) -> None:
    """Every source file (or shard) still has the size and modification time it had when it was cached."""
    changed = []
    files, first_sample = np.unique(file_of_sample, return_index=True)
    for file, sample in zip(files.tolist(), first_sample.tolist()):
        location = index.location(sample)
        try:
            size, mtime_ns = size_and_mtime(location)
        except OSError as error:
            raise stale(f"{location.file} cannot be read ({error.strerror or error})") from None
        if size != sizes[file] or mtime_ns != mtimes[file]:
            changed.append(index.relpath(sample))
    if changed:
        raise stale(f"{plural(len(changed), 'file')} changed (size or modification time) since the build, "
                    f"e.g. {', '.join(changed[:EXAMPLES_SHOWN])}")


def _bad_files(config: Config, index: SampleIndex, bad_samples: np.ndarray, reasons: dict[str, str],
               folder: str) -> list[tuple[str, str]]:
    """(path, reason) of each bad file once, through dataset.on_bad_image (bad_input.OnBadImage)."""
    found, seen = [], set()
    for sample in bad_samples:
        relpath = index.relpath(int(sample))
        if relpath not in seen:
            seen.add(relpath)
            found.append((index.path(int(sample)), reasons.get(relpath, "unusable when the cache was built")))
    return config.on_bad_image.refuse(found, f"listed as bad in the cache {folder}")
