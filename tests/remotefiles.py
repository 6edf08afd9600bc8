"""Shards in the tests' object store (tests/objectstore.py): a bucket per test, shards packed and
uploaded, and the config that reads them with a node cache of the test's own."""
from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from conftest import base_config, write_numbered_dataset, write_textured_dataset
from objectstore import ACCESS_KEY, REGION, SECRET_KEY
from shardfiles import pack_folder_split


def bucket_for(request) -> str:
    """A bucket of the test's own (the server is shared by the session): its name's start and a digest
    of the whole, so that the parameters of one test (`[torch]`, `[dali]`) never share one."""
    name = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40].strip("-")
    return f"t-{name}-{hashlib.blake2b(request.node.name.encode(), digest_size=4).hexdigest()}"


def uploaded(object_store, bucket: str, folder: Path, prefix: str = "wds") -> str:
    """Every file of `folder` put under s3://bucket/prefix/, straight to the server (obstore: a
    thousand small objects in seconds, where boto3 takes half a minute); that URL folder."""
    import obstore
    from obstore.store import S3Store

    object_store.make_bucket(bucket)
    store = S3Store(bucket, endpoint=object_store.server, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY,
                    region=REGION, client_options={"allow_http": True})
    paths = sorted(p for p in folder.rglob("*") if p.is_file())
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda p: obstore.put(store, f"{prefix}/{p.relative_to(folder).as_posix()}", p.read_bytes()),
                      paths))
    return f"s3://{bucket}/{prefix}"


def remote_config(tmp_path, shards: dict, **sections) -> dict:
    config = base_config("unused", **sections)
    config["dataset"] = {"format": "webdataset", **sections.get("dataset", {}),
                         "remote": {"cache_dir": str(tmp_path / "node"), "retry_timeout": 20,
                                    **sections.get("dataset", {}).get("remote", {})}}
    for split, patterns in shards.items():
        config[split] = {**config.get(split, {}), "shards": patterns}
    return config


def packed(tmp_path, per_class: int, per_shard: int, textured: bool = False) -> Path:
    """train and val of a small dataset as shards in tmp_path/shards (train-000000.tar ...)."""
    root = (write_textured_dataset if textured else write_numbered_dataset)(tmp_path / "d", per_class=per_class)
    for split in ("train", "val"):
        pack_folder_split(root / split, tmp_path / "shards", split, per_shard=per_shard)
    return tmp_path / "shards"


def cached_bytes(folder: Path) -> int:
    """The bytes of the complete shards in a node cache now (one may go while they are counted)."""
    total = 0
    for path in folder.iterdir():
        if path.name.endswith(".tar"):
            try:
                total += path.stat().st_size
            except FileNotFoundError:
                pass
    return total


