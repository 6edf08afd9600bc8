"""The tests' object store (tests/objectstore.py) is a real S3 server: obstore, the client
fastloader uses, reads what the tests put there, through a proxy that slows down, stops and starts."""
from __future__ import annotations

import time
from datetime import timedelta

import obstore
import pytest
from obstore.store import S3Store


def _store(object_store, bucket: str) -> S3Store:
    return S3Store(bucket, endpoint=object_store.endpoint, access_key_id="testing", secret_access_key="testing",
                   region="us-east-1", client_options={"allow_http": True, "timeout": "5s", "connect_timeout": "2s"},
                   retry_config={"max_retries": 0, "retry_timeout": timedelta(seconds=1),
                                 "backoff": {"init_backoff": timedelta(seconds=0.1),
                                             "max_backoff": timedelta(seconds=0.1), "base": 2}})


def test_objects_put_over_http_are_read_back_whole_and_by_range(object_store):
    bucket = object_store.make_bucket("selftest")
    object_store.put(bucket, "dir/a.bin", bytes(range(256)) * 4)
    store = _store(object_store, bucket)
    assert bytes(obstore.get(store, "dir/a.bin").bytes()) == bytes(range(256)) * 4
    assert bytes(obstore.get_range(store, "dir/a.bin", start=10, length=5)) == bytes(range(10, 15))
    assert obstore.head(store, "dir/a.bin")["size"] == 1024


def test_the_proxy_adds_latency_and_stops_and_starts(object_store):
    bucket = object_store.make_bucket("selftest")
    object_store.put(bucket, "b.bin", b"x" * 10)
    store = _store(object_store, bucket)
    object_store.proxy.latency = 0.2
    started = time.perf_counter()
    obstore.head(store, "b.bin")
    assert time.perf_counter() - started >= 0.2
    object_store.proxy.latency = 0.0
    object_store.proxy.stop()
    with pytest.raises(Exception):
        obstore.head(_store(object_store, bucket), "b.bin")
    object_store.proxy.start()
    assert obstore.head(_store(object_store, bucket), "b.bin")["size"] == 10
