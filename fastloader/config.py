"""load_config: a YAML file, a dict or a Config, with dotted overrides -> a validated Config.

This module reads the text (size-capped, a key given twice refused, binary files named) and applies
the overrides; config_paths.py resolves the paths, config_build.py builds and checks the dataclasses,
config_rules.py the rules across keys, config_dump.py turns a Config back into data.

Why strict: a misspelled key that is silently ignored trains a model with the wrong augmentation
for days. Every unknown key, wrong type or out-of-range value fails at once, naming the file (or the
override), the dotted key, the value and, for unknown keys, the closest valid key.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import yaml

from . import yaml_text
from .config_build import ConfigBuilder
from .config_dump import OVERRIDE, config_to_raw, plain_copy
from .config_paths import default_shard_root, read_classes_file, resolve_override_path, resolve_paths, resolve_shards
from .config_tuned import apply_tuned, tuned_as_section
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


def load_config(config: str | os.PathLike | Mapping[str, Any] | Config,
                overrides: Mapping[str, Any] | list[str] | tuple[str, ...] | None = None,
                *, origin: str | None = None, source_given: bool = False) -> Config:
    """Read a config from a YAML path, a dict or a Config, apply overrides and validate it all.

    Relative paths in a file are relative to the file's folder; in a dict, in overrides, and in a
    config read from a pipe (`fastloader check <(cat job.yaml)`, /dev/stdin), to the current
    directory. `$FASTLOADER_BACKEND` replaces `backend` when set. `origin` names where the
    overrides come from in messages and logs (a command's option, say), instead of "override 'KEY'".
    `source_given`: the split is read from a source given in code (build_loader(source=...)), so
    the config needs no dataset section, as where every split names its own source.
    A file named by `tuned` (fastloader tune's) applies over the config's values, the overrides over it;
    a loaded Config has it applied already, unless an override names another.
    """
    origins: dict[str, str] = {}
    if isinstance(config, Config):
        if not overrides and not os.environ.get(BACKEND_ENV):
            return config
        raw, source, base_dir = config_to_raw(config), config.source, Path.cwd()
        origins.update(config.origins)
    elif isinstance(config, Mapping):
        _check_size(config, "<dict>")
        raw, source, base_dir = plain_copy(config), "<dict>", Path.cwd()
    else:
        path = Path(config)
        try:
            raw = yaml_text.load(_read_config_text(path)) or {}
        except yaml_text.DuplicateKeyError as error:
            raise ConfigError(f"{path}: {error}") from None
        except yaml.YAMLError as error:
            raise ConfigError(f"{path}: not valid YAML at {yaml_text.one_line(error)}") from None
        _check_size(raw, str(path))
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(raw).__name__}")
        source, base_dir = str(path), path.resolve().parent if path.is_file() else Path.cwd()  # a pipe: no folder
        raw = resolve_paths(raw, base_dir)

    tuned_as_section(raw)
    for key, value in _parse_overrides(overrides):
        origins[key] = origin or OVERRIDE.format(key=key)
        _check_size(value, origins[key])
        _set_dotted(raw, key, resolve_override_path(key, value), origins[key], source)
    if not isinstance(config, Config) or any(key.startswith("tuned") for key, _ in _parse_overrides(overrides)):
        apply_tuned(raw, base_dir if not isinstance(config, Config) else Path.cwd(), origins)
    resolve_shards(raw, base_dir, origins)
    default_shard_root(raw, base_dir, origins, source_given)
    read_classes_file(raw, origins, source)
    forced = os.environ.get(BACKEND_ENV)
    if forced:
        raw["backend"] = forced
        origins["backend"] = f"environment variable {BACKEND_ENV}"
    return ConfigBuilder(source, origins).config(raw)


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
    a folder, a missing path, an image or other binary file, a file that cannot be read. A pipe
    (bash's `<(cat job.yaml)`, /dev/stdin) is read as a file is."""
    fix = "Pass the path of a YAML file such as configs/sample.yaml."
    if path.is_dir():
        try:
            inside = sorted(p.name for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
        except OSError:
            inside = []
        hint = f"Pass a YAML file in it, such as {str(path / inside[0])!r}." if inside else \
            f"It holds no .yaml file. {fix}"
        raise ConfigError(f"config file {str(path)!r} is a folder, not a YAML file. {hint}")
    if not path.exists():
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
    from .decoding.screen import sniff
    image = sniff(head[:32])
    if image:
        return f"a{'n' if image[0] in 'AEIOU' else ''} {image} image"
    named = next((what for magic, what in BINARY_SIGNATURES if head.startswith(magic)), None)
    return named or f"binary data (starts with {head[:8].hex(' ')})"


def _parse_overrides(overrides) -> list[tuple[str, Any]]:
    """Overrides as (dotted key, value) pairs; `key=value` strings have their value parsed as YAML."""
    if overrides is None:
        return []
    if isinstance(overrides, (str, bytes)):
        raise ConfigError(f"overrides {overrides!r}: a string, where a list of 'dotted.key=value' strings or a dict is "
                          f"wanted: overrides=[{str(overrides)!r}], or {{'train.batch_size': 32}}")
    if isinstance(overrides, Mapping):
        return [pair for k, v in overrides.items() for pair in _section_keys(str(k), v)]
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


def _section_keys(key: str, value: Any) -> list[tuple[str, Any]]:
    """A mapping given for a section, as a config nests it ({"workers": {"num_workers": 2}}, a tuned
    file's layout), as one override per key, so that it changes those keys and keeps the section's others."""
    if isinstance(value, Mapping) and (key in SECTIONS or key == "dataset.remote"):
        return [pair for k, v in value.items() for pair in _section_keys(f"{key}.{k}", v)]
    return [(key, value)]


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
