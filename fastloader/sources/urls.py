"""The words of an object store's URLs that modules below the store's client need: which paths are
URLs. A leaf, so that the byte readers, the config and the formats can tell a URL from a path
without importing the store's client (remote.py)."""
from __future__ import annotations

SCHEMES = ("s3://", "s3a://", "gs://", "az://", "abfs://", "abfss://", "azure://", "adl://", "https://", "http://")
"""The URL schemes read from an object store; anything else is a local path."""


def is_url(path: object) -> bool:
    """Whether a shard path names an object in a store (`s3://bucket/key` ...) rather than a local file."""
    return isinstance(path, str) and path.startswith(SCHEMES)
