"""`fastloader pack` on the CPU: every sample once, its own bytes and label, shards within their
limits, the same bytes twice, read back by tarfile, by our loader, by the webdataset package and
by DALI's webdataset reader as peers read them."""
from __future__ import annotations

import subprocess
import sys
import tarfile
from collections import Counter

import numpy as np
import pytest
from conftest import REPO, base_config, cpu_only_env, write_numbered_dataset
from PIL import Image

from fastloader import build_loader, load_config
from fastloader.sources.formats import build_index
from fastloader.sources.pack import pack_index, sample_keys


def members_of(shards) -> dict[str, bytes]:
    found = {}
    for shard in shards:
        with tarfile.open(shard) as archive:
            for info in archive:
                found[info.name] = archive.extractfile(info).read()
    return found


@pytest.fixture
def packed(tmp_path):
    root = write_numbered_dataset(tmp_path / "d", per_class=5, splits=("val",))
    config = load_config(base_config(root))
    index = build_index(config, config.split("val"))
    result = pack_index(config, index, str(tmp_path / "out"), "val", max_count=4)
    return root, index, result


def test_every_sample_is_packed_once_with_its_bytes_and_label(packed):
    root, index, result = packed
    assert result.samples == 15 and len(result.shards) == 4  # 15 samples, 4 a shard
    members = members_of(result.shards)
    keys = sample_keys(index)
    assert len(members) == 30
    for sample, key in enumerate(keys):
        assert members[f"{key}.png"] == open(index.path(sample), "rb").read()
        assert members[f"{key}.cls"] == str(index.label(sample)).encode()
    with tarfile.open(result.shards[0]) as archive:  # shuffled: the first shard is not the first class alone
        first = [int(archive.extractfile(i).read()) for i in archive if i.name.endswith(".cls")]
    assert len(first) == 4 and len(set(first)) > 1


def test_packing_twice_writes_the_same_bytes_and_no_partial_shard(packed, tmp_path):
    root, index, result = packed
    config = load_config(base_config(root))
    again = pack_index(config, index, str(tmp_path / "again"), "val", max_count=4)
    assert [open(a, "rb").read() for a in result.shards] == [open(b, "rb").read() for b in again.shards]
    assert not list((tmp_path / "out").glob("*.partial"))
    assert (tmp_path / "out" / "val-classes.txt").read_text().split() == list(index.classes)


def test_byte_limits_start_new_shards_and_keys_never_clash(tmp_path):
    root = tmp_path / "d" / "val" / "c"
    root.mkdir(parents=True)
    for name in ("a.b.png", "a_b.png", "x y.png"):
        Image.new("RGB", (20, 20), (9, 9, 9)).save(root / name)
    config = load_config(base_config(tmp_path / "d"))
    index = build_index(config, config.split("val"))
    assert sorted(sample_keys(index)) == ["c/a_b", "c/a_b_1", "c/x_y"]
    size = max((root / n).stat().st_size for n in ("a.b.png", "a_b.png"))
    result = pack_index(config, index, str(tmp_path / "out"), "v", max_bytes=size, shuffle_seed=None)
    assert len(result.shards) == 3  # no two images fit under the limit together


def test_our_loader_reads_the_packed_shards_as_the_folder(packed, tmp_path):
    root, index, result = packed
    folder_labels = Counter(label for _, labels in build_loader(base_config(root), "val") for label in labels.tolist())
    config = base_config(root)
    config["dataset"] = {"format": "webdataset", "classes": list(index.classes)}
    config["val"] = {**config["val"], "shards": str(tmp_path / "out" / "val-{000000..000003}.tar")}
    loader = build_loader(config, "val")
    assert Counter(label for _, labels in loader for label in labels.tolist()) == folder_labels


def test_the_webdataset_package_reads_our_shards_as_timm_does(packed):
    wds = pytest.importorskip("webdataset")
    root, index, result = packed
    dataset = wds.WebDataset(result.shards, shardshuffle=False).decode("pil").to_tuple("png", "cls")
    pairs = [(np.asarray(image).tolist()[0][0], label) for image, label in dataset]
    expected = [(list(Image.open(index.path(i)).convert("RGB").getpixel((0, 0))), index.label(i))
                for i in range(len(index))]
    assert sorted(pairs) == sorted(expected)


def test_dalis_webdataset_reader_reads_our_shards_on_the_cpu(packed, tmp_path):
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, pipeline_def

    root, index, result = packed

    @pipeline_def(batch_size=15, num_threads=1, device_id=None)
    def read():
        image, label = fn.readers.webdataset(paths=result.shards, ext=["png", "cls"],
                                             missing_component_behavior="error")
        return image, label

    pipe = read()
    pipe.build()
    images, labels = pipe.run()
    got = sorted((bytes(np.asarray(images[i])), bytes(np.asarray(labels[i]))) for i in range(15))
    expected = sorted((open(index.path(i), "rb").read(), str(index.label(i)).encode()) for i in range(len(index)))
    assert got == expected


def test_the_command_packs_a_split_and_names_bad_options(tmp_path):
    root = write_numbered_dataset(tmp_path / "d", per_class=2, splits=("val",))
    config = tmp_path / "c.yaml"
    config.write_text(f"dataset: {{root: {root}}}\nval: {{batch_size: 2}}\n")

    def pack(*args):
        return subprocess.run([sys.executable, "-m", "fastloader.cli", "pack", str(config), *args], cwd=REPO,
                              env=cpu_only_env(tmp_path / "cache"), capture_output=True, text=True, timeout=120)

    done = pack("--split", "val", "--out", str(tmp_path / "o"), "--per-shard", "4")
    assert done.returncode == 0, done.stderr
    assert "split val: 6 samples" in done.stdout
    assert f"shards: {tmp_path / 'o'}/val-{{000000..000001}}.tar" in done.stdout
    bad_size = pack("--split", "val", "--out", str(tmp_path / "p"), "--shard-size", "lots")
    assert bad_size.returncode == 2 and "--shard-size: expected a size such as 256MB" in bad_size.stderr
    no_split = pack("--split", "train", "--out", str(tmp_path / "p"))
    assert no_split.returncode == 2 and "--split: " in no_split.stderr and "its splits: val" in no_split.stderr
