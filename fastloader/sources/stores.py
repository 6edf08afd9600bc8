"""dataset.remote as one value: the object store's client settings and the node cache's, made once
where a split is prepared (registry.store_settings, for formats.build_index) and opened there,
before anything lists or reads a URL. Opening gives the loader a node cache of its own settings
(node_cache.open_cache: its token rides on every Location of the index) and lists with a client of
its own settings (remote.client_for); closing the loader releases the cache (the last loader that
holds it drops it, with all it kept). Nothing is set for the whole process, so two loaders with
different dataset.remote keep their own, and two with the same share one.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import node_cache, remote


@dataclass(frozen=True)
class StoreSettings:
    client: remote.Settings
    cache_dir: str | None
    cache_limit: int | None
    """Bytes; None: the node cache's default (a share of its disk's free space)."""
    concurrency: int

    def open(self) -> node_cache.NodeCache:
        """The node cache of these settings, for one more holder (repaired where a run was killed;
        the same one while these settings hold it); release_store(cache.token) when done."""
        return node_cache.open_cache(self.cache_dir, self.cache_limit, self.concurrency, remote.client_for(self.client))


def cache_limit(token: str) -> int:
    """The byte limit of the node cache an index's `store` names (the block budget's and the costs')."""
    return node_cache.cache_of(token).limit


def release_store(token: str) -> None:
    """A loader that held this node cache (its index's `store`) is closed; "": nothing to release."""
    if token:
        node_cache.release(token)
