"""A split's source, and its index: the one place a split's samples are chosen from.

A split reads one of: the source object a caller gives (`build_loader(..., source=obj)`), its own
`source: package.module:factory`, its `sources` (several, joined), or dataset.format's registered
format. Whichever it is, it is a Source (protocol.py); a built-in format's (registry.IndexedSource)
hands over its index with its byte ranges, any other is indexed from its `samples()`
and read through its `read()` (user_source.py). A split held out of another (`held_out`) reads a
seeded share of that split's samples, which the other split leaves out (holdout.py).

Importing this module registers the built-in formats (their modules register themselves).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import ConfigError
from ..samples import SampleIndex
from ..schema import Config, SourceConfig, SplitConfig
from . import folder, holdout, multi, parquet, webdataset  # noqa: F401  (each registers its formats)
from .registry import FORMATS, Format, IndexedSource, reads_a_store, store_settings
from .stores import release_store
from .user_source import from_factory, index_of, named_source


def split_source(config: Config, split: SplitConfig, given: object | None = None, store: str = "") -> object:
    """The split's source: `given` (checked against the protocol), its `source` factory's, its
    `sources` joined (through the protocol where one is a user's), or its format's. `store`: the
    node cache's token the indexes of a store's shards carry."""
    if given is not None:
        return named_source(given, "build_loader(source=...)")
    if split.source is not None:
        return from_factory(config, split)
    if split.sources is not None and any(entry.source is not None for entry in split.sources):
        return multi.JoinedSource(split, [_entry_source(config, split, number, store)
                                          for number in range(len(split.sources))])
    if split.sources is not None:
        return IndexedSource(multi.index_sources(config, split, index_source))
    return split_format(config).open(config, split)


def _entry_source(config: Config, split: SplitConfig, number: int, store: str) -> object:
    """One of a split's sources as a Source: a user's from its factory, a built-in format's index."""
    entry, as_split = split.sources[number], multi.source_split(split, number)
    if entry.source is not None:
        return from_factory(config, as_split)
    index = index_source(config, as_split, entry)
    return IndexedSource(dataclasses.replace(index, store=store) if store else index)


def build_index(config: Config, split: SplitConfig, given: object | None = None) -> SampleIndex:
    """The split's samples, names, labels and where their bytes are (split_source's, indexed). A
    split that names objects in a store opens its node cache first, with the config's
    dataset.remote: the index carries the cache's token (`store`), which the loader releases when
    it closes. A split held out of another (`held_out`) is its share of that split's samples, and a
    split others are held out of reads the rest (holdout.py)."""
    if split.held_out is not None:
        if given is not None:
            raise ConfigError(f"{config.origin(f'{split.name}.held_out')}: split '{split.name}' is held out of split "
                              f"'{split.held_out.of}' ({split.name}.held_out), so it reads no source of its own; "
                              f"build it without source=, or remove {split.name}.held_out")
        whole = _whole_index(config, config.split(split.held_out.of))
        chosen = holdout.part_of
    else:
        whole = _whole_index(config, split, given)
        chosen = holdout.rest_of
    try:
        return chosen(holdouts(config), split.name, whole)
    except BaseException:
        release_store(whole.store)
        raise


def held_out_of(config: Config, split: SplitConfig) -> SampleIndex | None:
    """The samples other splits hold out of `split` (None where none does): what a file written for
    the split's whole folder (its weights) may name beside the split's own samples."""
    if not any(other.of == split.name for other in holdouts(config)):
        return None
    whole = _whole_index(config, split)
    try:
        chosen = holdout.held_out(holdouts(config), split.name, whole)
        return whole.take(np.sort(np.concatenate(list(chosen.values()))))
    finally:
        release_store(whole.store)


def holdouts(config: Config) -> list[holdout.Holdout]:
    """The config's held-out splits (`<split>.held_out`) as values, in its order (the order they choose in)."""
    return [holdout.Holdout(split.name, split.held_out.of, split.held_out.fraction, split.held_out.count,
                            config.seed if split.held_out.seed is None else split.held_out.seed,
                            split.held_out.seed is not None)
            for split in config.splits.values() if split.held_out is not None]


def _whole_index(config: Config, split: SplitConfig, given: object | None = None) -> SampleIndex:
    """build_index's index before any held-out split is taken out of it."""
    token = ""
    if given is None and reads_a_store(config, split):
        token = store_settings(config).open().token
    try:
        index = _indexed(config, split, given, token)
    except BaseException:
        release_store(token)
        raise
    return dataclasses.replace(index, store=token) if token else index


def _indexed(config: Config, split: SplitConfig, given: object | None, store: str = "") -> SampleIndex:
    source = split_source(config, split, given, store)
    if isinstance(source, IndexedSource):  # a built-in format's: its own index, byte ranges and all
        return source.index
    if isinstance(source, multi.JoinedSource):
        return source.numbered(index_of(source, config, split))
    return index_of(source, config, split)


def split_format(config: Config) -> Format:
    """dataset.format's registered format (config_build checks the name when the config loads)."""
    return FORMATS[config.dataset.format]


def input_key(split: SplitConfig) -> str:
    """What to check where none of a split's samples can be read: the key that lists them (its sources,
    its source, or the key of a registered format that it sets), or the folder that holds them."""
    if split.held_out is not None:
        return f"{split.name}.held_out (the samples of split '{split.held_out.of}')"
    keys = ("sources", "source", *(key for fmt in FORMATS.values() for key in fmt.keys if key != "folder"))
    key = next((key for key in keys if getattr(split, key, None) is not None), None)
    return f"{split.name}.{key}" if key else f"dataset.root and {split.name}.folder"


def source_format(source: SourceConfig) -> str:
    """A source's format, from the registered formats whose keys it sets: shards are webdataset, a
    folder or a file list folder; files are parquet or arrow (its `format`, else arrow where every
    pattern ends in .arrow). dataset.format is the split's, and a source says its own."""
    named = [fmt.name for fmt in FORMATS.values() if any(getattr(source, key, None) is not None for key in fmt.keys)]
    if len(named) > 1:  # files: parquet or arrow
        return source.format or ("arrow" if all(name.endswith(".arrow") for name in source.files) else "parquet")
    return named[0] if named else "folder"


def index_source(config: Config, split: SplitConfig, source: SourceConfig) -> SampleIndex:
    """One source of a split (as a split of its own, multi.source_split), indexed by its own format,
    whatever dataset.format says (its store, the split's, opened by the split's build_index)."""
    opened = FORMATS[source_format(source)].open(config, split)
    return opened.index if isinstance(opened, IndexedSource) else index_of(opened, config, split)
