"""fastloader: image-classification batches for PyTorch from one YAML config.

    loader = fastloader.build_loader("configs/imagenette.yaml", split="train")
    for images, labels in loader:   # float [B, 3, H, W] normalized, int64 [B], on loader.device
        ...

The shapes (views, soft targets) and the hooks' signatures: fastloader.interfaces. Every error the
library raises on purpose is a FastloaderError (fastloader.errors).
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping

from .config import load_config
from .cuda_libraries import bind_wheel_nvjpegs
from .errors import (
    AugmentError,
    BadImageError,
    CacheError,
    ConfigError,
    DiskFullError,
    FastloaderError,
    HookError,
    LoaderError,
    LockTimeout,
    SourceChanged,
    SourceError,
    SourceReadError,
    StateError,
    StoreError,
)
from .interfaces import Batch, BatchHook, GraphHook, Images, SampleHook
from .schema import Config
from .sources.protocol import Samples, Source

if TYPE_CHECKING:
    from .contract import Loader
    from .hooks import with_global_rng

bind_wheel_nvjpegs()  # before anything (import torchvision) binds another nvJPEG under its soname: cuda_libraries.py

__version__ = "0.1.0"
__all__ = ["build_loader", "load_config", "Loader", "Samples", "Source", "with_global_rng", "__version__",
           "Batch", "Images", "SampleHook", "BatchHook", "GraphHook",
           "FastloaderError", "ConfigError", "CacheError", "StoreError", "LockTimeout", "SourceError", "SourceChanged",
           "SourceReadError", "BadImageError", "HookError", "AugmentError", "StateError", "LoaderError",
           "DiskFullError"]
_TORCH_NAMES = {"Loader": "contract", "with_global_rng": "hooks"}
"""Names whose modules import torch, imported when first asked for: a worker process that only reads
files (decoding/shared_reads.py) starts in a fraction of the 1.3 s that torch takes."""


def __dir__() -> list[str]:
    """The public names only: the submodules and helpers imported here are not the library's surface."""
    return sorted(__all__)


def __getattr__(name: str) -> Any:
    module = _TORCH_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'fastloader' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def build_loader(config: str | os.PathLike | Mapping[str, Any] | Config, split: str = "train",
                 overrides: Mapping[str, Any] | list[str] | None = None, source: Source | None = None,
                 sample_hook: SampleHook | str | None = None, batch_hook: BatchHook | str | None = None,
                 graph_hook: GraphHook | str | None = None) -> Loader:
    """A loader for one split of the config (a YAML path, a dict or a loaded Config).

    overrides: {"train.batch_size": 32} or ["train.batch_size=32"], validated like the file.
    source: an object of the Source protocol (fastloader.Source) to read the split from, instead of
    what the config says (its dataset keys then only need to be valid; docs/sources.md).
    sample_hook, batch_hook, graph_hook: your own transforms (functions, or 'package.module:function'),
    in place of the config's <split>.transform.sample_hook, batch_hook and dali.graph_hook
    (docs/transforms.md).
    """
    from .factory import create_loader
    return create_loader(load_config(config, overrides, source_given=source is not None), split, source,
                         {"sample_hook": sample_hook, "batch_hook": batch_hook, "graph_hook": graph_hook})
