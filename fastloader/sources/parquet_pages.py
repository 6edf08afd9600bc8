"""Where each row's image bytes lie in a parquet file, from its page headers (Thrift compact protocol).

Hugging Face's `datasets` writes an image column uncompressed and PLAIN encoded, so that the Hub can
deduplicate it: each image's bytes lie in the file as they are, after a 4-byte length. Walking each
row group's pages of that column (the page headers, the definition levels and the lengths: a few
small reads a row, never the images) gives each row's byte range, so that reading a row is one pread
of exactly its bytes (reading.py), as for a tar member.
"""
from __future__ import annotations

from array import array
from typing import Callable

import numpy as np

from .table_scan import Unreadable

_HEADER_READ = 4096
"""First read of a page header; a header holding large statistics (min / max images) is read again, longer."""
_PLAIN, _DATA_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 0, 2, 3


def parquet_ranges(path: str, file, leaf: int, max_def: int,
                   pread: Callable[[int, int], bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's image bytes in the file (start -1: null), from the pages of each row group's image
    column; a row group whose image pages are compressed or encoded otherwise than PLAIN: its rows get
    the column chunk's range and table_row 1 + their row, to be read with the row group."""
    starts, lengths, table_row = array("q"), array("q"), array("q")
    first = 0
    for group in range(file.metadata.num_row_groups):
        chunk = file.metadata.row_group(group).column(leaf)
        rows = file.metadata.row_group(group).num_rows
        if not _in_place(chunk):
            at = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
            starts.extend([at] * rows)
            lengths.extend([chunk.total_compressed_size] * rows)
            table_row.extend(range(first + 1, first + rows + 1))
            first += rows
            continue
        before = len(starts)
        try:
            _walk_pages(pread, chunk.data_page_offset, chunk.data_page_offset + chunk.total_compressed_size,
                        max_def, starts, lengths)
        except (IndexError, ValueError, OSError) as error:
            raise Unreadable(f"parquet row group {group}: its image pages cannot be read ({error})") from None
        if len(starts) - before != chunk.num_values:
            raise Unreadable(f"parquet row group {group}: its image pages hold {len(starts) - before} values, its "
                             f"metadata says {chunk.num_values}")
        table_row.extend([0] * rows)
        first += rows
    return (np.array(starts, dtype=np.int64), np.array(lengths, dtype=np.int64),
            np.array(table_row, dtype=np.int64))


def _in_place(chunk) -> bool:
    """Whether a column chunk's values lie in the file as they are: uncompressed, PLAIN, no dictionary."""
    return chunk.compression == "UNCOMPRESSED" and not chunk.has_dictionary_page and \
        set(chunk.encodings) <= {"PLAIN", "RLE", "BIT_PACKED"}


def _walk_pages(pread: Callable[[int, int], bytes], at: int, end: int, max_def: int, starts: array,
                lengths: array) -> None:
    """The data pages of one column chunk (uncompressed, PLAIN): each value's (start, length), or
    (-1, -1) where its definition level says null."""
    while at < end:
        header, size = _page_header(pread, at)
        body, stored = at + size, header[3]
        kind = header[1]
        if kind == _DATA_PAGE:
            page = header[5]
            count, encoding = page[1], page[2]
            if max_def:
                levels_length = int.from_bytes(pread(4, body), "little")
                levels = _hybrid(pread(levels_length, body + 4), max_def.bit_length(), count)
                values = body + 4 + levels_length
            else:
                levels, values = [0] * count, body
        elif kind == _DATA_PAGE_V2:
            page = header[8]
            count, encoding, def_length, rep_length = page[1], page[4], page[5], page[6]
            levels = _hybrid(pread(def_length, body + rep_length), max_def.bit_length(), count) if max_def \
                else [0] * count
            values = body + rep_length + def_length
        elif kind == _DICTIONARY_PAGE:
            raise ValueError("a dictionary page")
        else:  # an index page: nothing of ours
            at = body + stored
            continue
        if encoding != _PLAIN:
            raise ValueError(f"a page encoded {encoding}, not PLAIN")
        for level in levels:
            if level < max_def:
                starts.append(-1)
                lengths.append(-1)
                continue
            length = int.from_bytes(pread(4, values), "little")
            starts.append(values + 4)
            lengths.append(length)
            values += 4 + length
        if values > body + stored:
            raise ValueError(f"the values run past their page's end at byte {body + stored}")
        at = body + stored


def _page_header(pread: Callable[[int, int], bytes], at: int) -> tuple[dict, int]:
    """A page header (Thrift compact protocol) at `at`: its fields by number, and its size in bytes."""
    want = _HEADER_READ
    while True:
        data = pread(want, at)
        try:
            return _struct(data, 0)
        except IndexError:
            if len(data) < want:
                raise ValueError(f"a page header cut short at byte {at}") from None
            want *= 8


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _zigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


def _struct(data: bytes, at: int) -> tuple[dict, int]:
    fields, last = {}, 0
    while True:
        byte = data[at]
        at += 1
        if byte == 0:
            return fields, at
        kind, delta = byte & 0x0F, byte >> 4
        if delta:
            last += delta
        else:
            raw, at = _varint(data, at)
            last = _zigzag(raw)
        fields[last], at = _value(data, at, kind)


def _value(data: bytes, at: int, kind: int):
    """One Thrift compact value of this type (booleans, integers, binaries, lists, maps, structs)."""
    if kind in (1, 2):
        return kind == 1, at
    if kind == 3:
        return data[at], at + 1
    if kind in (4, 5, 6):
        raw, at = _varint(data, at)
        return _zigzag(raw), at
    if kind == 7:
        data[at + 7]  # noqa: B018 - a double, skipped (IndexError where it is cut short)
        return None, at + 8
    if kind == 8:
        length, at = _varint(data, at)
        if at + length > len(data):
            raise IndexError("binary cut short")
        return None, at + length  # statistics' min / max: not needed, skipped
    if kind in (9, 10):
        head = data[at]
        at += 1
        count, item = head >> 4, head & 0x0F
        if count == 15:
            count, at = _varint(data, at)
        items = []
        for _ in range(count):
            value, at = (data[at] == 1, at + 1) if item in (1, 2) else _value(data, at, item)
            items.append(value)
        return items, at
    if kind == 11:
        count, at = _varint(data, at)
        if count:
            types = data[at]
            at += 1
            for _ in range(count):
                _, at = _value(data, at, types >> 4)
                _, at = _value(data, at, types & 0x0F)
        return None, at
    if kind == 12:
        return _struct(data, at)
    raise ValueError(f"Thrift type {kind} in a page header")


def _hybrid(data: bytes, width: int, count: int) -> list[int]:
    """Definition levels in parquet's RLE / bit-packed hybrid encoding."""
    levels: list[int] = []
    at, mask, size = 0, (1 << width) - 1, (width + 7) // 8
    while len(levels) < count:
        header, at = _varint(data, at)
        if header & 1:  # bit-packed groups of 8
            groups = header >> 1
            bits = int.from_bytes(data[at:at + groups * width], "little")
            at += groups * width
            levels += [(bits >> (k * width)) & mask for k in range(groups * 8)]
        else:
            if at + size > len(data):
                raise IndexError("definition levels cut short")
            levels += [int.from_bytes(data[at:at + size], "little")] * (header >> 1)
            at += size
    return levels[:count]
