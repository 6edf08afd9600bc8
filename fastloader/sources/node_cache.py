"""The node cache: shards of an object store on a local disk, shared by every rank and worker of a
node, each fetched once, held under a limit.

Layout of `dataset.remote.cache_dir` (default $FASTLOADER_CACHE_DIR/remote):

    <digest>-<size>-<name>                  a complete shard: digest of (URL, ETag, size); only ever
                                            made by a rename, after its bytes were all written and counted
    .<entry>.<host>-<pid>-<n>.partial       a download under way, locked (flock) by its writer
    locks/<0..1023>.lock                    who fetches a shard: one process of the node at a time
    .account.lock                           held while space is reserved and shards evicted

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

Each loader opens the cache its dataset.remote names (`open_cache`: a token for its Locations, the
same NodeCache for the same settings, released when the loader closes), so two loaders with
different settings in one process keep their own folder, limit and client.

obstore cannot run in a forked process (remote.py): a forked reader (a DataLoader worker) asks the
process that opened the cache, over a Unix socket, to fetch a shard, then reads the file itself.
That process also counts what every reader waited and what was fetched (`counters`), and runs the
fetch-ahead (fetch_ahead.py).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import itertools
import logging
import os
import re
import shutil
import socket
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ..errors import ConfigError, StoreError
from ..locations import ContainerChanged, Location, NotRegularFile, not_regular, open_regular
from ..machine import human_bytes
from ..paths import remote_cache_folder
from ..words import plural
from . import file_locks, remote

log = logging.getLogger("fastloader")

LOCK_SLOTS = 1024
"""Fetch locks (shards hash to one each): a bounded number of lock files, whatever the shard count."""
EVICTED_RETRIES = 8
"""Times a reader fetches a shard that is evicted again before it could read it, before it gives up."""
TOUCH_EVERY_S = 2.0
"""A shard's mtime (its recency for eviction) is set at most this often by one process."""
FREE_SHARE = 0.9
"""Without dataset.remote.cache_limit: this share of the free space of cache_dir's disk at start."""
_ENTRY = re.compile(r"^[0-9a-f]{16}-(\d+)-")
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


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


def info_of(location: Location, client: remote.Client | None = None) -> remote.ObjectInfo:
    """The object a Location's shard is, as indexed (size, ETag), or as the store says now (`client`
    asked; its cache's where none is given)."""
    identity = location.identity
    if identity is None or not identity.etag:
        return (client or cache_of(location.store).client).stat(location.file)
    return remote.ObjectInfo(location.file, identity.size, identity.etag, identity.mtime_ns)


class NodeCache:
    def __init__(self, folder: str | os.PathLike, limit: int | None, concurrency: int,
                 client: remote.Client | None = None, token: str = ""):
        self.folder = Path(folder)
        self.concurrency = concurrency
        self.client = client or remote.client_for(remote.Settings())
        """What fetches its shards: the client of the dataset.remote that opened it."""
        self.token = token
        """Its name in this process's table of open caches (Location.store)."""
        self.key: tuple = ()
        """What it was opened with (open_cache's table)."""
        self.owner = os.getpid()
        self.counters = Counters()
        self.protected: dict[str, int] = {}
        """Entry -> how many plans of this process still need it: evicted last."""
        self.lock = threading.Lock()
        self._touched: dict[str, float] = {}
        self._partials = itertools.count()
        try:
            (self.folder / "locks").mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ConfigError(f"dataset.remote.cache_dir: {self.folder} cannot be made ({error.strerror}); set "
                              f"dataset.remote.cache_dir to a folder on a local disk") from None
        self.limit = limit if limit is not None else self._default_limit()
        self.limit_words = (f"dataset.remote.cache_limit: {human_bytes(self.limit)}" if limit is not None else
                            f"{human_bytes(self.limit)}, {FREE_SHARE:.0%} of the space free on its disk at start "
                            f"(dataset.remote.cache_limit sets it)")
        self.repair()

    def _default_limit(self) -> int:
        held = sum(size for _, size, _ in self._entries())
        return int((shutil.disk_usage(self.folder).free + held) * FREE_SHARE)

    # -- names -----------------------------------------------------------------------------------

    def entry(self, info: remote.ObjectInfo) -> Path:
        digest = hashlib.blake2b(f"{info.url}\0{info.etag}\0{info.size}".encode("utf-8", "surrogateescape"),
                                 digest_size=8).hexdigest()
        name = re.sub(r"[^\w.-]", "_", info.url.rsplit("/", 1)[-1])[-80:]
        return self.folder / f"{digest}-{info.size}-{name}"

    def _entries(self) -> list[tuple[float, int, Path]]:
        """(mtime, size, path) of the complete shards; partials count in `_partial_bytes`."""
        found = []
        with os.scandir(self.folder) as listing:
            for item in listing:
                if _ENTRY.match(item.name):
                    with contextlib.suppress(FileNotFoundError):
                        status = item.stat()
                        found.append((status.st_mtime, status.st_size, Path(item.path)))
        return found

    def _partial_bytes(self) -> int:
        total = 0
        with os.scandir(self.folder) as listing:
            for item in listing:
                if item.name.endswith(".partial"):
                    with contextlib.suppress(FileNotFoundError):
                        total += item.stat().st_size
        return total

    def _locked(self, path: Path, what: str = "the node cache's account lock",
                progress: Callable[[], object] | None = None):
        """An exclusive lock on `path`, waited for while its holder gets on (file_locks: a stopped
        holder is named after dataset.remote.retry_timeout, never waited for for ever)."""
        return file_locks.locked(path, False, self.client.settings.retry_timeout, what, progress)

    def _download_moved(self, entry: Path) -> Callable[[], object]:
        """What changes while some process downloads this shard: its partial files' write times."""
        def moved() -> object:
            with os.scandir(self.folder) as listing:
                return sorted(_mtime_ns(item) for item in listing
                              if item.name.startswith(f".{entry.name}.") and item.name.endswith(".partial"))
        return moved

    def _slot(self, entry: Path) -> Path:
        number = int(entry.name[:8], 16) % LOCK_SLOTS
        return self.folder / "locks" / f"{number}.lock"

    # -- repair and eviction -----------------------------------------------------------------------

    def repair(self) -> None:
        """Remove what a killed run left: partial downloads nobody writes, complete-looking shards of
        the wrong size; then evict down to the limit (it may have been lowered)."""
        removed = self._remove_odd_files()
        with self._locked(self.folder / ".account.lock"):
            with os.scandir(self.folder) as listing:
                items = list(listing)
            for item in items:
                if item.name.endswith(".partial") and _remove_unread(item.path):  # its writer is gone
                    removed.append(item.name)
                elif _ENTRY.match(item.name):
                    with contextlib.suppress(FileNotFoundError):
                        if item.stat().st_size != int(_ENTRY.match(item.name).group(1)) and \
                                _remove_unread(item.path):
                            removed.append(item.name)
            self._evict(0)
        if removed:
            log.info("node cache %s: removed %s a killed run left (%s)", self.folder,
                     plural(len(removed), "unfinished download"), ", ".join(removed[:3]) +
                     (" ..." if len(removed) > 3 else ""))

    def _remove_odd_files(self) -> list[str]:
        """FIFOs, sockets and folders under the names the cache uses (a shard, a partial, a lock): any
        open of them could wait for ever, and nothing of the cache's is one. Removed, each named."""
        removed = []
        for folder in (self.folder, self.folder / "locks"):
            with os.scandir(folder) as listing:
                items = [item for item in listing
                         if _ENTRY.match(item.name) or item.name.endswith((".partial", ".lock"))]
            for item in items:
                with contextlib.suppress(FileNotFoundError):
                    reason = not_regular(item.stat(follow_symlinks=False).st_mode)
                    if reason and not item.is_dir(follow_symlinks=False):
                        os.unlink(item.path)
                        log.warning("node cache %s: removed %s (%s), which no run of fastloader writes under a name "
                                    "the cache uses", self.folder, item.path, reason)
                        removed.append(item.name)
        return removed

    def _evict(self, needed: int) -> bool:
        """Under the account lock: remove the least recently used shards nobody reads until `needed`
        more bytes fit the limit (those this process's plans still need, last); whether they fit."""
        entries = sorted(self._entries())
        used = sum(size for _, size, _ in entries) + self._partial_bytes()
        for protect in (True, False):
            for _, size, path in entries:
                if used + needed <= self.limit:
                    return True
                if (protect and path.name in self.protected) or not path.exists():
                    continue
                if _remove_unread(path):
                    used -= size
                    with self.lock:
                        self.counters.evicted += 1
        return used + needed <= self.limit

    # -- fetching --------------------------------------------------------------------------------

    def ensure(self, info: remote.ObjectInfo, reader: bool, wanted: Callable[[], bool] | None = None) -> None:
        """Make the shard's complete copy exist here, fetching it unless another thread or process of
        the node is (then wait for it). `reader`: a reader waits for it, which counts as network wait.
        `wanted`: asked right before a fetch starts (a plan's: not once it is cancelled)."""
        started = time.monotonic()
        entry = self.entry(info)
        try:
            if _complete(entry):
                return
            with self._locked(self._slot(entry), f"the fetch lock of {info.url}", self._download_moved(entry)):
                if not _complete(entry) and (wanted is None or wanted()):
                    self._fetch(info, entry)
        finally:
            if reader:
                with self.lock:
                    self.counters.wait_s += time.monotonic() - started

    def _fetch(self, info: remote.ObjectInfo, entry: Path) -> None:
        partial = self.folder / f".{entry.name}.{socket.gethostname()}-{os.getpid()}-{next(self._partials)}.partial"
        fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # alive: repair leaves it
            self._reserve(info, fd)
            fetched = [0]

            def count(done: int) -> None:
                fetched[0] += done
                with self.lock:
                    self.counters.fetched_bytes += done
            try:
                self.client.download(info, fd, count)
            except remote.Changed:
                raise ContainerChanged(errno.ESTALE, f"the shard {info.url} changed since it was indexed (its ETag is "
                                                     f"no longer {info.etag}); its members are refused until a new "
                                                     f"loader indexes it again", info.url) from None
            except ConfigError as error:  # credentials refused mid-run: not the sample's fault
                raise StoreError(str(error)) from None
            except OSError as error:
                if error.errno in _NO_SPACE:
                    raise self._full(info, error) from None
                raise
            if fetched[0] != info.size or os.fstat(fd).st_size != info.size:
                raise StoreError(f"{info.url}: fetched {fetched[0]} bytes, the store said {info.size}")
            os.fsync(fd)  # on the disk before its name says complete: a crash then leaves no copy of zeros
            self._commit(partial, entry)
            with self.lock:
                self.counters.fetched_shards += 1
        except BaseException:
            _unlink(partial)
            raise
        finally:
            os.close(fd)

    def _commit(self, partial: Path, entry: Path) -> None:
        """Give a complete download its name, under the account lock: `_evict` counts the complete
        shards and then the partial ones, and a rename between the two counts would hide the shard
        from both, letting one more in over the limit."""
        with self._locked(self.folder / ".account.lock"):
            os.rename(partial, entry)

    def _reserve(self, info: remote.ObjectInfo, fd: int) -> None:
        """Room for the shard within the limit (evicting), then its bytes allocated on the disk, under
        the account lock, so that processes fetching at once never pass the limit together."""
        if info.size > self.limit:
            raise StoreError(f"{info.url} ({human_bytes(info.size)}) is larger than the node cache's limit, "
                             f"{self.limit_words}; raise dataset.remote.cache_limit")
        deadline = time.monotonic() + self.client.settings.retry_timeout
        while True:
            with self._locked(self.folder / ".account.lock"):
                if self._evict(info.size):
                    try:
                        _allocate(fd, info.size)
                    except OSError as error:
                        if error.errno in _NO_SPACE:
                            raise self._full(info, error) from None
                        raise
                    return
            if time.monotonic() > deadline:
                raise StoreError(f"the node cache {self.folder} cannot make room for {info.url} "
                                 f"({human_bytes(info.size)}) within {self.limit_words}: the shards in it are all "
                                 f"being read or fetched. Raise dataset.remote.cache_limit, or lower "
                                 f"dataset.remote.concurrency")
            time.sleep(0.05)

    def _full(self, info: remote.ObjectInfo, error: OSError) -> StoreError:
        free = shutil.disk_usage(self.folder).free
        return StoreError(f"the disk of the node cache {self.folder} is full ({error.strerror}): "
                          f"{human_bytes(free)} free, and {info.url} needs {human_bytes(info.size)}; its limit "
                          f"is {self.limit_words}. Free space there, set dataset.remote.cache_dir to a larger disk, "
                          f"or lower dataset.remote.cache_limit "
                          f"below the space the disk has; nothing half-written was kept")

    # -- reading ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def opened(self, location: Location) -> Iterator[int]:
        """A descriptor of the shard's complete local copy, under a shared lock (no eviction while
        the body reads), fetched first where it is missing."""
        info = info_of(location, self.client)
        entry = self.entry(info)
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
                self._touch(fd, entry)
                yield fd
                return
            finally:
                os.close(fd)
        raise StoreError(f"{info.url} was evicted from the node cache {self.folder} {EVICTED_RETRIES} times before it "
                         f"could be read: {self.limit_words} is too small for the shards read at once; raise "
                         f"dataset.remote.cache_limit")

    def discard(self, location: Location, inode: int, why: str | None = None) -> None:
        """Remove the shard's copy that was read as inode `inode` (damaged: its bytes are not what
        the store sent), so that the next read fetches it again; a newer copy is left alone. `why`:
        what the read found (default: a member's tar header that is not the one indexed)."""
        entry = self.entry(info_of(location, self.client))
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
            info = os.lstat(self.entry(info_of(location, self.client)))
        except FileNotFoundError:
            return None
        return info.st_ino, info.st_mtime_ns

    def _touch(self, fd: int, entry: Path) -> None:
        now = time.monotonic()
        if now - self._touched.get(entry.name, -TOUCH_EVERY_S) >= TOUCH_EVERY_S:
            self._touched[entry.name] = now
            with contextlib.suppress(OSError):
                os.utime(fd)

    def _arrive(self, info: remote.ObjectInfo) -> None:
        """Have the shard fetched: here, or, in a forked reader, by the process that owns the client."""
        if os.getpid() == self.owner:
            self.ensure(info, reader=True)
        else:
            _client().fetch(self.token, info)


def _remove_unread(path: str | Path) -> bool:
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
        _unlink(path)
        return True
    finally:
        os.close(fd)


def _complete(entry: Path) -> bool:
    """Whether a complete shard's copy is there: a regular file (a FIFO planted there is not one)."""
    try:
        return stat.S_ISREG(os.lstat(entry).st_mode)
    except FileNotFoundError:
        return False


def _mtime_ns(item: os.DirEntry) -> int:
    try:
        return item.stat().st_mtime_ns
    except FileNotFoundError:
        return 0


def _unlink(path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _allocate(fd: int, size: int) -> None:
    """The file's bytes reserved on the disk (a full disk fails here, before a byte is fetched)."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.ftruncate(fd, size)  # a file system without fallocate: a full disk is found while writing


# -- forked readers ask the owner ----------------------------------------------------------------------


class _Service:
    """In the process that owns the client: fetches what forked readers ask for (a shard of an open
    cache, by its token), one thread each."""

    def __init__(self):
        from multiprocessing.connection import Listener

        self.owner, self.key = os.getpid(), os.urandom(16)
        self.listener = Listener(family="AF_UNIX", authkey=self.key)
        self.address = self.listener.address
        threading.Thread(target=self._accept, name="fastloader-node-cache", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection = self.listener.accept()
            except Exception:  # noqa: BLE001 - a client that failed authentication: the next one
                time.sleep(0.01)
                continue
            threading.Thread(target=self._serve, args=(connection,), name="fastloader-node-cache-reader",
                             daemon=True).start()

    def _serve(self, connection) -> None:
        with connection:
            while True:
                try:
                    token, fields = connection.recv()
                    info = remote.ObjectInfo(*fields)
                except (EOFError, OSError):
                    return
                try:
                    cache_of(token).ensure(info, reader=True)
                    answer = ("ok", "")
                except ContainerChanged as error:
                    answer = ("changed", str(error))
                except FileNotFoundError as error:
                    answer = ("missing", str(error.strerror))
                except Exception as error:  # noqa: BLE001 - the reader raises it, named
                    answer = ("store", str(error))
                try:
                    connection.send(answer)
                except OSError:
                    return


class _Client:
    def __init__(self, address, key: bytes):
        from multiprocessing.connection import Client

        self.connection = Client(address, family="AF_UNIX", authkey=key)

    def fetch(self, token: str, info: remote.ObjectInfo) -> None:
        try:
            self.connection.send((token, tuple(info)))
            kind, message = self.connection.recv()
        except (EOFError, OSError) as error:
            raise StoreError(f"{info.url}: the process that fetches shards for this one (pid {_state.service_owner}) "
                             f"no longer answers ({error or type(error).__name__})") from None
        if kind == "changed":
            raise ContainerChanged(errno.ESTALE, message, info.url)
        if kind == "missing":
            raise FileNotFoundError(errno.ENOENT, message, info.url)
        if kind != "ok":
            raise StoreError(message)


class _State:
    caches: dict[str, NodeCache] = {}
    """The open caches by token: what Locations' `store` names, in this process and its forked readers."""
    tokens: dict[tuple, str] = {}
    """(folder, limit, concurrency, client) -> the token of the cache open with them."""
    holders: dict[str, int] = {}
    """token -> how many opens (loaders) hold it; released at 0."""
    numbers = itertools.count(1)
    default = ""
    """The token of the cache that Locations made outside a loader read through (cache_of(""))."""
    service: _Service | None = None
    address = None
    key = b""
    service_owner = 0
    client: _Client | None = None
    client_pid = 0
    lock = threading.Lock()


_state = _State()


def _forked() -> None:
    _state.lock = threading.Lock()
    _state.client = None
    for cache in _state.caches.values():
        cache.lock = threading.Lock()


os.register_at_fork(after_in_child=_forked)


def _client() -> _Client:
    if _state.client is None or _state.client_pid != os.getpid():
        if _state.address is None:
            raise StoreError("a forked reader has no process to fetch shards for it: build the loader in the "
                             "process that forks the readers")
        _state.client, _state.client_pid = _Client(_state.address, _state.key), os.getpid()
    return _state.client


def open_cache(cache_dir: str | None, limit: int | None, concurrency: int,
               client: remote.Client | None = None) -> NodeCache:
    """The node cache in `cache_dir` under `limit`, fetching with `client`, for one more holder (a
    loader, which calls `release(cache.token)` when it closes): opened and repaired the first time,
    the same object for the same settings while a holder keeps it (two loaders with other settings
    get caches of their own, on one folder or two). Forked readers find it by its token."""
    folder = Path(cache_dir) if cache_dir else remote_cache_folder()
    client = client or remote.client_for(remote.Settings())
    with _state.lock:
        key = (str(folder), limit, concurrency, id(client))  # clients live as long as the process
        token = _state.tokens.get(key)
        cache = _state.caches.get(token) if token else None
        if cache is None or cache.owner != os.getpid():  # none yet, or a forked copy of the parent's
            token = token if cache is not None else f"{os.getpid()}-{next(_state.numbers)}"
            cache = NodeCache(folder, limit, concurrency, client, token)
            cache.key = key
            _state.caches[token], _state.tokens[key] = cache, token
            _state.holders[token] = 0
            if _state.service is None or _state.service.owner != os.getpid():
                _state.service = _Service()
                _state.address, _state.key = _state.service.address, _state.service.key
                _state.service_owner = os.getpid()
        _state.holders[token] = _state.holders.get(token, 0) + 1
        return cache


def release(token: str) -> None:
    """A holder of the cache is done (its loader closed): the last one takes it out of the table."""
    with _state.lock:
        if token not in _state.holders:
            return
        _state.holders[token] -= 1
        if _state.holders[token] <= 0:
            cache = _state.caches.pop(token)
            del _state.holders[token]
            _state.tokens.pop(cache.key, None)


def cache_of(token: str) -> NodeCache:
    """The open cache a Location's `store` names; "" (a Location made outside a loader): the default
    cache, in $FASTLOADER_CACHE_DIR/remote, opened the first time."""
    cache = _state.caches.get(token)
    if cache is not None:
        return cache
    if token:
        raise StoreError(f"the node cache this shard was indexed with (token {token}) is closed: its loader was "
                         f"closed; build a new loader to read it")
    cache = _state.caches.get(_state.default)
    if cache is None or cache.owner != os.getpid():  # opened once, and held for the process
        cache = open_cache(None, None, 8)
        _state.default = cache.token
    return cache


def counters(token: str) -> Counters:
    """What the cache of `token` fetched and what its readers waited, so far in this process."""
    cache = _state.caches.get(token)
    if cache is None:
        return Counters()
    with cache.lock:
        return Counters(**vars(cache.counters))
