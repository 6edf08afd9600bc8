"""The node cache: shards of an object store on a local disk, shared by every rank and worker of a
node, each fetched once, held under a limit.

Layout of `dataset.remote.cache_dir` (default $FASTLOADER_CACHE_DIR/remote): cache_folder.py. A
complete shard is only ever made by a rename, after its bytes were all written and counted.

Why these rules:

- **Fetched once per node.** A reader that misses takes the shard's lock; whoever holds it downloads
  while the others wait, then find the complete file. Processes of one node, not only threads.
- **Nothing half-written counts.** A download goes to a `.partial` file, reserved whole first
  (posix_fallocate: a full disk fails before a byte is fetched, naming cache_dir and the limit), and is
  renamed when every byte arrived, its size checked and every part fetched on the indexed ETag
  (If-Match): the object changed since it was indexed fails, named, and is never mixed in.
- **Evicted least recently used, never while read.** A reader holds a shared flock on the shard
  while it reads (a few microseconds a member); eviction takes the shard's exclusive flock without
  waiting and skips it where it cannot, so a shard is removed only between reads. Reads touch the
  shard's mtime (at most every few seconds), which eviction sorts by. A reader that opened a shard
  just evicted sees it unlinked (st_nlink 0) and fetches it again.
- **Repaired at start.** The partials of a killed run are not locked by anyone: removed, with any
  complete-looking shard whose size is not its name's, when a process first opens the cache.

Who owns what. Each loader opens the cache its dataset.remote names (`open_cache`): a token for its
Locations, the same NodeCache for the same settings while a loader holds it (a reference count),
released when the loader closes; the last release drops it, and with it everything the cache keeps
(what it counted, the shards it fetched again, their recency, its plans' protections). Two loaders
with different settings in one process keep their own folder, limit and client; two on one folder
share it through the file system's locks, as two processes of the node do. The open caches are
found by token in OpenCaches (Locations carry the token, a string, into forked readers), which holds
only what loaders hold.

The pieces: the folder's names and repair (cache_folder.py), the limit and eviction (cache_space.py),
forked readers asking the process that opened the cache to fetch for them (cache_requests.py:
obstore cannot run in a forked process). That process also counts what every reader waited and
what was fetched (`counters`), and runs the fetch-ahead (fetch_ahead.py).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

from ..errors import ConfigError, StoreError
from ..locations import ContainerChanged, Location, NotRegularFile, open_regular
from ..paths import remote_cache_folder
from ..words import plural
from . import file_locks, remote
from .cache_folder import CacheFolder, complete, unlink
from .cache_requests import Asker, Service
from .cache_space import NO_SPACE, CacheSpace, Counters, Tally

log = logging.getLogger("fastloader")

EVICTED_RETRIES = 8
"""Times a reader fetches a shard that is evicted again before it could read it, before it gives up."""


def info_of(location: Location, client: remote.Client | None = None) -> remote.ObjectInfo:
    """The object a Location's shard is, as indexed (size, ETag), or as the store says now (`client`
    asked; its cache's where none is given)."""
    identity = location.identity
    if identity is None or not identity.etag:
        return (client or cache_of(location.store).client).stat(location.file)
    return remote.ObjectInfo(location.file, identity.size, identity.etag, identity.mtime_ns)


class CopyChecks:
    """What this process found of one node cache's copies of shards, each by (shard URL, ETag); kept
    by the cache, freed with it (reading.py makes the checks). A forked reader starts with its
    parent's and adds its own."""

    def __init__(self):
        self.labels_checked: set[tuple[str, str]] = set()
        """Copies found to hold the labels their `.idx` gave: checked once."""
        self.fetched_again: set[tuple[str, str]] = set()
        """Copies removed as damaged, to be fetched again: once a shard. A member that fails in the
        new copy fails for itself (or for its index): removing copy after copy would fetch the
        shard again at every read of it."""


class NodeCache:
    """One open node cache: fetches a shard once per node into its folder and opens its copy to read."""

    def __init__(self, folder: str | os.PathLike, limit: int | None, concurrency: int,
                 client: remote.Client | None = None, token: str = ""):
        self.folder = Path(folder)
        self.files = CacheFolder(self.folder)
        self.concurrency = concurrency
        self.client = client or remote.client_for(remote.Settings())
        """What fetches its shards: the client of the dataset.remote that opened it."""
        self.token = token
        """Its name in OpenCaches (Location.store)."""
        self.owner = os.getpid()
        self.tally = Tally()
        self.space = CacheSpace(self.files, limit, self.client.settings.retry_timeout, self.tally)
        self.copy_checks = CopyChecks()
        self.repair()

    @property
    def limit(self) -> int:
        return self.space.limit

    def entry(self, info: remote.ObjectInfo) -> Path:
        return self.files.entry(info)

    def repair(self) -> None:
        """Remove what a killed run left: partial downloads nobody writes, complete-looking shards of
        the wrong size; then evict down to the limit (it may have been lowered)."""
        removed = self.files.remove_odd_files()
        with self.space.account():
            removed += self.files.remove_unfinished()
            self.space.evict(0)
        if removed:
            log.info("node cache %s: removed %s a killed run left (%s)", self.folder,
                     plural(len(removed), "unfinished download"), ", ".join(removed[:3]) +
                     (" ..." if len(removed) > 3 else ""))

    # -- fetching --------------------------------------------------------------------------------

    def ensure(self, info: remote.ObjectInfo, reader: bool, wanted: Callable[[], bool] | None = None) -> None:
        """Make the shard's complete copy exist here, fetching it unless another thread or process of
        the node is (then wait for it). `reader`: a reader waits for it, which counts as network wait.
        `wanted`: asked right before a fetch starts (a plan's: not once it is cancelled)."""
        started = time.monotonic()
        entry = self.files.entry(info)
        try:
            if complete(entry):
                return
            with file_locks.locked(self.files.slot(entry), False, self.client.settings.retry_timeout,
                                   f"the fetch lock of {info.url}", self.files.download_moved(entry)):
                if not complete(entry) and (wanted is None or wanted()):
                    self._fetch(info, entry)
        finally:
            if reader:
                self.tally.add(wait_s=time.monotonic() - started)

    def _fetch(self, info: remote.ObjectInfo, entry: Path) -> None:
        partial = self.files.partial(entry)
        fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # alive: repair leaves it
            self.space.reserve(info, fd)
            fetched = [0]

            def count(done: int) -> None:
                fetched[0] += done
                self.tally.add(fetched_bytes=done)
            try:
                self.client.download(info, fd, count)
            except remote.Changed:
                raise ContainerChanged(errno.ESTALE, f"the shard {info.url} changed since it was indexed (its ETag is "
                                                     f"no longer {info.etag}); its members are refused until a new "
                                                     f"loader indexes it again", info.url) from None
            except ConfigError as error:  # credentials refused mid-run: not the sample's fault
                raise StoreError(str(error)) from None
            except OSError as error:
                if error.errno in NO_SPACE:
                    raise self.space.full(info, error) from None
                raise
            if fetched[0] != info.size or os.fstat(fd).st_size != info.size:
                raise StoreError(f"{info.url}: fetched {fetched[0]} bytes, the store said {info.size}")
            os.fsync(fd)  # on the disk before its name says complete: a crash then leaves no copy of zeros
            self.space.commit(partial, entry)
            self.tally.add(fetched_shards=1)
        except BaseException:
            unlink(partial)
            raise
        finally:
            os.close(fd)

    # -- reading ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def opened(self, location: Location) -> Iterator[int]:
        """A descriptor of the shard's complete local copy, under a shared lock (no eviction while
        the body reads), fetched first where it is missing."""
        info = info_of(location, self.client)
        entry = self.files.entry(info)
        for _ in range(EVICTED_RETRIES):
            try:
                fd = open_regular(str(entry))
            except FileNotFoundError:
                self._arrive(info)
                continue
            except NotRegularFile as error:
                raise StoreError(f"the node cache's copy of {info.url} is {error}: no run of fastloader writes one; "
                                 f"remove it (a new loader's start removes it too)") from None
            try:
                file_locks.wait_for(fd, True, self.client.settings.retry_timeout,
                                    f"the node cache's copy of {info.url}, locked to be evicted,", entry)
                if os.fstat(fd).st_nlink == 0:  # evicted between the open and the lock
                    continue
                self.space.touch(fd, entry)
                yield fd
                return
            finally:
                os.close(fd)
        raise StoreError(f"{info.url} was evicted from the node cache {self.folder} {EVICTED_RETRIES} times before it "
                         f"could be read: {self.space.limit_words} is too small for the shards read at once; raise "
                         f"dataset.remote.cache_limit")

    def discard(self, location: Location, inode: int, why: str | None = None) -> None:
        """Remove the shard's copy that was read as inode `inode` (damaged: its bytes are not what
        the store sent), so that the next read fetches it again; a newer copy is left alone. `why`:
        what the read found (default: a member's tar header that is not the one indexed)."""
        entry = self.files.entry(info_of(location, self.client))
        why = why or f"the tar header before {location.name} is not the one indexed"
        with contextlib.suppress(FileNotFoundError):
            if os.lstat(entry).st_ino == inode:
                os.unlink(entry)
                log.warning("node cache %s: the copy of %s was damaged (%s, though it was fetched under the indexed "
                            "ETag: a crash after an unsynced write leaves such copies); removed and fetched again",
                            self.folder, location.file, why)

    def copy_stamp(self, location: Location) -> tuple[int, int] | None:
        """(inode, mtime in ns) of the shard's local copy now, which tells one copy from the next; None
        where there is none."""
        try:
            info = os.lstat(self.files.entry(info_of(location, self.client)))
        except FileNotFoundError:
            return None
        return info.st_ino, info.st_mtime_ns

    def _arrive(self, info: remote.ObjectInfo) -> None:
        """Have the shard fetched: here, or, in a forked reader, by the process that owns the client."""
        if os.getpid() == self.owner:
            self.ensure(info, reader=True)
        else:
            _open.asker().fetch(self.token, info)

    def forked(self) -> None:
        """In a forked child: the locks another thread held at the fork stay held there."""
        self.tally.forked()
        self.space.protected.forked()


class OpenCaches:
    """The node caches open in this process, by token, each held by the loaders that opened it (a
    reference count): a cache is dropped at its last release, with everything it keeps. Also the
    Service that fetches for this process's forked readers, and, in a forked reader, its Asker."""

    def __init__(self):
        self.caches: dict[str, NodeCache] = {}
        """The open caches by token: what Locations' `store` names, in this process and its forked readers."""
        self.tokens: dict[tuple, str] = {}
        """(folder, limit, concurrency, client) -> the token of the cache open with them."""
        self.holders: dict[str, int] = {}
        """token -> how many opens (loaders) hold it; released at 0."""
        self.numbers = itertools.count(1)
        self.default = ""
        """The token of the cache that Locations made outside a loader read through (cache_of(""))."""
        self.service: Service | None = None
        self._asker: Asker | None = None
        self.lock = threading.Lock()

    def open(self, folder: Path, limit: int | None, concurrency: int, client: remote.Client) -> NodeCache:
        with self.lock:
            key = (str(folder), limit, concurrency, id(client))  # clients live as long as the process
            token = self.tokens.get(key)
            cache = self.caches.get(token) if token else None
            if cache is None or cache.owner != os.getpid():  # none yet, or a forked copy of the parent's
                token = token if cache is not None else f"{os.getpid()}-{next(self.numbers)}"
                cache = NodeCache(folder, limit, concurrency, client, token)
                self.caches[token], self.tokens[key] = cache, token
                self.holders[token] = 0
                if self.service is None or self.service.owner != os.getpid():
                    self.service = Service(lambda token, info: cache_of(token).ensure(info, reader=True))
            self.holders[token] = self.holders.get(token, 0) + 1
            return cache

    def release(self, token: str) -> None:
        with self.lock:
            if token not in self.holders:
                return
            self.holders[token] -= 1
            if self.holders[token] <= 0:
                self.caches.pop(token)
                del self.holders[token]
                self.tokens = {key: held for key, held in self.tokens.items() if held != token}

    def asker(self) -> Asker:
        """This forked reader's connection to the process that opened its caches."""
        if self._asker is None or self._asker.pid != os.getpid():
            if self.service is None:
                raise StoreError("a forked reader has no process to fetch shards for it: build the loader in the "
                                 "process that forks the readers")
            self._asker = Asker(self.service)
        return self._asker

    def forked(self) -> None:
        self.lock = threading.Lock()
        self._asker = None
        for cache in self.caches.values():
            cache.forked()


_open = OpenCaches()
os.register_at_fork(after_in_child=_open.forked)


def open_cache(cache_dir: str | None, limit: int | None, concurrency: int,
               client: remote.Client | None = None) -> NodeCache:
    """The node cache in `cache_dir` under `limit`, fetching with `client`, for one more holder (a
    loader, which calls `release(cache.token)` when it closes): opened and repaired the first time,
    the same object for the same settings while a holder keeps it (two loaders with other settings
    get caches of their own, on one folder or two). Forked readers find it by its token."""
    folder = Path(cache_dir) if cache_dir else remote_cache_folder()
    return _open.open(folder, limit, concurrency, client or remote.client_for(remote.Settings()))


def release(token: str) -> None:
    """A holder of the cache is done (its loader closed): the last one takes it out of the table,
    and the cache goes with everything it keeps."""
    _open.release(token)


def is_open(token: str) -> bool:
    """Whether a loader still holds the cache of this token."""
    return token in _open.caches


def cache_of(token: str) -> NodeCache:
    """The open cache a Location's `store` names; "" (a Location made outside a loader): the default
    cache, in $FASTLOADER_CACHE_DIR/remote, opened the first time."""
    cache = _open.caches.get(token)
    if cache is not None:
        return cache
    if token:
        raise StoreError(f"the node cache this shard was indexed with (token {token}) is closed: its loader was "
                         f"closed; build a new loader to read it")
    cache = _open.caches.get(_open.default)
    if cache is None or cache.owner != os.getpid():  # opened once, and held for the process
        cache = open_cache(None, None, 8)
        _open.default = cache.token
    return cache


def counters(token: str) -> Counters:
    """What the cache of `token` fetched and what its readers waited, so far in this process."""
    cache = _open.caches.get(token)
    return cache.tally.read() if cache is not None else Counters()
