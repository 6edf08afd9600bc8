"""Sources of the user's own: a split's `source: package.module:factory` (called with
`source_args`), or the object given to `build_loader(source=...)`; checked against the protocol,
indexed from its `samples()`, and opened in this process's table so that its samples' Locations
name it (protocol.py).

What a source gives is checked where it is indexed, naming the source and the sample: as many
labels as names, integer labels in range of its classes, names that are strings and distinct (a
resumed state, dataset.exclude and weights files name samples by name). Its length, where it has
one, is checked again at every epoch (check_length).
"""
from __future__ import annotations

import inspect
import logging
import os
from typing import Any

import numpy as np

from ..dotted import import_dotted
from ..errors import ConfigError, error_text
from ..samples import IndexBuilder, SampleIndex, label_problem
from ..schema import Config, SplitConfig
from .exclude import read_exclude_list
from .protocol import Samples, missing_parts, open_source, opened

log = logging.getLogger("fastloader")


def from_factory(config: Config, split: SplitConfig) -> object:
    """The source that `<split>.source`'s factory returns, called with `<split>.source_args`."""
    key, where = f"{split.name}.source", config.origin(f"{split.name}.source")
    factory = import_dotted(split.source, key, where, "the function or class that returns the source")
    args = dict(split.source_args or {})
    try:
        inspect.signature(factory).bind(**args)
    except TypeError as error:
        raise ConfigError(f"{where}: {split.name}.source_args: {sorted(args)} do not fit {split.source}"
                          f"{_signature(factory)}: {error}; give source_args the factory's keyword arguments") from None
    except ValueError:
        pass  # a callable without a signature to read (a builtin): called as it is
    try:
        source = factory(**args)
    except Exception as error:
        raise ConfigError(f"{where}: {key}: {split.source}(**source_args) raised {type(error).__name__}: "
                          f"{error_text(error)}") from error
    return named_source(source, f"{key}: {split.source}")


def _signature(factory: Any) -> str:
    try:
        return str(inspect.signature(factory))
    except (TypeError, ValueError):
        return "(...)"


def named_source(source: object, given_by: str) -> object:
    """`source` where it meets the protocol; else a ConfigError naming what gave it and what it lacks."""
    missing = missing_parts(source)
    if missing:
        raise ConfigError(f"{given_by}: {type(source).__name__} object is not a source: it lacks "
                          f"{', '.join(missing)}. A source gives name, samples(), read(item) and identity() "
                          f"(fastloader.Source; docs/sources.md)")
    return source


def index_of(source: object, config: Config, split: SplitConfig) -> SampleIndex:
    """The index of a user's source: its samples, checked, less dataset.exclude's names; each
    sample's Location names the opened source and its number there."""
    name = source.name
    try:
        samples = Samples(*source.samples())
    except Exception as error:
        raise ConfigError(f"source {name!r} ({split.name}): samples() raised {type(error).__name__}: "
                          f"{error_text(error)}") from error
    names, labels, classes = samples
    if len(names) != len(labels):
        raise ConfigError(f"source {name!r} ({split.name}): samples() gave {len(names)} names and {len(labels)} "
                          f"labels; give one label a name")
    classes = tuple(config.dataset.classes or classes)
    if not classes or not all(isinstance(c, str) and c for c in classes):
        raise ConfigError(f"source {name!r} ({split.name}): samples() gave the classes {list(classes)[:5]!r}; give "
                          f"the class names (non-empty strings) in label order")
    labels = np.asarray(labels)
    if labels.dtype.kind not in "iu":
        raise ConfigError(f"source {name!r} ({split.name}): its labels are {labels.dtype}, not integers; give each "
                          f"sample its class's number in classes")
    labels = labels.astype(np.int64)
    bad = np.flatnonzero((labels < 0) | (labels >= len(classes)))
    if len(bad):
        first = int(bad[0])
        raise ConfigError(f"source {name!r} ({split.name}): sample {first} ({names[first]!r}): "
                          f"{label_problem(int(labels[first]), classes)}; {len(bad)} of {len(labels)} such")
    excluded = read_exclude_list(config.dataset.exclude, config.dataset.root) if config.dataset.exclude else frozenset()
    builder, seen, items, left_out = IndexBuilder(), set(), [], 0
    for item, (sample, label) in enumerate(zip(names, labels.tolist())):
        if not isinstance(sample, str) or not sample:
            raise ConfigError(f"source {name!r} ({split.name}): sample {item}'s name is {sample!r}; give each "
                              f"sample a name (a non-empty string)")
        if sample in seen:
            raise ConfigError(f"source {name!r} ({split.name}): {sample!r} names two samples; give each sample its "
                              f"own name (a resumed state and dataset.exclude name samples by name)")
        seen.add(sample)
        if sample in excluded or os.path.normpath(sample) in excluded:
            left_out += 1
            continue
        builder.add(sample, label)
        items.append(item)
    token = open_source(source)
    index = builder.build(name, classes, excluded=left_out)
    return index.read_by(token, np.asarray(items, dtype=np.int64), len(names))


def check_length(index: SampleIndex) -> None:
    """A source that has a length and no longer has the one it had when indexed: an OSError naming
    it (its samples would be misread by number)."""
    if not index.reader:
        return
    source = opened(index.reader)
    length = getattr(source, "__len__", None)
    if length is None:
        return
    now, then = length(), index.source_length
    if now != then:
        raise SourceChanged(f"the source {source.name!r} had {then} samples when the loader was built and has "
                            f"{now} now: its samples are read by number, so they would be misread; build a new "
                            f"loader (or keep the source unchanged while a loader reads it)")


class SourceChanged(RuntimeError):
    """A source's length changed under a loader."""
