"""dataset.format -> the module that indexes a split of it: the one place a format is chosen (for a
split, and for each of a split's `sources`)."""
from __future__ import annotations

import dataclasses
from typing import Callable

from ..samples import SampleIndex
from ..schema import Config, SourceConfig, SplitConfig
from . import folder, multi, parquet, webdataset

FORMATS: dict[str, Callable[[Config, SplitConfig], SampleIndex]] = {
    "folder": folder.index_split,
    "webdataset": webdataset.index_split,
    "parquet": parquet.index_parquet,
    "arrow": parquet.index_arrow,
}
"""The choices of dataset.format and what indexes each (schema.DatasetConfig.format lists them too)."""


def build_index(config: Config, split: SplitConfig) -> SampleIndex:
    """The split's samples, names, labels and where their bytes are, in the config's format; a split
    of several sources, each in its own (sources/multi.py)."""
    if split.sources is not None:
        return multi.index_sources(config, split, index_source)
    return FORMATS[config.dataset.format](config, split)


def input_key(split: SplitConfig) -> str:
    """What to check where none of a split's samples can be read: the key that lists them (its sources,
    files, shards or file list), or the folder that holds them."""
    key = next((key for key in ("sources", "files", "shards", "file_list") if getattr(split, key) is not None), None)
    return f"{split.name}.{key}" if key else f"dataset.root and {split.name}.folder"


def source_format(source: SourceConfig) -> str:
    """A source's format, from the key that says where its samples are: shards are webdataset, files
    parquet or arrow (its `format`, else arrow where every pattern ends in .arrow), a folder or a file
    list folder (dataset.format is the split's, and a source says its own)."""
    if source.files is not None:
        return source.format or ("arrow" if all(name.endswith(".arrow") for name in source.files) else "parquet")
    return "webdataset" if source.shards is not None else "folder"


def index_source(config: Config, split: SplitConfig, source: SourceConfig) -> SampleIndex:
    """One source of a split (as a split of its own, multi.source_split), indexed by its format's module."""
    fmt = source_format(source)
    return FORMATS[fmt](dataclasses.replace(config, dataset=dataclasses.replace(config.dataset, format=fmt)), split)
