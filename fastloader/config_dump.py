"""A loaded Config back to plain data: for logs and JSON reports (the store's options hidden), and
as the `--set` options that give a command a config's overrides again.
"""
from __future__ import annotations

import dataclasses
import math
import shlex
from typing import Any, Mapping

import yaml

from .schema import DRAW_KEYS, EVAL_TRANSFORM_KEYS, TRAIN_SPLIT_KEYS, TRAIN_TRANSFORM_KEYS, VIEW_TRANSFORM_KEYS, Config


def plain_copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): plain_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_copy(v) for v in value]
    return value


def config_to_raw(config: Config) -> dict:
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
                if section["held_out"] is None:
                    section.pop("held_out")
                if section["views"] is None:
                    section.pop("views")
                else:  # a group as a file gives it: its count and name over its whole transform
                    section["views"] = [{"count": group["count"], **({"name": group["name"]} if group["name"] else {}),
                                         **{k: group["transform"][k] for k in VIEW_TRANSFORM_KEYS}}
                                        for group in section["views"]]
                raw[name] = section
        else:
            raw[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return plain_copy(raw)


def config_to_dict(config: Config) -> dict:
    """The resolved config as plain data, for logs and JSON reports: the store's options and each
    split's source_args (credentials, perhaps: a token, a connection string) show their names only."""
    return _hide_secrets(config_to_raw(config), "(set)")


def _hide_secrets(raw: dict, shown: str) -> dict:
    """`raw` with each of dataset.remote.options' and of every split's (and its sources') source_args'
    values replaced by `shown`: they may be credentials."""
    remote = raw["dataset"].get("remote") or {}
    if remote.get("options"):
        remote["options"] = {key: shown for key in remote["options"]}
    for section in raw.values():
        entries = section.get("sources") if isinstance(section, dict) else None
        for item in [section, *(entries if isinstance(entries, list) else [])]:
            if isinstance(item, dict) and isinstance(item.get("source_args"), dict):
                item["source_args"] = {key: shown for key in item["source_args"]}
    return raw


OVERRIDE = "override '{key}'"
"""The origin of a key set by an override (`--set KEY=VALUE`, or load_config's overrides)."""


SECRET_PLACEHOLDER = "<not shown: give it again>"
"""What a suggested command shows for a value of dataset.remote.options or a source_args, which may be
a secret."""


def override_options(config: Config, skip: tuple[str, ...] = ()) -> list[str]:
    """The `--set KEY=VALUE` options that give this config its overrides' values again (resolved, so
    they work from any folder): what a command that a message suggests must keep (but the keys in
    `skip`, which the command sets otherwise). dataset.remote.options' and source_args' values are
    never shown."""
    raw, options = _hide_secrets(config_to_raw(config), SECRET_PLACEHOLDER), []
    for key, origin in config.origins.items():
        if origin != OVERRIDE.format(key=key) or key in skip:
            continue
        value: Any = raw
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        text = yaml.safe_dump(value, default_flow_style=True, width=math.inf).strip().removesuffix("...").strip()
        options.append(f"--set {shlex.quote(f'{key}={text}')}")
    return options
