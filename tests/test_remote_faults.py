"""Faults of an object store and of the node cache, against the real local S3 server, on both backends
(CPU): named, never a hang. The store stopped mid-epoch (retried, then on, or stopped with the URL after
the retry budget); an object changed under a run (named, never mixed); a missing bucket or object and
refused credentials (at build, with the URL and the variable to set); a full cache disk (cache_dir and
the limit, nothing half-written kept); the client's options never logged."""
from __future__ import annotations

import io
import logging
import re
import tarfile
import threading
import time

import numpy as np
import pytest
from conftest import everything
from objectstore import start_server, stop_server
from PIL import Image
from remotefiles import bucket_for, packed, remote_config, uploaded
from shardfiles import add_member

from fastloader import build_loader
from fastloader.errors import BadImageError, ConfigError, StoreError

BACKENDS = ["torch", pytest.param("dali", marks=pytest.mark.skipif(
    not __import__("importlib").util.find_spec("nvidia.dali"), reason="NVIDIA DALI is not installed"))]


def sequential(tmp_path, object_store, request, backend: str, **remote) -> tuple[dict, int]:
    """A val split of 6 shards of 3 samples read in order, whose node cache holds 2 of them: the
    fetches of the later shards happen during the epoch. (config, shard size)."""
    folder = packed(tmp_path, per_class=6, per_shard=3)
    url = uploaded(object_store, bucket_for(request), folder)
    size = max(p.stat().st_size for p in folder.glob("val-*.tar"))
    config = remote_config(tmp_path, {"val": f"{url}/val-*.tar"}, backend=backend, val={"batch_size": 3},
                           dataset={"remote": {"cache_limit": f"{2 * size}B", "concurrency": 1, **remote}})
    return config, size


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_store_stopped_mid_epoch_and_started_again_is_retried_and_the_epoch_goes_on(
        tmp_path, object_store, request, backend):
    config, _ = sequential(tmp_path, object_store, request, backend)
    loader = build_loader(config, "val")
    batches = iter(loader)
    labels = next(batches)[1].tolist()
    object_store.proxy.stop()  # refused connections, open ones cut: as a store that went away
    restart = threading.Timer(1.5, object_store.proxy.start)
    restart.start()
    try:
        labels += [label for _, batch in batches for label in batch.tolist()]
    finally:
        restart.join()
    assert labels == [0] * 6 + [1] * 6 + [2] * 6  # every sample, in order, once
    assert loader.stats.network_wait_s > 1.0  # the readers waited through the outage, and it shows


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_store_back_within_retry_timeout_is_waited_for_after_the_clients_retries_are_spent(
        tmp_path, object_store, request, backend):
    """CI: the client's 10 retries (jittered backoff) ended 1.35 s into an outage of 1.5 s, and the
    epoch stopped though dataset.remote.retry_timeout (20 s) had not passed. With one client retry,
    spent at once, an outage of 1.5 s from the epoch's start is now waited out within that time."""
    config, _ = sequential(tmp_path, object_store, request, backend, retry_timeout=15, retries=1)
    loader = build_loader(config, "val")  # indexed; every shard is still to be fetched
    object_store.proxy.stop()
    restart = threading.Timer(1.5, object_store.proxy.start)
    restart.start()
    try:
        labels = [label for _, batch in loader for label in batch.tolist()]
    finally:
        restart.join()
    assert labels == [0] * 6 + [1] * 6 + [2] * 6


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_store_that_stays_away_stops_the_epoch_naming_the_url_after_the_retry_budget(
        tmp_path, object_store, request, backend):
    config, _ = sequential(tmp_path, object_store, request, backend, retry_timeout=2, retries=3)
    loader = build_loader(config, "val")
    batches = iter(loader)
    next(batches)
    object_store.proxy.stop()
    with pytest.raises(StoreError, match=r"s3://t-.*/wds/val-00000\d\.tar: downloading .* within "
                                         r"dataset\.remote\.retry_timeout \(2 s\).*AWS_ENDPOINT_URL"):
        for _ in batches:
            pass
    assert loader.bad_samples == []  # a store that went away is no sample's fault: nothing was skipped


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_object_changed_under_a_run_is_named_and_its_members_refused_never_mixed(
        tmp_path, object_store, request, backend):
    """The shard is replaced in the store after the loader indexed it: every fetch is conditional on
    the indexed ETag, so its members are refused by name (dataset.on_bad_image: skip), or stop the
    epoch (raise); the other shards' samples are all delivered, no byte of the new object is read."""
    config, _ = sequential(tmp_path, object_store, request, backend)
    config["dataset"]["remote"]["cache_limit"] = "1GB"
    loader = build_loader(config, "val")
    strict = build_loader({**config, "dataset": {**config["dataset"], "on_bad_image": "raise"}}, "val")
    bucket, key = bucket_for(request), "wds/val-000002.tar"
    replaced = io.BytesIO()
    with tarfile.open(fileobj=replaced, mode="w") as archive:
        add_member(archive, "other.png", (tmp_path / "shards" / "val-000000.tar").read_bytes()[:100])
    object_store.put(bucket, key, replaced.getvalue())
    labels, _ = everything(loader)
    changed = f"s3://{bucket}/{key}"
    assert len(labels) == 15 and all(name.startswith(f"{changed}:") for name, _ in loader.bad_samples)
    assert len(loader.bad_samples) == 3
    assert all("changed since it was indexed" in reason and "ETag" in reason for _, reason in loader.bad_samples)
    with pytest.raises(BadImageError, match=re.escape(changed) + r":.*changed since it was indexed"):
        everything(strict)


def test_a_missing_bucket_or_object_fails_at_build_with_the_url_and_what_to_check(tmp_path, object_store,
                                                                                  request):
    folder = packed(tmp_path, per_class=2, per_shard=3)
    url = uploaded(object_store, bucket_for(request), folder)
    with pytest.raises(ConfigError, match=r"s3://no-such-bucket-here/wds: the bucket s3://no-such-bucket-here "
                                          r"does not exist .*AWS_ENDPOINT_URL"):
        build_loader(remote_config(tmp_path, {"val": "s3://no-such-bucket-here/wds/val-{000000..000001}.tar"}),
                     "val")
    with pytest.raises(ConfigError, match=r"val\.shards: no shard found \('s3://.*/wds/val-000009\.tar': missing "
                                          r"\(no such object\)\); check the URL, and the store's environment "
                                          r"\(s3:// reads AWS_ACCESS_KEY_ID"):
        build_loader(remote_config(tmp_path, {"val": f"{url}/val-000009.tar"}), "val")
    some = build_loader(remote_config(tmp_path, {"val": f"{url}/val-{{000000..000009}}.tar"}), "val")
    assert len(some.index) == 6  # the shards that are there; the missing ones named, as on disk
    assert sum(1 for name, reason in some.bad_samples if "no such object" in reason) == 8


@pytest.fixture
def checking_server():
    """A second server that checks credentials (and knows none of the tests' keys)."""
    store = start_server({"INITIAL_NO_AUTH_ACTION_COUNT": "0"})
    yield store
    stop_server(store)


def test_refused_credentials_fail_at_build_naming_the_variables_to_set(tmp_path, checking_server, monkeypatch):
    for name, value in checking_server.environment().items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=r"s3://private/train-000000\.tar: the store refused the request .*403.*"
                                          r"Check the credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        build_loader(remote_config(tmp_path, {"val": "s3://private/train-000000.tar"}), "val")


def test_the_clients_options_are_checked_and_never_logged(tmp_path, object_store, request, caplog):
    folder = packed(tmp_path, per_class=2, per_shard=3)
    url = uploaded(object_store, bucket_for(request), folder)
    secret = "do-not-print-this-secret"
    config = remote_config(tmp_path, {"val": f"{url}/val-*.tar"},
                           dataset={"remote": {"options": {"secret_access_key": "testing", "session_token": secret}}})
    caplog.set_level(logging.DEBUG, logger="fastloader")
    loader = build_loader(config, "val")
    assert len([label for _, labels in loader for label in labels.tolist()]) == 6
    assert secret not in caplog.text and secret not in repr(loader) and secret not in str(loader.describe())
    assert loader.describe()["config"]["dataset"]["remote"]["options"]["session_token"] == "(set)"
    with pytest.raises(ConfigError, match=r"dataset\.remote\.options: .*'no_such_option' is not valid"):
        build_loader(remote_config(tmp_path, {"val": f"{url}/val-*.tar"},
                                   dataset={"remote": {"options": {"no_such_option": "1"}}}), "val")


def noise_shard(path, size: int) -> None:
    """A shard of one sample: a PNG of random pixels, about size x size x 3 bytes."""
    pixels = np.random.default_rng(size).integers(0, 256, (size, size, 3), dtype=np.uint8)
    image = io.BytesIO()
    Image.fromarray(pixels).save(image, format="PNG", compress_level=0)
    with tarfile.open(path, "w") as archive:
        add_member(archive, "noise.png", image.getvalue())
        add_member(archive, "noise.cls", b"0")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_full_cache_disk_stops_the_epoch_naming_cache_dir_and_the_limit_with_nothing_half_written(
        tmp_path, object_store, request, small_disk, backend):
    """A real 1 MB file system as cache_dir, with a limit larger than the disk: the shard that does
    not fit fails before a byte of it is fetched (its space is reserved first), named with the
    folder and the limit; no partial file is left, and what the cache holds is whole."""
    folder = tmp_path / "big"
    folder.mkdir()
    for number in range(4):
        noise_shard(folder / f"val-{number:06d}.tar", 300)  # 270 KB each: the fourth does not fit
    url = uploaded(object_store, bucket_for(request), folder)
    disk = small_disk("1m")
    config = remote_config(tmp_path, {"val": f"{url}/val-*.tar"}, backend=backend, val={"batch_size": 1},
                           dataset={"remote": {"cache_dir": str(disk), "cache_limit": "100MB"}})
    with pytest.raises(StoreError, match=re.escape(f"the disk of the node cache {disk} is full") +
                       r".*its limit is dataset\.remote\.cache_limit: 100\.0 MiB.*nothing half-written was kept"):
        everything(build_loader(config, "val"))
    deadline = time.monotonic() + 20  # a fetch ahead still under way ends too, and leaves nothing half-written
    while any(p.name.endswith(".partial") for p in disk.iterdir()):
        assert time.monotonic() < deadline, sorted(p.name for p in disk.iterdir())
        time.sleep(0.05)
    left = [p for p in disk.iterdir() if p.is_file()]
    for shard in [p for p in left if p.name.endswith(".tar")]:
        assert shard.stat().st_size == (folder / shard.name.split("-", 2)[2]).stat().st_size


def test_a_download_completing_while_the_cache_counts_its_bytes_is_counted_once_not_missed(tmp_path):
    """Device: none (the node cache alone, real files, real threads). The cache counts its complete
    shards, then its partial downloads; a download renamed complete between the two counts was in
    neither, so one more shard was let in over the limit (CI: 3 shards held under a limit of 2). The
    rename now waits for the count: here it is started while the count is between its two scans."""
    from fastloader.sources import cache_folder, node_cache

    size = 1000
    cache = node_cache.NodeCache(tmp_path / "node", limit=2 * size, concurrency=1)
    old = tmp_path / "node" / f"{'a' * 16}-{size}-old.tar"
    old.write_bytes(b"\0" * size)
    partial = tmp_path / "node" / f".{'b' * 16}-{size}-new.tar.host-1-0.partial"
    partial.write_bytes(b"\0" * size)
    renamed = threading.Event()

    def commit():
        cache.space.commit(partial, tmp_path / "node" / f"{'b' * 16}-{size}-new.tar")
        renamed.set()

    class Counting(cache_folder.CacheFolder):
        def entries(self):
            found = super().entries()  # the complete shards: `old`, not yet `new`
            threading.Thread(target=commit).start()
            renamed.wait(0.5)  # before the fix, the rename lands here, before the partials are counted
            return found

    cache.files.__class__ = Counting
    with cache.space.account():  # as reserve holds it around evict
        fits = cache.space.evict(size)
    renamed.wait(5)
    held = sum(p.stat().st_size for p in (tmp_path / "node").iterdir() if p.name.endswith(".tar"))
    assert fits and held == size, (fits, held)  # `old` evicted to make room: the new shard was counted
