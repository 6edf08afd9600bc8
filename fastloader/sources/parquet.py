"""Parquet and Arrow files of Hugging Face datasets: `<split>.files` -> the split's SampleIndex, one row
a sample, each row's image bytes a byte range in its file, found once as a tar member's is.

Each file is scanned once and its scan cached per file stamp: a parquet file's image pages are walked
(parquet_pages.py), an Arrow file is memory-mapped (arrow_file.py), their columns and class names
chosen by Hugging Face's conventions (hf_columns.py). Reading a row is then one pread of exactly the
image's bytes (sources/reading.py), as for tar members, so the sampler's orders, exact-once eval,
resume, screening, the uint8 cache and `pack` work unchanged.

Compressed or dictionary-encoded image pages (pyarrow's defaults, older `datasets`) have no byte range:
such a row group's rows are read by decoding the row group's image column (row_groups.py), which costs
the whole row group for one row in a uniform order; the block order over row groups reads each once
an epoch (order.Containers), and the loader says so (docs/performance.md, parquet: both measured).
Sample names are `file.parquet:row`.
"""
from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import os
import threading
from array import array
from typing import Sequence

import numpy as np

from ..errors import BadImageError, ConfigError
from ..locations import Identity, open_regular, stat_stamp
from ..paths import cache_home
from ..samples import ByteRanges, IndexBuilder, SampleIndex, label_problem
from ..schema import Config, SplitConfig, draws_from
from ..words import plural
from . import remote
from .arrow_file import scan_arrow
from .hf_columns import classlabel, columns, image_leaf, label_values, null_byte_paths
from .multi import files_format_key, order_split
from .parquet_pages import parquet_ranges
from .registry import Format, client_of, indexed, register_format
from .row_groups import ROW_GROUP_CACHE
from .table_scan import TableScan, Unreadable
from .webdataset import Excluded, listed_files

log = logging.getLogger("fastloader")

PARQUET_MAGIC = b"PAR1"
REWRITE = ("rewrite it with the image column uncompressed and PLAIN, as `datasets` writes image columns: "
           "`pq.write_table(pq.read_table(SRC), DST, compression='none', use_dictionary=False)` (pyarrow), or "
           "`datasets.load_dataset(...).to_parquet(DST)`")
"""The fix for a parquet file whose image pages cannot be read in place."""
SCAN_VERSION = 5
"""Raised when a cached scan of a file would read otherwise: 3, it keeps the label column's name, and
what the file says whatever dataset.classes is; 4, its identity keeps the file's ctime; 5, the paths of
rows whose image bytes are null."""


def index_parquet(config: Config, split: SplitConfig) -> SampleIndex:
    """The split's samples from its parquet files (dataset.format: parquet)."""
    return _index(config, split, "parquet")


def index_arrow(config: Config, split: SplitConfig) -> SampleIndex:
    """The split's samples from its Arrow files (dataset.format: arrow)."""
    return _index(config, split, "arrow")


def _index(config: Config, split: SplitConfig, kind: str) -> SampleIndex:
    key, source = f"{split.name}.files", config.origin(f"{split.name}.files")
    _check_split_keys(config, split, kind, key, source)
    if kind == "arrow" and any(remote.is_url(pattern) for pattern in split.files):
        raise ConfigError(f"{source}: {key}: Arrow files are memory-mapped, which needs them on a local disk; copy "
                          f"them there, or read the dataset's parquet files from the store "
                          f"({files_format_key(split)}: parquet)")
    kept, missing, objects, excluded, root = listed_files(config, split.files, key, f"{kind} file")
    problems = [(path, f"file {reason}") for path, reason in missing if not excluded(path)]
    scans: list[TableScan | None] = []
    scan = functools.partial(_cached_scan, kind=kind, config=config, objects=objects,
                             format_key=files_format_key(split))
    found = remote.in_parallel(scan, kept) if objects else map(scan, kept)
    for path, result in zip(kept, found):
        if isinstance(result, Unreadable):
            problems.append((path, str(result)))
        scans.append(result if isinstance(result, TableScan) else None)
    classes = config.dataset.classes or _class_names(kept, scans)
    builder, ranges = IndexBuilder(), (array("i"), array("q"), array("q"), array("q"))
    referenced_files = _ReferencedFiles(len(kept))
    for number, (path, scan) in enumerate(zip(kept, scans)):
        if scan is not None:
            _rows(path, number, scan, root, _labels_in(path, scan, classes, config), excluded, builder, ranges,
                  problems, referenced_files)
    if not len(builder):
        first = f" (the first problem: {problems[0][0]}: {problems[0][1]})" if problems else ""
        raise BadImageError(f"{source}: {key}: no usable row in {plural(len(kept), 'file')}{first}")
    tables = len(kept)
    identities = (*(scan.identity if scan is not None else Identity(0, 0, 0) for scan in scans),
                  *referenced_files.identities)
    kept = [*kept, *referenced_files.paths]  # the image files rows name: containers after the tables
    scans = [*scans, *(None for _ in referenced_files.paths)]
    classes = classes or tuple(str(i) for i in range(int(builder.labels().max()) + 1))
    table_row = np.array(ranges[3], dtype=np.int64)
    grouped = [path for path, scan in zip(kept, scans) if scan is not None and scan.table_row.any()]
    byte_ranges = ByteRanges(tuple(kept), np.array(ranges[0], dtype=np.int32), np.array(ranges[1], dtype=np.int64),
                             np.array(ranges[2], dtype=np.int64), None, identities,
                             table_row if grouped else None,
                             tuple(scan.column if scan is not None else None for scan in scans) if grouped else None)
    if grouped:
        _say_row_group_cost(config, split, grouped, scans)
    unusable = config.on_bad_image.refuse(problems, noun="files or rows")
    log.info("indexed %s of split '%s' (%s): %s in %s%s%s%s", plural(tables, f"{kind} file"), split.name, root,
             plural(len(builder), "row"), plural(len(classes), "class"),
             f", {plural(len(referenced_files.paths), 'row')} read from the image file its path names"
             if referenced_files.paths else "",
             f", {plural(len(unusable), 'row')} left out" if unusable else "",
             f", {excluded.count} left out by dataset.exclude" if excluded.count else "")
    return builder.build(root, classes, excluded=excluded.count, ranges=byte_ranges, unusable=unusable)


def _say_row_group_cost(config: Config, split: SplitConfig, grouped: list[str], scans) -> None:
    """What reading rows by row group costs in the split's order, and how to choose a cheaper one: named
    by the keys of the split that sets the order (a source's is the split it is of), and the block
    order only where that split may take it (weights and epoch_size refuse it)."""
    compressed = [scan for scan in scans if scan is not None and scan.table_row.any()]
    rows = sum(int((scan.table_row > 0).sum()) for scan in compressed)
    groups = sum(len(np.unique(scan.start[scan.table_row > 0])) for scan in compressed)
    group_bytes = sum(int(np.unique(np.stack([scan.start, scan.length])[:, scan.table_row > 0], axis=1)[1].sum())
                      for scan in compressed)
    per_group, mean_bytes = rows / max(groups, 1), group_bytes / max(groups, 1)
    more = " ..." if len(grouped) > 1 else ""
    files = f"{plural(len(grouped), 'parquet file')} ({os.path.basename(grouped[0])}{more})"
    what = (f"split '{split.name}': the image column of {files} is compressed or dictionary-encoded, so each of "
            f"its {rows:,} rows is read by decoding its row group ({per_group:.0f} rows, {mean_bytes / 1e6:.1f} MB "
            f"on average), kept in a cache of {ROW_GROUP_CACHE >> 20} MiB per reading process")
    order = order_split(split)
    if order.shuffle is not True:
        log.info("%s; %s.shuffle: %s reads a row group's rows together", what, order.name, order.shuffle)
        return
    draws = draws_from(order) + ([f"{order.name}.epoch_size"] if order.epoch_size is not None else [])
    block = (f"The block order, which reads each row group once an epoch, is refused with {' and '.join(draws)} "
             f"(samples drawn at random), so " if draws else
             f"Set {order.name}.shuffle: block with {order.name}.block_size: {ROW_GROUP_CACHE >> 20}MB (the cache) "
             f"to read each row group once an epoch per reading process, or ")
    log.warning("%s; in a uniform order (%s.shuffle: true) nearly every row costs its whole row group: about %.0f "
                "times the image bytes an epoch (%.1f GB instead of %.2f GB). %s%s", what, order.name, per_group,
                per_group * group_bytes / 1e9, group_bytes / 1e9, block, REWRITE)


def _check_split_keys(config: Config, split: SplitConfig, kind: str, key: str, source: str) -> None:
    other = next((name for name in ("shards", "file_list", "folder") if getattr(split, name)), None)
    if other:
        raise ConfigError(f"{config.origin(f'{split.name}.{other}')}: {split.name}.{other}: dataset.format: {kind} "
                          f"reads the split from {key}; remove {split.name}.{other}, or set dataset.format to the "
                          f"format of those files")
    if not split.files:
        suffix = "parquet" if kind == "parquet" else "arrow"
        raise ConfigError(f"{source}: {key}: missing; dataset.format: {kind} reads each split from its files, e.g. "
                          f"{split.name}: {{files: '{split.name}-*.{suffix}'}}")


def _rows(path: str, number: int, scan: TableScan, root: str, labels: dict, excluded: Excluded,
          builder: IndexBuilder, ranges: tuple[array, ...], problems: list[tuple[str, str]],
          referenced_files: "_ReferencedFiles") -> None:
    """The file's usable rows into the index, each label as `labels` maps it (_labels_in); (name, reason)
    of the others into problems. A row whose bytes are null and whose `path` names an image file is
    that file, whole, a container of its own (`referenced_files`), read and checked as any other."""
    name = remote.relative(path, root) if remote.is_url(path) else os.path.relpath(path, root)
    for row, (start, length, value, by_group) in enumerate(zip(scan.start.tolist(), scan.length.tolist(), scan.labels,
                                                               scan.table_row.tolist())):
        where = f"{path}:{row}"
        if excluded(where):
            excluded.count += 1
            continue
        if value is None:
            problems.append((where, "no label (null)"))
            continue
        label = labels[value]
        if isinstance(label, str):
            problems.append((where, label))
            continue
        if start < 0:
            referenced = scan.paths[row] if scan.paths else None
            if referenced is None:
                problems.append((where, "no image bytes (null)"))
                continue
            found = referenced_files.find(path, referenced)
            if isinstance(found, str):
                problems.append((where, found))
                continue
            number, start, length, by_group = found, 0, referenced_files.size(found), 0
        builder.add(f"{name}:{row}", label)
        ranges[0].append(number)
        ranges[1].append(start)
        ranges[2].append(length)
        ranges[3].append(by_group)


class _ReferencedFiles:
    """The image files that rows without bytes name by their path: each a container of its own,
    numbered after the split's table files, its identity (ctime too) checked at every read. A relative
    path is relative to the table file's folder; a table in an object store names no local file."""

    def __init__(self, first: int):
        self.first = first
        self.paths: list[str] = []
        self.identities: list[Identity] = []
        self.numbers: dict[str, int] = {}

    def find(self, table: str, referenced: str) -> int | str:
        """The container number of the file a row names, or why the row cannot be read from it."""
        if remote.is_url(table):
            return (f"no image bytes (null), and its path {referenced[:200]!r} names a file beside a table in an "
                    f"object store, which is not read; write the images into the table (`datasets` embeds them "
                    f"with datasets.table.embed_table_storage, as push_to_hub does)")
        full = os.path.normpath(os.path.join(os.path.dirname(table), os.path.expanduser(referenced)))
        number = self.numbers.get(full)
        if number is not None:
            return number
        try:
            fd = open_regular(full)
        except OSError as error:
            reason = error.strerror or str(error)
            return f"no image bytes (null), and its path {referenced!r} ({full}) cannot be read: {reason}"
        try:
            identity = Identity.of(os.fstat(fd), ctime=True)
        finally:
            os.close(fd)
        number = self.numbers[full] = self.first + len(self.paths)
        self.paths.append(full)
        self.identities.append(identity)
        return number

    def size(self, number: int) -> int:
        return self.identities[number - self.first].size


def _labels_in(path: str, scan: TableScan, classes: Sequence[str] | None, config: Config) -> dict:
    """Each label value of the file -> its label in the split's classes, or why the row has none.

    Class names (strings) are found by name in dataset.classes. Integers coded by a ClassLabel are
    found by their ClassLabel name, so that a file whose ClassLabel lists the classes in another order
    than dataset.classes keeps every row's class (a name dataset.classes lacks is refused). Plain
    integers are positions in the split's classes: dataset.classes, else the other files' ClassLabel."""
    values = set(scan.labels) - {None}
    given = config.dataset.classes
    if any(isinstance(value, str) for value in values):
        if not given:
            raise ConfigError(f"{path}: the label column {scan.label_column!r} holds class names (strings), and "
                              f"dataset.classes is not set; set dataset.classes to the class names in label order "
                              f"(or the path of a file of them, one a line)")
        where = {name: label for label, name in enumerate(given)}
        return {value: where.get(value, f"label {value[:40]!r} is not in dataset.classes") for value in values}
    names = scan.class_names
    if names is None:
        if given or not classes:
            return {value: label_problem(value, classes) or value for value in values}
        return {value: value if 0 <= value < len(classes) else
                f"label {value} is outside the {len(classes)} ClassLabel names of the split's other files"
                for value in values}
    where = {name: label for label, name in enumerate(classes)}
    missing = [name for name in names if name not in where]
    if missing:
        shown = ", ".join(repr(name[:40]) for name in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ConfigError(f"{config.origin('dataset.classes')}: dataset.classes: {path}: its ClassLabel names "
                          f"{plural(len(missing), 'class')} that dataset.classes lacks ({shown}); a file's integer "
                          f"labels are read by their ClassLabel names, so add {'it' if len(missing) == 1 else 'them'} "
                          f"to dataset.classes")
    return {value: where[names[value]] if 0 <= value < len(names) else
            f"label {value} is outside the ClassLabel's {len(names)} names" for value in values}


def _class_names(paths: list[str], scans: list[TableScan | None]) -> tuple[str, ...] | None:
    """The ClassLabel names the files' metadata gives, where dataset.classes is not set: all the same, or
    a ConfigError naming two that differ (which order would be the split's labels is not theirs to say)."""
    named = [(path, scan.class_names) for path, scan in zip(paths, scans) if scan is not None and scan.class_names]
    if not named:
        return None
    first_path, names = named[0]
    for path, other in named[1:]:
        if other != names:
            raise ConfigError(f"{path}: its ClassLabel names ({', '.join(other[:3])} ...) differ from those of "
                              f"{first_path} ({', '.join(names[:3])} ...); set dataset.classes to the names in the "
                              f"label order you want (each file's labels are read by their ClassLabel names), or "
                              f"read the files as splits of their own")
    return names


def _cached_scan(path: str, kind: str, config: Config, objects: dict[str, remote.ObjectInfo],
                 format_key: str) -> TableScan | Unreadable:
    """The file's scan from the cache where the file is unchanged (its stat stamp; in a store: its size
    and ETag), else scanned now and cached: a file in a store costs a ranged read a row to scan. A scan
    holds what the file says (its labels, as values or names, and its ClassLabel); what they mean in
    the split (dataset.classes) is settled per build, by _labels_in."""
    info = objects.get(path)
    stamp = (info.size, info.etag) if info is not None else stat_stamp(os.stat(path))
    key = json.dumps([SCAN_VERSION, kind, path, stamp, config.dataset.image_column, config.dataset.label_column])
    cache = cache_home() / "tables" / (hashlib.blake2b(key.encode("utf-8", "surrogateescape"),
                                                         digest_size=8).hexdigest() + ".npz")
    try:
        with np.load(cache) as stored:
            extra = json.loads(str(stored["extra"]))
            names = tuple(extra["classes"]) if extra["classes"] is not None else None
            return TableScan(stored["start"], stored["length"], extra["labels"], names, Identity(*extra["identity"]),
                             stored["table_row"], extra["column"], extra["label_column"], extra["paths"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        scan = _scan(path, kind, config, info, format_key)
    except Unreadable as error:
        return error
    except OSError as error:  # a FIFO, a folder, no permission: named, never waited on
        return Unreadable(f"unreadable: {error.strerror or error}")
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_name(f"{cache.stem}.{os.getpid()}.{threading.get_ident()}.tmp.npz")
    extra = {"labels": scan.labels, "classes": scan.class_names, "identity": list(scan.identity), "column": scan.column,
             "label_column": scan.label_column, "paths": scan.paths}
    np.savez(partial, start=scan.start, length=scan.length, table_row=scan.table_row, extra=np.array(json.dumps(extra)))
    os.replace(partial, cache)
    return scan


def _scan(path: str, kind: str, config: Config, info: remote.ObjectInfo | None, format_key: str) -> TableScan:
    """One file's rows, its columns found by the dataset's keys or Hugging Face's conventions."""
    if kind == "arrow":
        return scan_arrow(path, config, format_key)
    import pyarrow as pa
    import pyarrow.parquet as pq

    if info is not None:
        reader = remote.RangeFile(info, client_of(config))
        pread, size, identity = reader.pread, info.size, Identity(0, info.size, info.mtime_ns, info.etag)
        source = _StoredFile(reader, info.size)
    else:
        fd = open_regular(path)
        identity = Identity.of(os.fstat(fd), ctime=True)
        size = identity.size

        def pread(length: int, offset: int, fd=fd) -> bytes:
            return os.pread(fd, length, offset)
        source = path
    try:
        head, tail = pread(4, 0), pread(4, max(0, size - 4))
        if size == 0:  # a write that never happened, beside good files: named, the others read
            raise Unreadable("empty (0 bytes): a copy or a write that did not finish; copy it again, or remove it")
        if head != PARQUET_MAGIC:
            raise ConfigError(f"{path}: not a parquet file (it begins {head!r}, not {PARQUET_MAGIC!r}); list only "
                              f"`.parquet` files, or set {format_key} to the files' format")
        if tail != PARQUET_MAGIC:
            raise Unreadable(f"parquet file cut short ({size:,} bytes, no footer at its end); copy it again")
        try:
            file = pq.ParquetFile(source)
            schema = file.schema_arrow
            image, label = columns(path, schema, config)
            leaf, max_def = image_leaf(path, file, schema, image)
            labels = file.read(columns=[label], use_threads=False).column(0).combine_chunks()
        except (OSError, pa.ArrowException) as error:
            raise Unreadable(f"unreadable parquet file: {error}") from None
        start, length, table_row = parquet_ranges(path, file, leaf, max_def, pread)
        paths = None
        if (start < 0).any() and pa.types.is_struct(schema.field(image).type):
            try:  # rows `datasets` wrote from file paths: {bytes: null, path: ...}, read by their path
                struct = file.read(columns=[f"{image}.path"], use_threads=False).column(0).combine_chunks()
                paths = null_byte_paths(struct, (start < 0).tolist())
            except (OSError, pa.ArrowException, KeyError):
                paths = None
    finally:
        if info is None:
            os.close(fd)
    column = file.metadata.schema.column(leaf).path if table_row.any() else None
    return TableScan(start, length, label_values(path, label, labels), classlabel(schema, label), identity,
                     table_row, column, label, paths)


class _StoredFile(io.RawIOBase):
    """An object in a store as the file object pyarrow reads a footer and a label column from (ranged reads)."""

    def __init__(self, reader: remote.RangeFile, size: int):
        super().__init__()
        self.reader, self.size, self.at = reader, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.at = offset if whence == 0 else self.at + offset if whence == 1 else self.size + offset
        return self.at

    def tell(self) -> int:
        return self.at

    def readinto(self, buffer) -> int:
        data = self.reader.pread(min(len(buffer), max(0, self.size - self.at)), self.at)
        buffer[:len(data)] = data
        self.at += len(data)
        return len(data)


register_format(Format("parquet", indexed(index_parquet), keys=("files",), containers=True, remote=True,
                       needs_root=False))
register_format(Format("arrow", indexed(index_arrow), keys=("files",), containers=True, needs_root=False))
