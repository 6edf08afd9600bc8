"""Raw config data (YAML's dicts and lists, overrides applied) -> the frozen dataclasses of
schema.py, each value checked against its field's type and range. Every key a dataclass has is
read from its fields, so that no key can be dropped and silently take its default; an unknown key
fails with the closest valid one. The rules across keys are config_rules.py's.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import math
import re
import types
import typing
from typing import Any, Literal, Mapping, Union

from .config_rules import (
    block_order_needs_shards,
    check_batch_sizes,
    check_holdouts,
    check_sizes,
    check_sources,
    check_views,
    draws_need_a_uniform_order,
    graph_args_need_a_graph_hook,
    source_keys,
    split_format,
)
from .config_words import show_value
from .errors import ConfigError
from .schema import (
    DRAW_KEYS,
    EVAL_TRANSFORM_KEYS,
    NAMED_SPLITS,
    SCALARS,
    SECTIONS,
    TRAIN_SPLIT_KEYS,
    TRAIN_TRANSFORM_KEYS,
    VIEW_TRANSFORM_KEYS,
    Config,
    HeldOutConfig,
    MixupConfig,
    SourceConfig,
    SplitConfig,
    TransformConfig,
    ViewConfig,
)
from .sources import formats  # noqa: F401  (registers the built-in formats: dataset.format's choices)

SPLIT_SECTIONS = {"transform": TransformConfig, "mixup": MixupConfig}
"""Split keys that hold a section of their own."""
SPLIT_VALUE_KEYS = tuple(f.name for f in dataclasses.fields(SplitConfig)
                         if f.name not in ("name", "mode", "views") and f.name not in SPLIT_SECTIONS)
"""The split keys read as values, in the dataclass's order: every field but the name, the mode (read
first, since it sets the defaults), the views (read over the transform) and the sections, so that a
new key cannot be left out."""


def all_dotted_keys() -> list[str]:
    keys = [*SCALARS]
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):  # a section inside a section: dataset.remote
                keys += [f"{section}.{f.name}.{inner.name}" for inner in dataclasses.fields(hints[f.name])]
            else:
                keys.append(f"{section}.{f.name}")
    for f in dataclasses.fields(SplitConfig):
        if f.name == "name":
            continue
        if f.name in SPLIT_SECTIONS:
            keys += [f"<split>.{f.name}.{t.name}" for t in dataclasses.fields(SPLIT_SECTIONS[f.name])]
        elif f.name == "sources":
            keys += ["<split>.sources", *(f"<split>.sources.{t.name}" for t in dataclasses.fields(SourceConfig))]
        elif f.name == "held_out":
            keys += ["<split>.held_out", *(f"<split>.held_out.{t.name}" for t in dataclasses.fields(HeldOutConfig))]
        elif f.name == "views":
            keys += ["<split>.views", "<split>.views.count", "<split>.views.name"]  # and transform keys
        else:
            keys.append(f"<split>.{f.name}")
    return keys


class ConfigBuilder:
    """Turns raw YAML data into the frozen dataclasses, raising ConfigError with exact locations."""

    def __init__(self, source: str, origins: Mapping[str, str]):
        self.source = source
        self.origins = origins
        self.unknowns: list[str] = []
        """Every unknown key met so far, said together (three typos: one run, not three)."""

    def where(self, path: str) -> str:
        """The file, or the override / environment variable that set this key or one of its parents."""
        parts = re.sub(r"\[\d+\]", "", path).split(".")  # an item of a list is set with its list
        for depth in range(len(parts), 0, -1):
            origin = self.origins.get(".".join(parts[:depth]))
            if origin:
                return origin
        return self.source

    def fail(self, path: str, message: str) -> typing.NoReturn:
        self.raise_unknowns()  # a missing or odd key may be a misspelt one: the typos first
        raise ConfigError(f"{self.where(path)}: {path}: {message}")

    def raise_unknowns(self) -> None:
        """The unknown keys met, all in one error (none: nothing)."""
        if len(self.unknowns) == 1:
            raise ConfigError(self.unknowns[0])
        if self.unknowns:
            raise ConfigError(f"{len(self.unknowns)} unknown keys:\n  " + "\n  ".join(self.unknowns))

    def unknown(self, path: str, valid: list[str]) -> None:
        """Note an unknown key, with the closest valid one or where it belongs; the walk goes on over
        the rest, and raise_unknowns says them all."""
        leaf = path.rsplit(".", 1)[-1]
        close = difflib.get_close_matches(leaf, valid, n=1, cutoff=0.6)
        if close:
            prefix = path.rsplit(".", 1)[0] + "." if "." in path else ""
            hint = f"did you mean '{prefix}{close[0]}'?"
        else:
            elsewhere = [k for k in all_dotted_keys() if k.rsplit(".", 1)[-1] == leaf]
            hint = (f"'{leaf}' belongs at '{elsewhere[0]}'." if elsewhere else
                    f"valid keys here: {', '.join(valid)}.")
        self.unknowns.append(f"{self.where(path)}: unknown key '{path}'; {hint}")

    def unnamed_split(self, name: str, others: list[str]) -> typing.NoReturn:
        """A split section other than train/val/test that does not state its mode: most often a typo
        (`trian.batch_size=8` would create a split 'trian' and leave 'train' as it was)."""
        self.raise_unknowns()
        origin = next((o for k, o in self.origins.items() if k == name or k.startswith(name + ".")), self.source)
        close = difflib.get_close_matches(name, [*others, *NAMED_SPLITS], n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"{origin}: split section '{name}' does not state its mode{hint} A split other than "
                          f"{', '.join(NAMED_SPLITS[:-1])} or {NAMED_SPLITS[-1]} must state it ('{name}.mode: train' "
                          f"or 'eval'), so that a typo cannot create a new split")

    # -- top level ---------------------------------------------------------------------------

    def config(self, raw: dict) -> Config:
        values: dict[str, Any] = {}
        splits: dict[str, SplitConfig] = {}
        split_keys = [f.name for f in dataclasses.fields(SplitConfig) if f.name != "name"]
        for key, value in raw.items():
            if key in split_keys and key not in SCALARS and key not in SECTIONS:
                splits_here = [k for k, v in raw.items()
                               if isinstance(v, dict) and k not in SECTIONS and k not in split_keys]
                self.fail(key, f"is a split's key, not a top-level one: indent it under the split it is for, e.g. "
                               f"'{(splits_here or ['train'])[0]}:' then '  {key}: ...' (docs/config.md)")
            if key in SCALARS:
                hint = typing.get_type_hints(Config)[key]
                values[key] = self.coerce(value, hint, key)
            elif key in SECTIONS:
                values[key] = self.section(SECTIONS[key], value, key)
            elif isinstance(value, dict):
                close = difflib.get_close_matches(key, [*SECTIONS, *SCALARS], n=1, cutoff=0.75)
                if close:  # 'normalise:' is a typo, not a split named 'normalise'
                    self.unknown(key, [*SECTIONS, *SCALARS])
                    continue
                if "mode" not in value and key not in NAMED_SPLITS:
                    self.unnamed_split(key, [k for k in raw if k != key and k not in SECTIONS])
                splits[key] = self.split(key, value)
            else:
                self.unknown(key, [*SECTIONS, *SCALARS, "<split name>"])
        self.raise_unknowns()
        for key in SCALARS:
            if key not in raw:
                self.origins.setdefault(key, f"the default, as {self.source} does not set it")
        if "dataset" not in values:
            self.fail("dataset", "missing; every config needs 'dataset: {root: PATH}'")
        self.validate_fields(Config, values, "")
        split_format(self.fail, values["dataset"], splits)
        block_order_needs_shards(self.fail, values["dataset"], splits)
        draws_need_a_uniform_order(self.fail, splits)
        check_holdouts(self.fail, splits)
        graph_args_need_a_graph_hook(self.fail, values.get("dali"))
        self.raise_unknowns()
        return Config(**values, splits=splits, source=self.source, origins=dict(self.origins))

    def split(self, name: str, raw: dict) -> SplitConfig:
        valid = [f.name for f in dataclasses.fields(SplitConfig) if f.name != "name"]
        for key in raw:
            if key not in valid:
                self.unknown(f"{name}.{key}", valid)
        mode = self.coerce(raw.get("mode", "train" if name == "train" else "eval"),
                           typing.get_type_hints(SplitConfig)["mode"], f"{name}.mode")
        defaults = {"shuffle": mode == "train", "drop_last": mode == "train"}
        values: dict[str, Any] = {"name": name, "mode": mode}
        hints = typing.get_type_hints(SplitConfig)
        if mode != "train":
            for key in TRAIN_SPLIT_KEYS:
                if key in raw:
                    self.fail(f"{name}.{key}", f"applies only to train mode, and split '{name}' has mode: {mode}: eval "
                                               f"batches are never repeated, mixed or smoothed; remove {name}.{key}, "
                                               f"or set {name}.mode: train")
        for key in DRAW_KEYS:
            if mode != "train" and raw.get(key) is not None:
                self.fail(f"{name}.{key}", f"applies only to train mode, and split '{name}' has mode: {mode}: eval "
                                           f"reads every sample exactly once, and {key} would draw some samples "
                                           f"more than once and others never; remove {name}.{key}, or set "
                                           f"{name}.mode: train")
        for key in SPLIT_VALUE_KEYS:
            if key in raw and (key not in DRAW_KEYS + ("sources",) or raw[key] is not None):
                values[key] = self.coerce(raw[key], hints[key], f"{name}.{key}")
            elif key in defaults:
                values[key] = defaults[key]
        for key in ("shards", "files"):
            if isinstance(values.get(key), str):
                values[key] = (values[key],)
        source_keys(self.fail, name, values)
        if values.get("sources") is not None:
            check_sources(self.fail, name, mode, values)
        if values.get("block_size") is not None and values["shuffle"] != "block":
            self.fail(f"{name}.block_size", f"applies only with {name}.shuffle: block, and split '{name}' has shuffle: "
                                            f"{show_value(values['shuffle'])}; remove {name}.block_size, or set "
                                            f"{name}.shuffle: block")
        if mode == "eval" and values["drop_last"]:
            self.fail(f"{name}.drop_last", "must be false in eval mode, where every sample is read exactly once; "
                                           "set drop_last: false, or mode: train")
        transform = raw.get("transform", {})
        if not isinstance(transform, dict):
            self.fail(f"{name}.transform", f"expected a mapping of transform keys, got {transform!r}")
        allowed = TRAIN_TRANSFORM_KEYS if mode == "train" else EVAL_TRANSFORM_KEYS
        for key in transform:
            if key not in allowed and key in EVAL_TRANSFORM_KEYS + TRAIN_TRANSFORM_KEYS:
                self.fail(f"{name}.transform.{key}",
                          f"applies only to {'eval' if mode == 'train' else 'train'} mode, and split '{name}' "
                          f"has mode: {mode}; {mode} mode takes {', '.join(allowed)}")
        values["transform"] = self.section(TransformConfig, transform, f"{name}.transform")
        check_sizes(self.fail, name, values["transform"])
        if values.get("batch_sizes") is not None:
            check_batch_sizes(self.fail, name, values)
        if "mixup" in raw:
            values["mixup"] = self.section(MixupConfig, raw["mixup"], f"{name}.mixup")
        if raw.get("views") is not None:
            values["views"] = self.views(name, mode, raw["views"], transform)
            check_views(self.fail, name, values)
        elif raw.get("view_ops", "auto") != "auto":
            self.fail(f"{name}.view_ops", f"says how the ops of {name}.views run, and split '{name}' has no views; "
                                          f"remove {name}.view_ops, or add {name}.views")
        self.validate_fields(SplitConfig, values, name)
        return SplitConfig(**values)

    def views(self, name: str, mode: str, raw: Any, transform: dict) -> tuple[ViewConfig, ...]:
        """A train split's view groups, each group's transform the split's with the group's keys over it."""
        if mode != "train":
            self.fail(f"{name}.views", f"applies only to train mode, and split '{name}' has mode: {mode}: an eval "
                                       f"split gives one centre crop of each sample; remove {name}.views, or set "
                                       f"{name}.mode: train")
        if not isinstance(raw, (list, tuple)) or not raw:
            self.fail(f"{name}.views", f"expected a list of view groups, each a mapping of count, name and "
                                       f"transform keys (e.g. [{{count: 2, size: 224, scale: [0.32, 1.0]}}, {{count: "
                                       f"8, size: 96, scale: [0.05, 0.32]}}]), got {show_value(raw)}")
        valid = ["count", "name", *VIEW_TRANSFORM_KEYS]
        inherited = {key: value for key, value in transform.items() if key in VIEW_TRANSFORM_KEYS}
        groups = []
        for k, group in enumerate(raw):
            path = f"{name}.views[{k}]"
            if not isinstance(group, dict):
                self.fail(path, f"expected a mapping of {', '.join(valid[:6])}, ... keys, got {show_value(group)}")
            for key in group:
                if key in ("progressive", "sizes", "sample_hook", "batch_hook"):
                    self.fail(f"{path}.{key}", f"is the split's, not a view group's: set it as {name}.transform.{key} "
                                               f"(a size schedule is refused with views; a hook runs on every view)")
                if key not in valid:
                    self.unknown(f"{path}.{key}", valid)
            own = {key: value for key, value in group.items() if key in VIEW_TRANSFORM_KEYS}
            view_transform = self.section(TransformConfig, {**inherited, **own}, path)
            values = {key: self.coerce(group[key], typing.get_type_hints(ViewConfig)[key], f"{path}.{key}")
                      for key in ("count", "name") if key in group}
            self.validate_fields(ViewConfig, values, path)
            groups.append(ViewConfig(**values, transform=view_transform))
        return tuple(groups)

    # -- sections and values -------------------------------------------------------------------

    def section(self, cls, raw: Any, path: str):
        if not isinstance(raw, dict):
            self.fail(path, f"expected a mapping of keys ({', '.join(f.name for f in dataclasses.fields(cls))}), "
                            f"got {raw!r}")
        hints = typing.get_type_hints(cls)
        names = [f.name for f in dataclasses.fields(cls)]
        values = {}
        for key, value in raw.items():
            if key not in names:
                self.unknown(f"{path}.{key}", names)
                continue
            values[key] = self.coerce(value, hints[key], f"{path}.{key}")
        for f in dataclasses.fields(cls):
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in values:
                fix = ("; set it to the folder that holds the split folders (root/<split>/<class>/<images>), e.g. "
                       "'dataset: {root: /data/imagenette2-320}'" if f"{path}.{f.name}" == "dataset.root" else "")
                self.fail(f"{path}.{f.name}", f"missing; it has no default{fix}")
        self.validate_fields(cls, values, path)
        return cls(**values)

    def validate_fields(self, cls, values: dict, path: str) -> None:
        for f in dataclasses.fields(cls):
            check = f.metadata.get("check")
            if check and f.name in values:
                predicate, message = check
                if not predicate(values[f.name]):
                    dotted = f"{path}.{f.name}" if path else f.name
                    wants = message(values[f.name]) if callable(message) else message
                    self.fail(dotted, f"must be {wants}, got {show_value(values[f.name])}")

    def coerce(self, value: Any, hint: Any, path: str) -> Any:
        """Check `value` against a type hint, converting YAML lists to tuples and ints to floats."""
        if hint is Any:  # source_args' values: plain YAML data, the factory's to check
            return value
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
        if origin in (Union, types.UnionType):
            refusals = []
            for option in args:
                try:
                    return self.coerce(value, option, path)
                except ConfigError as error:
                    if _structure_fits(value, option):  # a list of sources, a mapping: what is wrong inside it
                        raise
                    refusals.append(error.with_traceback(None))  # its traceback holds this frame: a cycle
            not_finite = [error for error in refusals if "expected a finite number" in str(error)]
            if not_finite:  # the type fits, the value does not: say so rather than "expected a number"
                raise not_finite[0]
            self.fail(path, f"expected {_describe_type(hint)}, got {show_value(value)}")
        if dataclasses.is_dataclass(hint):
            return self.section(hint, value, path)
        if origin is collections.abc.Mapping:
            if not isinstance(value, Mapping):
                self.fail(path, f"expected {_describe_type(hint)}, got {show_value(value)}")
            return {str(key): self.coerce(item, args[1], f"{path}.{key}") for key, item in value.items()}
        if origin is Literal:
            if value in args and type(value) is type(args[args.index(value)]):
                return value
            close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
            hint_text = f"; did you mean '{close[0]}'?" if close else ""
            self.fail(path, f"expected {_describe_type(hint)}, got {show_value(value)}{hint_text}")
        if origin is tuple:
            if not isinstance(value, (list, tuple)):
                self.fail(path, f"expected {_describe_type(hint)}, got {show_value(value)}")
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(self.coerce(v, args[0], f"{path}[{i}]") for i, v in enumerate(value))
            if len(value) != len(args):
                self.fail(path, f"expected {_describe_type(hint)}, got {len(value)} values: {show_value(value)}")
            return tuple(self.coerce(v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
        if dataclasses.is_dataclass(hint):  # a section inside a section (dataset.remote)
            return self.section(hint, value, path)
        if origin is dict:  # names to strings (dataset.remote.options): values never shown, they may be secrets
            if not isinstance(value, Mapping):
                self.fail(path, f"expected a mapping of option names to values, got {type(value).__name__}")
            options = {}
            for key, item in value.items():
                if not isinstance(key, str) or isinstance(item, (dict, list)) or item is None:
                    self.fail(f"{path}.{key}", f"expected a string (an option's value), got {type(item).__name__}")
                options[key] = str(item).lower() if isinstance(item, bool) else str(item)
            return options
        if hint is type(None):
            if value is None:
                return None
            self.fail(path, f"expected null, got {show_value(value)}")
        if hint is bool:
            if isinstance(value, bool):
                return value
        elif hint is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        elif hint is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                number = float(value) if isinstance(value, float) or abs(value) < 2**1023 else math.inf
                if not math.isfinite(number):  # .inf / .nan would poison every batch (NaN targets)
                    self.fail(path, f"expected a finite number, got {show_value(value)}")
                return number
        elif hint is str:
            if isinstance(value, str):
                return value
        else:  # pragma: no cover - a schema error, not a user error
            raise TypeError(f"unsupported type hint {hint!r} at {path}")
        self.fail(path, f"expected {_describe_type(hint)}, got {show_value(value)}")


def _structure_fits(value: Any, hint: Any) -> bool:
    """Whether a value has the shape of a list or mapping type (not of a scalar's): then its own
    refusal, which names the item or key inside it, is the one to give."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:  # a fixed-length tuple fits a list of its length only (color_jitter: 3 or 4 numbers)
        return isinstance(value, (list, tuple)) and (args[-1] is Ellipsis or len(value) == len(args))
    return isinstance(value, Mapping) and (origin is collections.abc.Mapping or dataclasses.is_dataclass(hint))


def _describe_type(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(_describe_type(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis and dataclasses.is_dataclass(args[0]):
            return f"a list of mappings, each of keys {', '.join(f.name for f in dataclasses.fields(args[0]))}"
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_describe_type(args[0]).removeprefix('a ').removeprefix('an ')}s"
        return f"a list of {len(args)} {_describe_type(args[0]).removeprefix('a ').removeprefix('an ')}s"
    if origin is collections.abc.Mapping:
        key, item = (_describe_type(arg).removeprefix("a ").removeprefix("an ") for arg in args)
        return f"a mapping of {key}s to {item}s"
    if dataclasses.is_dataclass(hint):
        return f"a mapping of keys ({', '.join(f.name for f in dataclasses.fields(hint))})"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string",
            type(None): "null"}.get(hint, str(hint))
