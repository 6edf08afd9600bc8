"""dataset.format -> the module that indexes a split of it: the one place a format is chosen."""
from __future__ import annotations

from typing import Callable

from ..samples import SampleIndex
from ..schema import Config, SplitConfig
from . import folder, webdataset

FORMATS: dict[str, Callable[[Config, SplitConfig], SampleIndex]] = {
    "folder": folder.index_split,
    "webdataset": webdataset.index_split,
}
"""The choices of dataset.format and what indexes each (schema.DatasetConfig.format lists them too)."""


def build_index(config: Config, split: SplitConfig) -> SampleIndex:
    """The split's samples, names, labels and where their bytes are, in the config's format."""
    return FORMATS[config.dataset.format](config, split)
