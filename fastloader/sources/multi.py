"""Several sources in one split (`<split>.sources`): each source indexed by its format's module as a
split of its own (so bad files and dataset.exclude work per source as they do for a split), then the
indexes concatenated into one SampleIndex.

Names stay unique and say which source a sample is from: each is prefixed by its source's root
relative to the sources' common folder (`imagenet/train/n01/x.JPEG`, `extra/train/cat/y.jpg`), so
the index's fingerprint, and so a loader state, changes with the sources. Two sources in the same
folder keep their names, and may not hold the same sample (nor may a folder and a link to it, nor a
file list and any other source: _refuse_shared_samples). Labels are remapped into one class list:
a `shared` source's class names are the split's (a name the others lack is appended), an `own`
source's classes are appended after the others, named `<source name>/<class>`. Which source each
sample is from is kept (`SampleIndex.entry`), for the sources' weights (fastloader/weights.py).

A source of the user's own among them (`source: package.module:factory`) joins through the Source
protocol instead (JoinedSource): every source is then a Source (a built-in format's, its index as
an IndexedSource), the split's samples are theirs named `<source name>/<name>`, and each read asks
the source that holds the sample. Its files are not screened at build, as a user's source's are not.
"""
from __future__ import annotations

import bisect
import dataclasses
import logging
import os
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import ConfigError
from ..samples import ByteRanges, SampleIndex
from ..schema import Config, SourceConfig, SplitConfig
from ..words import plural
from .urls import is_url
from .user_source import three_parts

log = logging.getLogger("fastloader")

IndexSource = Callable[[Config, SplitConfig, SourceConfig], SampleIndex]
"""(config, the source as a split of its own, the source) -> its index: formats.py chooses the format."""


def source_name(source: SourceConfig, number: int) -> str:
    """What logs and own class names call a source: its `name`, else source<k>."""
    return source.name or f"source{number}"


def source_key(split: SplitConfig, number: int) -> str:
    """The config key of a split's source, `train.sources[1]`, for messages."""
    return f"{split.name}.sources[{number}]"


@dataclasses.dataclass(frozen=True)
class SourceSplit(SplitConfig):
    """A source as a split of its own (source_split), named by its key, `train.sources[1]`, so that its
    indexer's messages name `train.sources[1].files`; `of` is the split it is a source of, whose keys
    (shuffle, block_size, the weights) set the order its samples are read in."""
    of: SplitConfig | None = None


def source_split(split: SplitConfig, number: int) -> SourceSplit:
    """A source as a split of its own, named by its key, so that every message of its indexer names
    `train.sources[1].shards` rather than a key the config does not have."""
    source = split.sources[number]
    fields = {field.name: getattr(split, field.name) for field in dataclasses.fields(SplitConfig)}
    return SourceSplit(**{**fields, "name": source_key(split, number), "folder": source.folder,
                          "file_list": source.file_list, "shards": source.shards, "files": source.files,
                          "source": source.source, "source_args": source.source_args, "sources": None}, of=split)


def order_split(split: SplitConfig) -> SplitConfig:
    """The split whose keys (shuffle, block_size, weights) set `split`'s order: itself, or the split a
    source is of, so that advice about the order names keys the config has (`train.shuffle`)."""
    return split.of if isinstance(split, SourceSplit) and split.of is not None else split


def files_format_key(split: SplitConfig) -> str:
    """The key that says the format of a split's files: dataset.format, or a source's own `format`."""
    return f"{split.name}.format" if isinstance(split, SourceSplit) else "dataset.format"


def index_sources(config: Config, split: SplitConfig, index_source: IndexSource) -> SampleIndex:
    """The split's sources, each indexed by `index_source`, as one index."""
    parts = [index_source(config, source_split(split, number), source) for number, source in enumerate(split.sources)]
    combined = combine(split, parts)
    for number, (source, part) in enumerate(zip(split.sources, parts)):
        weight = f", weight {source.weight:g}" if source.weight is not None else ""
        log.info("split '%s', source %r (%s): %s in %s (%s classes)%s", split.name, source_name(source, number),
                 source_key(split, number), plural(len(part), "sample"), part.root, source.classes, weight)
    log.info("split '%s': %s from %s, %s", split.name, plural(len(combined), "sample"),
             plural(len(parts), "source"), plural(len(combined.classes), "class"))
    return combined


def combine(split: SplitConfig, parts: Sequence[SampleIndex]) -> SampleIndex:
    """The sources' indexes as one: names prefixed, labels remapped, byte ranges concatenated."""
    kinds = [part.ranges is not None for part in parts]
    if any(kinds) and not all(kinds):
        files, container = kinds.index(False), kinds.index(True)
        what = "tar shards" if split.sources[container].shards is not None else "parquet or Arrow files"
        raise ConfigError(f"{source_key(split, files)} reads image files and {source_key(split, container)} {what}: "
                          f"the sources of one split are all image files (folders, file lists) or all containers "
                          f"(tar shards, parquet or Arrow files). Pack the image files into shards with `fastloader "
                          f"pack`, or read them as a split of their own")
    classes, labels = _classes(split, [(part.classes, part.labels) for part in parts])
    root, prefixes = _common_folder([part.root for part in parts])
    _refuse_shared_samples(split, parts, prefixes)
    path_bytes, offsets = _names(parts, prefixes)
    names = tuple(source_name(source, number) for number, source in enumerate(split.sources))
    return SampleIndex(root=root, classes=classes, path_bytes=path_bytes, offsets=offsets,
                       labels=np.concatenate(labels), excluded=sum(part.excluded for part in parts),
                       ranges=_ranges([part.ranges for part in parts]) if all(kinds) else None,
                       unusable=tuple(item for part in parts for item in part.unusable),
                       entry=np.repeat(np.arange(len(parts), dtype=np.int16), [len(part) for part in parts]),
                       entry_names=names)


def _classes(split: SplitConfig, parts: Sequence[tuple[Sequence[str], np.ndarray]]
             ) -> tuple[tuple[str, ...], list[np.ndarray]]:
    """(the split's class names, each source's labels in them), from each source's (classes, labels):
    shared names once, in the order the sources bring them; own classes appended as `<source name>/<class>`."""
    classes: list[str] = []
    where: dict[str, int] = {}
    labels = []
    for number, (source, (part_classes, part_labels)) in enumerate(zip(split.sources, parts)):
        names = part_classes if source.classes == "shared" else \
            [f"{source_name(source, number)}/{name}" for name in part_classes]
        table = np.empty(len(names), dtype=np.int64)
        for label, name in enumerate(names):
            if name not in where:
                where[name] = len(classes)
                classes.append(name)
            table[label] = where[name]
        labels.append(table[part_labels] if len(part_labels) else np.asarray(part_labels, dtype=np.int64))
    return tuple(classes), labels


class JoinedSource:
    """A split's `sources` as one Source, where one of them is a user's: each source's samples,
    named `<source name>/<name>`, labels mapped into the split's classes; read(item) asks the source
    that holds the sample (samples() is asked first where it was not)."""

    def __init__(self, split: SplitConfig, sources: Sequence[Any]):
        self.split, self.sources = split, list(sources)
        self.name = f"{split.name}.sources"
        self.starts: list[int] | None = None
        """Where each source's samples begin among the split's (and the total, last)."""

    def samples(self) -> tuple[list[str], np.ndarray, tuple[str, ...]]:
        given = [three_parts(source.samples(), f"{source_key(self.split, number)}: samples()")
                 for number, source in enumerate(self.sources)]
        classes, labels = _classes(self.split, [(part_classes, np.asarray(part_labels, dtype=np.int64))
                                                for _, part_labels, part_classes in given])
        names = [f"{source_name(entry, number)}/{name}" for number, (entry, (part_names, _, _))
                 in enumerate(zip(self.split.sources, given)) for name in part_names]
        self.starts = np.cumsum([0, *(len(part_names) for part_names, _, _ in given)]).tolist()
        return names, np.concatenate(labels), classes

    def read(self, item: int) -> Any:
        if self.starts is None:
            self.samples()
        number = bisect.bisect_right(self.starts, item) - 1
        return self.sources[number].read(item - self.starts[number])

    def identity(self) -> str:
        return "|".join(str(source.identity()) for source in self.sources)

    def __len__(self) -> int:
        if self.starts is None:
            self.samples()
        counts = [len(source) if hasattr(source, "__len__") else end - start  # no length: as it was indexed
                  for source, start, end in zip(self.sources, self.starts, self.starts[1:])]
        return sum(counts)

    def numbered(self, index: SampleIndex) -> SampleIndex:
        """The split's index with each sample's entry number (`entry`, for the sources' weights)."""
        numbers = np.searchsorted(np.asarray(self.starts), index.items, side="right") - 1
        names = tuple(source_name(entry, number) for number, entry in enumerate(self.split.sources))
        return dataclasses.replace(index, entry=numbers.astype(np.int16), entry_names=names)


def _common_folder(roots: Sequence[str]) -> tuple[str, list[str]]:
    """(the folder the roots share, each root's rest): cut at '/', never normalized, so that a
    remote root (`s3://bucket/train`) stays as it is written."""
    split = [root.rstrip("/").split("/") if root.strip("/") else [""] for root in roots]
    shared = 0
    while all(len(parts) > shared for parts in split) and len({parts[shared] for parts in split}) == 1:
        shared += 1
    common = "/".join(split[0][:shared])
    if shared == 1 and common == "":
        common = "/"
    rests = ["/".join(parts[shared:]) for parts in split]
    return common, rests


def _names(parts: Sequence[SampleIndex], prefixes: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """The samples' names, each source's prefixed by its folder under the common one (a name that is
    an absolute path is kept whole), as one byte buffer and its offsets."""
    pieces, lengths = [], []
    for part, prefix in zip(parts, prefixes):
        data = part.path_bytes.tobytes()
        bounds = part.offsets.tolist()
        if not prefix:
            pieces.append(data)
            lengths.append(np.diff(part.offsets))
            continue
        head = prefix.encode("utf-8", "surrogateescape") + b"/"
        names = [data[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        joined = [name if name.startswith(b"/") else head + name for name in names]
        pieces.append(b"".join(joined))
        lengths.append(np.fromiter(map(len, joined), dtype=np.int64, count=len(joined)))
    offsets = np.zeros(sum(len(length) for length in lengths) + 1, dtype=np.int64)
    np.cumsum(np.concatenate(lengths) if lengths else np.zeros(0, np.int64), out=offsets[1:])
    return np.frombuffer(b"".join(pieces), dtype=np.uint8), offsets


def _refuse_shared_samples(split: SplitConfig, parts: Sequence[SampleIndex], prefixes: Sequence[str]) -> None:
    """One file in two sources would be two samples under two names (or one name for two samples: its
    weight, a state's fingerprint), so a sample in two sources is refused.

    Sources are compared by where their files really are: each source's root by its real path (one
    realpath per source, so a folder and a link to it are one folder), each file as that plus its name.
    Sources whose real roots nest (the same folder, or one inside the other) are compared, and a file
    list with every other source (its lines may name files anywhere: absolute, or `../`); sources in
    folders apart cannot hold one file, and are not. A file reached through a link below a root (a
    link in a folder tree, or a file list's line through a linked folder) is not found so: that would
    take a realpath per file."""
    roots = [part.root if is_url(part.root) else os.path.realpath(part.root) for part in parts]
    lists = [source.file_list is not None for source in split.sources]
    compared = sorted({number for number, root in enumerate(roots) for other, rest in enumerate(roots)
                       if other != number and (lists[number] or lists[other] or _nested(root, rest))})
    seen: dict[bytes, tuple[int, bytes]] = {}  # where a file is -> (the first source holding it, its name there)
    for number in compared:
        part, head = parts[number], os.path.join(roots[number], "").encode("utf-8", "surrogateescape")
        data, bounds = part.path_bytes.tobytes(), part.offsets.tolist()
        for a, b in zip(bounds[:-1], bounds[1:]):
            name = data[a:b]
            where = name if name[:1] == b"/" else head + name
            if name[:2] == b"..":  # a file list's `../x`, normalized against its root
                where = os.path.normpath(where)
            first, first_name = seen.setdefault(where, (number, name))
            if first != number:
                held, again = _shown(prefixes[first], first_name), _shown(prefixes[number], name)
                also = f" ({source_key(split, number)} names it {again!r})" if again != held else ""
                raise ConfigError(f"{source_key(split, first)} and {source_key(split, number)} both hold {held!r}"
                                  f"{also}: a sample may be in one source only. Remove it from one of them, or weigh "
                                  f"it with {split.name}.weights instead")


def _nested(root: str, other: str) -> bool:
    """Whether two roots are one folder, or one is inside the other."""
    return root == other or root.startswith(os.path.join(other, "")) or other.startswith(os.path.join(root, ""))


def _shown(prefix: str, name: bytes) -> str:
    """A source's sample as the joined index names it: prefixed by its folder (an absolute path whole)."""
    text = name.decode("utf-8", "surrogateescape")
    return text if not prefix or text[:1] == "/" else f"{prefix}/{text}"


def _ranges(ranges: Sequence[ByteRanges]) -> ByteRanges:
    """The sources' byte ranges as one: containers listed one source after the other, each sample's
    container number moved along; per-container fields (tuples) and per-sample ones (arrays) joined,
    those a source lacks filled with 'not checked' (None, 0)."""
    moved, at = [], 0
    for part in ranges:
        moved.append(part.file.astype(np.int64) + at)
        at += len(part.files)
    values = {}
    for field in dataclasses.fields(ByteRanges):
        given = [getattr(part, field.name) for part in ranges]
        if field.name == "file":
            values["file"] = np.concatenate(moved).astype(np.int32)
        elif all(value is None for value in given):
            values[field.name] = None
        elif isinstance(next(value for value in given if value is not None), tuple):  # one per container
            values[field.name] = tuple(item for part, value in zip(ranges, given)
                                       for item in (value if value is not None else (None,) * len(part.files)))
        else:  # one per sample
            values[field.name] = np.concatenate([value if value is not None else np.zeros(len(part.file), np.int64)
                                                 for part, value in zip(ranges, given)])
    return ByteRanges(**values)
