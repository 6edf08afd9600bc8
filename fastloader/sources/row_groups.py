"""Rows of compressed or dictionary-encoded parquet image pages (pyarrow's defaults, older `datasets`),
which have no byte range: a row is read by decoding its row group's image column, kept in a cache of
ROW_GROUP_CACHE bytes per process so that the rows of a row group read together decode it once."""
from __future__ import annotations

import collections
import errno
import io
import os
import threading

from ..locations import ContainerChanged, Location, open_regular, table_changed
from . import remote

ROW_GROUP_CACHE = 256 << 20
"""Bytes of decoded row groups (compressed image pages) each reading process keeps: a block of at most
this many bytes (`<split>.block_size`) has each of its row groups read once."""


class EmptyRow(OSError):
    """A row read with its row group whose image bytes are null."""

    def __str__(self) -> str:
        return str(self.strerror)


def read_row(location: Location) -> bytearray:
    """The image bytes of a row of compressed parquet pages: its row group's image column decoded (or
    found in this process's cache of row groups) and the row's value taken. OSError (EmptyRow for a null,
    ContainerChanged for a file rewritten since it was indexed) naming the row where it cannot."""
    return _row_groups.value(location)


def forget_row_groups() -> None:
    """Drop the row groups this process keeps decoded (a benchmark's fresh reader starts without them)."""
    _row_groups.pid = -1


def _changed(location: Location) -> bool:
    """Whether a local file's status moved since its rows were indexed (reading._range checks a byte
    range's file the same way); a file that is gone counts as changed."""
    if location.identity is None or not location.identity.ctime_ns:
        return False
    try:
        return not location.identity.matches(os.stat(location.file))
    except OSError:
        return True


class _RowGroups:
    """Decoded image columns of row groups, the most recent ROW_GROUP_CACHE bytes, per process: a forked
    reader starts empty and opens the files itself (pyarrow's readers are not shared across a fork)."""

    def __init__(self):
        self.pid = -1

    def _reset(self) -> None:
        self.pid, self.lock = os.getpid(), threading.Lock()
        self.groups: collections.OrderedDict[tuple, tuple[int, object]] = collections.OrderedDict()
        self.size = 0
        self.metadata: dict[tuple, object] = {}

    def value(self, location: Location) -> bytearray:
        if self.pid != os.getpid():
            self._reset()
        key = (location.file, location.identity, location.start)
        with self.lock:
            found = self.groups.get(key)
            if found is not None:
                self.groups.move_to_end(key)
        if found is not None and _changed(location):  # as a fresh reader would find it: both backends alike
            raise table_changed(location.file)
        if found is None:
            found = self._read(location)
            with self.lock:
                self.groups[key] = found
                self.size += found[1].nbytes
                while self.size > ROW_GROUP_CACHE and len(self.groups) > 1:
                    _, (_, dropped) = self.groups.popitem(last=False)
                    self.size -= dropped.nbytes
        first, values = found
        at = location.row - first
        if not 0 <= at < len(values):
            raise ContainerChanged(errno.ESTALE, f"{location.name}: the row is not in its row group any more; the "
                                                 f"file changed since it was indexed", location.file)
        value = values[at]
        if not value.is_valid:
            raise EmptyRow(errno.ENODATA, "no image bytes (null)", location.name)
        return bytearray(value.as_buffer())

    def _read(self, location: Location) -> tuple[int, object]:
        """(the row group's first row, its image values), read from the file (a file in a store: from the node
        cache's copy), its identity checked as a shard's is."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            if remote.is_url(location.file):
                from .node_cache import cache_of
                with cache_of(location.store).opened(location) as fd:
                    return self._group(pq, io.FileIO(os.dup(fd), "r"), location)
            fd = open_regular(location.file)
            try:
                if location.identity is not None and not location.identity.matches(os.fstat(fd)):
                    raise ContainerChanged(errno.ESTALE, f"the parquet file {location.file} changed since it was "
                                                         f"indexed; its rows are refused until a new loader indexes "
                                                         f"it again", location.file)
                return self._group(pq, io.FileIO(os.dup(fd), "r"), location)
            finally:
                os.close(fd)
        except pa.ArrowException as error:
            raise OSError(errno.EIO, f"its row group cannot be read: {error}", location.file) from None

    def _group(self, pq, handle, location: Location) -> tuple[int, object]:
        with handle:
            key = (location.file, location.identity)
            metadata = self.metadata.get(key)
            file = pq.ParquetFile(handle, metadata=metadata, pre_buffer=False)
            self.metadata[key] = file.metadata
            first = 0
            for group in range(file.metadata.num_row_groups):
                rows = file.metadata.row_group(group).num_rows
                if location.row < first + rows:
                    break
                first += rows
            top, _, field = location.column.partition(".")
            column = file.read_row_group(group, columns=[top], use_threads=False).column(0).combine_chunks()
            values = column.field(field) if field else column
            if column.null_count:  # a null struct is a null image, whatever its field holds
                import pyarrow.compute as pc
                values = pc.if_else(column.is_valid(), values, None)
            return first, values


_row_groups = _RowGroups()
