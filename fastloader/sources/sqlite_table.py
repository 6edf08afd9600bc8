"""A SQLite table of encoded images, one row a sample: a source that ships as an example of the
protocol and as a format people keep (one file, no small files, read with the standard library).

    train:
      source: fastloader.sources.sqlite_table:SQLiteSource
      source_args: {path: /data/train.sqlite, table: images}

The table has a name column (distinct), a blob of the encoded image and an integer label; the class
names are `classes` (a list), else the `<table>_classes(label, name)` table where there is one, else
the labels' numbers. Each process and thread opens the file read-only on its first read (sqlite3
connections are not shared across threads, nor across a fork), so DataLoader workers and DALI's feed
read it at once; its identity is the file's stamp (inode, size, mtime, and its write-ahead log's).
Each read takes the row's name and label with its image and checks them against what samples() gave
at that number: a table rebuilt or VACUUMed under a running loader (rows renumbered, or others at the
same rowids) stops the run, naming the table, rather than give another image under each label.
"""
from __future__ import annotations

import os
import re
import sqlite3
import threading
from typing import Sequence

import numpy as np

from ..errors import SourceChanged, SourceError
from .protocol import Samples

BUSY_S = 60.0
"""How long a read waits for another process's write lock (sqlite's busy timeout) before the run stops,
naming the database: a writer holds it for a transaction, not for minutes."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SQLiteSource:
    def __init__(self, path: str, table: str = "images", name_column: str = "name", image_column: str = "image",
                 label_column: str = "label", classes: Sequence[str] | None = None):
        for what, value in (("table", table), ("name_column", name_column), ("image_column", image_column),
                            ("label_column", label_column)):
            if not _NAME.fullmatch(value):
                raise ValueError(f"{what} {value!r} is not a plain SQL name (letters, digits and _)")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no such database file")
        self.path, self.table, self.classes = os.path.abspath(path), table, classes
        self.columns = name_column, image_column, label_column
        self.name = self.path
        self.rowids = np.zeros(0, dtype=np.int64)
        self.indexed: list[tuple[str, int]] = []
        """Each sample's (name, label) as samples() gave them: what each read checks its row against."""
        self._local = threading.local()

    def _connection(self) -> sqlite3.Connection:
        """This thread's read-only connection (a new one after a fork: the parent's is not the child's)."""
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            local.connection = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False,
                                               timeout=BUSY_S)
            local.pid = os.getpid()
        return local.connection

    def _query(self, sql: str, parameters: tuple = ()) -> list:
        """The rows of a query; a lock another process held for all of BUSY_S, named with what to do."""
        try:
            return self._connection().execute(sql, parameters).fetchall()
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) and "busy" not in str(error):
                raise
            raise SourceError(f"{self.path}: the database is locked by another process's write for more than "
                              f"{BUSY_S:g} s (sqlite: {error}): let the writer finish or stop it (`fuser "
                              f"{self.path}` names it), or read a copy of the database") from None

    def samples(self) -> Samples:
        names, labels = self._keys()
        return Samples(names, labels, self._class_names(labels))

    def _keys(self) -> tuple[list[str], list[int]]:
        """Each row's name and label, in rowid order, kept as what each read checks its row against."""
        name, _, label = self.columns
        rows = self._query(f"SELECT rowid, {name}, {label} FROM {self.table} ORDER BY rowid")
        self.rowids = np.array([row[0] for row in rows], dtype=np.int64)
        names, labels = [row[1] for row in rows], [row[2] for row in rows]
        self.indexed = list(zip(names, labels))
        return names, labels

    def _class_names(self, labels: Sequence[int]) -> list[str]:
        if self.classes is not None:
            return list(self.classes)
        try:
            rows = self._query(f"SELECT label, name FROM {self.table}_classes ORDER BY label")
        except sqlite3.OperationalError:  # no such table: the labels' numbers
            return [str(label) for label in range(max(labels, default=-1) + 1)]
        return [name for _, name in rows]

    def read(self, item: int) -> bytes:
        name, image, label = self.columns
        if not self.indexed:  # read before samples(): the rows as they are now are the ones checked against
            self._keys()
        rowid = int(self.rowids[item])
        found = self._query(f"SELECT {image}, {name}, {label} FROM {self.table} WHERE rowid = ?", (rowid,))
        row = found[0] if found else None
        if row is None or (row[1], row[2]) != self.indexed[item]:
            now = "no row" if row is None else f"{row[1]!r} (label {row[2]})"
            was, was_label = self.indexed[item]
            raise SourceChanged(f"{self.path}: table {self.table}'s row {rowid} holds {now} now, and held {was!r} "
                                f"(label {was_label}) when the loader was built: the table was rewritten (a rebuild, "
                                f"a VACUUM) under the running loader, so its rows would be read under other samples' "
                                f"labels. Build a new loader (or keep the table unchanged while a loader reads it)")
        return row[0]

    def __len__(self) -> int:
        return self._query(f"SELECT count(*) FROM {self.table}")[0][0]

    def identity(self) -> str:
        stamps = []
        for path in (self.path, f"{self.path}-wal"):
            try:
                info = os.stat(path)
            except FileNotFoundError:
                continue
            stamps.append(f"{info.st_ino}:{info.st_size}:{info.st_mtime_ns}")
        return "/".join(stamps)

    def __getstate__(self) -> dict:
        return {key: value for key, value in self.__dict__.items() if key != "_local"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._local = threading.local()


def write_table(path: str, rows: Sequence[tuple[str, bytes, int]], classes: Sequence[str] = (),
                table: str = "images") -> None:
    """A database of (name, encoded image, label) rows and its class names, as SQLiteSource reads it
    (for tests, benchmarks and the docs' example)."""
    with sqlite3.connect(path) as connection:
        connection.execute(f"CREATE TABLE {table} (name TEXT UNIQUE NOT NULL, image BLOB NOT NULL, label INTEGER)")
        connection.executemany(f"INSERT INTO {table} (name, image, label) VALUES (?, ?, ?)", rows)
        if classes:
            connection.execute(f"CREATE TABLE {table}_classes (label INTEGER PRIMARY KEY, name TEXT)")
            connection.executemany(f"INSERT INTO {table}_classes VALUES (?, ?)", list(enumerate(classes)))
    connection.close()
