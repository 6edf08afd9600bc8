"""Several sources in one split (`<split>.sources`): folders, file lists, tar shards and parquet or Arrow
files, their weights,
their classes (shared or own), bad files and exclusions per source, on both backends (CPU)."""
from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import base_config, identities, resumed_on_three_ranks, write_numbered_dataset
from shardfiles import pack_folder_split, png_bytes
from tablefiles import split_as_arrow, split_as_parquet, table, write_parquet
from test_weights import BACKENDS, within_binomial

from fastloader import build_loader
from fastloader.config import load_config
from fastloader.errors import BadImageError, ConfigError


def colours_by_file(root, folder, per_class=6):
    """{colour: (class folder, file)} of a numbered split folder, read through an eval loader."""
    loader = build_loader(base_config(root, val={"folder": folder, "batch_size": 64}), "val")
    seen = [c for images, _ in loader for c in identities(images)]
    return {colour: loader.index.relpath(i) for i, colour in enumerate(seen)}


@pytest.fixture
def two_folders(tmp_path):
    """root/train and root/val: two numbered splits of 3 classes x 6, every image its own colour."""
    return write_numbered_dataset(tmp_path / "d", per_class=6)


def sources_config(root, *sources, **train):
    return base_config(root, train={"sources": list(sources), "batch_size": 4, **train})


def delivered(loader) -> tuple[list[tuple], list[int]]:
    colours, labels = [], []
    for images, batch_labels in loader:
        colours += identities(images)
        labels += batch_labels.tolist()
    return colours, labels


def test_two_folders_without_weights_are_one_split_each_sample_once(two_folders):
    loader = build_loader(sources_config(two_folders, {"folder": "train"}, {"folder": "val"}, drop_last=False), "train")
    assert loader.num_samples == 36 and loader.classes == ("a_red", "b_green", "c_blue")
    assert loader.order.draws is None and loader.index.entry_names == ("source0", "source1")
    names = [loader.index.relpath(i) for i in range(36)]
    assert names[0] == "train/a_red/n_00.png" and names[18] == "val/a_red/n_00.png"  # the names say the source
    assert loader.index.path(18) == str(two_folders / "val" / "a_red" / "n_00.png")
    plain = build_loader(base_config(two_folders), "train")
    assert loader.index.fingerprint != plain.index.fingerprint
    files = {**{c: f"train/{n}" for c, n in colours_by_file(two_folders, "train").items()},
             **{c: f"val/{n}" for c, n in colours_by_file(two_folders, "val").items()}}
    colours, labels = delivered(loader)
    assert sorted(files[c] for c in colours) == sorted(names)  # every sample of both, once
    assert all(files[c].split("/")[1] == loader.classes[label] for c, label in zip(colours, labels))


def test_own_classes_are_appended_after_the_shared_ones(two_folders):
    loader = build_loader(sources_config(two_folders, {"folder": "train"},
                                         {"folder": "val", "classes": "own", "name": "extra"}), "train")
    assert loader.classes == ("a_red", "b_green", "c_blue", "extra/a_red", "extra/b_green", "extra/c_blue")
    assert loader.num_classes == 6
    val_colours = colours_by_file(two_folders, "val")
    colours, labels = delivered(loader)
    for colour, label in zip(colours, labels):
        expected = f"extra/{val_colours[colour].split('/')[0]}" if colour in val_colours else None
        assert loader.classes[label] == expected or (expected is None and label < 3)


def test_shared_classes_take_each_name_once_and_append_the_new_ones(tmp_path):
    root = write_numbered_dataset(tmp_path / "d", per_class=2)
    (root / "val" / "d_new").mkdir()
    (root / "val" / "a_red" / "n_00.png").rename(root / "val" / "d_new" / "n_00.png")
    loader = build_loader(sources_config(root, {"folder": "val"}, {"folder": "train"}), "train")
    assert loader.classes == ("a_red", "b_green", "c_blue", "d_new")
    labels = {loader.index.relpath(i): loader.index.label(i) for i in range(len(loader.index))}
    assert labels["val/d_new/n_00.png"] == 3 and labels["train/c_blue/n_01.png"] == 2


def test_weighted_sources_are_drawn_in_their_proportions(two_folders):
    config = sources_config(two_folders, {"folder": "train", "weight": 1}, {"folder": "val", "weight": 3},
                            epoch_size=400)
    loader = build_loader(config, "train")
    source = loader.index.entry
    counts = sum(np.bincount(source[loader.order.permutation(epoch)], minlength=2) for epoch in range(50))
    within_binomial(counts, np.array([0.25, 0.75]), 50 * 400)
    p = loader.order.draws.probabilities
    assert np.allclose(p[source == 0], 0.25 / 18) and np.allclose(p[source == 1], 0.75 / 18)
    val_colours = colours_by_file(two_folders, "val")
    plan = loader.order.permutation(0)[:len(loader) * 4]
    colours, _ = delivered(loader)
    assert [c in val_colours for c in colours] == (source[plan] == 1).tolist()


def test_weighted_sources_with_class_weights_balance_classes_within_each_source(tmp_path):
    root = write_numbered_dataset(tmp_path / "d", per_class=4)
    for extra in range(4, 12):  # train/a_red: 12 images, the other classes 4
        first = root / "train" / "a_red" / "n_00.png"
        (root / "train" / "a_red" / f"n_{extra:02d}.png").write_bytes(first.read_bytes())
    loader = build_loader(sources_config(root, {"folder": "train", "weight": 2}, {"folder": "val", "weight": 2},
                                         class_weights="inverse"), "train")
    p, labels, source = loader.order.draws.probabilities, loader.index.labels, loader.index.entry
    for s in (0, 1):
        shares = np.bincount(labels[source == s], weights=p[source == s], minlength=3)
        assert np.allclose(shares, 0.5 / 3)


def test_exclusions_and_bad_files_work_per_source(two_folders, tmp_path):
    (two_folders / "train" / "b_green" / "n_01.png").write_bytes(b"\x89PNG\r\n\x1a\n cut short")
    exclude = tmp_path / "exclude.txt"
    exclude.write_text("val/c_blue/n_03.png\n")
    config = sources_config(two_folders, {"folder": "train", "weight": 1}, {"folder": "val", "weight": 1},
                            epoch_size=64)
    config["dataset"]["exclude"] = str(exclude)
    loader = build_loader(config, "train")
    names = {loader.index.relpath(i) for i in range(len(loader.index))}
    assert loader.num_samples == 34 and loader.index.excluded == 2  # the excluded file, the bad one
    assert "val/c_blue/n_03.png" not in names and "train/b_green/n_01.png" not in names
    assert [path for path, _ in loader.bad_samples] == [str(two_folders / "train" / "b_green" / "n_01.png")]
    assert sum(1 for _ in loader) == 16


def shard_sources(tmp_path):
    """The numbered train and val splits as two sets of shards of 5 samples, in folders apart."""
    root = write_numbered_dataset(tmp_path / "d", per_class=5)
    return [[str(p) for p in pack_folder_split(root / split, tmp_path / f"{split}-shards", split, 5)]
            for split in ("train", "val")]


def colours_in_index_order(config) -> list[tuple]:
    """The colour of every sample of the config's train sources, in index order (an eval loader of them)."""
    sources = [{k: v for k, v in source.items() if k != "weight"} for source in config["train"]["sources"]]
    loader = build_loader({**config, "backend": "torch", "train": {
        "sources": sources, "mode": "eval", "batch_size": 64, "transform": {"size": 32}}}, "train")
    return [c for images, _ in loader for c in identities(images)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_shard_sources_on_both_backends_give_the_planned_samples(tmp_path, backend):
    train, val = shard_sources(tmp_path)
    config = sources_config(tmp_path, {"shards": train, "weight": 1}, {"shards": val, "weight": 1, "classes": "own"},
                            epoch_size=30, drop_last=False)
    config.update(backend=backend, dataset={"format": "webdataset"})
    loader = build_loader(config, "train")
    assert loader.index.ranges is not None and len(loader.index.ranges.files) == 6
    assert loader.index.relpath(0).startswith("train-shards/train-000000.tar:")
    assert loader.num_classes == 6
    by_sample = colours_in_index_order(config)
    plan = np.concatenate(loader.order.batches(0))[:, 0]
    colours, labels = delivered(loader)
    assert colours == [by_sample[i] for i in plan.tolist()]
    assert labels == loader.index.labels[plan].tolist() and max(labels) >= 3  # own classes from the second


def test_a_resume_mid_epoch_on_2_ranks_then_3_over_shard_sources(tmp_path):
    train, val = shard_sources(tmp_path)
    config = sources_config(tmp_path, {"shards": train, "weight": 1}, {"shards": val, "weight": 2}, epoch_size=48)
    config["dataset"] = {"format": "webdataset"}
    interleaved = resumed_on_three_ranks(config)
    whole = build_loader(config, "train")
    by_sample = colours_in_index_order(config)
    planned = [by_sample[i] for i in whole.order.permutation(0).tolist()]
    assert interleaved == planned[16:16 + len(interleaved)] and len(interleaved) == 24  # 32 left: 2 batches of 12


def test_the_block_order_reads_shard_sources_without_weights(tmp_path):
    train, val = shard_sources(tmp_path)
    config = sources_config(tmp_path, {"shards": train}, {"shards": val}, shuffle="block", block_size="40KB",
                            drop_last=False)
    config["dataset"] = {"format": "webdataset"}
    loader = build_loader(config, "train")
    assert sorted(np.concatenate(loader.order.batches(1))[:, 0].tolist()) == list(range(30))
    assert len(loader.order.blocks.blocks(7, 1)) > 1


def table_and_shard_sources(tmp_path) -> tuple[tuple[str, ...], tuple[str, ...], list[str]]:
    """The numbered train split as parquet (2 files, row groups of 4) and as Arrow files, the val
    split as shards of 5 samples, in folders apart."""
    root = write_numbered_dataset(tmp_path / "d", per_class=5)
    split_as_parquet(root / "train", tmp_path / "parquet", files=2, row_group_size=4)
    split_as_arrow(root / "train", tmp_path / "arrow")
    parquet, arrow = (tuple(sorted(map(str, (tmp_path / kind).iterdir()))) for kind in ("parquet", "arrow"))
    shards = [str(p) for p in pack_folder_split(root / "val", tmp_path / "val-shards", "val", 5)]
    return parquet, arrow, shards


@pytest.mark.parametrize("backend", BACKENDS)
def test_parquet_and_shard_sources_in_one_split_give_the_planned_samples(tmp_path, backend):
    """Device: CPU. A Hugging Face dataset's parquet files beside tar shards of other data, weighted:
    each delivered image is the planned sample's, with its source's labels (own classes after)."""
    parquet, _, shards = table_and_shard_sources(tmp_path)
    config = sources_config(tmp_path, {"files": list(parquet), "weight": 1},
                            {"shards": shards, "weight": 1, "classes": "own", "name": "extra"},
                            epoch_size=30, drop_last=False)
    config["backend"] = backend
    loader = build_loader(config, "train")
    assert [f.rsplit(".", 1)[1] for f in loader.index.ranges.files] == ["parquet"] * 2 + ["tar"] * 3
    assert loader.classes[:3] == ("a_red", "b_green", "c_blue")  # the parquet files' ClassLabel
    assert len(loader.classes) == 6 and all(name.startswith("extra/") for name in loader.classes[3:])
    by_sample = colours_in_index_order(config)
    plan = np.concatenate(loader.order.batches(0))[:, 0]
    colours, labels = delivered(loader)
    assert colours == [by_sample[i] for i in plan.tolist()]
    assert labels == loader.index.labels[plan].tolist() and min(labels) < 3 <= max(labels)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_parquet_sources_classlabel_is_read_by_name_beside_shards_named_by_dataset_classes(tmp_path, backend):
    """Device: CPU. dataset.classes [cat, dog] names a tar source's integer labels, and a parquet source's
    ClassLabel says [dog, cat]: its rows keep their classes by name, so every red image (a cat) is
    labelled cat and every blue one (a dog) dog, from either source, on each backend."""
    red, blue = (250, 10, 10), (10, 10, 250)
    for name, colour in (("cat", red), ("dog", blue)):
        (tmp_path / "d" / "val" / name).mkdir(parents=True)
        for k in range(2):
            (tmp_path / "d" / "val" / name / f"{k}.png").write_bytes(png_bytes(colour))
    shards = [str(p) for p in pack_folder_split(tmp_path / "d" / "val", tmp_path / "shards", "val", 2)]
    (tmp_path / "hub").mkdir()
    write_parquet(tmp_path / "hub" / "hub.parquet", table([png_bytes(blue), png_bytes(blue), png_bytes(red)],
                                                          [0, 0, 1], ["dog", "cat"]))
    config = base_config(tmp_path, backend=backend, dataset={"classes": ["cat", "dog"]},
                         val={"sources": [{"shards": shards}, {"files": str(tmp_path / "hub" / "hub.parquet")}]})
    loader = build_loader(config, "val")
    pairs = [("red" if colour[0] > colour[2] else "blue", loader.classes[label]) for images, labels in loader
             for colour, label in zip(identities(images), labels.tolist(), strict=True)]
    assert loader.classes == ("cat", "dog") and len(pairs) == 7
    assert sorted(set(pairs)) == [("blue", "dog"), ("red", "cat")], pairs
    n_shards = len(shards)  # not "pixels from 3 tar shards" for shards and a parquet file (issue 41.18)
    assert f"pixels from 1 parquet file, {n_shards} tar shards)" in repr(loader)


def test_messages_about_a_parquet_source_name_the_keys_the_config_has(tmp_path, caplog):
    """A source is indexed as a split named `train.sources[1]`, and its messages name the keys that
    exist: the order's (`train.shuffle`, `train.block_size`; no block order where the sources'
    weights refuse it), the source's own `format`, and what to check where nothing can be read."""
    images = [png_bytes((30 * k, 0, 0)) for k in range(6)]
    (tmp_path / "t").mkdir()
    write_parquet(tmp_path / "t" / "plain.parquet", table(images, [0, 1] * 3, ["a", "b"]))
    pq.write_table(table(images, [0, 1] * 3, ["a", "b"]), tmp_path / "t" / "packed.parquet", row_group_size=3)
    plain, packed = str(tmp_path / "t" / "plain.parquet"), str(tmp_path / "t" / "packed.parquet")
    build_loader(sources_config(tmp_path, {"files": plain}, {"files": packed, "classes": "own"}), "train")
    assert "Set train.shuffle: block with train.block_size: 256MB" in caplog.text
    assert "train.sources[1].shuffle" not in caplog.text and "train.sources[1].block_size" not in caplog.text
    caplog.clear()
    build_loader(sources_config(tmp_path, {"files": plain, "weight": 1}, {"files": packed, "weight": 1}), "train")
    assert "in a uniform order (train.shuffle: true)" in caplog.text and "Set train.shuffle: block" not in caplog.text
    assert "The block order, which reads each row group once an epoch, is refused with train.sources[].weight" \
        in caplog.text
    with pytest.raises(ConfigError, match=r"plain\.parquet: not an Arrow file .* or set train\.sources\[0\]\.format "
                                          r"to the files' format"):
        build_loader(sources_config(tmp_path, {"files": plain, "format": "arrow"}), "train")
    write_parquet(tmp_path / "t" / "text.parquet", table([b"not an image"] * 2, [0, 1], ["a", "b"]))
    with pytest.raises(BadImageError, match=r"none of the 2 samples in .* can be decoded .*; check train\.sources$"):
        build_loader(sources_config(tmp_path, {"files": str(tmp_path / "t" / "text.parquet")}), "train")
    (tmp_path / "empty").mkdir()
    write_numbered_dataset(tmp_path / "d", per_class=2, splits=("train",))
    with pytest.raises(ConfigError, match=r"train\.sources\[1\]\.folder: '.*empty' has no class folders; "):
        build_loader(sources_config(tmp_path, {"folder": "d/train"}, {"folder": "empty"}), "train")


def test_arrow_and_parquet_sources_are_read_once_an_epoch_in_the_block_order(tmp_path):
    """The same rows as parquet and as Arrow files (the format from the extension, or said): an eval
    split of both reads every row of each once across 2 ranks; a train split reads them block by block."""
    parquet, arrow, _ = table_and_shard_sources(tmp_path)
    sources = [{"files": list(parquet), "name": "hub"}, {"files": list(arrow), "format": "arrow", "name": "cache"}]
    seen = []
    for rank in range(2):
        config = base_config(tmp_path, val={"sources": sources, "batch_size": 4},
                             distributed={"rank": rank, "world_size": 2})
        loader = build_loader(config, "val")
        seen += [(loader.index.entry[i], c) for i, c in zip(np.concatenate(loader.order.batches(0))[:, 0],
                                                              (c for images, _ in loader for c in identities(images)))]
    assert len(seen) == len(set(seen)) == 30 and {source for source, _ in seen} == {0, 1}
    assert {c for s, c in seen if s == 0} == {c for s, c in seen if s == 1}  # the same 15 images in each format
    train = build_loader(sources_config(tmp_path, *sources, shuffle="block", block_size="4KB", drop_last=False),
                         "train")
    assert sorted(np.concatenate(train.order.batches(1))[:, 0].tolist()) == list(range(30))
    assert len(train.order.blocks.blocks(7, 1)) > 1


def test_image_files_and_parquet_files_in_one_split_are_refused(tmp_path):
    parquet, _, _ = table_and_shard_sources(tmp_path)
    config = sources_config(tmp_path / "d", {"files": list(parquet)}, {"folder": "val"})
    with pytest.raises(ConfigError, match=r"train.sources\[1\] reads image files and train.sources\[0\] parquet or "
                                          r"Arrow files: the sources of one split are all image files .* or all "
                                          r"containers"):
        build_loader(config, "train")


def test_an_eval_split_of_sources_reads_every_sample_once_across_ranks(two_folders):
    config = base_config(two_folders, val={"sources": [{"folder": "train"}, {"folder": "val"}], "batch_size": 5})
    seen = []
    for rank in range(2):
        loader = build_loader({**config, "distributed": {"rank": rank, "world_size": 2}}, "val")
        seen += [c for images, _ in loader for c in identities(images)]
    assert len(seen) == 36 == len(set(seen))


def test_a_sample_in_two_sources_is_refused(two_folders, tmp_path):
    listed = tmp_path / "list.txt"
    listed.write_text("val/a_red/n_01.png 0\ntrain/c_blue/n_02.png 2\n")
    with pytest.raises(ConfigError, match=r"train.sources\[0\] and train.sources\[1\] both hold "
                                          r"'train/c_blue/n_02.png': a sample may be in one source only"):
        build_loader(sources_config(two_folders, {"folder": "train"}, {"file_list": str(listed)}), "train")


@pytest.mark.parametrize("spelling", ["./{name}", "train//{rest}", "train/x/../{rest}", "{root}/{name}",
                                      "../d/{name}"])
def test_a_sample_in_two_sources_is_refused_however_the_file_list_spells_it(two_folders, tmp_path, spelling):
    listed = tmp_path / "list.txt"
    name = "train/c_blue/n_02.png"
    listed.write_text(f"val/a_red/n_01.png 0\n{spelling.format(name=name, rest=name[6:], root=two_folders)} 2\n")
    with pytest.raises(ConfigError, match=r"train.sources\[0\] and train.sources\[1\] both hold "
                                          r"'train/c_blue/n_02.png'( \(.*\))?: a sample may be in one source only"):
        build_loader(sources_config(two_folders, {"folder": "train"}, {"file_list": str(listed)}), "train")


@pytest.mark.parametrize("link, target, first, again", [
    ("d/link", "d/train", "train/a_red/n_00.png", "link/a_red/n_00.png"),  # a link to the folder
    ("outer", "d", "d/train/a_red/n_00.png", "outer/train/a_red/n_00.png"),  # a link to the folder above it
])
def test_a_folder_and_a_link_to_it_or_above_it_hold_the_same_samples(two_folders, link, target, first, again):
    (two_folders.parent / link).symlink_to(two_folders.parent / target)
    config = sources_config(two_folders, {"folder": "train"}, {"folder": str(two_folders.parent / link)})
    with pytest.raises(ConfigError, match=rf"train.sources\[0\] and train.sources\[1\] both hold '{first}' "
                                          rf"\(train.sources\[1\] names it '{again}'\): a sample may be in one "
                                          rf"source only"):
        build_loader(config, "train")


def test_an_empty_folder_source_is_named_by_its_key(two_folders):
    (two_folders / "empty" / "a_red").mkdir(parents=True)
    config = sources_config(two_folders, {"folder": "train"}, {"folder": "empty"})
    with pytest.raises(ConfigError, match=r"train.sources\[1\].folder: no image files under '.*/empty'"):
        build_loader(config, "train")
    (two_folders / "empty" / "a_red").rmdir()
    with pytest.raises(ConfigError, match=r"train.sources\[1\].folder: '.*/empty' has no class folders"):
        build_loader(config, "train")


def test_image_files_and_shards_in_one_split_are_refused(tmp_path):
    train, _ = shard_sources(tmp_path)
    config = sources_config(tmp_path / "d", {"folder": "val"}, {"shards": train})
    with pytest.raises(ConfigError, match=r"train.sources\[0\] reads image files and train.sources\[1\] tar shards: "
                                          r"the sources of one split are all image files .* or all containers"):
        build_loader(config, "train")


@pytest.mark.parametrize("train, message", [
    ({"sources": [{"folder": "a"}], "folder": "b"},
     "train.folder: split 'train' reads its samples from train.sources; move train.folder into a source"),
    ({"sources": [{"weight": 1}]}, "train.sources[0]: a source reads one of folder, file_list, shards, files or "
                                   "source (your own), and it sets none of them"),
    ({"sources": [{"folder": "a", "source": "m:f"}]}, "train.sources[0]: a source reads one of folder, file_list, "
                                                      "shards, files or source (your own), and it sets folder and "
                                                      "source"),
    ({"sources": [{"folder": "a", "format": "arrow"}]}, "train.sources[0].format: says how a source's `files` are "
                                                        "stored (parquet or arrow), and this source reads folder"),
    ({"sources": [{"folder": "a", "weight": 1}, {"folder": "b"}]},
     "train.sources[1].weight: missing: set weight on every source"),
    ({"sources": [{"folder": "a", "weight": 0}, {"folder": "b", "weight": 0}]},
     "train.sources[0].weight: every source's weight is 0"),
    ({"sources": [{"folder": "a", "weight": -1}]}, "train.sources[0].weight: must be a number >= 0, got -1.0"),
    ({"sources": [{"folder": "a", "weight": float("nan")}]}, "train.sources[0].weight: expected a finite number"),
    ({"sources": [{"folder": "a", "wieght": 1}]}, "unknown key 'train.sources[0].wieght'; did you mean "
                                                  "'train.sources[0].weight'?"),
    ({"sources": [{"folder": "a", "classes": "mine"}]}, "train.sources[0].classes: expected one of 'shared', 'own'"),
    ({"sources": [{"folder": "a", "name": "x"}, {"folder": "b", "name": "x"}]},
     "train.sources[1].name: 'x' names two sources"),
    ({"sources": [{"folder": "a"}], "shuffle": "block", "block_size": "1GB"},
     "train.shuffle: block reads the split's tar shards (or parquet row groups) block by block, and "
     "train.sources[0] reads image files"),
])
def test_sources_that_cannot_work_fail_when_the_config_is_loaded(tmp_path, train, message):
    with pytest.raises(ConfigError) as refused:
        load_config(base_config(tmp_path, train=train))
    assert message in str(refused.value)


def test_eval_splits_refuse_the_sources_weights(tmp_path):
    with pytest.raises(ConfigError, match=r"val.sources\[0\].weight: applies only to train mode, and split 'val' has "
                                          r"mode: eval: eval reads every sample of every source exactly once"):
        load_config(base_config(tmp_path, val={"sources": [{"folder": "a", "weight": 1},
                                                           {"folder": "b", "weight": 2}]}))


def test_a_source_whose_samples_all_weigh_0_is_refused_at_load(two_folders):
    config = sources_config(two_folders, {"folder": "train", "weight": 1}, {"folder": "val", "weight": 1,
                                                                           "classes": "own", "name": "x"},
                            class_weights={"x/a_red": 0, "x/b_green": 0, "x/c_blue": 0})
    with pytest.raises(ConfigError, match=r"train.sources\[1\].weight: 1, but each of its samples weighs 0 "
                                          r"\(train.class_weights\), so its share cannot be drawn"):
        build_loader(config, "train")
