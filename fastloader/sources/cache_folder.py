"""The files of one node cache's folder: what each is named, and what a killed run left in it.

The layout (node_cache.py says why each rule holds):

    <digest>-<size>-<name>                  a complete shard: digest of (URL, ETag, size)
    .<entry>.<host>-<pid>-<n>.partial       a download under way, locked (flock) by its writer
    locks/<0..1023>.lock                    who fetches a shard: one process of the node at a time
    .account.lock                           held while space is reserved and shards evicted

Kept apart from the fetching and the limit so that the names are made in one place: a shard's
name is what every process of the node agrees on without asking each other.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import logging
import os
import re
import socket
import stat
from pathlib import Path
from typing import Callable

from ..errors import ConfigError
from ..locations import not_regular
from . import remote

log = logging.getLogger("fastloader")

LOCK_SLOTS = 1024
"""Fetch locks (shards hash to one each): a bounded number of lock files, whatever the shard count."""
ENTRY = re.compile(r"^[0-9a-f]{16}-(\d+)-")


class CacheFolder:
    """One node cache's folder: the names of its shards, partial downloads and locks, and listings."""

    def __init__(self, path: Path):
        self.path = path
        self.account_lock = path / ".account.lock"
        """Held while space is reserved, shards evicted and downloads renamed complete."""
        self._partials = itertools.count()
        try:
            (path / "locks").mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ConfigError(f"dataset.remote.cache_dir: {path} cannot be made ({error.strerror}); set "
                              f"dataset.remote.cache_dir to a folder on a local disk") from None

    def entry(self, info: remote.ObjectInfo) -> Path:
        """The complete copy's name: the digest of (URL, ETag, size), the size, the object's own name."""
        digest = hashlib.blake2b(f"{info.url}\0{info.etag}\0{info.size}".encode("utf-8", "surrogateescape"),
                                 digest_size=8).hexdigest()
        name = re.sub(r"[^\w.-]", "_", info.url.rsplit("/", 1)[-1])[-80:]
        return self.path / f"{digest}-{info.size}-{name}"

    def partial(self, entry: Path) -> Path:
        """A new name for a download of `entry` by this process (host and pid: who writes it)."""
        return self.path / f".{entry.name}.{socket.gethostname()}-{os.getpid()}-{next(self._partials)}.partial"

    def slot(self, entry: Path) -> Path:
        """The fetch lock of `entry`: one of LOCK_SLOTS files."""
        number = int(entry.name[:8], 16) % LOCK_SLOTS
        return self.path / "locks" / f"{number}.lock"

    def entries(self) -> list[tuple[float, int, Path]]:
        """(mtime, size, path) of the complete shards; partials count in `partial_bytes`."""
        found = []
        with os.scandir(self.path) as listing:
            for item in listing:
                if ENTRY.match(item.name):
                    with contextlib.suppress(FileNotFoundError):
                        status = item.stat()
                        found.append((status.st_mtime, status.st_size, Path(item.path)))
        return found

    def partial_bytes(self) -> int:
        total = 0
        with os.scandir(self.path) as listing:
            for item in listing:
                if item.name.endswith(".partial"):
                    with contextlib.suppress(FileNotFoundError):
                        total += item.stat().st_size
        return total

    def download_moved(self, entry: Path) -> Callable[[], object]:
        """What changes while some process downloads this shard: its partial files' write times."""
        def moved() -> object:
            with os.scandir(self.path) as listing:
                return sorted(_mtime_ns(item) for item in listing
                              if item.name.startswith(f".{entry.name}.") and item.name.endswith(".partial"))
        return moved

    def remove_odd_files(self) -> list[str]:
        """FIFOs, sockets and folders under the names the cache uses (a shard, a partial, a lock): any
        open of them could wait for ever, and nothing of the cache's is one. Removed, each named."""
        removed = []
        for folder in (self.path, self.path / "locks"):
            with os.scandir(folder) as listing:
                items = [item for item in listing
                         if ENTRY.match(item.name) or item.name.endswith((".partial", ".lock"))]
            for item in items:
                with contextlib.suppress(FileNotFoundError):
                    reason = not_regular(item.stat(follow_symlinks=False).st_mode)
                    if reason and not item.is_dir(follow_symlinks=False):
                        os.unlink(item.path)
                        log.warning("node cache %s: removed %s (%s), which no run of fastloader writes under a name "
                                    "the cache uses", self.path, item.path, reason)
                        removed.append(item.name)
        return removed

    def remove_unfinished(self) -> list[str]:
        """Under the account lock: the partial downloads nobody writes (their writer is gone) and the
        complete-looking shards whose size is not their name's, removed; their names."""
        removed = []
        with os.scandir(self.path) as listing:
            items = list(listing)
        for item in items:
            if item.name.endswith(".partial") and remove_unread(item.path):
                removed.append(item.name)
            elif ENTRY.match(item.name):
                with contextlib.suppress(FileNotFoundError):
                    if item.stat().st_size != int(ENTRY.match(item.name).group(1)) and remove_unread(item.path):
                        removed.append(item.name)
        return removed


def remove_unread(path: str | Path) -> bool:
    """Unlink a file nobody reads or writes now (its exclusive lock taken without waiting); whether it went."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))  # a FIFO never blocks it
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    try:
        unlink(path)
        return True
    finally:
        os.close(fd)


def complete(entry: Path) -> bool:
    """Whether a complete shard's copy is there: a regular file (a FIFO planted there is not one)."""
    try:
        return stat.S_ISREG(os.lstat(entry).st_mode)
    except FileNotFoundError:
        return False


def unlink(path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _mtime_ns(item: os.DirEntry) -> int:
    try:
        return item.stat().st_mtime_ns
    except FileNotFoundError:
        return 0
