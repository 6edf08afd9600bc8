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
import contextlib
import errno
import io
import os
import threading
from typing import BinaryIO, Iterator, Sequence

from ..errors import SourceChanged
from ..locations import (
    TAR_BLOCK,
    ContainerChanged,
    Identity,
    Location,
    ReadArena,
    TruncatedError,
    as_location,
    header_digest,
    open_regular,
    open_regular_sized,
    table_changed,
)
from ..schema import BOMB_PIXELS
from . import fetch_ahead, node_cache
from .row_groups import read_row
from .source_reads import identity_stamp, source_bytes
from .tar_members import INDEX_SUFFIX, copy_labels_digest, mark_stale_index
from .urls import is_url


def read_bytes(where: str | Location, into: ReadArena | None = None, max_pixels: int = BOMB_PIXELS
               ) -> bytearray | memoryview:
    """The sample's encoded bytes. Raises OSError (FileNotFoundError, PermissionError, NotRegularFile,
    TruncatedError, ContainerChanged ...) naming the file or container where it cannot; a shard in an
    object store is read from the node cache's copy, fetched first where it is missing (StoreError
    where the store or the cache cannot serve it). `into`: a local file or shard member is read into
    that arena, and a view of it returned, valid until the arena's next reset. `max_pixels`: the
    largest decoded image a source's read() may give (its shape checked before it is copied)."""
    location = as_location(where)
    if location.reader:  # a sample of a source: its read() gives it
        return source_bytes(location, into, max_pixels)
    if location.row >= 0:  # a row of compressed parquet pages: decoded with its row group
        return read_row(location)
    if is_url(location.file):
        return _from_node_cache(location)
    if location.whole_file:
        return _whole(*open_regular_sized(location.file), close=True, into=into)
    with _open_containers.reading(location.file, location.identity) as fd:
        return _range(fd, location, into)


def _from_node_cache(location: Location) -> bytearray:
    """A shard's bytes from its node-cache copy. The copy was fetched under the indexed ETag, so a
    member header that is not the one indexed means the local copy is damaged (a power cut after an
    unsynced write leaves zeros of the right size): it is removed and fetched again, once a shard
    and cache (its CopyChecks, freed with it). Where a copy fetched again still disagrees, the index is
    what is wrong: a `.idx` beside the shard is named (SourceChanged), set aside for the next loader.
    Labels taken from the `.idx` are checked against the copy first (_labels_checked)."""
    cache = node_cache.cache_of(location.store)
    checks, shard = cache.copy_checks, _shard_key(location)
    while True:
        with cache.opened(location) as fd:
            try:
                _labels_checked(location, fd, checks)
                return _whole(fd, os.fstat(fd).st_size) if location.whole_file else _range(fd, location)
            except ContainerChanged as error:
                if shard in checks.fetched_again:
                    raise _index_lies(location, error) from None
                damaged, why = os.fstat(fd).st_ino, (error.strerror if error.errno == errno.EIO else None)
        cache.discard(location, damaged, why)
        checks.fetched_again.add(shard)




def _shard_key(location: Location) -> tuple[str, str]:
    return location.file, location.identity.etag if location.identity is not None else ""


def _index_lies(location: Location, error: ContainerChanged) -> OSError:
    """What a member's check that fails in a copy fetched again says: where the shard's `.idx` gave
    its byte ranges (unread then), the index is wrong (its offsets are not the shard's), named, and
    marked stale so that a new loader checks it against the shard's own headers; else the error."""
    identity = location.identity
    if error.errno != errno.ESTALE or identity is None or not identity.labels:
        return error
    marker = mark_stale_index(location.file, identity.etag)
    return SourceChanged(f"{location.file}{INDEX_SUFFIX} does not describe the shard {location.file}: the tar header "
                         f"before {location.name} is not the one it lists, in a copy of the shard fetched again (the "
                         f"index's byte ranges are not the shard's); rewrite the index (`fastloader pack` writes a "
                         f"true one) or delete it. A new loader checks it against the shard's own headers ({marker} "
                         f"remembers it)")


def _labels_checked(location: Location, fd: int, checks: node_cache.CopyChecks) -> None:
    """Where the labels of a shard in an object store came from the `.idx` beside it, unread then (a
    request a label member), the copy's own label members must be those (once a shard and cache):
    an index kept beside a shard rewritten with other labels would label the run with the old ones.
    SourceChanged where they differ in a copy `fetched_again` (the labels are already the run's), and
    the index is marked stale, so that a new loader checks it; ContainerChanged where the copy itself
    is damaged, or may be: a first copy that differs (zeros where a crash cut a write end the walk of
    its headers early) is fetched again before the index is blamed."""
    identity = location.identity
    if identity is None or not identity.labels or _shard_key(location) in checks.labels_checked:
        return
    fetched_again = _shard_key(location) in checks.fetched_again
    digest, problems = copy_labels_digest(fd)
    if problems:
        raise ContainerChanged(errno.EIO, f"the node cache's copy of {location.file} is damaged: {problems[0][1]}",
                               location.file)
    if digest != identity.labels and not fetched_again:
        raise ContainerChanged(errno.EIO, f"its label members are not the ones {location.file}{INDEX_SUFFIX} lists, "
                                          f"which a damaged copy or a stale index would give", location.file)
    if digest != identity.labels:
        marker = mark_stale_index(location.file, identity.etag)
        raise SourceChanged(f"{location.file}{INDEX_SUFFIX} is stale: the label members it lists are not the ones "
                            f"in the shard {location.file} (the shard was written again, its index kept), and this "
                            f"run's labels came from it; rewrite the index (`fastloader pack` writes a true one) or "
                            f"delete it. A new loader reads the shard's own label members ({marker} remembers it)")
    checks.labels_checked.add(_shard_key(location))


def fetch_again(location: Location, why: str) -> bool:
    """Where a shard member in an object store fails a check of its bytes (not an image, cut short, a
    decoder's error), the node cache's copy may be what is damaged (zeros where a crash cut a write),
    not the image: the copy is removed, to be fetched again by the next read; once a shard and
    cache (CopyChecks.fetched_again: a member that fails in a copy fetched again fails for itself).
    Whether it was (then read the member again before calling it bad)."""
    if not is_url(location.file) or location.reader:
        return False
    cache = node_cache.cache_of(location.store)
    stamp, fetched_again = cache.copy_stamp(location), cache.copy_checks.fetched_again
    if stamp is None or _shard_key(location) in fetched_again:
        return False
    cache.discard(location, stamp[0], f"{location.name}: {why}")
    fetched_again.add(_shard_key(location))
    with cache.opened(location):  # fetched again now
        pass
    return True


def _whole(fd: int, size: int, close: bool = False, into: ReadArena | None = None) -> bytearray | memoryview:
    """A whole file of `size` bytes (its fstat's) in one read of its size and a byte more: that byte
    says the file grew since fstat, and then the rest is read too. Into a fresh writable bytearray
    (torch.frombuffer wants one), or into the arena (a view of it)."""
    try:
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
        if _identity_checked(location) and not location.identity.matches(os.fstat(fd)):
            raise table_changed(location.file)
    if got != location.length:
        raise TruncatedError(f"{location.file} ends {location.length - max(got, 0)} bytes into {location.name} "
                             f"(the shard was cut short since it was indexed)")
    return data


RUN_GAP = 8192
"""Bytes between two ranges of one container that a single read of both still takes (a tar member's
padding and the next member's header, a parquet page's header) rather than two reads."""
RUN_MEMBERS = 256
"""At most this many ranges a read."""


def runs(locations: Sequence[Location]) -> Iterator[tuple[int, int]]:
    """[begin, end) of each run of `locations` that read_run reads in one call: ranges of one local
    container, each beginning at most RUN_GAP bytes after the one before it ends (a shard's members
    in the order they lie in it: a val epoch's, a block of a train epoch's); anything else is a run
    of its own. One pass, a few comparisons a location: it runs for every batch a worker reads."""
    begin, count = 0, len(locations)
    while begin < count:
        first, end = locations[begin], begin + 1
        if first.length >= 0 and first.row < 0 and not first.reader and not is_url(first.file):
            file, identity, position = first.file, first.identity, first.start + first.length
            while end < count and end - begin < RUN_MEMBERS:
                location = locations[end]
                gap = _span_start(location) - position
                if location.file != file or location.length < 0 or location.row >= 0 or location.reader \
                        or location.identity != identity or not 0 <= gap <= RUN_GAP:
                    break
                position = location.start + location.length
                end += 1
        yield begin, end
        begin = end


def _span_start(location: Location) -> int:
    """Where a range's read starts: at its tar header, where that is checked."""
    return location.start - (TAR_BLOCK if location.header else 0)


def run_bytes(locations: Sequence[Location]) -> int:
    """What read_run reads of a run: from its first range (with its tar header) to its last's end."""
    return locations[-1].start + locations[-1].length - _span_start(locations[0])


def read_run(locations: Sequence[Location], into: memoryview) -> list[int]:
    """A run of ranges (`runs`) read with one pread into `into` (run_bytes long), whatever lies
    between them too: one system call, one descriptor look-up and one copy a run instead of one a
    range (a worker's read of a shard member took 15 us alone, 8 in a run). The checks are _range's,
    each range's own: its tar header compared with the index, its length read whole, the
    container's identity. Where each range's bytes are in `into`, or -1 for one that does not pass
    them (nothing is said: read_bytes then reads it alone and raises what it finds)."""
    first = locations[0]
    base = _span_start(first)
    try:
        with _open_containers.reading(first.file, first.identity) as fd:
            got = os.preadv(fd, [into], base)
            changed = any(_identity_checked(location) for location in locations) \
                and not first.identity.matches(os.fstat(fd))
    except OSError:
        return [-1] * len(locations)
    offsets = []
    for location in locations:
        offset = location.start - base
        passed = not changed and got >= offset + location.length and (
            not location.header or header_digest(into[offset - TAR_BLOCK:offset]) == location.header)
        offsets.append(offset if passed else -1)
    return offsets


def _identity_checked(location: Location) -> bool:
    """Whether a range is checked against its container's identity after it is read: a range with
    no tar header to compare (a row of a parquet or Arrow file) whose index kept the ctime."""
    return not location.header and location.identity is not None and bool(location.identity.ctime_ns)


def open_bytes(where: str | Location) -> BinaryIO:
    """A binary file object over the sample's bytes (a whole file is opened, a range read into memory)."""
    location = as_location(where)
    if location.whole_file and not is_url(location.file):
        return open(open_regular(location.file), "rb")
    return io.BytesIO(read_bytes(location))


def size_and_mtime(where: str | Location) -> tuple[int, int]:
    """(size, mtime_ns) of the file that holds the sample's bytes (a shard's, for a member): what
    says it is unchanged since a result about it was kept. A shard in an object store: as indexed
    (its ETag is checked where it is fetched). OSError where it cannot be stat'ed."""
    location = as_location(where)
    if location.reader:  # one stamp for the whole source: its identity
        return 0, identity_stamp(location.reader)
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
            with _open_containers.reading(path):
                pass
        except OSError:
            pass  # named when a sample of it is read


def will_read(files: Sequence[str], identities: Sequence[Identity] | None, sequence, label: str, store: str):
    """The loader is about to read files[sequence[0]], files[sequence[1]] ... (one per sample, in
    order): shards in an object store are fetched ahead in that order (fetch_ahead.Plan, which takes
    `reached(position)` and `cancel()`); None for local files, which need nothing."""
    if not len(files) or not is_url(files[0]):
        return None
    return fetch_ahead.plan(files, identities, sequence, label, store)


def fetch_counters(store: str):
    """What the node cache of `store` (an index's token) fetched and what readers waited for it, so
    far in this process (node_cache.Counters; zeros without shards in an object store)."""
    return node_cache.counters(store)


class _OpenContainers:
    """Descriptors of the containers this process reads, the most recent `limit` kept open.

    Per process: a forked worker gets descriptors that its parent opened, which pread shares safely
    (pread has no file position), and opens the others itself; a cap keeps thousands of shards under
    the descriptor limit. Each descriptor remembers the identity it was checked against: a reader
    that expects another one (a new index of a changed shard) has it checked again, and reopened.
    A descriptor is closed only when no thread reads through it (`reading` counts them): closed under a
    reader of another thread, its number could be given to the next file opened, and the reader would
    take that file's bytes for its shard's."""

    def __init__(self, limit: int = 256):
        self.limit = limit
        self.lock = threading.Lock()
        self.open: collections.OrderedDict[str, tuple[int, Identity | None]] = collections.OrderedDict()
        self.readers: dict[int, int] = {}
        """Threads reading through each descriptor now."""
        self.retired: set[int] = set()
        """Descriptors let go of (evicted, or their file replaced) while read: closed by their last reader."""
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        self.lock = threading.Lock()  # a lock held by another thread at fork stays held in the child
        for fd in self.retired:  # the child's copies; the parent's readers are not the child's threads
            os.close(fd)
        self.readers, self.retired = {}, set()

    @contextlib.contextmanager
    def reading(self, path: str, identity: Identity | None = None) -> Iterator[int]:
        """The open descriptor of `path` (checked against `identity`), kept open until the block ends."""
        with self.lock:
            fd = self._descriptor(path, identity)
            self.readers[fd] = self.readers.get(fd, 0) + 1
        try:
            yield fd
        finally:
            with self.lock:
                self.readers[fd] -= 1
                if not self.readers[fd]:
                    del self.readers[fd]
                    if fd in self.retired:
                        self.retired.discard(fd)
                        os.close(fd)

    def _let_go(self, fd: int) -> None:
        if fd in self.readers:
            self.retired.add(fd)
        else:
            os.close(fd)

    def _descriptor(self, path: str, identity: Identity | None) -> int:
        fd, checked = self.open.get(path, (-1, None))
        if fd >= 0 and (identity is None or identity == checked or identity.matches(os.fstat(fd))):
            self.open[path] = fd, identity or checked
            self.open.move_to_end(path)
            return fd
        if fd >= 0:  # not the file the caller's index was built from: perhaps replaced since
            del self.open[path]
            self._let_go(fd)
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
            self._let_go(oldest)
        return fd


def _differences(indexed: Identity, found: Identity) -> str:
    changed = [f"{name} {old} then, {new} now" for name, old, new in zip(Identity._fields, indexed, found)
               if old != new]
    return "; ".join(changed)


_open_containers = _OpenContainers()
