"""A shard's node-cache copy against its index over an object store (the real S3 server of
tests/objectstore.py, real shards written by `pack` with their `.idx`): a copy whose middle reads as
zeros (a crash after an unsynced write) is fetched again, not blamed on a good index (issue 68.9);
an index whose byte ranges lie is named after one fetch again of its shard, not fetched again and
again until a RecursionError skips the sample, and a new loader sets it aside (issue 68.10).
Device: CPU, both backends (DALI: its CPU flavour)."""
from __future__ import annotations

import gc
import json
import logging
import weakref
from pathlib import Path

import pytest
from remotefiles import bucket_for, remote_config, uploaded
from test_shard_index_file import BACKENDS, labels_by_key, shard  # noqa: F401 - the fixture

from fastloader import build_loader
from fastloader.errors import SourceChanged
from fastloader.sources import node_cache, reading
from fastloader.sources.tar_members import stale_index_marker


def _loader(tmp_path, url: str, name: str, backend: str):
    config = remote_config(tmp_path, {"val": f"{url}/{name}"}, backend=backend,
                           val={"batch_size": 4, "transform": {"size": 32}})
    return build_loader(config, "val")


def _labels(loader) -> dict[str, int]:
    with loader:
        labels = [label for _, batch in loader for label in batch.tolist()]
        names = [loader.index.relpath(i).split(":")[-1] for i in range(len(loader.index))]
    return dict(zip(names, labels))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_copy_zeroed_mid_shard_is_fetched_again_not_blamed_on_its_index(shard, backend, tmp_path,  # noqa: F811
                                                                           object_store, request, caplog):
    truth = labels_by_key(shard, "torch")
    url = uploaded(object_store, bucket_for(request), shard.parent)
    loader = _loader(tmp_path, url, shard.name, backend)
    location = loader.index.location(0)
    with node_cache.cache_of(loader.index.store).opened(location):  # the copy, fetched before a label is checked
        pass
    copy = next(p for p in (tmp_path / "node").iterdir() if p.name.endswith(".tar"))
    size = copy.stat().st_size
    with open(copy, "r+b") as handle:  # what a crash after an unsynced write leaves: zeros, the size kept
        handle.seek(size // 3)
        handle.write(bytes(size // 3))
    caplog.set_level(logging.WARNING, logger="fastloader")
    labels = _labels(loader)
    assert labels == {name.split(":")[-1]: label for name, label in truth.items()} and not loader.bad_samples
    assert f"the copy of {url}/{shard.name} was damaged" in caplog.text
    assert not stale_index_marker(f"{url}/{shard.name}", location.identity.etag).exists()  # the index is good
    assert copy.read_bytes() == shard.read_bytes()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_index_whose_byte_ranges_lie_is_named_after_one_fetch_again_then_set_aside(shard, backend,  # noqa: F811
                                                                                       tmp_path, object_store,
                                                                                       request, caplog):
    truth = labels_by_key(shard, "torch")
    index = json.loads(Path(f"{shard}.idx").read_text())
    images = [member for member in index["members"] if member[0].endswith(".png")]
    (images[3][1], images[3][2]), (images[4][1], images[4][2]) = (images[4][1], images[4][2]), \
        (images[3][1], images[3][2])  # two images' ranges swapped, their headers' digests not
    Path(f"{shard}.idx").write_text(json.dumps(index))
    url = uploaded(object_store, bucket_for(request), shard.parent)
    loader = _loader(tmp_path, url, shard.name, backend)
    with pytest.raises(SourceChanged) as raised:
        [labels for _, labels in loader]
    assert reading.fetch_counters(loader.index.store).fetched_shards <= 2  # the copy, and once again
    loader.close()
    assert f"{url}/{shard.name}.idx does not describe the shard {url}/{shard.name}: the tar header before " \
           f"{url}/{shard.name}:{images[3][0]} is not the one it lists" in str(raised.value) or \
           f"{url}/{shard.name}:{images[4][0]} is not the one it lists" in str(raised.value)
    assert "`fastloader pack` writes a true one" in str(raised.value)
    caplog.set_level(logging.WARNING, logger="fastloader")
    labels = _labels(_loader(tmp_path, url, shard.name, backend))
    assert labels == {name.split(":")[-1]: label for name, label in truth.items()}
    assert f"{url}/{shard.name}.idx does not describe the shard it stands beside: the tar header of " in caplog.text


@pytest.mark.timeout(300)
def test_what_a_process_found_of_copies_is_each_node_caches_own_and_goes_with_it(shard, tmp_path,  # noqa: F811
                                                                                 object_store, request):
    """What a process found of a shard's node-cache copy (its labels checked, fetched again once) is
    kept by the node cache of those copies (node_cache.CopyChecks): a loader with a cache of its own
    fetches its own copy again where another loader's copy was fetched again already (a set of the
    process's refused it: "once a shard and process"), and a closed loader's checks go with its cache.
    Device: CPU, torch backend."""
    url = uploaded(object_store, bucket_for(request), shard.parent)
    loaders = [build_loader(remote_config(tmp_path / name, {"val": f"{url}/{shard.name}"}, backend="torch",
                                          workers={"num_workers": 0}, val={"batch_size": 4, "transform": {"size": 32}}),
                            "val") for name in ("a", "b")]
    locations = [loader.index.location(0) for loader in loaders]
    for location in locations:
        with node_cache.cache_of(location.store).opened(location):  # each cache's own copy, fetched
            pass
    assert reading.fetch_again(locations[0], "a check failed")
    assert not reading.fetch_again(locations[0], "a check failed")  # once a shard and cache
    assert reading.fetch_again(locations[1], "a check failed")  # the other cache's copy is its own
    checks = weakref.ref(node_cache.cache_of(locations[0].store).copy_checks)
    assert checks().fetched_again == {(locations[0].file, locations[0].identity.etag)}
    for loader in loaders:
        loader.close()
    del loaders, locations
    gc.collect()
    assert checks() is None
