"""The vocabulary of a sample's bytes, which every reader and every format shares: where they are
(`Location`), what says a container is still the one indexed (`Identity`), the refusals of what
cannot be read, and the one way to open a file (`open_regular`: nothing but a regular file, opened
non-blocking and checked with fstat before a byte is read, since a FIFO named `.JPEG` would block its
reader for ever). A leaf: it imports nothing of fastloader, so the readers that dispatch on it
(reading.py), the node cache and the formats all stand on it without a circle.
"""
from __future__ import annotations

import errno
import hashlib
import os
import stat
from typing import NamedTuple

from .errors import FastloaderError

TAR_BLOCK = 512
"""A tar header block: the one right before a member's data is that member's own header."""


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"))


class Identity(NamedTuple):
    """What says that a container file is still the one that was indexed: a file rewritten or
    replaced changes at least one of these (a copy with `cp -p` keeps size and mtime, not the
    content at the offsets: the member headers catch that)."""
    inode: int
    size: int
    mtime_ns: int
    etag: str = ""
    """A shard in an object store: its ETag (inode 0), which the node cache checks what it fetches against."""
    ctime_ns: int = 0
    """A parquet or Arrow file's status-change time (0: not checked). A write changes it, and no one
    can set it back as `cp -p` sets mtime: a row's bytes carry no header that would show the file
    rewritten with the same layout (rows reordered), so each read compares it (reading._range)."""
    labels: str = ""
    """A shard in an object store indexed through the `.idx` beside it: the digest of the label
    members that index gave (tar_members.labels_digest), which the shard's node-cache copy is
    checked against before its first member is read (an index kept beside a shard rewritten with
    new labels would otherwise label a run); "": nothing to check."""

    @classmethod
    def of(cls, info: os.stat_result, ctime: bool = False) -> "Identity":
        return cls(info.st_ino, info.st_size, info.st_mtime_ns, "", info.st_ctime_ns if ctime else 0)

    def matches(self, info: os.stat_result) -> bool:
        """Whether a local file's status is this identity's (its ctime too, where it is kept)."""
        return self == Identity.of(info, ctime=bool(self.ctime_ns))


class Location(NamedTuple):
    name: str
    """What messages call the sample: a file's path, or `/dir/shard.tar:member`."""
    file: str
    """The file holding its bytes."""
    start: int = 0
    length: int = -1
    """The byte count from `start`; -1: the whole file."""
    header: int = 0
    """A range's tar header digest as indexed (`header_digest` of the block before `start`); 0: not checked."""
    identity: Identity | None = None
    """The container's identity when it was indexed; None: not checked."""
    row: int = -1
    """A row of a parquet file whose image pages are compressed: its row in the file, read with its row
    group (sources/row_groups.py; start and length: the row group's image column chunk); -1: a byte range."""
    column: str = ""
    """That row's image column (its parquet leaf path)."""
    reader: str = ""
    """A sample of a source read through the Source protocol (sources/protocol.py): the token of the
    opened source, whose read(start) gives the bytes (`file` is then the source's name); "": a file."""
    store: str = ""
    """A file in an object store: the token of the node cache its loader opened (node_cache.open_cache),
    whose copy is read; "": the default cache (a Location made outside a loader)."""

    @property
    def whole_file(self) -> bool:
        """A whole file on a disk or in a store (not a range, not a source's sample)."""
        return self.length < 0 and not self.reader


def stat_stamp(info: os.stat_result) -> tuple[int, int, int, int]:
    """(inode, size, mtime_ns, ctime_ns): what says a file is unchanged since a result about it was
    kept. ctime changes with every write and no tool sets it back (`cp -p`, `touch -d` restore the
    mtime only); a chmod changes it too, which only costs a check again."""
    return info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


def path_stamp(path: str | bytes) -> tuple[int, int, int, int]:
    """stat_stamp of a path (following links), zeros where it cannot be stat'ed."""
    try:
        return stat_stamp(os.stat(path))
    except (OSError, ValueError):
        return 0, 0, 0, 0


def as_location(where: str | Location) -> Location:
    """A plain path is the location of a whole file."""
    return where if isinstance(where, Location) else Location(where, where)


class TruncatedError(FastloaderError, OSError):
    """A byte range that runs past the end of its container: the shard was cut short after indexing."""


class NotRegularFile(FastloaderError, OSError):
    """A FIFO, socket, device or folder where a file was expected: refused before a byte is read."""

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


class ContainerChanged(FastloaderError, OSError):
    """A container (tar shard) that is no longer the file its index was built from."""

    def __str__(self) -> str:
        return str(self.strerror)


def not_regular(mode: int) -> str | None:
    """'not a regular file: a FIFO' (a socket, a device, a folder), or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), f"mode {stat.filemode(mode)}")
    return f"not a regular file: {kind}"


def open_regular(path: str) -> int:
    """A read-only descriptor of `path`, or NotRegularFile: opened non-blocking (a FIFO's open
    would wait for a writer for ever) and checked with fstat before anything is read."""
    return open_regular_sized(path)[0]


def open_regular_sized(path: str) -> tuple[int, int]:
    """open_regular's descriptor and the file's size, from its one fstat: the read of a whole file
    (one per sample on the DALI feed's thread) takes no second."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        if error.errno == errno.ENXIO:  # a socket, or a FIFO on some systems: say what it is
            reason = not_regular(os.stat(path).st_mode)
            if reason:
                raise NotRegularFile(errno.EINVAL, reason, path) from None
        raise
    try:
        status = os.fstat(fd)
        reason = not_regular(status.st_mode)
        if reason:
            raise NotRegularFile(errno.EINVAL, reason, path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, status.st_size


def header_digest(block: bytes | bytearray | memoryview) -> int:
    """A member's 512-byte tar header as a nonzero int64, kept in the index and compared at each read."""
    digest = int.from_bytes(hashlib.blake2b(block, digest_size=8).digest(), "little", signed=True)
    return digest or 1


class ReadArena:
    """Reused memory that a batch's reads land in, one after another, instead of a fresh zero-filled
    bytearray each: no allocation, no memset and no new pages per sample. Chunks of CHUNK bytes are
    filled in turn and kept; `reset()` starts again at the first, once the bytes read since the last
    reset are no longer needed (the DALI feed keeps one arena per batch in flight). A read of
    more than a quarter of a chunk gets memory of its own, so the arena stays near a batch's bytes."""

    CHUNK = 8 << 20

    def __init__(self) -> None:
        self.chunks: list[bytearray] = []
        self.chunk = 0
        self.offset = 0

    def reset(self) -> None:
        self.chunk = self.offset = 0

    def view(self, size: int) -> memoryview:
        """A writable view of `size` bytes, valid until the next reset()."""
        if size > self.CHUNK // 4:
            return memoryview(bytearray(size))
        if self.chunk < len(self.chunks) and self.offset + size > self.CHUNK:
            self.chunk, self.offset = self.chunk + 1, 0
        if self.chunk == len(self.chunks):
            self.chunks.append(bytearray(self.CHUNK))
        view = memoryview(self.chunks[self.chunk])[self.offset:self.offset + size]
        self.offset += size
        return view


def table_changed(path: str) -> ContainerChanged:
    """The refusal of a row of a parquet or Arrow file whose status moved since it was indexed."""
    return ContainerChanged(errno.ESTALE, f"the file {path} changed since it was indexed (written to, its "
                                          f"status-change time moved): its rows are refused until a new loader "
                                          f"indexes it again", path)
