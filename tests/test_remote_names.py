"""What a user writes about a store, as users write it, against the real local S3 server (CPU): a
malformed endpoint, a plain-HTTP endpoint without AWS_ALLOW_HTTP, a URL with '..' or '//', an odd key
beside the shards, a '?' in a shard's name. Each is read or refused at once with the key and the
fix: never a Rust panic past `except Exception`, an internal error, or a retry budget spent on a
request that cannot succeed (issue 41.4, 41.5, 41.13, 41.15)."""
from __future__ import annotations

import logging
import time

import pytest
from remotefiles import bucket_for, packed, remote_config, uploaded

from fastloader import build_loader
from fastloader.errors import ConfigError


def labels_of(loader) -> list[int]:
    return [label for _, labels in loader for label in labels.tolist()]


@pytest.fixture
def shards(tmp_path, object_store, request) -> str:
    return uploaded(object_store, bucket_for(request), packed(tmp_path, per_class=2, per_shard=3))


@pytest.mark.parametrize("endpoint", ["http://[::1", "ht!tp://x y", "127.0.0.1:9000", "http://host:port"])
def test_a_malformed_endpoint_option_is_a_config_error_naming_the_key(tmp_path, shards, endpoint):
    config = remote_config(tmp_path, {"val": f"{shards}/val-*.tar"},
                           dataset={"remote": {"options": {"endpoint": endpoint}}})
    try:
        build_loader(config, "val")
    except ConfigError as error:
        assert str(error) == (f"dataset.remote.options.endpoint: {endpoint!r} is not an endpoint URL; give the "
                              f"store's address as http(s)://HOST[:PORT], e.g. https://s3.example.com or "
                              f"http://127.0.0.1:9000")
    except BaseException as error:  # a PanicException is a BaseException: pytest.raises would let it pass
        pytest.fail(f"{type(error).__name__}: {error}")
    else:
        pytest.fail("built")


def test_a_malformed_endpoint_variable_is_a_config_error_naming_the_variable(tmp_path, shards, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "ht!tp://x y")
    with pytest.raises(ConfigError, match=r"^the environment variable AWS_ENDPOINT_URL: 'ht!tp://x y' is not an "
                                          r"endpoint URL"):
        build_loader(remote_config(tmp_path, {"val": f"{shards}/val-*.tar"}), "val")


def test_a_plain_http_endpoint_without_allow_http_fails_at_once_with_the_fix(tmp_path, shards, monkeypatch):
    monkeypatch.delenv("AWS_ALLOW_HTTP", raising=False)
    monkeypatch.delenv("ALLOW_HTTP", raising=False)
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"AWS_ENDPOINT_URL: 'http://127\.0\.0\.1:\d+' is plain HTTP, which the "
                                          r"client refuses unless told: set AWS_ALLOW_HTTP=true"):
        build_loader(remote_config(tmp_path, {"val": f"{shards}/val-*.tar"}), "val")
    assert time.monotonic() - started < 5  # not the 20 s retry budget
    config = remote_config(tmp_path, {"val": f"{shards}/val-*.tar"},
                           dataset={"remote": {"options": {"allow_http": "true"}}})
    assert len(labels_of(build_loader(config, "val"))) == 6  # the fix works


@pytest.mark.parametrize("path, odd", [("/../wds/val-000000.tar", "'..'"), ("//val-000000.tar", "an empty part"),
                                       ("/./val-000000.tar", "'.'")])
def test_a_url_with_dots_or_an_empty_part_is_refused_with_the_tidy_url(tmp_path, shards, path, odd):
    url = shards + path
    with pytest.raises(ConfigError) as raised:
        build_loader(remote_config(tmp_path, {"val": url}), "val")
    message = str(raised.value)
    assert message.startswith(f"<dict>: val.shards: {url}: ")  # the key that gave the URL (issue 57.11)
    assert f"{url}: an object store's path has no empty, '.' or '..' part" in message and f"has {odd})" in message
    tidy = message.rsplit("e.g. ", 1)[1]
    assert tidy == f"{shards}/val-000000.tar"


@pytest.mark.timeout(60)
def test_an_odd_key_beside_the_shards_fails_a_glob_at_once_and_a_brace_range_reads_on(tmp_path, object_store,
                                                                                     request, caplog):
    shards = uploaded(object_store, bucket_for(request), packed(tmp_path, per_class=2, per_shard=1))
    object_store.put(shards.split("/")[2], "wds//notes.txt", b"a note a tool left")
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"wds//notes\.txt.*rename or delete that object.*brace range"):
        build_loader(remote_config(tmp_path, {"val": f"{shards}/val-*.tar"}), "val")
    assert time.monotonic() - started < 10  # not blamed on the network after the 20 s budget
    caplog.set_level(logging.WARNING, logger="fastloader")
    loader = build_loader(remote_config(tmp_path, {"val": f"{shards}/val-{{000000..000005}}.tar"}), "val")
    assert sorted(labels_of(loader)) == [0, 0, 1, 1, 2, 2]  # 6 shards: one listing would have said their sizes
    assert "the 6 shards named in it are looked up one by one instead" in caplog.text


def test_a_shard_whose_name_holds_a_question_mark_is_read_as_named(tmp_path, shards, object_store):
    bucket = shards.split("/")[2]
    data = (tmp_path / "shards" / "val-000000.tar").read_bytes()
    object_store.put(bucket, "odd/val?0.tar", data)
    object_store.put(bucket, "odd/valx0.tar", (tmp_path / "shards" / "val-000001.tar").read_bytes())
    loader = build_loader(remote_config(tmp_path, {"val": f"s3://{bucket}/odd/val?0.tar"}), "val")
    assert labels_of(loader) == [0, 0, 1]  # that one object, not valx0.tar too
