"""A split's file list: lines of `relative/path label`, relative to dataset.root.

A label is an integer (a position in dataset.classes, else 0 .. the largest label) or a class name
(`n04243546/x.JPEG n04243546`): a name of dataset.classes where it is set, else the list names the
classes itself, sorted as folders are, together with the names the config's other file lists give,
so that a val list without one of train's classes does not shift every label after it.

Each path is normalized as it is read (`./a//b` is `a/b`; an absolute path under dataset.root is made
relative to it; one outside stays absolute), so that one file has one name: the name a weights file,
dataset.exclude and the other sources of a split (sources/multi.py) know it by. A file named on two
lines is refused, since it would be two samples of one file (weigh it with `<split>.weights`)."""
from __future__ import annotations

import dataclasses
import difflib
import logging
import os
from array import array
from typing import Sequence

import numpy as np

from ..errors import ConfigError
from ..locations import not_regular, open_regular
from ..samples import IndexBuilder, SampleIndex, label_problem
from ..schema import IMAGE_EXTENSIONS
from ..words import plural

log = logging.getLogger("fastloader")


EXPECTED = "expected 'relative/path label' (the label an integer or a class name)"
"""What a line of a file list is, in the words of its messages and of docs/config.md."""


def read_file_list(list_path: str, root: str, classes: Sequence[str] | None = None,
                   excluded: frozenset[str] = frozenset(), key: str = "",
                   weights_key: str = "<split>.weights", other_lists: Sequence[str] = ()) -> SampleIndex:
    """Lines of `relative/path label` (the label an integer or a class name; paths may hold spaces;
    '#' starts a comment). `key` and `weights_key` are the config keys that messages name
    (`train.sources[1].file_list`). `other_lists`: the config's other file lists, whose class names
    join this list's where it names its classes (without dataset.classes)."""
    where = f"{key}: " if key else ""
    if not os.path.isfile(list_path):
        what = not_regular(os.stat(list_path).st_mode) if os.path.exists(list_path) else "does not exist"
        raise ConfigError(f"{where}file list {list_path!r}: {what}; fix {key or 'the file_list key'}")
    folders, normpath = _root_folders(root), os.path.normpath
    builder = IndexBuilder()
    hashes = array("q")  # each sample's name's hash: a name given twice is found by sorting them
    skipped = 0
    labels = _Labels(classes, f"{where}{list_path}")
    with open(open_regular(list_path), encoding="utf-8") as handle:  # replaced by a FIFO since: refused, not waited on
        for number, line in enumerate(handle, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.rsplit(None, 1)
            if len(parts) != 2:
                raise ConfigError(f"{where}{list_path}:{number}: {EXPECTED}, got {line!r}")
            label = labels.of(parts[1], number, line)
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
    index = labels.index(builder, root, skipped, other_lists)
    repeat = _first_repeat(index, np.frombuffer(hashes, dtype=np.int64))
    if repeat is not None:
        name = index.relpath(repeat)
        first, again = _lines_naming(list_path, name, folders)
        raise ConfigError(f"{where}{list_path}:{again}: names {name!r} again (first on line {first}), so one file "
                          f"would be two samples; remove one of the two lines, or weigh the file with {weights_key}")
    if skipped:
        log.info("file list %s: %s, %d left out by dataset.exclude", list_path, plural(len(index), "sample"), skipped)
    return index


class _Labels:
    """A list's labels as it is read: integers, or class names (of `classes`, else named by the list)."""

    def __init__(self, classes: Sequence[str] | None, where: str):
        self.classes, self.where = classes, where
        self.positions = {name: position for position, name in enumerate(classes)} if classes is not None else {}
        self.named: dict[str, int] = {}  # without dataset.classes: the list's names, in the order first read
        self.first_integer = self.first_name = 0  # the line of each kind's first label

    def of(self, word: str, number: int, line: str) -> int:
        """The label a line's last word gives, or ConfigError naming the line and the fix."""
        if word.lstrip("-").isdigit():
            label = int(word)
            problem = label_problem(label, self.classes)
            if problem:
                raise ConfigError(f"{self.where}:{number}: {problem}")
            self.first_integer = self.first_integer or number
        elif not _is_class_name(word):
            raise ConfigError(f"{self.where}:{number}: {EXPECTED}, got {line!r}, whose last word is a file, not a "
                              f"label: add the label after the path")
        elif self.classes is not None:
            if word not in self.positions:
                close = difflib.get_close_matches(word, list(self.positions), n=1)
                hint = f" (closest: {close[0]!r})" if close else ""
                raise ConfigError(f"{self.where}:{number}: class {word!r} is not in dataset.classes{hint}; fix the "
                                  f"label, or add the class to dataset.classes")
            label = self.positions[word]
        else:
            label = self.named.setdefault(word, len(self.named))
            self.first_name = self.first_name or number
        if self.classes is None and self.first_integer and self.first_name:
            raise ConfigError(f"{self.where}:{max(self.first_integer, self.first_name)}: line {self.first_integer} "
                              f"gives an integer label and line {self.first_name} a class name: without "
                              f"dataset.classes a list gives one kind; write every label as a class name, or set "
                              f"dataset.classes (integers are then positions in it)")
        return label

    def index(self, builder: IndexBuilder, root: str, skipped: int, other_lists: Sequence[str]) -> SampleIndex:
        """The samples read, with their classes: dataset.classes, the names of this and the other lists
        sorted, or 0 .. the largest integer label."""
        if self.classes is not None:
            return builder.build(root, self.classes, excluded=skipped)
        if not self.named:
            return builder.build(root, [str(i) for i in range(int(builder.labels().max()) + 1)], excluded=skipped)
        names = sorted(set(self.named).union(*(_class_names_in(path) for path in other_lists)))
        index = builder.build(root, names, excluded=skipped)
        position = np.array([names.index(name) for name in self.named], dtype=np.int64)
        return dataclasses.replace(index, labels=position[index.labels])


def _class_names_in(list_path: str) -> set[str]:
    """The class names another file list gives (none where it gives integers or cannot be read: it
    is refused when its own split is built)."""
    names: set[str] = set()
    try:
        with open(open_regular(list_path), encoding="utf-8") as handle:
            for line in handle:
                parts = line.strip().rsplit(None, 1)
                if len(parts) == 2 and not parts[0].startswith("#") and _is_class_name(parts[1]):
                    names.add(parts[1])
    except (OSError, UnicodeDecodeError):
        return set()
    return names


def _is_class_name(word: str) -> bool:
    """A line's last word that names a class: no integer, and no file (`x.jpg`, `a/b`: a line without a label)."""
    return not word.lstrip("-").isdigit() and "/" not in word and not word.lower().endswith(IMAGE_EXTENSIONS)


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
