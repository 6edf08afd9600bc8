"""WebDataset tar shards (dataset.format: webdataset) on both backends, on the CPU: the same samples,
labels, order and pixels as the same images in a folder; the shard index cached and renewed; every
kind of bad shard named `shard.tar:member` and skipped, or raised."""
from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import tarfile

import pytest
import torch
from conftest import REPO, base_config, cpu_only_env, everything, write_numbered_dataset, write_textured_dataset
from shardfiles import add_member, pack_folder_split, png_bytes, resumes_and_evaluates_once, write_bad_corpus

from fastloader import build_loader
from fastloader.errors import BadImageError, ConfigError
from fastloader.sources.webdataset import expand_braces

BACKENDS = ["torch", pytest.param("dali", marks=pytest.mark.skipif(
    not __import__("importlib").util.find_spec("nvidia.dali"), reason="NVIDIA DALI is not installed"))]


def shard_config(patterns, **sections) -> dict:
    config = base_config("unused", **sections)
    config["dataset"] = {"format": "webdataset", **sections.get("dataset", {})}
    for split in ("train", "val"):
        config[split] = {**config[split], "shards": patterns[split] if isinstance(patterns, dict) else patterns}
    return config


def test_brace_ranges_and_lists_expand_as_webdataset_writes_them():
    assert expand_braces("t-{000..002}.tar") == ["t-000.tar", "t-001.tar", "t-002.tar"]
    assert expand_braces("{a,b}-{8..10}.tar") == ["a-8.tar", "a-9.tar", "a-10.tar", "b-8.tar", "b-9.tar", "b-10.tar"]
    assert expand_braces("plain.tar") == ["plain.tar"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_shards_give_the_folders_samples_labels_order_and_pixels(tmp_path, backend):
    """The same images packed in the folder index's order: every train batch (a seeded permutation,
    random crops and flips) and every val batch equal, pixel for pixel, on each backend (CPU)."""
    root = write_textured_dataset(tmp_path / "d", per_class=5)
    shards = {split: [str(p) for p in pack_folder_split(root / split, tmp_path / "shards", split, per_shard=4)]
              for split in ("train", "val")}
    sections = dict(backend=backend, workers={"num_workers": 2})
    for split in ("train", "val"):
        from_folder = build_loader(base_config(root, **sections), split)
        from_shards = build_loader(shard_config(shards, **sections), split)
        assert len(from_shards) == len(from_folder) and from_shards.num_classes == from_folder.num_classes
        for epoch in range(2):
            folder_labels, folder_images = everything(from_folder)
            shard_labels, shard_images = everything(from_shards)
            assert shard_labels == folder_labels, (split, epoch)
            for ours, theirs in zip(shard_images, folder_images, strict=True):
                assert torch.equal(ours, theirs)
    assert "4 tar shards" in repr(from_shards)  # val: 15 images in shards of 4
    assert "val-000000.tar:" in from_shards.index.path(0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_shard_loader_resumes_mid_epoch_and_evaluates_each_sample_once_across_ranks(tmp_path, backend):
    root = write_numbered_dataset(tmp_path / "d", per_class=6)
    shards = {split: [str(p) for p in pack_folder_split(root / split, tmp_path / "s", split, per_shard=5)]
              for split in ("train", "val")}
    resumes_and_evaluates_once(shard_config(shards, backend=backend))


def test_the_shard_index_is_cached_and_read_again_when_a_shard_changes(tmp_path, caplog):
    root = write_numbered_dataset(tmp_path / "d", per_class=3, splits=("train",))
    shards = [str(p) for p in pack_folder_split(root / "train", tmp_path / "s", "train", per_shard=4)]
    config = shard_config({"train": shards, "val": shards})
    caplog.set_level(logging.INFO, logger="fastloader")
    assert len(build_loader(config, "val").index) == 9
    assert "read the headers of 3 shards" in caplog.text
    caplog.clear()
    assert len(build_loader(config, "val").index) == 9
    assert "read the headers" not in caplog.text  # all from the cache
    with tarfile.open(shards[-1], "a") as archive:  # one more sample: the shard's size and mtime change
        add_member(archive, "extra.png", png_bytes())
        add_member(archive, "extra.cls", b"2")
    caplog.clear()
    index = build_loader(config, "val").index
    assert len(index) == 10 and index.path(9).endswith("train-000002.tar:extra.png")
    assert "read the headers of 1 shard in" in caplog.text


def test_labels_from_txt_and_json_members_name_classes(tmp_path):
    shard = tmp_path / "t.tar"
    with tarfile.open(shard, "w") as archive:
        for key, member, text in [("a", "a.txt", b" dog\n"), ("b", "b.json", b'{"label": "cat"}'),
                                  ("c", "c.json", b'"dog"'), ("d", "d.json", b"1"), ("e", "e.txt", b"horse")]:
            add_member(archive, f"{key}.png", png_bytes())
            add_member(archive, member, text)
    config = shard_config(str(shard), dataset={"classes": ["cat", "dog"]})
    loader = build_loader(config, "val")
    assert loader.index.labels.tolist() == [1, 0, 1, 1]
    assert [(name.split(":")[-1], "horse" in reason) for name, reason in loader.bad_samples] == [("e.png", True)]
    with pytest.raises(BadImageError, match=r"t\.tar:a\.png.*set dataset\.classes"):
        build_loader(shard_config(str(shard), dataset={"on_bad_image": "raise"}), "val")


def test_shard_keys_and_patterns_that_cannot_work_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"val\.shards: no shard found .*nothing-\*\.tar"):
        build_loader(shard_config(str(tmp_path / "nothing-*.tar")), "val")
    with pytest.raises(ConfigError, match=r"is a folder; list the shard files"):
        build_loader(shard_config(str(tmp_path)), "val")
    config = shard_config(str(tmp_path / "x.tar"))
    del config["val"]["shards"]
    with pytest.raises(ConfigError, match=r"val\.shards: missing; dataset\.format: webdataset"):
        build_loader(config, "val")
    folder_config = base_config(tmp_path, val={"shards": "x.tar"})
    with pytest.raises(ConfigError, match=r"need dataset\.format: webdataset"):
        build_loader(folder_config, "val")


def test_relative_shards_resolve_against_dataset_root_when_it_is_set_and_missing_ones_are_never_indexed(
        tmp_path, monkeypatch):
    """Item 16 of issue 33: `dataset.root` with shards was ignored (the shards were looked for beside the
    config). In the file or by an override, dataset.root is where relative shard paths are read; without
    it, the config's folder. A split whose shards are all missing writes no shard index."""
    monkeypatch.setenv("FASTLOADER_CACHE_DIR", str(tmp_path / "cache"))
    root = write_numbered_dataset(tmp_path / "d", per_class=2, splits=("val",))
    pack_folder_split(root / "val", tmp_path / "data" / "wds", "val", per_shard=4)
    configs = tmp_path / "configs"
    configs.mkdir()
    with_root = configs / "root.yaml"
    with_root.write_text("dataset: {format: webdataset, root: ../data/wds}\n"
                         "val: {shards: 'val-{000000..000001}.tar'}\n")
    loader = build_loader(with_root, "val", overrides={"backend": "torch", "output.device": "cpu"})
    assert len(loader.index) == 6 and loader.index.ranges.files[0] == str(tmp_path / "data" / "wds" / "val-000000.tar")
    without_root = configs / "beside.yaml"
    without_root.write_text("dataset: {format: webdataset}\nval: {shards: 'val-{000000..000001}.tar'}\n")
    indexes = set((tmp_path / "cache").rglob("*.json"))
    with pytest.raises(ConfigError, match=re.escape(
            f"{without_root}: val.shards: no shard found ('{configs}/val-000000.tar': missing (no such file)); "
            f"relative shard paths are relative to the config file's folder, or to dataset.root when it is set")):
        build_loader(without_root, "val")
    assert set((tmp_path / "cache").rglob("*.json")) == indexes  # no index of shards that are not there
    moved = build_loader(without_root, "val", overrides=[f"dataset.root={tmp_path / 'data' / 'wds'}", "backend=torch",
                                                          "output.device=cpu"])
    assert len(moved.index) == 6
    with pytest.raises(ConfigError, match=re.escape(
            f"relative shard paths are relative to dataset.root ({tmp_path / 'nowhere'}, from override "
            f"'dataset.root')")):
        build_loader(without_root, "val", overrides=[f"dataset.root={tmp_path / 'nowhere'}"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_kind_of_bad_shard_is_named_and_skipped_and_the_rest_is_read(tmp_path, backend):
    patterns, bad, good = write_bad_corpus(tmp_path / "corpus")
    config = shard_config(patterns, backend=backend, workers={"num_workers": 2}, val={"batch_size": 5})
    loader = build_loader(config, "val")
    labels, images = everything(loader)
    assert len(labels) == good and sorted(set(labels)) == [0, 1]
    assert all(image.shape[1:] == (3, 32, 32) for image in images)
    reasons = dict(loader.bad_samples)
    assert set(reasons) == set(bad), sorted(reasons)
    for name, word in bad.items():
        assert word in reasons[name], (name, reasons[name])
    assert "fastloader pack" in reasons[str(tmp_path / "corpus" / "i-compressed.tar.gz")]


def test_under_raise_a_bad_shard_stops_the_build_with_its_name(tmp_path):
    patterns, bad, _ = write_bad_corpus(tmp_path / "corpus")
    with pytest.raises(BadImageError) as failure:
        build_loader(shard_config(patterns, dataset={"on_bad_image": "raise"}), "val")
    message = str(failure.value)
    assert message.startswith(f"cannot use image '{tmp_path / 'corpus' / 'c-nolabel.tar'}:orphan.png': no label")
    assert "more shards or members fail the same check" in message


def test_check_lists_the_bad_members_and_shards(tmp_path):
    patterns, bad, good = write_bad_corpus(tmp_path / "corpus")
    config = tmp_path / "shards.yaml"
    config.write_text("dataset: {format: webdataset}\nval: {shards: [%s]}\n" % ", ".join(f"'{p}'" for p in patterns))
    exclude = tmp_path / "exclude.txt"
    result = subprocess.run([sys.executable, "-m", "fastloader.cli", "check", str(config), "--exclude-list",
                             str(exclude)], cwd=REPO, env=cpu_only_env(tmp_path / "cache"), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert f"split val: {good + 1} images" in result.stdout  # page.jpg is indexed, then refused by the header check
    assert f"problems: {len(bad)} of {good + len(bad)} files" in result.stdout
    for name in bad:
        assert os.path.relpath(name, tmp_path) in result.stdout or name in result.stdout, name
    # the list check wrote leaves every bad shard and member out, quietly, and nothing else
    config = shard_config(patterns, dataset={"exclude": str(exclude), "root": str(tmp_path)})
    loader = build_loader(config, "val")
    # counted as left out: the 3 members that became samples and the 2 shards not read; the duplicate
    # and the truncated member never became samples
    assert loader.bad_samples == [] and loader.index.excluded == 5, loader.index.excluded
    assert sum(len(labels) for _, labels in loader) == good


def test_the_uint8_cache_is_built_from_shards_and_serves_their_samples(tmp_path):
    """`fastloader cache` reads the members through the same seam; the cached loader gives the
    shard loader's labels and (val: the same centre crops of the same pixels) its images."""
    from fastloader.cache_write import build_split_cache
    from fastloader.config import load_config
    from fastloader.sources.formats import build_index

    root = write_numbered_dataset(tmp_path / "d", per_class=4, splits=("val",))
    shards = [str(p) for p in pack_folder_split(root / "val", tmp_path / "s", "val", per_shard=5)]
    config = load_config(shard_config(shards))
    report = build_split_cache(config, config.split("val"), build_index(config, config.split("val")),
                               str(tmp_path / "cache"), short_side=37, workers=0)
    assert report["images"] == 12, report
    direct_labels, direct = everything(build_loader(shard_config(shards), "val"))
    cached = build_loader(shard_config(shards, dataset={"cache": str(tmp_path / "cache")}), "val")
    assert "the cache" in repr(cached)
    cached_labels, cached_images = everything(cached)
    assert cached_labels == direct_labels
    for ours, theirs in zip(cached_images, direct, strict=True):
        assert (ours - theirs).abs().max() < 0.05  # one colour per image, resized twice: the same colour


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_shard_cut_short_after_indexing_names_its_members_and_the_rest_is_read(tmp_path, backend):
    """The index says where each member is; a shard truncated afterwards (a copy still running, a
    quota hit) is found when a member is read: named and skipped, or raised, on both backends."""
    root = write_numbered_dataset(tmp_path / "d", per_class=4, splits=("val",))
    shards = [str(p) for p in pack_folder_split(root / "val", tmp_path / "s", "val", per_shard=6)]
    loader = build_loader(shard_config(shards, backend=backend), "val")
    strict = build_loader(shard_config(shards, backend=backend, dataset={"on_bad_image": "raise"}), "val")
    data = open(shards[1], "rb").read()
    with open(shards[1], "wb") as handle:
        handle.write(data[:len(data) // 2])
    delivered = sum(len(labels) for _, labels in loader)
    assert loader.bad_samples and delivered + len(loader.bad_samples) == 12
    assert all(name.startswith(f"{shards[1]}:") and "cut short" in reason for name, reason in loader.bad_samples)
    with pytest.raises(BadImageError, match=r"val-000001\.tar:.*cut short"):
        sum(len(labels) for _, labels in strict)
