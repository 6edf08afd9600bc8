"""The uint8 cache's format: its file names, version, manifest keys and checksums, which the writer
(cache_write.py) and the reader (cache.py) both follow. Its own module so that neither imports the
other (cache.py says what the files hold).
"""
from __future__ import annotations

import hashlib
import os
from typing import Mapping

import numpy as np

from .locations import open_regular

DEFAULT_SHORT_SIDE = 256
"""`fastloader cache --short-side`'s default: the shorter side a cached image is shrunk to."""

FORMAT = "fastloader-cache"
VERSION = 2
"""2: the manifest holds the checksums of the index arrays and of sampled pixels."""
MANIFEST, FILES, OFFSETS, SHAPES, LABELS, PIXELS = (
    "manifest.json", "files.npz", "offsets.npy", "shapes.npy", "labels.npy", "pixels.u8")
FILE_ARRAYS = {"path_bytes": np.uint8, "path_offsets": np.int64, "labels": np.int64, "rows": np.int64,
               "size": np.int64, "mtime_ns": np.int64}
"""The arrays of files.npz and their dtypes."""
MANIFEST_KEYS = {"format": str, "version": int, "source_root": str, "classes": list, "short_side": int, "images": int,
                 "files": int, "bytes": int, "bad": list, "checksums": dict}
"""The manifest's keys that a loader reads, and their JSON types."""
PARTIAL = ".{split}.partial-"
"""Prefix of a build in progress (or killed): never read as a cache."""
SAMPLED_IMAGES = 256
"""Images whose first and last EDGE_BYTES make the pixel checksum: a pixel file of the right size
from another build, or with images moved, fails it; a few hundred small reads when a cache opens."""
EDGE_BYTES = 64


def split_folder(cache_dir: str, split: str) -> str:
    return os.path.join(cache_dir, split)


def index_checksum(files: Mapping[str, np.ndarray], offsets: np.ndarray, shapes: np.ndarray,
                   labels: np.ndarray) -> str:
    """A digest of every index array (names, dtypes, shapes and bytes), written by the build."""
    digest = hashlib.blake2b(digest_size=16)
    for name, array in sorted({**files, OFFSETS: offsets, SHAPES: shapes, LABELS: labels}.items()):
        array = np.ascontiguousarray(array)
        digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
        digest.update(array.data)
    return digest.hexdigest()


def build_checksums(folder: str) -> dict[str, str]:
    """The manifest's checksums of a cache folder's arrays and pixels, as a loader will read them."""
    with np.load(os.path.join(folder, FILES), allow_pickle=False) as npz:
        files = {name: npz[name] for name in FILE_ARRAYS}
    offsets, shapes, labels = (np.load(os.path.join(folder, name)) for name in (OFFSETS, SHAPES, LABELS))
    return {"index": index_checksum(files, offsets, shapes, labels),
            "pixels": pixel_checksum(os.path.join(folder, PIXELS), offsets)}


def pixel_checksum(pixels: str, offsets: np.ndarray) -> str:
    """A digest of the first and last EDGE_BYTES of up to SAMPLED_IMAGES images, evenly spaced."""
    digest = hashlib.blake2b(digest_size=16)
    images = len(offsets) - 1
    with open(open_regular(pixels), "rb", buffering=0) as handle:
        for row in np.unique(np.linspace(0, images - 1, min(images, SAMPLED_IMAGES)).astype(np.int64)).tolist():
            start, end = int(offsets[row]), int(offsets[row + 1])
            digest.update(os.pread(handle.fileno(), min(EDGE_BYTES, end - start), start))
            digest.update(os.pread(handle.fileno(), min(EDGE_BYTES, end - start), max(start, end - EDGE_BYTES)))
    return digest.hexdigest()


