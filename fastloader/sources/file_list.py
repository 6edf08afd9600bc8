"""A split's file list: lines of `relative/path label`, relative to dataset.root.

Each path is normalized as it is read (`./a//b` is `a/b`; an absolute path under dataset.root is made
relative to it; one outside stays absolute), so that one file has one name: the name a weights file,
dataset.exclude and the other sources of a split (sources/multi.py) know it by. A file named on two
lines is refused, since it would be two samples of one file (weigh it with `<split>.weights`)."""
from __future__ import annotations

import logging
import os
from array import array
from typing import Sequence

import numpy as np

from ..errors import ConfigError
from ..locations import not_regular, open_regular
from ..samples import IndexBuilder, SampleIndex, label_problem
from ..words import plural

log = logging.getLogger("fastloader")


def read_file_list(list_path: str, root: str, classes: Sequence[str] | None = None,
                   excluded: frozenset[str] = frozenset(), key: str = "",
                   weights_key: str = "<split>.weights") -> SampleIndex:
    """Lines of `relative/path label` (label an integer; paths may hold spaces; '#' starts a comment).
    `key` and `weights_key` are the config keys that messages name (`train.sources[1].file_list`)."""
    where = f"{key}: " if key else ""
    if not os.path.isfile(list_path):
        what = not_regular(os.stat(list_path).st_mode) if os.path.exists(list_path) else "does not exist"
        raise ConfigError(f"{where}file list {list_path!r}: {what}; fix {key or 'the file_list key'}")
    folders, normpath = _root_folders(root), os.path.normpath
    builder = IndexBuilder()
    hashes = array("q")  # each sample's name's hash: a name given twice is found by sorting them
    skipped = 0
    with open(open_regular(list_path), encoding="utf-8") as handle:  # replaced by a FIFO since: refused, not waited on
        for number, line in enumerate(handle, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.rsplit(None, 1)
            if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
                raise ConfigError(f"{where}{list_path}:{number}: expected 'relative/path label', got {line!r}")
            label = int(parts[1])
            problem = label_problem(label, classes)
            if problem:
                raise ConfigError(f"{where}{list_path}:{number}: {problem}")
            name = normpath(parts[0])  # one name a file: `./a//b` is `a/b`
            if name[:1] == os.sep:
                name = _under(name, folders)
            if name in excluded or (name[:1] == os.sep and os.path.relpath(name, root) in excluded):
                skipped += 1
            else:
                builder.add(name, label)
                hashes.append(hash(name))
    if not len(builder):
        raise ConfigError(f"{where}file list {list_path!r} holds no samples")
    index = builder.build(root, classes if classes is not None else
                          [str(i) for i in range(int(builder.labels().max()) + 1)], excluded=skipped)
    repeat = _first_repeat(index, np.frombuffer(hashes, dtype=np.int64))
    if repeat is not None:
        name = index.relpath(repeat)
        first, again = _lines_naming(list_path, name, folders)
        raise ConfigError(f"{where}{list_path}:{again}: names {name!r} again (first on line {first}), so one file "
                          f"would be two samples; remove one of the two lines, or weigh the file with {weights_key}")
    if skipped:
        log.info("file list %s: %s, %d left out by dataset.exclude", list_path, plural(len(index), "sample"), skipped)
    return index


def _root_folders(root: str) -> tuple[str, ...]:
    """dataset.root as an absolute path and as its real path (one realpath a list, none a line), each
    ending in '/': an absolute path under either is made relative to it."""
    return tuple(os.path.join(folder, "") for folder in dict.fromkeys((os.path.abspath(root), os.path.realpath(root))))


def _under(path: str, folders: tuple[str, ...]) -> str:
    """An absolute path relative to the first of `folders` it is under; as it is if none."""
    folder = next((folder for folder in folders if path.startswith(folder)), None)
    return path[len(folder):] if folder is not None else path


def _lines_naming(list_path: str, name: str, folders: tuple[str, ...]) -> tuple[int, int]:
    """The first two lines of the list that name `name` (read again: the list is refused, so no line
    number was kept per sample)."""
    found = []
    with open(open_regular(list_path), encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            line = line.strip()
            if line and not line.startswith("#"):
                path = os.path.normpath(line.rsplit(None, 1)[0])
                if (_under(path, folders) if path[:1] == os.sep else path) == name:
                    found.append(number)
                    if len(found) == 2:
                        break
    return found[0], found[1]


def _first_repeat(index: SampleIndex, hashes: np.ndarray) -> int | None:
    """The first sample whose name an earlier sample has, or None: found by sorting the names' hashes
    (8 bytes a sample, not a set of a million strings), each run of one hash then checked by its names
    (the same name, or rarely a collision)."""
    order = np.argsort(hashes, kind="stable")
    ordered = hashes[order]
    found: int | None = None
    for value in np.unique(ordered[1:][ordered[1:] == ordered[:-1]]):
        run = order[np.searchsorted(ordered, value):np.searchsorted(ordered, value, side="right")]
        names: set[str] = set()
        for sample in run.tolist():  # in index order: the sort is stable
            name = index.relpath(sample)
            if name in names and (found is None or sample < found):
                found = sample
            names.add(name)
    return found
