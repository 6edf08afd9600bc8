"""The index beside a shard (`shard.tar.idx`) is a shortcut, never the authority on labels or byte
ranges: an index kept after a `.cls` member was rewritten in place, one that gives other labels, or
one whose member runs past the shard's end (a length of 2**40, once allocated at read) is set aside
with a WARNING and the shard's own headers read. Real shards written by `pack`, edited in place;
both backends (CPU) (issue 41.3, 41.6). Over an object store, checked on the shard's node-cache copy
before it is read: a stale index stops the run by name (issue 56.5)."""
from __future__ import annotations

import json
import logging
import tarfile
from pathlib import Path

import pytest
from conftest import base_config, write_textured_dataset
from remotefiles import bucket_for, remote_config, uploaded

from fastloader import build_loader, load_config
from fastloader.errors import SourceChanged
from fastloader.packing import pack_index
from fastloader.sources.formats import build_index

BACKENDS = ["torch", pytest.param("dali", marks=pytest.mark.skipif(
    not __import__("importlib").util.find_spec("nvidia.dali"), reason="NVIDIA DALI is not installed"))]


@pytest.fixture
def shard(tmp_path) -> Path:
    """One shard of 18 textured PNGs (3 classes), large enough that its middle is outside the 16 KB
    at each end that the index is checked against; its index beside it."""
    root = write_textured_dataset(tmp_path / "d", per_class=6, splits=("val",))
    config = load_config(base_config(root))
    packed = pack_index(config, build_index(config, config.split("val")), str(tmp_path / "wds"), "val",
                        shuffle_seed=None)
    assert len(packed.shards) == 1 and Path(packed.shards[0]).stat().st_size > 100_000
    return Path(packed.shards[0])


def labels_by_key(shard: Path, backend: str) -> dict[str, int]:
    config = base_config(shard.parent, backend=backend, dataset={"format": "webdataset", "root": str(shard.parent)},
                         val={"batch_size": 4, "shards": str(shard), "transform": {"size": 32}})
    loader = build_loader(config, "val")
    labels = [label for _, batch in loader for label in batch.tolist()]
    names = [loader.index.relpath(i) for i in range(len(loader.index))]
    return dict(zip(names, labels))


def middle_label_member(shard: Path) -> tarfile.TarInfo:
    with tarfile.open(shard) as archive:
        members = [m for m in archive.getmembers() if m.name.endswith(".cls")]
    return next(m for m in members if 20_000 < m.offset_data < shard.stat().st_size - 20_000)


def relabel_middle_member(shard: Path) -> tuple[tarfile.TarInfo, bytes, bytes]:
    """A `.cls` member in the shard's middle given another class in place (the size kept): (member,
    old text, new text)."""
    member = middle_label_member(shard)
    with open(shard, "r+b") as handle:
        handle.seek(member.offset_data)
        old = handle.read(member.size)
        new = b"2" if old != b"2" else b"0"
        handle.seek(member.offset_data)
        handle.write(new)
    return member, old, new


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_label_member_rewritten_in_place_under_an_old_index_gives_the_shards_label(shard, backend, caplog):
    member, old, new = relabel_middle_member(shard)
    caplog.set_level(logging.WARNING, logger="fastloader")
    labels = labels_by_key(shard, backend)
    key = member.name[:-len(".cls")]
    assert [label for name, label in labels.items() if name.split(":")[-1].startswith(key + ".")] == [int(new)]
    assert f"{shard}.idx does not describe the shard it stands beside: {member.name} holds {new.decode()!r}, the " \
           f"index says {old.decode()!r}" in caplog.text


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_index_that_gives_other_labels_is_set_aside(shard, backend, caplog):
    truth = labels_by_key(shard, backend)
    index = json.loads(Path(f"{shard}.idx").read_text())
    for member in index["members"]:
        if member[0].endswith(".cls"):
            member[4] = "0"
    Path(f"{shard}.idx").write_text(json.dumps(index))
    shard.touch()  # the cached scan of the shard is keyed by its stamp: read anew
    caplog.set_level(logging.WARNING, logger="fastloader")
    assert labels_by_key(shard, backend) == truth and set(truth.values()) == {0, 1, 2}
    assert "does not describe the shard it stands beside" in caplog.text


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_index_with_a_member_past_the_shards_end_is_never_allocated(shard, backend):
    truth = labels_by_key(shard, backend)
    index = json.loads(Path(f"{shard}.idx").read_text())
    image = next(member for member in index["members"] if member[0].endswith(".png"))
    image[2] = 2 ** 40
    Path(f"{shard}.idx").write_text(json.dumps(index))
    shard.touch()
    assert labels_by_key(shard, backend) == truth  # every sample read, from the shard's headers


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stale_index_over_an_object_store_stops_the_run_then_a_new_loader_reads_the_shard(
        shard, backend, tmp_path, object_store, request, caplog):
    """Over a store the index's label members are not read at build (a request each): the shard's
    whole copy in the node cache is checked before its first member is read. A shard rewritten with
    another label beside its old index stops the run naming the index (issue 56.5); a new loader
    reads the shard's own label members and gives the shard's label."""
    member, old, new = relabel_middle_member(shard)
    url = uploaded(object_store, bucket_for(request), shard.parent)
    config = remote_config(tmp_path, {"val": f"{url}/{shard.name}"}, backend=backend,
                           val={"batch_size": 4, "transform": {"size": 32}})
    with pytest.raises(SourceChanged) as raised:
        [labels for _, labels in build_loader(config, "val")]
    assert f"{url}/{shard.name}.idx is stale: the label members it lists are not the ones in the shard " \
           f"{url}/{shard.name}" in str(raised.value)
    caplog.set_level(logging.WARNING, logger="fastloader")
    loader = build_loader(config, "val")
    labels = [label for _, batch in loader for label in batch.tolist()]
    names = [loader.index.relpath(i) for i in range(len(loader.index))]
    key = member.name[:-len(".cls")]
    assert [label for name, label in zip(names, labels) if name.split(":")[-1].startswith(key + ".")] == [int(new)]
    assert len(labels) == 18
    assert f"{url}/{shard.name}.idx does not describe the shard it stands beside: {member.name} holds " \
           f"{new.decode()!r}, the index says {old.decode()!r}" in caplog.text


@pytest.mark.timeout(180)
def test_a_true_index_over_an_object_store_is_believed_and_its_labels_read(shard, tmp_path, object_store, request):
    """The same shard unchanged: its index's labels pass the copy's check, every sample once."""
    url = uploaded(object_store, bucket_for(request), shard.parent)
    config = remote_config(tmp_path, {"val": f"{url}/{shard.name}"}, val={"batch_size": 4, "transform": {"size": 32}})
    loader = build_loader(config, "val")
    remote_labels = sorted(label for _, batch in loader for label in batch.tolist())
    assert remote_labels == sorted(labels_by_key(shard, "torch").values()) == [0] * 6 + [1] * 6 + [2] * 6
