"""A tuned file (`fastloader tune` writes it): the loader settings measured best on one kind of
machine, applied over a config that names it (`tuned: FILE`), and the warning when it is used on
another kind.

Why a file of its own: the settings are the machine's, not the job's. One config serves a laptop
and a GPU node; each node kind gets the file measured on it. The file holds only keys that change
how fast batches come, never what they hold (TUNABLE_KEYS), so applying it cannot change a
training run's samples, labels or order; a file with any other key is refused.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Mapping

import yaml

from . import yaml_text
from .errors import ConfigError
from .machine import installed_version, usable_cores

log = logging.getLogger("fastloader")

TUNABLE_KEYS = ("backend", "workers.num_workers", "workers.prefetch_factor", "workers.pin_memory",
                "dali.threads", "dali.feed_processes", "dali.hw_decoder_load", "dali.fancy_upsampling")
"""The keys a tuned file may set: how wide and how far ahead the loader works, and which backend,
none of which changes the samples, labels or order delivered (docs/config.md#tuned-settings).
workers.prefetch_factor is both backends' prefetch depth (DALI's prefetch_queue_depth)."""
MEASURED_ON = "tuned.measured_on"
"""The key of what the settings were measured on (machine_key), which the file holds beside them."""
COMPARED = ("cores", "ranks_per_node", "gpu", "torch", "dali", "data_format")
"""What a tuned file's measurement depends on: used where any of these differ, build_loader warns."""


def machine_key(ranks_per_node: int, data_format: str) -> dict[str, Any]:
    """What a measurement depends on: the cores this process may use (each of the ranks_per_node
    ranks gets its share of them), the GPU, the torch and DALI versions, and the data's format."""
    import torch
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    dali = installed_version("nvidia-dali-cuda130")
    if dali == "not installed":
        dali = installed_version("nvidia-dali-cuda120")
    return {"cores": usable_cores(), "ranks_per_node": ranks_per_node, "gpu": gpu,
            "torch": str(torch.__version__), "dali": dali, "data_format": data_format}


def data_format(fmt: str, cached: bool) -> str:
    """The data's format as a measurement depends on it: dataset.format, and whether the pixels come
    from the uint8 cache (dataset.cache)."""
    return f"{fmt}{' (uint8 cache)' if cached else ''}"


def nested(flat: Mapping[str, Any]) -> dict[str, Any]:
    """{"workers.num_workers": 2} as {"workers": {"num_workers": 2}}: a config's own layout."""
    tree: dict[str, Any] = {}
    for key, value in flat.items():
        put(tree, key, value)
    return tree


def put(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set dotted `key` in a nested mapping, making (or replacing with) a section where a part is not one."""
    node = tree
    *parents, last = key.split(".")
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


def flat(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The reverse of nested: every key dotted, but tuned.measured_on's, which is one value."""
    found: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and dotted != MEASURED_ON:
            found.update(flat(value, f"{dotted}."))
        else:
            found[dotted] = value
    return found


def read_tuned(path: Path) -> dict[str, Any]:
    """The file's settings as dotted keys (measured_on included), or an error naming the file, the
    key and the fix: a missing or unreadable file, or a key that is not a tunable one."""
    fix = "run `fastloader tune CONFIG --out FILE` to write it"
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"tuned file {str(path)!r} not found; {fix}, or remove the config's `tuned` key") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"tuned file {str(path)!r} cannot be read ({error}); {fix}") from None
    try:
        tree = yaml_text.load(text) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"tuned file {str(path)!r}: not valid YAML: {error}; {fix}") from None
    if not isinstance(tree, Mapping):
        raise ConfigError(f"tuned file {str(path)!r}: the top level must be a mapping of config keys; {fix}")
    settings = flat(tree)
    refused = [key for key in settings if key not in TUNABLE_KEYS and key != MEASURED_ON]
    if refused:
        raise ConfigError(f"tuned file {str(path)!r} sets {', '.join(map(repr, refused))}: a tuned file sets only "
                          f"keys that change how fast batches come, not what they hold ({', '.join(TUNABLE_KEYS)}); "
                          f"set the others in the config itself")
    return settings


def tuned_as_section(raw: dict) -> None:
    """`tuned: FILE` as the section it is short for, {file: FILE}, so that an override of tuned.file applies."""
    if isinstance(raw.get("tuned"), (str, os.PathLike)):
        raw["tuned"] = {"file": str(raw["tuned"])}


def apply_tuned(raw: dict, base_dir: Path, origins: dict[str, str]) -> None:
    """Apply the file `raw` names in `tuned` (a path, or {file: path}) over `raw`'s own values, but
    not over a key an override set (origins names those): the command line still wins."""
    tuned_as_section(raw)
    tuned = raw.get("tuned")
    if not isinstance(tuned, dict) or not isinstance(tuned.get("file"), (str, os.PathLike)):
        return  # no file named (a wrong type fails the schema's check, with its key)
    path = Path(os.path.expandvars(os.path.expanduser(str(tuned["file"]))))
    path = path if path.is_absolute() else base_dir / path
    tuned["file"] = str(path)
    for key, value in read_tuned(path).items():
        if key in origins and key != MEASURED_ON:
            continue
        put(raw, key, value)
        origins[key] = f"tuned file {path}"


def mismatches(measured_on: Mapping[str, Any], here: Mapping[str, Any]) -> list[str]:
    """'cores: 2 there, 1 here', for each thing the measurement depends on that differs."""
    return [f"{key}: {measured_on.get(key)} there, {here.get(key)} here" for key in COMPARED
            if key in measured_on and str(measured_on.get(key)) != str(here.get(key))]


_WARNED: set[tuple[str, ...]] = set()
"""The differences warned of in this process: a second loader (val's) does not repeat the warning."""


def warn_if_measured_elsewhere(measured_on: Mapping[str, Any] | None, where: str, ranks_per_node: int,
                               data_format: str) -> list[str]:
    """Warn (once per process and difference) where tuned settings are used on another kind of
    machine or data than they were measured on; the differences, empty where none."""
    if not measured_on:
        return []
    different = mismatches(measured_on, machine_key(ranks_per_node, data_format))
    if different and tuple(different) not in _WARNED:
        _WARNED.add(tuple(different))
        log.warning("tuned settings from %s were measured on another kind of machine or data (%s): they may be slow "
                    "here; run `fastloader tune` on this kind of node and name its file in `tuned`", where,
                    "; ".join(different))
    return different
