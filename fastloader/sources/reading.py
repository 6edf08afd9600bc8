"""Where a sample's encoded bytes are, and the one way to read them.

A sample's bytes are a whole file (folders, file lists, the demo) or a byte range of a container
file (a member of a tar shard). Everything that reads image bytes (screening, both backends, the
cache writer, `check`) reads a `Location` through `read_bytes` or `open_bytes`, so a new container
format only has to say where its samples' bytes are.

A range is read with `os.pread` on a descriptor kept open per container and per process: one open
per shard, not per sample, which is what a cluster filesystem's metadata server can bear.
"""
from __future__ import annotations

import collections
import io
import os
import threading
from typing import BinaryIO, NamedTuple


class Location(NamedTuple):
    name: str
    """What messages call the sample: a file's path, or `/dir/shard.tar:member`."""
    file: str
    """The file holding its bytes."""
    start: int = 0
    length: int = -1
    """The byte count from `start`; -1: the whole file."""

    @property
    def whole_file(self) -> bool:
        return self.length < 0


def as_location(where: str | Location) -> Location:
    """A plain path is the location of a whole file."""
    return where if isinstance(where, Location) else Location(where, where)


class TruncatedError(OSError):
    """A byte range that runs past the end of its container: the shard was cut short after indexing."""


def read_bytes(where: str | Location) -> bytearray:
    """The sample's encoded bytes. Raises OSError (FileNotFoundError, PermissionError,
    TruncatedError ...) naming the container where it cannot."""
    location = as_location(where)
    if location.whole_file:  # straight into a writable buffer (torch.frombuffer wants one)
        with open(location.file, "rb", buffering=0) as handle:
            data = bytearray(os.fstat(handle.fileno()).st_size)
            got = handle.readinto(data)
            if got < len(data):  # the file shrank since fstat
                del data[got:]
            rest = handle.read()  # or grew
        return data + rest if rest else data
    data = bytearray(location.length)
    got = os.preadv(_open_containers.descriptor(location.file), [data], location.start)
    if got != location.length:
        raise TruncatedError(f"{location.file} ends {location.length - got} bytes into {location.name} "
                             f"(the shard was cut short since it was indexed)")
    return data


def open_bytes(where: str | Location) -> BinaryIO:
    """A binary file object over the sample's bytes (a whole file is opened, a range read into memory)."""
    location = as_location(where)
    if location.whole_file:
        return open(location.file, "rb")
    return io.BytesIO(read_bytes(location))


def byte_count(where: str | Location) -> int:
    location = as_location(where)
    return os.stat(location.file).st_size if location.whole_file else location.length


def keep_open(files) -> None:
    """Open these containers now (up to the cap): a process about to fork its readers (DataLoader
    workers) opens each shard once, and the workers share the descriptors."""
    for path in list(files)[:_open_containers.limit]:
        try:
            _open_containers.descriptor(path)
        except OSError:
            pass  # named when a sample of it is read


class _OpenContainers:
    """Descriptors of the containers this process reads, the most recent `limit` kept open.

    Per process: a forked worker gets descriptors that its parent opened, which pread shares safely
    (pread has no file position), and opens the others itself; a cap keeps thousands of shards under
    the descriptor limit."""

    def __init__(self, limit: int = 256):
        self.limit = limit
        self.lock = threading.Lock()
        self.open: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.pid = os.getpid()
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        self.lock = threading.Lock()  # a lock held by another thread at fork stays held in the child

    def descriptor(self, path: str) -> int:
        with self.lock:
            fd = self.open.get(path)
            if fd is not None:
                self.open.move_to_end(path)
                return fd
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            self.open[path] = fd
            while len(self.open) > self.limit:
                _, oldest = self.open.popitem(last=False)
                os.close(oldest)
            return fd


_open_containers = _OpenContainers()
