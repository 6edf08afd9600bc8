"""The paths a config holds, made absolute where it is loaded: relative to the config file's
folder (a dict's and an override's: to the working directory), a split's shards relative to
dataset.root where it is set; dataset.root's default for configs that name their files; and
dataset.classes given as a file, read into names.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from .errors import ConfigError
from .schema import DEFAULT_ROOT_ORIGIN, SECTIONS
from .sources.class_names import read_class_names
from .sources.registry import FORMATS
from .sources.urls import is_url

DATASET_PATHS = ("root", "exclude", "cache")
"""dataset keys that hold paths: relative ones are resolved against the config file's folder."""


REMOTE_PATHS = ("cache_dir",)
"""dataset.remote keys that hold paths, resolved as DATASET_PATHS are."""


def _is_path_key(dotted: str) -> bool:
    """A key whose relative path an override gives relative to the working directory (shards: see
    resolve_shards)."""
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


def resolve_paths(raw: dict, base_dir: Path) -> dict:
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


def resolve_shards(raw: dict, base_dir: Path, origins: Mapping[str, str]) -> None:
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


def default_shard_root(raw: dict, base_dir: Path, origins: dict[str, str], source_given: bool = False) -> None:
    """format: webdataset names its shards per split; dataset.root, which it does not need, defaults
    to the config's folder (and so does the whole dataset section where every split names its files
    or its source, or where build_loader is given the source: `source_given`)."""
    if "dataset" not in raw and (source_given or _containers_only(raw)):
        raw["dataset"] = {}
    dataset = raw.get("dataset")
    if isinstance(dataset, dict) and "root" not in dataset and (
            source_given or _format_names_its_files(dataset.get("format")) or _containers_only(raw)):
        dataset["root"] = str(base_dir)
        origins["dataset.root"] = DEFAULT_ROOT_ORIGIN


def _format_names_its_files(name: object) -> bool:
    """Whether dataset.format's splits name their own files (the registry's needs_root)."""
    return isinstance(name, str) and name in FORMATS and not FORMATS[name].needs_root


def _containers_only(raw: dict) -> bool:
    """Whether every split reads shards, parquet/Arrow files or a source of its own (its own keys, or
    each of its sources'), or is held out of another: then no split needs dataset.root, whatever
    dataset.format says."""
    def containers(item: object) -> bool:
        return isinstance(item, dict) and ("shards" in item or "files" in item or "source" in item)
    splits = [section for name, section in raw.items() if name not in SECTIONS and isinstance(section, dict)]
    return bool(splits) and all(containers(split) or "held_out" in split or (  # it reads another split's
        isinstance(split.get("sources"), list) and split["sources"] and all(containers(source)
                                                                             for source in split["sources"]))
        for split in splits)


def resolve_override_path(key: str, value: Any) -> Any:
    if key.endswith(".sources") and isinstance(value, list):  # each source's file list (shards: resolve_shards)
        return [{**item, "file_list": _resolve_one(item["file_list"], Path.cwd())}
                if isinstance(item, dict) and "file_list" in item else item for item in value]
    return _resolve_one(value, Path.cwd()) if _is_path_key(key) or (key == "dataset.classes" and
                                                                   isinstance(value, str)) else value


def read_classes_file(raw: dict, origins: Mapping[str, str], source: str) -> None:
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
