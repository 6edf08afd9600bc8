"""The formats of dataset.format, each registered by its own module: what opens a split of it as a
Source, and what the rest of fastloader needs to know of it without importing it (which split keys
say where its samples are, whether they are byte ranges of container files, whether those may be in
an object store, whether it needs dataset.root).

A format of one's own is one module with one registration:

    register_format(Format("lines", open=open_lines_split))

after which `dataset.format: lines` reads each split with `open_lines_split(config, split)` (its
arguments in `<split>.source_args`). The built-in formats register the same way (folder.py,
webdataset.py, parquet.py); formats.py imports them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..samples import SampleIndex
from ..schema import Config, SplitConfig
from ..units import parse_size
from . import remote
from .protocol import Samples, Source
from .reading import read_bytes
from .stores import StoreSettings
from .urls import is_url


@dataclass(frozen=True)
class Format:
    name: str
    """dataset.format's value."""
    open: Callable[[Config, SplitConfig], Source]
    """(config, split) -> the split's source."""
    keys: tuple[str, ...] = ()
    """The split keys that say where its samples are (`shards`), for messages ("check train.shards")."""
    containers: bool = False
    """Its samples are byte ranges of container files (tar shards, parquet files): `shuffle: block`
    groups them, and the node cache keeps those in an object store."""
    remote: bool = False
    """Its files may be in an object store (dataset.root or its keys' paths may be URLs)."""
    needs_root: bool = True
    """Its splits are found under dataset.root; False: they name their own files (dataset.root may be
    left out, and is then the config's folder)."""
    args: bool = False
    """It reads `<split>.source_args` (a format of the user's: its own keys); the built-ins have keys
    of the schema, and refuse them."""


FORMATS: dict[str, Format] = {}
"""dataset.format's choices, in the order they were registered."""


def register_format(format: Format) -> Format:
    """Make `format` a choice of dataset.format. A name taken by another format is refused (the same
    module registering again, as on a reload, is not)."""
    taken = FORMATS.get(format.name)
    if taken is not None and taken.open.__qualname__ != format.open.__qualname__:
        raise ValueError(f"dataset.format {format.name!r} is already registered (by {taken.open.__module__}); "
                         f"choose another name")
    FORMATS[format.name] = format
    return format


class IndexedSource:
    """A built-in format's source: its SampleIndex, whose Locations say where each sample's bytes lie
    (a file, a shard member's byte range, a parquet row). formats.build_index takes `index` as it
    is, so the built-ins keep their ranged reads, checks and containers."""

    def __init__(self, index: SampleIndex):
        self.index = index
        self.name = index.root

    def samples(self) -> Samples:
        return Samples([self.index.relpath(i) for i in range(len(self.index))], self.index.labels, self.index.classes)

    def read(self, item: int) -> bytearray | memoryview:
        return read_bytes(self.index.location(item))

    def identity(self) -> str:
        return self.index.fingerprint

    def __len__(self) -> int:
        return len(self.index)


def indexed(index_split: Callable[[Config, SplitConfig], SampleIndex]) -> Callable[[Config, SplitConfig], Source]:
    """A format's index function as its `open`: the split's index, as an IndexedSource."""
    def open_split(config: Config, split: SplitConfig) -> Source:
        return IndexedSource(index_split(config, split))
    open_split.__qualname__ = f"indexed({index_split.__module__}.{index_split.__qualname__})"
    return open_split


def store_settings(config: Config) -> StoreSettings:
    """dataset.remote as the formats' stores take it (parsed once, where a split is prepared)."""
    settings = config.dataset.remote
    limit = parse_size(settings.cache_limit, "dataset.remote.cache_limit") if settings.cache_limit else None
    return StoreSettings(remote.Settings(settings.options, settings.timeout, settings.retries, settings.retry_timeout),
                         settings.cache_dir, limit, settings.concurrency)


def client_of(config: Config) -> remote.Client:
    """The store client of the config's dataset.remote: what lists and stats a split's objects."""
    return remote.client_for(store_settings(config).client)


def reads_a_store(config: Config, split: SplitConfig) -> bool:
    """Whether the split names anything in an object store: its shards or files, its sources', or a
    dataset.root that is a URL."""
    patterns = [*(split.shards or ()), *(split.files or ())]
    for source in split.sources or ():
        patterns += [*(source.shards or ()), *(source.files or ())]
    return is_url(config.dataset.root) or any(is_url(pattern) for pattern in patterns)
