"""dataset.on_bad_image, decided in one place: what a file or shard member that cannot be used does
when it is found before any batch: while indexing shards, screening, building the uint8 cache, or
opening a cache that lists bad files.

raise: a BadImageError naming the first one (and how many more) and the ways on; skip: each one
logged once, in one wording, and handed back to be listed in loader.bad_samples. What a backend
finds while decoding raises the same error with the same wording (`errors.refused_file`) or is
skipped through `skipped_files.SkippedFiles.skip`, which logs it once.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal, Sequence

from .errors import BadImageError, refused_file

log = logging.getLogger("fastloader")

LOGGED_EACH = 50
"""Found items logged one by one up to this many; the rest in one line (a broken shard can hold thousands)."""


@dataclass(frozen=True)
class OnBadImage:
    """dataset.on_bad_image, and the config file a refusal names (Config.on_bad_image makes it): what
    the indexers, screening and the caches apply to what they find, without the config itself."""
    action: Literal["raise", "skip"]
    config_file: str

    def refuse(self, found: Sequence[tuple[str, str]], context: str = "",
               noun: str = "files") -> list[tuple[str, str]]:
        """Apply the action to (name, reason) pairs; returns them (skip) or raises (raise). `context`
        says where they were found, e.g. "listed as bad in the cache DIR"; `noun` what they are."""
        found = list(found)
        if not found:
            return found
        if self.action == "raise":
            name, reason = found[0]
            more = f" ({len(found) - 1} more {noun} fail the same check)" if len(found) > 2 else \
                " (1 more fails the same check)" if len(found) == 2 else ""
            raise BadImageError(refused_file(name, reason, self.config_file, context) + more)
        where = f"; {context}" if context else ""
        for name, reason in found[:LOGGED_EACH]:
            log.warning("left out %s: %s (dataset.on_bad_image: skip%s)", name, reason, where)
        if len(found) > LOGGED_EACH:
            log.warning("left out %d more (dataset.on_bad_image: skip%s); all are listed in loader.bad_samples",
                        len(found) - LOGGED_EACH, where)
        return found
