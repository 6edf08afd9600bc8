"""Who owns the node cache's tables in one process (issue 71.2), with the real local S3 server and
real shards: two loaders on one cache folder (one cache held by both, counted; or two caches with
other settings sharing the folder through the file system's locks), and a closed loader's cache
going with everything it kept, the shards it fetched again included. Device: CPU, torch backend
(the node cache is the same for both backends)."""
from __future__ import annotations

import gc
import logging
import time
import weakref

import pytest
from remotefiles import bucket_for, packed, remote_config, uploaded
from test_shard_index_file import labels_by_key, shard  # noqa: F401 - the fixture

from fastloader import build_loader
from fastloader.errors import StoreError
from fastloader.sources import node_cache
from fastloader.sources.tar_members import stale_index_marker


def _labels(loader) -> list[int]:
    return sorted(label for _, labels in loader for label in labels.tolist())


def _gone(reference: weakref.ref) -> bool:
    """Whether the object is freed, within 10 s (a fetch thread of a cancelled plan ends first)."""
    deadline = time.monotonic() + 10
    while reference() is not None and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    return reference() is None


@pytest.mark.timeout(180)
def test_two_loaders_on_one_cache_folder_share_it_and_the_last_close_frees_it(tmp_path, object_store, request):
    """Same dataset.remote: one NodeCache held by both (a reference count), one fetch for both; the
    first close leaves it to the second, the second close drops it. Another cache_limit on the same
    folder: a cache of its own, which finds the shard the first fetched (the folder's names and
    flocks are shared, as by two processes of the node) and fetches nothing."""
    url = uploaded(object_store, bucket_for(request), packed(tmp_path, per_class=2, per_shard=6))
    config = remote_config(tmp_path, {"val": f"{url}/val-*.tar"})
    first, second = build_loader(config, "val"), build_loader(config, "val")
    cache = node_cache.cache_of(first.index.store)
    assert node_cache.cache_of(second.index.store) is cache
    assert _labels(first) == _labels(second) == [0, 0, 1, 1, 2, 2]
    assert node_cache.counters(first.index.store).fetched_shards == 1  # one fetch, counted once for both
    other = build_loader(remote_config(tmp_path, {"val": f"{url}/val-*.tar"},
                                       dataset={"remote": {"cache_limit": "32MB"}}), "val")
    assert node_cache.cache_of(other.index.store) is not cache
    assert node_cache.cache_of(other.index.store).folder == cache.folder == tmp_path / "node"
    assert _labels(other) == [0, 0, 1, 1, 2, 2] and node_cache.counters(other.index.store).fetched_shards == 0
    other.close()
    reference, token = weakref.ref(cache), cache.token
    del cache
    first.close()
    assert node_cache.is_open(token) and _labels(second) == [0, 0, 1, 1, 2, 2]
    second.close()
    assert not node_cache.is_open(token) and _gone(reference)
    with pytest.raises(StoreError, match="is closed"):
        node_cache.cache_of(token)


def _damage_copy(folder) -> None:
    """What a crash after an unsynced write leaves in the shard's copy: zeros mid-file, the size kept."""
    copy = next(p for p in folder.iterdir() if p.name.endswith(".tar"))
    size = copy.stat().st_size
    with open(copy, "r+b") as handle:
        handle.seek(size // 3)
        handle.write(bytes(size // 3))


@pytest.mark.timeout(180)
def test_a_closed_loader_takes_the_shards_it_fetched_again_with_it(shard, tmp_path, object_store,  # noqa: F811
                                                                   request, caplog):
    """A shard's copy found damaged is fetched again once a cache (then a member that still fails is
    the index's fault). That record was the process's: a later loader of the same process whose copy
    was damaged again blamed the shard's good `.idx` (SourceChanged, the index set aside) instead of
    fetching it again. Now it is the cache's, and goes with the loader that held it."""
    truth = {name.split(":")[-1]: label for name, label in labels_by_key(shard, "torch").items()}
    url = uploaded(object_store, bucket_for(request), shard.parent)
    config = remote_config(tmp_path, {"val": f"{url}/{shard.name}"}, val={"batch_size": 4, "transform": {"size": 32}})
    caplog.set_level(logging.WARNING, logger="fastloader")
    for run in range(2):
        loader = build_loader(config, "val")
        location = loader.index.location(0)
        cache = node_cache.cache_of(loader.index.store)
        with cache.opened(location):  # the copy, fetched before a label is checked
            pass
        _damage_copy(tmp_path / "node")
        with loader:
            labels = [label for _, batch in loader for label in batch.tolist()]
            names = [loader.index.relpath(i).split(":")[-1] for i in range(len(loader.index))]
        assert dict(zip(names, labels)) == truth and not loader.bad_samples, run
        assert caplog.text.count("was damaged") == run + 1
        assert not stale_index_marker(f"{url}/{shard.name}", location.identity.etag).exists()  # the index is good
        reference = weakref.ref(cache)
        del cache
        assert _gone(reference), run  # the cache, its record of shards fetched again with it
