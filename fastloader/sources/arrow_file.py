"""The rows of an Arrow file (`datasets`' cache, `save_to_disk`): the file is memory-mapped, its
buffers are the file's bytes, and each value's offset in them is its byte range, read as a tar
member's is (reading.py)."""
from __future__ import annotations

import os
from array import array

import numpy as np

from ..errors import ConfigError
from ..locations import Identity, open_regular
from ..schema import Config
from .hf_columns import classlabel, columns, label_values, null_byte_paths
from .table_scan import TableScan, Unreadable


def scan_arrow(path: str, config: Config, format_key: str = "dataset.format") -> TableScan:
    """An Arrow file (IPC file or stream, as `datasets` writes its cache) memory-mapped: each value's
    place in the mapped buffers is its byte range in the file; format_key names the key that says the
    files' format (a source's own `format`, for a split's source)."""
    import pyarrow as pa

    fd = open_regular(path)  # a FIFO or a folder is refused before pyarrow maps it
    identity = Identity.of(os.fstat(fd), ctime=True)
    os.close(fd)
    try:
        mapped = pa.memory_map(path, "r")
        base = _base_address(mapped)
        try:
            reader = pa.ipc.open_file(mapped)
            schema, batches = reader.schema, [reader.get_batch(i) for i in range(reader.num_record_batches)]
        except pa.ArrowInvalid:
            mapped.seek(0)
            reader = pa.ipc.open_stream(mapped)
            schema, batches = reader.schema, list(reader)
    except (OSError, pa.ArrowException) as error:
        head = open(path, "rb").read(8)
        if not head.startswith((b"ARROW1", b"\xff\xff\xff\xff")):
            raise ConfigError(f"{path}: not an Arrow file (it begins {head!r}); list only the `.arrow` files "
                              f"`datasets` writes (its cache, `save_to_disk`), or set {format_key} to the files' "
                              f"format") from None
        raise Unreadable(f"unreadable Arrow file (cut short?): {error}") from None
    image, label = columns(path, schema, config)
    starts, lengths, labels, paths = array("q"), array("q"), [], []
    for batch in batches:
        column = batch.column(schema.get_field_index(image))
        values = column.field("bytes") if pa.types.is_struct(column.type) else column
        null = np.asarray(column.is_null().to_numpy(zero_copy_only=False)) | \
            np.asarray(values.is_null().to_numpy(zero_copy_only=False))
        offsets_buffer, data = values.buffers()[1], values.buffers()[2]
        wide = pa.types.is_large_binary(values.type)
        offsets = np.frombuffer(offsets_buffer, dtype=np.int64 if wide else np.int32)[
            values.offset:values.offset + len(values) + 1].astype(np.int64)
        if data is None or not data.size:  # no bytes in this batch: nulls, or empty values
            data_at = 0
        else:
            data_at = data.address - base
            if not 0 <= data_at <= identity.size - data.size:
                raise ConfigError(f"{path}: its image column {image!r} is stored compressed, so a row's image has "
                                  f"no byte range to read in place; write the file uncompressed (as `datasets` "
                                  f"does), or use its parquet files")
        row_start = data_at + offsets[:-1]
        row_length = np.diff(offsets)
        paths += null_byte_paths(column, null.tolist()) or [None] * len(null)
        starts.extend(np.where(null, -1, row_start).tolist())
        lengths.extend(np.where(null, -1, row_length).tolist())
        labels += batch.column(schema.get_field_index(label)).to_pylist()
    labels = label_values(path, label, pa.array(labels, type=schema.field(label).type) if labels else
                           pa.array([], schema.field(label).type))
    return TableScan(np.array(starts, dtype=np.int64), np.array(lengths, dtype=np.int64), labels,
                     classlabel(schema, label), identity, np.zeros(len(starts), dtype=np.int64), label_column=label,
                     paths=paths if any(paths) else None)


def _base_address(mapped) -> int:
    """Where the memory map begins: buffers read from it point into it (zero copy)."""
    mapped.seek(0)
    first = mapped.read_buffer(1)
    mapped.seek(0)
    return first.address
