"""YAML -> the frozen dataclasses of schema.py, with strict validation and dotted overrides.

Why strict: a misspelled key that is silently ignored trains a model with the wrong augmentation
for days. Every unknown key, wrong type or out-of-range value fails at once, naming the file (or the
override), the dotted key, the value and, for unknown keys, the closest valid key.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import math
import os
import re
import shlex
import types
import typing
from pathlib import Path
from typing import Any, Literal, Mapping, Union

import yaml

from . import yaml_text
from .errors import ConfigError
from .schema import (  # noqa: F401  (the schema's names are re-exported for users who read them here)
    BACKEND_ENV,
    DRAW_KEYS,
    EVAL_TRANSFORM_KEYS,
    IMAGE_EXTENSIONS,
    IMAGENET_MEAN,
    IMAGENET_STD,
    NAMED_SPLITS,
    SCALARS,
    SECTIONS,
    SOURCE_KINDS,
    TRAIN_SPLIT_KEYS,
    TRAIN_TRANSFORM_KEYS,
    Config,
    DaliConfig,
    DatasetConfig,
    DistributedConfig,
    MixupConfig,
    NormalizeConfig,
    OutputConfig,
    SourceConfig,
    SplitConfig,
    StatsConfig,
    TransformConfig,
    WorkersConfig,
)
from .sources.remote import is_url

# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def load_config(config: str | os.PathLike | Mapping[str, Any] | Config,
                overrides: Mapping[str, Any] | list[str] | tuple[str, ...] | None = None,
                *, origin: str | None = None) -> Config:
    """Read a config from a YAML path, a dict or a Config, apply overrides and validate it all.

    Relative paths in a file are relative to the file's folder; in a dict, and in overrides, to the
    current directory. `$FASTLOADER_BACKEND` replaces `backend` when set. `origin` names where the
    overrides come from in messages and logs (a command's option, say), instead of "override 'KEY'".
    """
    origins: dict[str, str] = {}
    if isinstance(config, Config):
        if not overrides and not os.environ.get(BACKEND_ENV):
            return config
        raw, source, base_dir = _config_to_raw(config), config.source, Path.cwd()
        origins.update(config.origins)
    elif isinstance(config, Mapping):
        _check_size(config, "<dict>")
        raw, source, base_dir = _deep_copy(config), "<dict>", Path.cwd()
    else:
        path = Path(config)
        try:
            raw = yaml_text.load(_read_config_text(path)) or {}
        except yaml_text.DuplicateKeyError as error:
            raise ConfigError(f"{path}: {error}") from None
        except yaml.YAMLError as error:
            raise ConfigError(f"{path}: not valid YAML: {error}") from None
        _check_size(raw, str(path))
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(raw).__name__}")
        source, base_dir = str(path), path.resolve().parent
        raw = _resolve_paths(raw, base_dir)

    for key, value in _parse_overrides(overrides):
        origins[key] = origin or OVERRIDE.format(key=key)
        _check_size(value, origins[key])
        _set_dotted(raw, key, _resolve_override_path(key, value), origins[key], source)
    _resolve_shards(raw, base_dir, origins)
    _default_shard_root(raw, base_dir, origins)
    _read_classes_file(raw, origins, source)
    forced = os.environ.get(BACKEND_ENV)
    if forced:
        raw["backend"] = forced
        origins["backend"] = f"environment variable {BACKEND_ENV}"
    return _Builder(source, origins).config(raw)


MAX_CONFIG_BYTES = 4 << 20
"""The largest config file read (4 MiB): a config is a page of keys, and its shards are patterns."""
MAX_CONFIG_VALUES = 100_000
"""The most values (keys, list items, scalars) a config may hold once its YAML aliases are expanded:
nine nested aliases of nine items each are 387 million, which took 289 s and 2.9 GB to refuse."""


def _check_size(raw: Any, source: str) -> None:
    """Count the values of a loaded config, each alias as often as it is used, and stop at
    MAX_CONFIG_VALUES: an alias bomb fails here in milliseconds, before anything walks it whole. The
    same walk refuses a key that is no name (`1:`, `null:`), which every later step takes for one."""
    count, stack = 0, [(raw, "")]
    while stack:
        value, path = stack.pop()
        count += 1
        if count > MAX_CONFIG_VALUES:
            key = path[:path.find("[", path.find("[") + 1)] if path.count("[") > 1 else path
            where = f" (at {key}...)" if key else ""
            raise ConfigError(f"{source}: the config holds more than {MAX_CONFIG_VALUES:,} values once its YAML "
                              f"aliases are expanded{where}; each `*alias` repeats its anchor's whole value, so "
                              f"nested aliases multiply. List shards as patterns (`train-{{000000..000146}}.tar`), "
                              f"not one by one, and use no nested aliases")
        if isinstance(value, Mapping):
            for key in value:
                if not isinstance(key, str):
                    where = f"under {path}" if path else "at the top level"
                    text = yaml.safe_dump(key).removesuffix("...\n").strip()
                    raise ConfigError(f"{source}: the key {text} {where} is not a name (YAML reads it as "
                                      f"{'null' if key is None else type(key).__name__}): every config key is a name "
                                      f"such as 'train' or 'batch_size' (docs/config.md); fix the key, or quote it "
                                      f"(\"{text}\") if it is meant as a name")
            stack += [(child, f"{path}.{key}" if path else str(key)) for key, child in value.items()]
        elif isinstance(value, (list, tuple)):
            stack += [(child, f"{path}[{i}]") for i, child in reversed(list(enumerate(value)))]


BINARY_SIGNATURES = ((b"\x1f\x8b", "a gzip archive"), (b"PK\x03\x04", "a zip archive"), (b"%PDF", "a PDF document"),
                     (b"\x7fELF", "a program (ELF)"))
"""First bytes of common files that are not text, beyond the image formats screening names."""


def _read_config_text(path: Path) -> str:
    """The config file's text, or an error that names the file, what it is instead and the fix:
    a folder, a missing path, an image or other binary file, a file that cannot be read."""
    fix = "Pass the path of a YAML file such as configs/sample.yaml."
    if path.is_dir():
        try:
            inside = sorted(p.name for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
        except OSError:
            inside = []
        hint = f"Pass a YAML file in it, such as {str(path / inside[0])!r}." if inside else \
            f"It holds no .yaml file. {fix}"
        raise ConfigError(f"config file {str(path)!r} is a folder, not a YAML file. {hint}")
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} not found (working directory: {Path.cwd()}). {fix}")
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise ConfigError(f"config file {str(path)!r} cannot be read: {error.strerror or error}. {fix}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {str(path)!r} is larger than {MAX_CONFIG_BYTES >> 20} MiB; a config is a page "
                          f"of keys: list shards as patterns (`train-{{000000..000146}}.tar`), not one by one. {fix}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"config file {str(path)!r} is {_what_binary(data)}, not YAML text (byte "
                          f"0x{data[error.start]:02x} at offset {error.start} is not UTF-8). {fix}") from None


def _what_binary(head: bytes) -> str:
    """'a PNG image', 'a gzip archive', ... or 'binary data (starts with 00 01 ...)'."""
    from .imaging.screen import sniff
    image = sniff(head[:32])
    if image:
        return f"a{'n' if image[0] in 'AEIOU' else ''} {image} image"
    named = next((what for magic, what in BINARY_SIGNATURES if head.startswith(magic)), None)
    return named or f"binary data (starts with {head[:8].hex(' ')})"


def _parse_overrides(overrides) -> list[tuple[str, Any]]:
    """Overrides as (dotted key, value) pairs; `key=value` strings have their value parsed as YAML."""
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        return [(str(k), v) for k, v in overrides.items()]
    pairs = []
    for item in overrides:
        if not isinstance(item, str) or "=" not in item:
            raise ConfigError(f"override {item!r}: expected 'dotted.key=value', e.g. 'train.batch_size=32'")
        key, text = item.split("=", 1)
        try:
            value = yaml_text.load(text) if text.strip() else None
        except yaml_text.DuplicateKeyError as error:
            raise ConfigError(f"override {item!r}: {error}") from None
        except yaml.YAMLError:
            value = text
        pairs.append((key.strip(), value))
    return pairs


def _set_dotted(raw: dict, key: str, value: Any, origin: str, source: str) -> None:
    parts = key.split(".")
    if not key or any(not p for p in parts):
        raise ConfigError(f"{origin}: '{key}' is not a dotted key such as 'train.batch_size'")
    node = raw
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            prefix = ".".join(parts[: depth + 1])
            raise ConfigError(f"{origin}: '{prefix}' in {source} is a value, not a section, so '{key}' cannot be set")
        node = child
    node[parts[-1]] = value


DEFAULT_SHARD_ROOT = "the config's folder (dataset.format: webdataset, parquet or arrow)"
"""Where dataset.root came from when a webdataset config leaves it out (its origin, in messages)."""
CONTAINER_FORMATS = ("webdataset", "parquet", "arrow")
"""The formats whose splits name their files (`shards`, `files`), so that dataset.root may be left out."""
DATASET_PATHS = ("root", "exclude", "cache")
"""dataset keys that hold paths: relative ones are resolved against the config file's folder."""
REMOTE_PATHS = ("cache_dir",)
"""dataset.remote keys that hold paths, resolved as DATASET_PATHS are."""


def _is_path_key(dotted: str) -> bool:
    """A key whose relative path an override gives relative to the working directory (shards: see
    _resolve_shards)."""
    return dotted in {f"dataset.{key}" for key in DATASET_PATHS} | {f"dataset.remote.{key}" for key in REMOTE_PATHS} \
        or dotted.endswith((".file_list", ".weights"))


def _resolve_one(value: Any, base_dir: Path | str) -> Any:
    """A path made absolute against base_dir (a folder, or an object store URL); a URL is kept as written."""
    if isinstance(value, list):  # a split's shards
        return [_resolve_one(item, base_dir) for item in value]
    if not isinstance(value, str) or value.startswith("builtin:") or is_url(value):
        return value
    expanded = os.path.expanduser(os.path.expandvars(value))
    if is_url(str(base_dir)) and not os.path.isabs(expanded):
        return f"{str(base_dir).rstrip('/')}/{expanded}"
    return os.path.normpath(expanded if os.path.isabs(expanded) else str(Path(base_dir) / expanded))


def _resolve_paths(raw: dict, base_dir: Path) -> dict:
    """Make the file's relative paths absolute against its folder, so the config works from any cwd."""
    dataset = raw.get("dataset")
    if isinstance(dataset, dict):
        for key in DATASET_PATHS:
            if key in dataset:
                dataset[key] = _resolve_one(dataset[key], base_dir)
        if isinstance(dataset.get("classes"), str):  # a file of class names; a list is the names themselves
            dataset["classes"] = _resolve_one(dataset["classes"], base_dir)
        remote = dataset.get("remote")
        if isinstance(remote, dict):
            for key in REMOTE_PATHS:
                if key in remote:
                    remote[key] = _resolve_one(remote[key], base_dir)
    for key, section in raw.items():
        if key in SECTIONS or not isinstance(section, dict):
            continue
        for item in [section, *_sources_of(section)]:
            if "file_list" in item:
                item["file_list"] = _resolve_one(item["file_list"], base_dir)
        if "weights" in section:
            section["weights"] = _resolve_one(section["weights"], base_dir)
    return raw


def _sources_of(section: dict) -> list[dict]:
    """The mappings among a split section's `sources` (what is not a mapping fails its check later)."""
    sources = section.get("sources")
    return [item for item in sources if isinstance(item, dict)] if isinstance(sources, list) else []


def _resolve_shards(raw: dict, base_dir: Path, origins: Mapping[str, str]) -> None:
    """A split's relative shard paths are relative to dataset.root when it is set (in the file or an
    override), else to the config file's folder (in an override or a dict: the working directory)."""
    dataset = raw.get("dataset")
    root = dataset.get("root") if isinstance(dataset, dict) else None
    given = isinstance(root, str) and root != "" and not root.startswith("builtin:")
    for name, section in raw.items():
        if name in SECTIONS or not isinstance(section, dict):
            continue
        for key, item, field_name in [("shards", section, "shards"), ("files", section, "files"),
                                      *(("sources", source, kind) for source in _sources_of(section)
                                        for kind in ("shards", "files"))]:
            if field_name not in item:
                continue
            overridden = any(set_by in origins for set_by in (name, f"{name}.{key}"))
            base = root if given and is_url(root) else \
                Path(os.path.expanduser(os.path.expandvars(root))).absolute() if given else \
                Path.cwd() if overridden else base_dir
            item[field_name] = _resolve_one(item[field_name], base)


def _default_shard_root(raw: dict, base_dir: Path, origins: dict[str, str]) -> None:
    """format: webdataset names its shards per split; dataset.root, which it does not need, defaults
    to the config's folder."""
    dataset = raw.get("dataset")
    if isinstance(dataset, dict) and "root" not in dataset and (
            dataset.get("format") in CONTAINER_FORMATS or _containers_only(raw)):
        dataset["root"] = str(base_dir)
        origins["dataset.root"] = DEFAULT_SHARD_ROOT


def _containers_only(raw: dict) -> bool:
    """Whether every split reads shards or parquet/Arrow files (its own keys, or each of its sources'):
    then no split needs dataset.root, whatever dataset.format says."""
    def containers(item: object) -> bool:
        return isinstance(item, dict) and ("shards" in item or "files" in item)
    splits = [section for name, section in raw.items() if name not in SECTIONS and isinstance(section, dict)]
    return bool(splits) and all(containers(split) or (isinstance(split.get("sources"), list) and split["sources"] and
                                                      all(containers(source) for source in split["sources"]))
                                for split in splits)


def _resolve_override_path(key: str, value: Any) -> Any:
    if key.endswith(".sources") and isinstance(value, list):  # each source's file list (shards: _resolve_shards)
        return [{**item, "file_list": _resolve_one(item["file_list"], Path.cwd())}
                if isinstance(item, dict) and "file_list" in item else item for item in value]
    return _resolve_one(value, Path.cwd()) if _is_path_key(key) or (key == "dataset.classes" and
                                                                   isinstance(value, str)) else value


def read_class_names(path: str) -> tuple[str, ...]:
    """A file of class names in label order, one a line (as `fastloader pack` writes `<split>-classes.txt`);
    blank lines and the spaces around a name are left out. OSError or ValueError say what is wrong."""
    with open(path, encoding="utf-8") as handle:
        names = tuple(line.strip() for line in handle if line.strip())
    if not names:
        raise ValueError("it holds no class name (one a line)")
    repeated = sorted({name for name in names if names.count(name) > 1}) if len(set(names)) < len(names) else []
    if repeated:
        raise ValueError(f"it names {repeated[0]!r} twice; each class once, in label order")
    return names


def _read_classes_file(raw: dict, origins: Mapping[str, str], source: str) -> None:
    """dataset.classes given as a file (a path, resolved like the other paths): its names, read now, so
    that every reader sees a list."""
    dataset = raw.get("dataset")
    path = dataset.get("classes") if isinstance(dataset, dict) else None
    if not isinstance(path, str):
        return
    where = origins.get("dataset.classes") or origins.get("dataset") or source
    try:
        dataset["classes"] = list(read_class_names(path))
    except FileNotFoundError:
        raise ConfigError(f"{where}: dataset.classes: {path!r} does not exist; give the class names as a list, or "
                          f"the file of them (one a line, as `fastloader pack` writes <split>-classes.txt)") from None
    except (OSError, UnicodeDecodeError, ValueError) as error:
        why = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise ConfigError(f"{where}: dataset.classes: the file {path!r} cannot serve as class names: {why}") from None


def _deep_copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _deep_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_deep_copy(v) for v in value]
    return value


def _config_to_raw(config: Config) -> dict:
    raw = {}
    for f in dataclasses.fields(Config):
        if f.name in ("source", "origins"):
            continue
        value = getattr(config, f.name)
        if f.name == "splits":
            for name, split in value.items():
                section = dataclasses.asdict(split)
                section.pop("name")
                allowed = TRAIN_TRANSFORM_KEYS if split.mode == "train" else EVAL_TRANSFORM_KEYS
                section["transform"] = {k: v for k, v in section["transform"].items() if k in allowed}
                if split.mode != "train":
                    for key in (*TRAIN_SPLIT_KEYS, *DRAW_KEYS):
                        section.pop(key)
                if section["sources"] is None:
                    section.pop("sources")
                raw[name] = section
        else:
            raw[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return _deep_copy(raw)


def config_to_dict(config: Config) -> dict:
    """The resolved config as plain data, for logs and JSON reports: the store's options (credentials,
    perhaps) show their names only."""
    return _hide_store_options(_config_to_raw(config), "(set)")


def _hide_store_options(raw: dict, shown: str) -> dict:
    """`raw` with each of dataset.remote.options' values replaced by `shown`: they may be credentials."""
    remote = raw["dataset"].get("remote") or {}
    if remote.get("options"):
        remote["options"] = {key: shown for key in remote["options"]}
    return raw


OVERRIDE = "override '{key}'"
"""The origin of a key set by an override (`--set KEY=VALUE`, or load_config's overrides)."""


SECRET_PLACEHOLDER = "<not shown: give it again>"
"""What a suggested command shows for a value of dataset.remote.options, which may be a secret."""


def override_options(config: Config, skip: tuple[str, ...] = ()) -> list[str]:
    """The `--set KEY=VALUE` options that give this config its overrides' values again (resolved, so
    they work from any folder): what a command that a message suggests must keep (but the keys in
    `skip`, which the command sets otherwise). dataset.remote.options' values are never shown."""
    raw, options = _hide_store_options(_config_to_raw(config), SECRET_PLACEHOLDER), []
    for key, origin in config.origins.items():
        if origin != OVERRIDE.format(key=key) or key in skip:
            continue
        value: Any = raw
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        text = yaml.safe_dump(value, default_flow_style=True, width=math.inf).strip().removesuffix("...").strip()
        options.append(f"--set {shlex.quote(f'{key}={text}')}")
    return options


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


SPLIT_SECTIONS = {"transform": TransformConfig, "mixup": MixupConfig}
"""Split keys that hold a section of their own."""


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
        else:
            keys.append(f"<split>.{f.name}")
    return keys


class _Builder:
    """Turns raw YAML data into the frozen dataclasses, raising ConfigError with exact locations."""

    def __init__(self, source: str, origins: Mapping[str, str]):
        self.source = source
        self.origins = origins

    def where(self, path: str) -> str:
        """The file, or the override / environment variable that set this key or one of its parents."""
        parts = re.sub(r"\[\d+\]", "", path).split(".")  # an item of a list is set with its list
        for depth in range(len(parts), 0, -1):
            origin = self.origins.get(".".join(parts[:depth]))
            if origin:
                return origin
        return self.source

    def fail(self, path: str, message: str) -> typing.NoReturn:
        raise ConfigError(f"{self.where(path)}: {path}: {message}")

    def unknown(self, path: str, valid: list[str]) -> typing.NoReturn:
        leaf = path.rsplit(".", 1)[-1]
        close = difflib.get_close_matches(leaf, valid, n=1, cutoff=0.6)
        if close:
            prefix = path.rsplit(".", 1)[0] + "." if "." in path else ""
            hint = f"did you mean '{prefix}{close[0]}'?"
        else:
            elsewhere = [k for k in all_dotted_keys() if k.rsplit(".", 1)[-1] == leaf]
            hint = (f"'{leaf}' belongs at '{elsewhere[0]}'." if elsewhere else
                    f"valid keys here: {', '.join(valid)}.")
        raise ConfigError(f"{self.where(path)}: unknown key '{path}'; {hint}")

    def unnamed_split(self, name: str, others: list[str]) -> typing.NoReturn:
        """A split section other than train/val/test that does not state its mode: most often a typo
        (`trian.batch_size=8` would create a split 'trian' and leave 'train' as it was)."""
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
                if "mode" not in value and key not in NAMED_SPLITS:
                    self.unnamed_split(key, [k for k in raw if k != key and k not in SECTIONS])
                splits[key] = self.split(key, value)
            else:
                self.unknown(key, [*SECTIONS, *SCALARS, "<split name>"])
        for key in SCALARS:
            if key not in raw:
                self.origins.setdefault(key, f"the default, as {self.source} does not set it")
        if "dataset" not in values:
            self.fail("dataset", "missing; every config needs 'dataset: {root: PATH}'")
        if is_url(values["dataset"].root) and values["dataset"].format not in ("webdataset", "parquet"):
            self.fail("dataset.root", f"{values['dataset'].root!r} is in an object store, which fastloader reads as "
                                      f"tar shards: set dataset.format: webdataset and each split's shards (pack a "
                                      f"folder with `fastloader pack`, then upload the shards)")
        self.validate_fields(Config, values, "")
        self.block_order_needs_shards(values["dataset"], splits)
        self.draws_need_a_uniform_order(splits)
        return Config(**values, splits=splits, source=self.source, origins=dict(self.origins))

    def block_order_needs_shards(self, dataset: DatasetConfig, splits: Mapping[str, SplitConfig]) -> None:
        """`shuffle: block` reads a split's shards block by block: image files have none to group."""
        for name, split in splits.items():
            if split.shuffle == "block" and split.sources is not None:
                files = next((k for k, source in enumerate(split.sources)
                              if source.shards is None and source.files is None), None)
                if files is not None:
                    self.fail(f"{name}.shuffle", f"block reads the split's tar shards (or parquet row groups) block by "
                                                 f"block, and {name}.sources[{files}] reads image files, which have "
                                                 f"no shards to group; set {name}.shuffle: true, or pack that source "
                                                 f"into shards with `fastloader pack`")
                continue
            if split.shuffle == "block" and dataset.format == "folder":
                self.fail(f"{name}.shuffle", "block reads the split's tar shards block by block, and dataset.format: "
                                             "folder reads image files, which have no shards to group; set "
                                             f"{name}.shuffle: true (a uniform permutation costs image files "
                                             "nothing more), or pack the split into shards with `fastloader pack` "
                                             "and read them with dataset.format: webdataset")

    def draws_need_a_uniform_order(self, splits: Mapping[str, SplitConfig]) -> None:
        """Weights draw at random: `shuffle: false` cannot keep the index order, and the block order is
        refused with them (docs/semantics.md, the block order: grouped by block, the draws of a rare
        sample would crowd the few blocks that hold it). An epoch_size alone takes either uniform order."""
        for name, split in splits.items():
            weighted = [f"{name}.{key}" for key in ("weights", "class_weights") if getattr(split, key) is not None]
            if split.sources is not None and any(source.weight is not None for source in split.sources):
                weighted.append(f"{name}.sources[].weight")
            if split.shuffle == "block" and (weighted or split.epoch_size is not None):
                keys = weighted or [f"{name}.epoch_size"]
                self.fail(f"{name}.shuffle", f"block reads every shard once an epoch, and {', '.join(keys)} draw "
                                             f"samples with replacement (or more than once an epoch): drawn "
                                             f"samples grouped by block would crowd the few blocks that hold a "
                                             f"rare sample (docs/semantics.md, the block order). Set "
                                             f"{name}.shuffle: true, or remove {keys[0]}")
            if split.shuffle is False and weighted:
                self.fail(f"{name}.shuffle", f"false reads the samples in index order, and {weighted[0]} draws them at "
                                             f"random in proportion to their weights; set {name}.shuffle: true, or "
                                             f"remove {weighted[0]}")

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
        for key in ("batch_size", "shuffle", "block_size", "drop_last", "folder", "file_list", "shards", "files",
                    "sources", "weights", "class_weights", "epoch_size", "aug_repeats", "label_smoothing"):
            if key in raw and (key not in DRAW_KEYS + ("sources",) or raw[key] is not None):
                values[key] = self.coerce(raw[key], hints[key], f"{name}.{key}")
            elif key in defaults:
                values[key] = defaults[key]
        for key in ("shards", "files"):
            if isinstance(values.get(key), str):
                values[key] = (values[key],)
        if values.get("sources") is not None:
            self.check_sources(name, mode, values)
        if values.get("block_size") is not None and values["shuffle"] != "block":
            self.fail(f"{name}.block_size", f"applies only with {name}.shuffle: block, and split '{name}' has shuffle: "
                                            f"{_show(values['shuffle'])}; remove {name}.block_size, or set "
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
        self.check_sizes(name, values["transform"])
        if "mixup" in raw:
            values["mixup"] = self.section(MixupConfig, raw["mixup"], f"{name}.mixup")
        self.validate_fields(SplitConfig, values, name)
        return SplitConfig(**values)

    def check_sizes(self, name: str, t: TransformConfig) -> None:
        """A size schedule that can be followed: a ramp that goes up and ends after it starts; one
        schedule, not two (docs/semantics.md#output-sizes)."""
        ramp, key = t.progressive, f"{name}.transform.progressive"
        if ramp is not None:
            if ramp.min_size > t.size:
                self.fail(f"{key}.min_size", f"{ramp.min_size} is above {name}.transform.size {t.size}, where the "
                                             f"ramp ends; set min_size <= size (FFCV's ResNet-50: 160 up to 192)")
            if ramp.end_epoch <= ramp.start_epoch:
                self.fail(f"{key}.end_epoch", f"{ramp.end_epoch} is not after start_epoch {ramp.start_epoch}: the ramp "
                                              f"would end before it starts; set end_epoch > start_epoch")
            if t.sizes is not None:
                self.fail(f"{name}.transform.sizes", f"a size per batch and {key} are two schedules of one size; "
                                                     f"keep one of them")

    def check_sources(self, name: str, mode: str, values: dict) -> None:
        """A split's sources: each says where its samples are with one key; the split itself then says
        nothing of it; weights on every source or on none, not all 0, and none in eval mode; names distinct."""
        sources = values["sources"]
        if not sources:
            return  # refused by its check: a list of at least one
        for key in SOURCE_KINDS:
            if values.get(key) is not None:
                self.fail(f"{name}.{key}", f"split '{name}' reads its samples from {name}.sources; move {name}.{key} "
                                           f"into a source (e.g. sources: [{{{key}: ...}}]), or remove it")
        for number, source in enumerate(sources):
            kinds = [key for key in SOURCE_KINDS if getattr(source, key) is not None]
            if len(kinds) != 1:
                found = f"it sets {' and '.join(kinds)}" if kinds else "it sets none of them"
                self.fail(f"{name}.sources[{number}]", f"a source reads one of folder, file_list, shards or "
                                                       f"files, and {found}; give each source one, e.g. "
                                                       f"{{folder: extra/train}}")
            if source.format is not None and source.files is None:
                self.fail(f"{name}.sources[{number}].format", "says how a source's `files` are stored (parquet or "
                                                              f"arrow), and this source reads {kinds[0]}; remove it")
            for key in ("shards", "files"):
                if isinstance(getattr(source, key), str):
                    source = dataclasses.replace(source, **{key: (getattr(source, key),)})
            sources = (*sources[:number], source, *sources[number + 1:])
        values["sources"] = tuple(sources)
        weighted = [source.weight is not None for source in sources]
        if any(weighted) and mode != "train":
            at = weighted.index(True)
            self.fail(f"{name}.sources[{at}].weight", f"applies only to train mode, and split '{name}' has mode: "
                                                      f"{mode}: eval reads every sample of every source exactly "
                                                      f"once; remove the sources' weights, or set {name}.mode: train")
        if any(weighted) and not all(weighted):
            at = weighted.index(False)
            self.fail(f"{name}.sources[{at}].weight", "missing: set weight on every source (each one's share of the "
                                                      "epoch's draws) or on none (the sources read as one split)")
        if all(weighted) and not any(source.weight > 0 for source in sources):
            self.fail(f"{name}.sources[0].weight", "every source's weight is 0, so no sample could be drawn; give "
                                                   "at least one source a weight above 0")
        names = [source.name or f"source{number}" for number, source in enumerate(sources)]
        twice = next((n for n in names if names.count(n) > 1), None)
        if twice is not None:
            self.fail(f"{name}.sources[{len(names) - 1 - names[::-1].index(twice)}].name",
                      f"{twice!r} names two sources; give each source its own name")

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
                    self.fail(dotted, f"must be {wants}, got {_show(values[f.name])}")

    def coerce(self, value: Any, hint: Any, path: str) -> Any:
        """Check `value` against a type hint, converting YAML lists to tuples and ints to floats."""
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
                    refusals.append(error)
            not_finite = [error for error in refusals if "expected a finite number" in str(error)]
            if not_finite:  # the type fits, the value does not: say so rather than "expected a number"
                raise not_finite[0]
            self.fail(path, f"expected {_describe_type(hint)}, got {_show(value)}")
        if dataclasses.is_dataclass(hint):
            return self.section(hint, value, path)
        if origin is collections.abc.Mapping:
            if not isinstance(value, Mapping):
                self.fail(path, f"expected {_describe_type(hint)}, got {_show(value)}")
            return {str(key): self.coerce(item, args[1], f"{path}.{key}") for key, item in value.items()}
        if origin is Literal:
            if value in args and type(value) is type(args[args.index(value)]):
                return value
            close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
            hint_text = f"; did you mean '{close[0]}'?" if close else ""
            self.fail(path, f"expected {_describe_type(hint)}, got {_show(value)}{hint_text}")
        if origin is tuple:
            if not isinstance(value, (list, tuple)):
                self.fail(path, f"expected {_describe_type(hint)}, got {_show(value)}")
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(self.coerce(v, args[0], f"{path}[{i}]") for i, v in enumerate(value))
            if len(value) != len(args):
                self.fail(path, f"expected {_describe_type(hint)}, got {len(value)} values: {_show(value)}")
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
            self.fail(path, f"expected null, got {_show(value)}")
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
                    self.fail(path, f"expected a finite number, got {_show(value)}")
                return number
        elif hint is str:
            if isinstance(value, str):
                return value
        else:  # pragma: no cover - a schema error, not a user error
            raise TypeError(f"unsupported type hint {hint!r} at {path}")
        self.fail(path, f"expected {_describe_type(hint)}, got {_show(value)}")


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


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        value = list(value)
    text = repr(value) if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True).strip()
    return text.removesuffix("\n...").strip()
