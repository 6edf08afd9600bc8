"""Where fastloader keeps what it writes for itself, outside any dataset.

Everything lives under one folder, `cache_home()`, so that one variable moves it (a node's local
disk, a scratch file system) and deleting it only costs the work of redoing it:

    sample-v<N>/    the embedded demo dataset (`dataset.root: builtin:sample`), generated on first use
    screen/         each dataset's header screening, so it runs once per dataset and machine
    transcoded/     PNG copies of the files DALI cannot decode (GIF)
    remote/         the node cache of shards in an object store (dataset.remote.cache_dir's default)
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_home() -> Path:
    """$FASTLOADER_CACHE_DIR, else $XDG_CACHE_HOME/fastloader, else ~/.cache/fastloader."""
    explicit = os.environ.get("FASTLOADER_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fastloader"


def remote_cache_folder() -> Path:
    """The node cache's folder when dataset.remote.cache_dir is not set (sources/node_cache.py)."""
    return cache_home() / "remote"


def screening_file(root: str, fingerprint: str, max_pixels: int) -> Path:
    """Where a dataset's screening result is kept (one per dataset folder, file list and bomb limit)."""
    return cache_home() / "screen" / f"{_dataset_key(root, fingerprint)}-{max_pixels}.json"


def transcode_folder(root: str, fingerprint: str) -> Path:
    """Where the PNG copies of a dataset's files in formats DALI cannot decode are kept."""
    return cache_home() / "transcoded" / _dataset_key(root, fingerprint)


def _dataset_key(root: str, fingerprint: str) -> str:
    """The dataset's files where they are now: its fingerprint (names and labels) and its folder
    (SampleIndex.root and .fingerprint)."""
    return hashlib.blake2b(f"{root}\0{fingerprint}".encode("utf-8", "surrogateescape"), digest_size=8).hexdigest()
