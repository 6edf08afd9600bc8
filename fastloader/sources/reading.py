"""Where a sample's encoded bytes are, and the one way to read them.

A sample's bytes are a whole file (folders, file lists, the demo) or a byte range of a container
file (a member of a tar shard, a row of a parquet or Arrow file); a row of a parquet file whose
image pages are compressed is decoded with its row group (sources/row_groups.py `read_row`).
Everything that reads image bytes (screening, both backends, the cache writer, `check`) reads a
`Location` through `read_bytes` or `open_bytes`, so a new container format only has to say where its
samples' bytes are.

A range is read with `os.pread` on a descriptor kept open per container and per process: one open
per shard, not per sample, which is what a cluster filesystem's metadata server can bear. A shard in
an object store (its file a URL: `s3://`, `gs://`, `az://`, `https://`) is read the same way from
its copy in the node cache (node_cache.py, which fetches it once per node); `will_read` tells the
cache which shards an epoch reads, in order, to fetch them ahead. No other module opens a URL.

Nothing but a regular file is read: a FIFO named `.JPEG` would block its reader for ever (open
waits for a writer), a device never ends. Files are opened non-blocking and checked with fstat
before a byte is read (`open_regular`). A container is also checked against what its index was
built from: its identity (inode, size, mtime) when its descriptor is opened, and each member's
tar header, read with the member in the same pread, so that a shard rewritten under a running
loader is refused by name instead of read at its old offsets (docs/bad-input.md says what each
check cannot see).
"""
from __future__ import annotations

import collections
import errno
import hashlib
import io
import os
import stat
import threading
from typing import BinaryIO, NamedTuple, Sequence

from .remote import is_url

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

    @property
    def whole_file(self) -> bool:
        return self.length < 0


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


class TruncatedError(OSError):
    """A byte range that runs past the end of its container: the shard was cut short after indexing."""


class NotRegularFile(OSError):
    """A FIFO, socket, device or folder where a file was expected: refused before a byte is read."""

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


class ContainerChanged(OSError):
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
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        if error.errno == errno.ENXIO:  # a socket, or a FIFO on some systems: say what it is
            reason = not_regular(os.stat(path).st_mode)
            if reason:
                raise NotRegularFile(errno.EINVAL, reason, path) from None
        raise
    try:
        reason = not_regular(os.fstat(fd).st_mode)
        if reason:
            raise NotRegularFile(errno.EINVAL, reason, path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def header_digest(block: bytes | bytearray | memoryview) -> int:
    """A member's 512-byte tar header as a nonzero int64, kept in the index and compared at each read."""
    digest = int.from_bytes(hashlib.blake2b(block, digest_size=8).digest(), "little", signed=True)
    return digest or 1


class ReadArena:
    """Reused memory that a batch's reads land in, one after another, instead of a fresh zero-filled
    bytearray each: no allocation, no memset and no new pages per sample. Chunks of CHUNK bytes are
    filled in turn and kept; `reset()` starts again at the first, once the last batch's bytes are no
    longer needed (the DALI feed: DALI copies what a call returns before it calls again). A read of
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


def read_bytes(where: str | Location, into: ReadArena | None = None) -> bytearray | memoryview:
    """The sample's encoded bytes. Raises OSError (FileNotFoundError, PermissionError, NotRegularFile,
    TruncatedError, ContainerChanged ...) naming the file or container where it cannot; a shard in an
    object store is read from the node cache's copy, fetched first where it is missing (StoreError
    where the store or the cache cannot serve it). `into`: a local file or shard member is read into
    that arena, and a view of it returned, valid until the arena's next reset."""
    location = as_location(where)
    if location.row >= 0:  # a row of compressed parquet pages: decoded with its row group
        from .row_groups import read_row
        return read_row(location)
    if is_url(location.file):
        return _from_node_cache(location)
    if location.whole_file:
        return _whole(open_regular(location.file), close=True, into=into)
    return _range(_open_containers.descriptor(location.file, location.identity), location, into)


def _from_node_cache(location: Location) -> bytearray:
    """A shard's bytes from its node-cache copy. The copy was fetched under the indexed ETag, so a
    member header that is not the one indexed means the local copy is damaged (a power cut after an
    unsynced write leaves zeros of the right size): it is removed and fetched again, once."""
    from .node_cache import current

    cache = current()
    for attempt in range(2):
        with cache.opened(location) as fd:
            try:
                return _whole(fd) if location.whole_file else _range(fd, location)
            except ContainerChanged:
                if attempt:
                    raise
                damaged = os.fstat(fd).st_ino
        cache.discard(location, damaged)
    raise AssertionError("unreachable")


def _whole(fd: int, close: bool = False, into: ReadArena | None = None) -> bytearray | memoryview:
    """A whole file in one read of its size and a byte more: that byte says the file grew since
    fstat, and then the rest is read too. Into a fresh writable bytearray (torch.frombuffer wants
    one), or into the arena (a view of it)."""
    try:
        size = os.fstat(fd).st_size
        data = into.view(size + 1) if into is not None else bytearray(size + 1)
        got = os.readv(fd, [data])
        if got > size:  # it grew
            return bytearray(data) + b"".join(iter(lambda: os.read(fd, 1 << 20), b""))
        if into is not None:
            return data[:got]
        del data[got:]  # the extra byte, or what the file shrank by
        return data
    finally:
        if close:
            os.close(fd)


def table_changed(path: str) -> ContainerChanged:
    """The refusal of a row of a parquet or Arrow file whose status moved since it was indexed."""
    return ContainerChanged(errno.ESTALE, f"the file {path} changed since it was indexed (written to, its "
                                          f"status-change time moved): its rows are refused until a new loader "
                                          f"indexes it again", path)


def _range(fd: int, location: Location, into: ReadArena | None = None) -> bytearray | memoryview:
    """A member's bytes, its own tar header read in the same pread and compared with the index."""
    data = into.view(location.length) if into is not None else bytearray(location.length)
    if location.header:  # the member's own header block in the same read: is it still the one indexed?
        block = bytearray(TAR_BLOCK)
        got = os.preadv(fd, [block, data], location.start - TAR_BLOCK) - TAR_BLOCK
        if got >= 0 and header_digest(block) != location.header:
            raise ContainerChanged(errno.ESTALE, f"the shard {location.file} changed since it was indexed: the tar "
                                                 f"header before {location.name} is not the one indexed (the shard "
                                                 f"was rewritten in place); its members are refused until a new "
                                                 f"loader indexes it again", location.file)
    else:
        got = os.preadv(fd, [data], location.start)
        if location.identity is not None and location.identity.ctime_ns and not location.identity.matches(
                os.fstat(fd)):
            raise table_changed(location.file)
    if got != location.length:
        raise TruncatedError(f"{location.file} ends {location.length - max(got, 0)} bytes into {location.name} "
                             f"(the shard was cut short since it was indexed)")
    return data


def open_bytes(where: str | Location) -> BinaryIO:
    """A binary file object over the sample's bytes (a whole file is opened, a range read into memory)."""
    location = as_location(where)
    if location.whole_file and not is_url(location.file):
        return open(open_regular(location.file), "rb")
    return io.BytesIO(read_bytes(location))


def byte_count(where: str | Location) -> int:
    location = as_location(where)
    if not location.whole_file and location.row < 0:
        return location.length
    if location.row >= 0:
        return len(read_bytes(location))
    return location.identity.size if is_url(location.file) and location.identity else \
        len(read_bytes(location)) if is_url(location.file) else os.stat(location.file).st_size


def size_and_mtime(where: str | Location) -> tuple[int, int]:
    """(size, mtime_ns) of the file that holds the sample's bytes (a shard's, for a member): what
    says it is unchanged since a result about it was kept. A shard in an object store: as indexed
    (its ETag is checked where it is fetched). OSError where it cannot be stat'ed."""
    location = as_location(where)
    if is_url(location.file):
        if location.identity is None:
            raise FileNotFoundError(errno.ENOENT, "not indexed", location.file)
        return location.identity.size, location.identity.mtime_ns
    info = os.stat(location.file)
    return info.st_size, info.st_mtime_ns


def is_remote(path: str) -> bool:
    """Whether reading this container costs a download (a shard in an object store)."""
    return is_url(path)


def keep_open(files) -> None:
    """Open these containers now (up to the cap): a process about to fork its readers (DataLoader
    workers) opens each shard once, and the workers share the descriptors. Shards in an object store
    are read from the node cache, one open a read (so that eviction can come between reads)."""
    for path in [path for path in files if not is_url(path)][:_open_containers.limit]:
        try:
            _open_containers.descriptor(path)
        except OSError:
            pass  # named when a sample of it is read


def will_read(files: Sequence[str], identities: Sequence[Identity] | None, sequence, label: str):
    """The loader is about to read files[sequence[0]], files[sequence[1]] ... (one per sample, in
    order): shards in an object store are fetched ahead in that order (node_cache.Plan, which takes
    `reached(position)` and `cancel()`); None for local files, which need nothing."""
    if not len(files) or not is_url(files[0]):
        return None
    from .node_cache import plan
    return plan(files, identities, sequence, label)


def cache_limit(files: Sequence[str]) -> int | None:
    """The node cache's limit in bytes where these containers are in an object store (what a block
    order's budget and the cost of a uniform order follow); None for local files, read in place."""
    if not len(files) or not is_url(files[0]):
        return None
    from .node_cache import current
    return current().limit


def fetch_counters():
    """What the node cache fetched and what readers waited for it, so far in this process
    (node_cache.Counters; zeros without shards in an object store)."""
    from .node_cache import counters
    return counters()


class _OpenContainers:
    """Descriptors of the containers this process reads, the most recent `limit` kept open.

    Per process: a forked worker gets descriptors that its parent opened, which pread shares safely
    (pread has no file position), and opens the others itself; a cap keeps thousands of shards under
    the descriptor limit. Each descriptor remembers the identity it was checked against: a reader
    that expects another one (a new index of a changed shard) has it checked again, and reopened."""

    def __init__(self, limit: int = 256):
        self.limit = limit
        self.lock = threading.Lock()
        self.open: collections.OrderedDict[str, tuple[int, Identity | None]] = collections.OrderedDict()
        self.pid = os.getpid()
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        self.lock = threading.Lock()  # a lock held by another thread at fork stays held in the child

    def descriptor(self, path: str, identity: Identity | None = None) -> int:
        with self.lock:
            fd, checked = self.open.get(path, (-1, None))
            if fd >= 0 and (identity is None or identity == checked or identity.matches(os.fstat(fd))):
                self.open[path] = fd, identity or checked
                self.open.move_to_end(path)
                return fd
            if fd >= 0:  # not the file the caller's index was built from: perhaps replaced since
                del self.open[path]
                os.close(fd)
            fd = open_regular(path)
            info = os.fstat(fd)
            if identity is not None and not identity.matches(info):
                found = Identity.of(info, ctime=bool(identity.ctime_ns))
                os.close(fd)
                raise ContainerChanged(errno.ESTALE, f"the shard {path} changed since it was indexed ("
                                                     f"{_differences(identity, found)}); its members are refused "
                                                     f"until a new loader indexes it again", path)
            self.open[path] = fd, identity
            while len(self.open) > self.limit:
                _, (oldest, _) = self.open.popitem(last=False)
                os.close(oldest)
            return fd


def _differences(indexed: Identity, found: Identity) -> str:
    changed = [f"{name} {old} then, {new} now" for name, old, new in zip(Identity._fields, indexed, found)
               if old != new]
    return "; ".join(changed)


_open_containers = _OpenContainers()
