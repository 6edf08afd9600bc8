"""dataset.exclude: the names every split leaves out (what `fastloader check --exclude-list` writes),
whatever the format: file paths, or `shard.tar:member` names of shard members, relative to
dataset.root or absolute."""
from __future__ import annotations

import os

from ..errors import ConfigError


def read_exclude_list(list_path: str, root: str) -> frozenset[str]:
    """dataset.exclude: image paths relative to dataset.root (or absolute), one per line, '#' comments."""
    if not os.path.isfile(list_path):
        raise ConfigError(f"dataset.exclude: file {list_path!r} does not exist; write it with "
                          f"`fastloader check CONFIG --exclude-list {list_path}` or remove the key")
    with open(list_path, encoding="utf-8", errors="surrogateescape") as handle:
        lines = [line.strip() for line in handle]
    return frozenset(os.path.normpath(os.path.relpath(line, root) if os.path.isabs(line) else line)
                     for line in lines if line and not line.startswith("#"))
