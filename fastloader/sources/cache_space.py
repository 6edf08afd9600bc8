"""A node cache's bytes held under its limit: shards evicted least recently used, never while read,
and room reserved for a download before a byte of it is fetched.

Why under the account lock (a flock on `.account.lock`, taken by every process of the node): the
limit is the node's, so processes fetching at once must count and reserve one after another, or
together they pass it. A reader holds a shared flock on the shard while it reads; eviction takes the
shard's exclusive flock without waiting and skips it where it cannot, so a shard is removed only
between reads. Reads touch the shard's mtime (at most every TOUCH_EVERY_S), which eviction sorts by.

What is counted (Tally) and what this process's fetch-ahead plans still need (Protected) belong to
the one cache that owns them, and go with it.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import StoreError
from ..machine import human_bytes
from . import file_locks, remote
from .cache_folder import CacheFolder, remove_unread

TOUCH_EVERY_S = 2.0
"""A shard's mtime (its recency for eviction) is set at most this often by one process."""
FREE_SHARE = 0.9
"""Without dataset.remote.cache_limit: this share of the free space of cache_dir's disk at start."""
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


@dataclass
class Counters:
    """What the node cache of this process did, its forked readers' requests included."""
    fetched_bytes: int = 0
    fetched_shards: int = 0
    wait_s: float = 0.0
    """Time readers waited for shards to arrive (summed over readers)."""
    evicted: int = 0

    def since(self, before: "Counters") -> "Counters":
        return Counters(self.fetched_bytes - before.fetched_bytes, self.fetched_shards - before.fetched_shards,
                        self.wait_s - before.wait_s, self.evicted - before.evicted)


class Tally:
    """One cache's Counters, added to by its fetching and reading threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counters = Counters()

    def add(self, **amounts: float) -> None:
        with self._lock:
            for name, amount in amounts.items():
                setattr(self._counters, name, getattr(self._counters, name) + amount)

    def read(self) -> Counters:
        with self._lock:
            return Counters(**vars(self._counters))

    def forked(self) -> None:
        """In a forked child: a lock another thread held at the fork stays held there."""
        self._lock = threading.Lock()


class Protected:
    """Entry names this process's fetch-ahead plans still need, each with how many plans need it:
    evicted last."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def hold(self, name: str) -> None:
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + 1

    def release(self, name: str) -> None:
        with self._lock:
            count = self._counts.get(name, 0) - 1
            if count > 0:
                self._counts[name] = count
            else:
                self._counts.pop(name, None)

    def __contains__(self, name: str) -> bool:
        return name in self._counts

    def forked(self) -> None:
        self._lock = threading.Lock()


class CacheSpace:
    """The limit of one node cache's folder, and what keeps the folder under it."""

    def __init__(self, folder: CacheFolder, limit: int | None, patience: float, tally: Tally):
        self.folder = folder
        self.patience = patience
        """dataset.remote.retry_timeout: how long the account lock is waited for without progress."""
        self.tally = tally
        self.protected = Protected()
        self._touched: dict[str, float] = {}
        self.limit = limit if limit is not None else self._default_limit()
        self.limit_words = (f"dataset.remote.cache_limit: {human_bytes(self.limit)}" if limit is not None else
                            f"{human_bytes(self.limit)}, {FREE_SHARE:.0%} of the space free on its disk at start "
                            f"(dataset.remote.cache_limit sets it)")

    def _default_limit(self) -> int:
        held = sum(size for _, size, _ in self.folder.entries())
        return int((shutil.disk_usage(self.folder.path).free + held) * FREE_SHARE)

    def account(self):
        """The account lock, waited for while its holder gets on (file_locks: a stopped holder is
        named after dataset.remote.retry_timeout, never waited for for ever)."""
        return file_locks.locked(self.folder.account_lock, False, self.patience, "the node cache's account lock")

    def evict(self, needed: int) -> bool:
        """Under the account lock: remove the least recently used shards nobody reads until `needed`
        more bytes fit the limit (those this process's plans still need, last); whether they fit."""
        entries = sorted(self.folder.entries())
        used = sum(size for _, size, _ in entries) + self.folder.partial_bytes()
        for protect in (True, False):
            for _, size, path in entries:
                if used + needed <= self.limit:
                    return True
                if (protect and path.name in self.protected) or not path.exists():
                    continue
                if remove_unread(path):
                    used -= size
                    self.tally.add(evicted=1)
        return used + needed <= self.limit

    def reserve(self, info: remote.ObjectInfo, fd: int) -> None:
        """Room for the shard within the limit (evicting), then its bytes allocated on the disk, under
        the account lock, so that processes fetching at once never pass the limit together."""
        if info.size > self.limit:
            raise StoreError(f"{info.url} ({human_bytes(info.size)}) is larger than the node cache's limit, "
                             f"{self.limit_words}; raise dataset.remote.cache_limit")
        deadline = time.monotonic() + self.patience
        while True:
            with self.account():
                if self.evict(info.size):
                    try:
                        _allocate(fd, info.size)
                    except OSError as error:
                        if error.errno in NO_SPACE:
                            raise self.full(info, error) from None
                        raise
                    return
            if time.monotonic() > deadline:
                raise StoreError(f"the node cache {self.folder.path} cannot make room for {info.url} "
                                 f"({human_bytes(info.size)}) within {self.limit_words}: the shards in it are all "
                                 f"being read or fetched. Raise dataset.remote.cache_limit, or lower "
                                 f"dataset.remote.concurrency")
            time.sleep(0.05)

    def commit(self, partial: Path, entry: Path) -> None:
        """Give a complete download its name, under the account lock: `evict` counts the complete
        shards and then the partial ones, and a rename between the two counts would hide the shard
        from both, letting one more in over the limit."""
        with self.account():
            os.rename(partial, entry)

    def full(self, info: remote.ObjectInfo, error: OSError) -> StoreError:
        free = shutil.disk_usage(self.folder.path).free
        return StoreError(f"the disk of the node cache {self.folder.path} is full ({error.strerror}): "
                          f"{human_bytes(free)} free, and {info.url} needs {human_bytes(info.size)}; its limit "
                          f"is {self.limit_words}. Free space there, set dataset.remote.cache_dir to a larger disk, "
                          f"or lower dataset.remote.cache_limit "
                          f"below the space the disk has; nothing half-written was kept")

    def touch(self, fd: int, entry: Path) -> None:
        """The shard was read now: its mtime (its recency for eviction) set, at most every TOUCH_EVERY_S."""
        now = time.monotonic()
        if now - self._touched.get(entry.name, -TOUCH_EVERY_S) >= TOUCH_EVERY_S:
            self._touched[entry.name] = now
            with contextlib.suppress(OSError):
                os.utime(fd)


def _allocate(fd: int, size: int) -> None:
    """The file's bytes reserved on the disk (a full disk fails here, before a byte is fetched)."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.ftruncate(fd, size)  # a file system without fallocate: a full disk is found while writing
