"""dataset.remote as one value: the object store's client settings and the node cache's, built once
where a split is prepared (formats.build_index, the factory) and opened there, before anything lists
or reads a URL, rather than set as a side effect of listing files. The node cache itself stays per
process (node_cache.py: forked readers ask their parent), so opening it is what hands the settings
to every reader of the split.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..schema import Config, SplitConfig
from ..units import parse_size
from . import node_cache, remote
from .urls import is_url


@dataclass(frozen=True)
class StoreSettings:
    client: remote.Settings
    cache_dir: str | None
    cache_limit: int | None
    """Bytes; None: the node cache's default (a share of its disk's free space)."""
    concurrency: int

    @classmethod
    def of(cls, config: Config) -> "StoreSettings":
        settings = config.dataset.remote
        limit = parse_size(settings.cache_limit, "dataset.remote.cache_limit") if settings.cache_limit else None
        return cls(remote.Settings(settings.options, settings.timeout, settings.retries, settings.retry_timeout),
                   settings.cache_dir, limit, settings.concurrency)

    def open(self) -> node_cache.NodeCache:
        """This process's store client and node cache, set to these settings (repaired where a run was
        killed); the same cache again where they are unchanged."""
        remote.configure(self.client)
        return node_cache.configure(self.cache_dir, self.cache_limit, self.concurrency)


def reads_a_store(config: Config, split: SplitConfig) -> bool:
    """Whether the split names anything in an object store: its shards or files, its sources', or a
    dataset.root that is a URL."""
    patterns = [*(split.shards or ()), *(split.files or ())]
    for source in split.sources or ():
        patterns += [*(source.shards or ()), *(source.files or ())]
    return is_url(config.dataset.root) or any(is_url(pattern) for pattern in patterns)
