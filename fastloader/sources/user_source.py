"""Sources of the user's own: a split's `source: package.module:factory` (called with
`source_args`), or the object given to `build_loader(source=...)`; checked against the protocol,
indexed from its `samples()`, and opened in this process's table so that its samples' Locations
name it (protocol.py).

What a source gives is checked where it is indexed, naming the source and the sample: as many
labels as names, integer labels in range of its classes, names that are strings and distinct (a
resumed state, dataset.exclude and weights files name samples by name). Its length, where it has
one, and its identity are checked again at every epoch (check_unchanged): a source that changed
under a loader is refused by name, never read on by number.
"""
from __future__ import annotations

import inspect
import logging
import os
from typing import Any, Mapping

import numpy as np

from ..dotted import import_dotted
from ..errors import ConfigError, SourceChanged, error_text
from ..samples import IndexBuilder, SampleIndex, label_problem
from ..schema import Config, SplitConfig
from .exclude import read_exclude_list
from .protocol import missing_parts, open_source, opened

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
        given = source.samples()
    except Exception as error:
        raise ConfigError(f"source {name!r} ({split.name}): samples() raised {type(error).__name__}: "
                          f"{error_text(error)}") from error
    names, labels, classes = three_parts(given, f"source {name!r} ({split.name}): samples()")
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
    bad = np.flatnonzero((labels >= len(classes)) | ((labels < 0) if labels.dtype.kind == "i" else False))
    if len(bad):  # checked in the labels' own type: a uint64 past int64 is not wrapped to a negative number
        first = int(bad[0])
        raise ConfigError(f"source {name!r} ({split.name}): sample {first} ({names[first]!r}): "
                          f"{label_problem(int(labels[first]), classes)}; {len(bad)} of {len(labels)} such")
    labels = labels.astype(np.int64)
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
    identity = _identity(source, split)
    token = open_source(source)
    index = builder.build(name, classes, excluded=left_out)
    return index.read_by(token, np.asarray(items, dtype=np.int64), len(names), identity)


def _identity(source: object, split: SplitConfig) -> str:
    try:
        return str(source.identity())
    except Exception as error:  # the user's code
        raise ConfigError(f"source {source.name!r} ({split.name}): identity() raised {type(error).__name__}: "
                          f"{error_text(error)}; give what changes when the source's contents change") from error


def three_parts(given: Any, what: str) -> tuple[list, Any, list]:
    """(names, labels, classes) of what samples() gave: a Samples or any 3-sequence of them, or a
    mapping of `names`, `labels` and `classes`; names and classes given as any iterable (a generator)
    are taken as lists. Anything else: a ConfigError that says what it was and what to give."""
    if isinstance(given, Mapping):
        if not {"names", "labels", "classes"} <= set(given):
            raise ConfigError(f"{what} gave a dict with the keys {sorted(map(str, given))[:8]}; give (names, labels, "
                              f"classes), e.g. fastloader.Samples(names, labels, classes)")
        given = (given["names"], given["labels"], given["classes"])
    if isinstance(given, (str, bytes)) or not isinstance(given, (tuple, list)) or len(given) != 3:
        kind = f"a {type(given).__name__}" + (f" of {len(given)}" if isinstance(given, (tuple, list)) else "")
        raise ConfigError(f"{what} gave {kind}; give (names, labels, classes), e.g. fastloader.Samples(names, "
                          f"labels, classes)")
    names, labels, classes = given
    parts = []
    for part, value in (("names", names), ("labels", labels), ("classes", classes)):
        if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
            raise ConfigError(f"{what} gave {part} as a {type(value).__name__}; give a sequence (a list, a numpy "
                              f"array), one entry a sample" + ("" if part != "classes" else " (classes: a class)"))
        parts.append(value if isinstance(value, np.ndarray) else list(value))
    return parts[0], parts[1], parts[2]


def check_unchanged(index: SampleIndex) -> None:
    """A source whose length (where it has one) or identity is not what it was when indexed: a
    SourceChanged naming it (its samples would be misread by number)."""
    if not index.reader:
        return
    source = opened(index.reader)
    fix = ("its samples are read by number, so they would be misread; build a new loader (or keep the source "
           "unchanged while a loader reads it)")
    length = getattr(source, "__len__", None)
    if length is not None and (now := length()) != index.source_length:
        raise SourceChanged(f"the source {source.name!r} had {index.source_length} samples when the loader was built "
                            f"and has {now} now: {fix}")
    if index.source_identity and (now := str(source.identity())) != index.source_identity:
        raise SourceChanged(f"the source {source.name!r} changed since the loader was built (its identity() was "
                            f"{index.source_identity!r}, and is {now!r} now): {fix}")
