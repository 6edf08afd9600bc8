"""dataset.on_bad_image, decided in one place: what a file or shard member that cannot be used does
when it is found before any batch: while indexing shards, screening, building the uint8 cache, or
opening a cache that lists bad files.

raise: a BadImageError naming the first one (and how many more) and the ways on; skip: each one
logged once, in one wording, and handed back to be listed in loader.bad_samples. What a backend
finds while decoding raises the same error with the same wording (`errors.refused_file`) or is
skipped through `contract._skip_sample`, which logs it once.
"""
from __future__ import annotations

import logging
from typing import Sequence

from .errors import BadImageError, refused_file
from .schema import Config

log = logging.getLogger("fastloader")

LOGGED_EACH = 50
"""Found items logged one by one up to this many; the rest in one line (a broken shard can hold thousands)."""


def refuse(config: Config, found: Sequence[tuple[str, str]], context: str = "",
           noun: str = "files") -> list[tuple[str, str]]:
    """Apply dataset.on_bad_image to (name, reason) pairs; returns them (skip) or raises (raise).
    `context` says where they were found, e.g. "listed as bad in the cache DIR"; `noun` what they are."""
    found = list(found)
    if not found:
        return found
    if config.dataset.on_bad_image == "raise":
        name, reason = found[0]
        more = f" ({len(found) - 1} more {noun} fail the same check)" if len(found) > 2 else \
            " (1 more fails the same check)" if len(found) == 2 else ""
        raise BadImageError(refused_file(name, reason, config.source, context) + more)
    where = f"; {context}" if context else ""
    for name, reason in found[:LOGGED_EACH]:
        log.warning("left out %s: %s (dataset.on_bad_image: skip%s)", name, reason, where)
    if len(found) > LOGGED_EACH:
        log.warning("left out %d more (dataset.on_bad_image: skip%s); all are listed in loader.bad_samples",
                    len(found) - LOGGED_EACH, where)
    return found
