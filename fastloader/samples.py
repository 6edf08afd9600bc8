"""The SampleIndex: every (name, label) of a split, and where its bytes are, scanned once and shared
by both backends.

A sample's name is its path relative to `root` (a file), or `shard.tar:member` (a member of a tar
shard, whose byte range `ranges` holds). Every reader takes a sample's `location(i)` to
`fastloader.sources.reading`, so no reader needs to know which kind it is.

Why numpy: DataLoader workers are forked, and a list of 1.28M Python strings is touched page by page
by reference counting, so each worker slowly copies the whole list. Three numpy arrays (one byte
buffer of UTF-8 paths, their offsets, the labels) are three objects: nothing is copied.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import os
from array import array
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from .locations import Identity, Location
from .schema import MAX_CLASSES_WITHOUT_NAMES


@dataclass(frozen=True, eq=False)
class ByteRanges:
    """Where the samples of a container format are: sample i is bytes [start, start + length) of
    files[file[i]]. 28 bytes a sample, in numpy arrays, like the names."""
    files: tuple[str, ...]
    """The containers (tar shards), as absolute paths."""
    file: np.ndarray
    """int32 [n]: which container holds sample i."""
    start: np.ndarray
    """int64 [n]: the sample's first byte in its container."""
    length: np.ndarray
    """int64 [n]: the sample's byte count."""
    header: np.ndarray | None = None
    """int64 [n]: the digest of the tar header right before the sample's bytes, as indexed; each
    read checks it (sources/reading.py), so a shard rewritten under a run is refused, not misread."""
    identities: tuple[Identity, ...] | None = None
    """Each container's identity (inode, size, mtime) when it was indexed, checked when it is opened."""
    table_row: np.ndarray | None = None
    """int64 [n], parquet files: 1 + the sample's row in its file where its image is read with its row
    group (compressed image pages: start and length are then the row group's image column chunk); 0:
    the sample's bytes are the byte range itself. None: no such rows."""
    columns: tuple[str | None, ...] | None = None
    """Each container's image column (a parquet leaf path, `image.bytes`), for the rows read by row group."""

    def take(self, samples: np.ndarray) -> "ByteRanges":
        header = self.header[samples] if self.header is not None else None
        table_row = self.table_row[samples] if self.table_row is not None else None
        return ByteRanges(self.files, self.file[samples], self.start[samples], self.length[samples], header,
                          self.identities, table_row, self.columns)

    @property
    def nbytes(self) -> int:
        header = self.header.nbytes if self.header is not None else 0
        table_row = self.table_row.nbytes if self.table_row is not None else 0
        return self.file.nbytes + self.start.nbytes + self.length.nbytes + header + table_row


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
    ranges: ByteRanges | None = None
    """Byte ranges in container files (tar shards); None: each sample is the whole file at path(i)."""
    unusable: tuple[tuple[str, str], ...] = ()
    """(name, reason) of what indexing found but could not make a sample of (a shard member without
    a label, a truncated shard ...), under dataset.on_bad_image: skip; already logged."""
    entry: np.ndarray | None = None
    """int16 [n]: which entry of the split's `sources` each sample comes from (sources/multi.py); None:
    a split without `sources`."""
    entry_names: tuple[str, ...] = ()
    """The names of the split's `sources` entries, by number (empty without `sources`)."""
    reader: str = ""
    """The samples of a user's source (sources/protocol.py): the opened source's token, whose read()
    gives sample i's bytes as read(items[i]); `root` is then the source's name. "": files and ranges."""
    items: np.ndarray | None = None
    """int64 [n]: each sample's number in the reader's samples()."""
    source_length: int = 0
    """How many samples the reader had when it was indexed (what check_unchanged compares)."""
    source_identity: str = ""
    """The reader's identity() when it was indexed (what check_unchanged compares)."""
    store: str = ""
    """Files in an object store: the token of the node cache the loader opened for them, which every
    location carries (node_cache.open_cache); "": local files, or the default cache."""

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
        ranges = self.ranges.take(samples) if self.ranges is not None else None
        entry = self.entry[samples] if self.entry is not None else None
        items = self.items[samples] if self.items is not None else None
        return SampleIndex(root=self.root, classes=self.classes, path_bytes=path_bytes, offsets=offsets,
                           labels=self.labels[samples].copy(), excluded=self.excluded, ranges=ranges,
                           unusable=self.unusable, entry=entry, entry_names=self.entry_names,
                           reader=self.reader, items=items, source_length=self.source_length,
                           source_identity=self.source_identity, store=self.store)

    def read_by(self, reader: str, items: np.ndarray, source_length: int, source_identity: str) -> "SampleIndex":
        """This index as the samples of an opened source (its token), sample i its items[i]."""
        return dataclasses.replace(self, reader=reader, items=items, source_length=source_length,
                                   source_identity=source_identity)

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
        """The sample's name for people: a file's path, `/dir/shard.tar:member`, or `source:name`."""
        if self.reader:
            return f"{self.root}:{self.relpath(i)}"
        return os.path.join(self.root, self.relpath(i))

    def location(self, i: int) -> Location:
        """Where sample i's bytes are, for fastloader.sources.reading."""
        name = self.path(i)
        if self.reader:
            return Location(name, self.root, int(self.items[i]), reader=self.reader)
        if self.ranges is None:
            return Location(name, name, store=self.store)
        ranges = self.ranges
        file = int(ranges.file[i])
        row = int(ranges.table_row[i]) - 1 if ranges.table_row is not None else -1
        return Location(name, ranges.files[file], int(ranges.start[i]), int(ranges.length[i]),
                        int(ranges.header[i]) if ranges.header is not None else 0,
                        ranges.identities[file] if ranges.identities is not None else None,
                        row, ranges.columns[file] or "" if row >= 0 and ranges.columns is not None else "",
                        store=self.store)

    def locations(self, samples: np.ndarray) -> list[Location]:
        """location(i) of each of `samples`, built together from the arrays (the DALI feed asks for a
        batch of them on its one thread: 0.6 against 1.5 us a file)."""
        rows = np.asarray(samples, dtype=np.int64)
        if self.reader or (self.ranges is not None and self.ranges.table_row is not None):
            return [self.location(i) for i in rows.tolist()]
        raw, folder = memoryview(self.path_bytes), os.path.join(self.root, "")
        names = [str(raw[start:end], "utf-8", "surrogateescape")
                 for start, end in zip(self.offsets[rows].tolist(), self.offsets[rows + 1].tolist())]
        names = [name if name[:1] == "/" else folder + name for name in names]  # os.path.join's result
        store = self.store  # every field given by position: a keyword costs a third more a Location
        if self.ranges is None:
            return [Location(name, name, 0, -1, 0, None, -1, "", "", store) for name in names]
        ranges = self.ranges
        files = [ranges.files[file] for file in ranges.file[rows].tolist()]
        identities = ([ranges.identities[file] for file in ranges.file[rows].tolist()]
                      if ranges.identities is not None else itertools.repeat(None))
        headers = ranges.header[rows].tolist() if ranges.header is not None else itertools.repeat(0)
        return [Location(name, file, start, length, header, identity, -1, "", "", store)
                for name, file, start, length, header, identity
                in zip(names, files, ranges.start[rows].tolist(), ranges.length[rows].tolist(), headers, identities)]

    def label(self, i: int) -> int:
        return int(self.labels[i])

    def paths(self) -> Iterator[str]:
        return (self.path(i) for i in range(len(self)))

    def class_counts(self) -> np.ndarray:
        return np.bincount(self.labels, minlength=len(self.classes))

    @property
    def nbytes(self) -> int:
        ranges = self.ranges.nbytes if self.ranges is not None else 0
        entry = self.entry.nbytes if self.entry is not None else 0
        items = self.items.nbytes if self.items is not None else 0
        return self.path_bytes.nbytes + self.offsets.nbytes + self.labels.nbytes + ranges + entry + items

    @functools.cached_property
    def fingerprint(self) -> str:
        """A short hash of the classes, relative paths and labels: a saved loader state names the
        dataset it belongs to, wherever the dataset is mounted."""
        digest = hashlib.blake2b(digest_size=8)
        digest.update("\0".join(self.classes).encode("utf-8", "surrogateescape"))
        for part in (self.path_bytes, self.offsets, self.labels):
            digest.update(np.ascontiguousarray(part).data)
        return digest.hexdigest()


def label_problem(label: int, classes: Sequence[str] | None, where: str = "") -> str | None:
    """Why an integer label cannot be used, or None: below 0, past dataset.classes, or (without
    dataset.classes, where the classes are 0 .. the largest label) past MAX_CLASSES_WITHOUT_NAMES."""
    of = f" of {where}" if where else ""
    if label < 0 or (classes is not None and label >= len(classes)):
        limit = f" (dataset.classes has {len(classes)} names)" if classes is not None else ""
        return f"label {label}{of} out of range{limit}"
    if classes is None and label >= MAX_CLASSES_WITHOUT_NAMES:
        return (f"label {label}{of} is above {MAX_CLASSES_WITHOUT_NAMES - 1:,}, the largest label read without "
                f"dataset.classes (the classes would be 0 .. {label}); set dataset.classes to the class names in "
                f"label order, or fix the label")
    return None


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

    def build(self, root: str, classes: Sequence[str], excluded: int = 0, ranges: ByteRanges | None = None,
              unusable: Sequence[tuple[str, str]] = ()) -> SampleIndex:
        return SampleIndex(root=str(root), classes=tuple(classes),
                           path_bytes=np.frombuffer(bytes(self._bytes), dtype=np.uint8),
                           offsets=np.array(self._offsets, dtype=np.int64),
                           labels=np.array(self._labels, dtype=np.int64), excluded=excluded, ranges=ranges,
                           unusable=tuple(unusable))
