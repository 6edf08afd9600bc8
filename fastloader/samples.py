"""The SampleIndex: every (path, label) of a split, scanned once and shared by both backends.

Why numpy: DataLoader workers are forked, and a list of 1.28M Python strings is touched page by page
by reference counting, so each worker slowly copies the whole list. Three numpy arrays (one byte
buffer of UTF-8 paths, their offsets, the labels) are three objects: nothing is copied.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import time
from array import array
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from .errors import ConfigError
from .schema import Config, SplitConfig

log = logging.getLogger("fastloader")


@dataclass(frozen=True, eq=False)
class SampleIndex:
    root: str
    """Folder the relative paths are relative to."""
    classes: tuple[str, ...]
    """Class names; label i is classes[i]."""
    path_bytes: np.ndarray
    """uint8: the UTF-8 relative paths, back to back."""
    offsets: np.ndarray
    """int64 [n + 1]: path i is path_bytes[offsets[i]:offsets[i + 1]]."""
    labels: np.ndarray
    """int64 [n]."""
    excluded: int = 0
    """Files of the split that dataset.exclude left out."""

    @classmethod
    def from_lists(cls, root: str, classes: Sequence[str], relpaths: Sequence[str],
                   labels: Sequence[int]) -> "SampleIndex":
        builder = IndexBuilder()
        for path, label in zip(relpaths, labels, strict=True):
            builder.add(path, label)
        return builder.build(root, classes)

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, samples: Sequence[int]) -> "SampleIndex":
        """The samples at these positions, in this order, as an index of their own."""
        samples = np.asarray(samples, dtype=np.int64)
        starts, ends = self.offsets[:-1][samples], self.offsets[1:][samples]
        offsets = np.zeros(len(samples) + 1, dtype=np.int64)
        np.cumsum(ends - starts, out=offsets[1:])
        pieces = [self.path_bytes[a:b] for a, b in zip(starts, ends)]
        path_bytes = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint8)
        return SampleIndex(root=self.root, classes=self.classes, path_bytes=path_bytes, offsets=offsets,
                           labels=self.labels[samples].copy(), excluded=self.excluded)

    def without(self, drop: Sequence[int]) -> "SampleIndex":
        """The same index less the samples at positions `drop` (files known to be unusable); the
        dropped files count in `excluded`, and the fingerprint changes with them."""
        keep = np.ones(len(self), dtype=bool)
        keep[np.asarray(drop, dtype=np.int64)] = False
        kept = self.take(np.flatnonzero(keep))
        return dataclasses.replace(kept, excluded=self.excluded + int((~keep).sum()))

    def relpath(self, i: int) -> str:
        start, end = self.offsets[i], self.offsets[i + 1]
        return self.path_bytes[start:end].tobytes().decode("utf-8", "surrogateescape")

    def path(self, i: int) -> str:
        return os.path.join(self.root, self.relpath(i))

    def path_rows(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(uint8 [n, width], int32 [n, 1]): the samples' full paths as UTF-8 rows of one byte
        matrix, and each row's length (the bytes after it are padding). Built with a few numpy
        operations, so that a batch of paths costs no Python per sample (the DALI feed's paths)."""
        samples = np.asarray(samples, dtype=np.int64)
        starts = self.offsets[samples]
        lengths = self.offsets[samples + 1] - starts
        width = int(lengths.max()) if len(samples) else 0
        relative = self.path_bytes.take(starts[:, None] + np.arange(width), mode="clip")
        prefix = np.frombuffer(os.fsencode(os.path.join(self.root, "")), dtype=np.uint8)
        absolute = (relative[:, 0] == ord(os.sep)) if width else np.zeros(len(samples), dtype=bool)
        if not len(prefix) or absolute.all():
            return relative, lengths.astype(np.int32).reshape(-1, 1)
        rows = np.empty((len(samples), len(prefix) + width), dtype=np.uint8)
        rows[:, :len(prefix)] = prefix
        rows[:, len(prefix):] = relative
        if absolute.any():  # a file list may name some files by absolute path: not joined to the root, as in path()
            rows[absolute, :width] = relative[absolute]
        return rows, (lengths + np.where(absolute, 0, len(prefix))).astype(np.int32).reshape(-1, 1)

    def label(self, i: int) -> int:
        return int(self.labels[i])

    def paths(self) -> Iterator[str]:
        return (self.path(i) for i in range(len(self)))

    def class_counts(self) -> np.ndarray:
        return np.bincount(self.labels, minlength=len(self.classes))

    @property
    def nbytes(self) -> int:
        return self.path_bytes.nbytes + self.offsets.nbytes + self.labels.nbytes

    @functools.cached_property
    def fingerprint(self) -> str:
        """A short hash of the classes, relative paths and labels: a saved loader state names the
        dataset it belongs to, wherever the dataset is mounted."""
        digest = hashlib.blake2b(digest_size=8)
        digest.update("\0".join(self.classes).encode("utf-8", "surrogateescape"))
        for part in (self.path_bytes, self.offsets, self.labels):
            digest.update(np.ascontiguousarray(part).data)
        return digest.hexdigest()


class IndexBuilder:
    """Appends (path, label) pairs straight into compact buffers: no list of a million strings,
    even while scanning."""

    def __init__(self):
        self._bytes = bytearray()
        self._offsets = array("q", [0])
        self._labels = array("q")

    def __len__(self) -> int:
        return len(self._labels)

    def add(self, relpath: str, label: int) -> None:
        self._bytes += relpath.encode("utf-8", "surrogateescape")
        self._offsets.append(len(self._bytes))
        self._labels.append(label)

    def labels(self) -> np.ndarray:
        return np.frombuffer(self._labels, dtype=np.int64)

    def build(self, root: str, classes: Sequence[str], excluded: int = 0) -> SampleIndex:
        return SampleIndex(root=str(root), classes=tuple(classes),
                           path_bytes=np.frombuffer(bytes(self._bytes), dtype=np.uint8),
                           offsets=np.array(self._offsets, dtype=np.int64),
                           labels=np.array(self._labels, dtype=np.int64), excluded=excluded)


def dataset_root(config: Config) -> str:
    """dataset.root as a folder (a builtin dataset is generated on first use)."""
    root = config.dataset.root
    if root.startswith("builtin:"):
        from .demo import builtin_dataset_root
        root = builtin_dataset_root(root, config.origin("dataset.root"))
    return root


def build_index(config: Config, split: SplitConfig) -> SampleIndex:
    """The split's samples, from its file list or from root/<folder>/<class>/... folders."""
    root = dataset_root(config)
    excluded = read_exclude_list(config.dataset.exclude, root) if config.dataset.exclude else frozenset()
    if split.file_list:
        return read_file_list(split.file_list, root, config.dataset.classes, excluded)
    folder = os.path.normpath(split.folder or split.name)
    skip = frozenset(path[len(folder) + 1:] for path in excluded if path.startswith(folder + os.sep))
    # the folders' problems are blamed on what set dataset.root: the file, or an override
    return scan_folder(os.path.join(root, folder), config.dataset.extensions, config.dataset.classes,
                       config.origin("dataset.root"), key=f"{split.name}.folder", skip=skip)


def read_exclude_list(list_path: str, root: str) -> frozenset[str]:
    """dataset.exclude: image paths relative to dataset.root (or absolute), one per line, '#' comments."""
    if not os.path.isfile(list_path):
        raise ConfigError(f"dataset.exclude: file {list_path!r} does not exist; write it with "
                          f"`fastloader check CONFIG --exclude-list {list_path}` or remove the key")
    with open(list_path, encoding="utf-8", errors="surrogateescape") as handle:
        lines = [line.strip() for line in handle]
    return frozenset(os.path.normpath(os.path.relpath(line, root) if os.path.isabs(line) else line)
                     for line in lines if line and not line.startswith("#"))


def scan_folder(split_dir: str, extensions: Sequence[str], classes: Sequence[str] | None = None,
                source: str = "<dict>", key: str = "dataset.root", skip: frozenset[str] = frozenset()) -> SampleIndex:
    """ImageFolder convention: sorted class folders -> labels 0..C-1; files in sorted order, recursively.

    A class folder without images keeps its label (so labels stay aligned with other splits) and is
    logged as a warning; a split without any image is an error. Paths in `skip` (relative to
    split_dir, from dataset.exclude) are left out and counted in the log.
    """
    if not os.path.isdir(split_dir):
        parent = os.path.dirname(split_dir.rstrip(os.sep))
        if not os.path.isdir(parent):
            raise ConfigError(f"{source}: dataset.root: folder {parent!r} does not exist; set dataset.root to the "
                              f"folder that holds the split folders (or pass --set dataset.root=PATH)")
        present = sorted(e.name for e in os.scandir(parent) if e.is_dir())
        raise ConfigError(f"{source}: split folder {split_dir!r} does not exist (folders in dataset.root: "
                          f"{', '.join(present) or 'none'}); set {key} to one of them")
    found = sorted(e.name for e in os.scandir(split_dir) if e.is_dir() and not e.name.startswith("."))
    if classes is None:
        classes = found
        if not classes:
            raise ConfigError(f"{source}: {split_dir!r} has no class folders; expected "
                              f"{split_dir}/<class name>/<image files>")
    else:
        missing = [c for c in classes if c not in found]
        extra = [c for c in found if c not in classes]
        if extra:
            raise ConfigError(f"{source}: dataset.classes: {split_dir!r} has class folders not in the list: "
                              f"{', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}; add them to dataset.classes")
        for name in missing:
            log.warning("%s: class %r has no folder in %s; its label is kept, with no samples", source, name, split_dir)

    suffixes = tuple(e.lower() for e in extensions)
    builder = IndexBuilder()
    skipped = 0
    started = last_report = time.monotonic()
    for label, name in enumerate(classes):
        class_dir = os.path.join(split_dir, name)
        if not os.path.isdir(class_dir):
            continue
        before = len(builder)
        for dirpath, dirnames, filenames in os.walk(class_dir, followlinks=True):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, split_dir)
            for filename in sorted(filenames):
                if filename.lower().endswith(suffixes):
                    relpath = os.path.normpath(os.path.join(rel_dir, filename))
                    if relpath in skip:
                        skipped += 1
                    else:
                        builder.add(relpath, label)
        if len(builder) == before:
            log.warning("class folder %s holds no image files (%s); its label %d is kept, with no samples",
                        class_dir, "/".join(suffixes), label)
        now = time.monotonic()
        if now - last_report > 5:
            log.info("scanning %s: %d/%d classes, %d images so far", split_dir, label + 1, len(classes), len(builder))
            last_report = now
    if not len(builder):
        raise ConfigError(f"{source}: no image files under {split_dir!r} (looked for {', '.join(suffixes)}); "
                          f"check dataset.root and dataset.extensions")
    log.info("indexed %s: %d images in %d classes (%.2fs)%s", split_dir, len(builder), len(classes),
             time.monotonic() - started, f", {skipped} left out by dataset.exclude" if skipped else "")
    return builder.build(split_dir, classes, excluded=skipped)


def read_file_list(list_path: str, root: str, classes: Sequence[str] | None = None,
                   excluded: frozenset[str] = frozenset()) -> SampleIndex:
    """Lines of `relative/path label` (label an integer; paths may hold spaces; '#' starts a comment)."""
    if not os.path.isfile(list_path):
        raise ConfigError(f"file list {list_path!r} does not exist; fix the split's file_list key")
    builder = IndexBuilder()
    skipped = 0
    with open(list_path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.rsplit(None, 1)
            if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
                raise ConfigError(f"{list_path}:{number}: expected 'relative/path label', got {line!r}")
            label = int(parts[1])
            if label < 0 or (classes is not None and label >= len(classes)):
                limit = f" (dataset.classes has {len(classes)} names)" if classes is not None else ""
                raise ConfigError(f"{list_path}:{number}: label {label} out of range{limit}")
            if os.path.normpath(parts[0]) in excluded:
                skipped += 1
            else:
                builder.add(parts[0], label)
    if not len(builder):
        raise ConfigError(f"file list {list_path!r} holds no samples")
    if classes is None:
        classes = [str(i) for i in range(int(builder.labels().max()) + 1)]
    if skipped:
        log.info("file list %s: %d samples, %d left out by dataset.exclude", list_path, len(builder), skipped)
    return builder.build(root, classes, excluded=skipped)
