"""A split's file list: lines of `relative/path label`, relative to dataset.root."""
from __future__ import annotations

import logging
import os
from typing import Sequence

from ..errors import ConfigError
from ..samples import IndexBuilder, SampleIndex, label_problem
from ..words import plural
from .reading import not_regular, open_regular

log = logging.getLogger("fastloader")


def read_file_list(list_path: str, root: str, classes: Sequence[str] | None = None,
                   excluded: frozenset[str] = frozenset()) -> SampleIndex:
    """Lines of `relative/path label` (label an integer; paths may hold spaces; '#' starts a comment)."""
    if not os.path.isfile(list_path):
        what = not_regular(os.stat(list_path).st_mode) if os.path.exists(list_path) else "does not exist"
        raise ConfigError(f"file list {list_path!r}: {what}; fix the split's file_list key")
    builder = IndexBuilder()
    skipped = 0
    with open(open_regular(list_path), encoding="utf-8") as handle:  # replaced by a FIFO since: refused, not waited on
        for number, line in enumerate(handle, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.rsplit(None, 1)
            if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
                raise ConfigError(f"{list_path}:{number}: expected 'relative/path label', got {line!r}")
            label = int(parts[1])
            problem = label_problem(label, classes)
            if problem:
                raise ConfigError(f"{list_path}:{number}: {problem}")
            if os.path.normpath(parts[0]) in excluded:
                skipped += 1
            else:
                builder.add(parts[0], label)
    if not len(builder):
        raise ConfigError(f"file list {list_path!r} holds no samples")
    if classes is None:
        classes = [str(i) for i in range(int(builder.labels().max()) + 1)]
    if skipped:
        log.info("file list %s: %s, %d left out by dataset.exclude", list_path, plural(len(builder), "sample"), skipped)
    return builder.build(root, classes, excluded=skipped)
