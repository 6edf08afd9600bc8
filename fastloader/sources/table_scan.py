"""What scanning one parquet or Arrow file gives the index: each row's image bytes and label
(TableScan), or why the file cannot be read (Unreadable). Its own module so that the scans of both
formats (parquet_pages.py, arrow_file.py) and the index built from them (parquet.py) share it."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..locations import Identity


class Unreadable(Exception):
    """A table file that cannot be indexed (cut short, unreadable): named under dataset.on_bad_image."""


class TableScan(NamedTuple):
    """One file's rows: each row's image byte range (start -1: null bytes), or for a row of compressed
    pages its row group's image column chunk (table_row 1 + its row); its label or None; the file's
    class names (ClassLabel) where its metadata has them. What the file says, whatever the config's
    dataset.classes: the scan is cached per file, and names are resolved per build."""
    start: np.ndarray
    length: np.ndarray
    labels: list
    class_names: tuple[str, ...] | None
    identity: Identity
    table_row: np.ndarray
    column: str | None = None
    """The image column's parquet leaf path (`image.bytes`) where rows are read by row group."""
    label_column: str = "label"
    """The label column's name, for messages."""
    paths: list | None = None
    """Each row's image `path` where its bytes are null (Hugging Face's Image feature, as `datasets`
    writes rows cast from file paths: {bytes: null, path: ...}), else None; None: no such column."""
