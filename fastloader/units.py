"""Byte sizes as people write them ('256MB', '1G', '50GB'): one parser for the command line
(`pack --shard-size`) and for config keys that take a size (`dataset.remote.cache_limit`)."""
from __future__ import annotations

import re

from .errors import ConfigError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)\s*$", re.IGNORECASE)
UNITS = "B (bytes), K or KB, M or MB, G or GB, T or TB (powers of 1024; KiB ... too)"


def parse_size(text: str, key: str) -> int:
    """'256MB', '1G', '500k', '1048576B' -> bytes (powers of 1024); `key` names the option or config
    key in the error. A number without a unit is refused: `--shard-size 10` meant 10 MB, not 10
    bytes (a shard per image)."""
    match = _SIZE.match(str(text))
    if not match or float(match.group(1)) <= 0 or (not match.group(2) and match.group(3).upper() not in ("", "B")):
        raise ConfigError(f"{key}: expected a size such as 256MB, 1G or 500K, got {text!r}; units: {UNITS}")
    if not match.group(2) and not match.group(3):
        number = match.group(1)
        raise ConfigError(f"{key}: {text!r} has no unit; write {number}MB for megabytes or {number}B for "
                          f"bytes (units: {UNITS})")
    return int(float(match.group(1)) * 1024 ** " KMGT".index(match.group(2).upper() or " "))
