"""A split held out of another (`val: {held_out: {of: train, fraction: 0.1}}`): a new user's photos in
one folder of classes, a val split carved out of it. Real files, real loaders; device: CPU."""
from __future__ import annotations

import logging

import numpy as np
import pytest
from conftest import base_config, identities, write_numbered_dataset
from test_resume import BACKENDS

from fastloader import build_loader, load_config
from fastloader.errors import ConfigError
from fastloader.sources.formats import build_index


def names(index) -> list[str]:
    return [index.relpath(i) for i in range(len(index))]


def held_out_config(root, holdout, seed=7, **sections) -> dict:
    config = base_config(root, seed=seed, **sections)
    config["val"] = {**config["val"], "held_out": holdout}
    return config


def indexes(config: dict):
    loaded = load_config(config)
    return build_index(loaded, loaded.split("train")), build_index(loaded, loaded.split("val"))


def test_a_fraction_of_each_class_is_held_out_and_train_reads_the_rest(tmp_path, caplog):
    root = write_numbered_dataset(tmp_path / "data", per_class=12, splits=("train",))
    whole = build_index(load_config(base_config(root)), load_config(base_config(root)).split("train"))
    with caplog.at_level(logging.INFO, logger="fastloader"):
        train, val = indexes(held_out_config(root, {"of": "train", "fraction": 0.25}))
    assert np.bincount(val.labels).tolist() == [3, 3, 3] and np.bincount(train.labels).tolist() == [9, 9, 9]
    assert not set(names(train)) & set(names(val)) and sorted(names(train) + names(val)) == sorted(names(whole))
    assert train.classes == val.classes == whole.classes
    for index in (train, val):  # each name keeps its label
        assert all(whole.labels[names(whole).index(name)] == index.labels[i] for i, name in enumerate(names(index)))
    assert ("split 'val': 9 samples held out of split 'train' (0.25 of each class, seed 7, the config's), which "
            "reads the other 27") in caplog.text


def test_the_choice_is_a_pure_function_of_the_seed(tmp_path):
    root = write_numbered_dataset(tmp_path / "data", per_class=12, splits=("train",))
    quarter = {"of": "train", "fraction": 0.25}
    first, again = indexes(held_out_config(root, quarter))[1], indexes(held_out_config(root, quarter))[1]
    assert names(first) == names(again)
    other_seed = indexes(held_out_config(root, quarter, seed=8))[1]
    assert names(other_seed) != names(first) and np.bincount(other_seed.labels).tolist() == [3, 3, 3]
    fixed = {**quarter, "seed": 7}  # holdout.seed: the config's seed may change, the split stays
    assert names(indexes(held_out_config(root, fixed, seed=123))[1]) == names(first)
    (root / "train" / "a_red" / "n_99.png").write_bytes((root / "train" / "a_red" / "n_00.png").read_bytes())
    grown = indexes(held_out_config(root, quarter))[1]  # a file added to one class moves no other class's choice
    assert [n for n in names(grown) if not n.startswith("a_red/")] == [n for n in names(first)
                                                                        if not n.startswith("a_red/")]


def test_a_count_per_class_keeps_one_sample_of_each_class_in_train(tmp_path, caplog):
    root = write_numbered_dataset(tmp_path / "data", per_class=4, splits=("train",))
    train, val = indexes(held_out_config(root, {"of": "train", "count": 2}))
    assert np.bincount(val.labels).tolist() == [2, 2, 2] and np.bincount(train.labels).tolist() == [2, 2, 2]
    with caplog.at_level(logging.WARNING, logger="fastloader"):
        train, val = indexes(held_out_config(root, {"of": "train", "count": 9}))
    assert np.bincount(val.labels).tolist() == [3, 3, 3] and np.bincount(train.labels).tolist() == [1, 1, 1]
    assert ("split 'val': 3 classes of split 'train' have too few samples to hold out what val.held_out asks and "
            "keep one in 'train': 'a_red' (3 of 9), 'b_green' (3 of 9), 'c_blue' (3 of 9)") in caplog.text


def test_two_splits_held_out_of_one_are_disjoint(tmp_path):
    root = write_numbered_dataset(tmp_path / "data", per_class=12, splits=("train",))
    config = held_out_config(root, {"of": "train", "fraction": 0.25})
    config["test"] = {"batch_size": 4, "held_out": {"of": "train", "count": 2}}
    loaded = load_config(config)
    train, val, test = (build_index(loaded, loaded.split(name)) for name in ("train", "val", "test"))
    assert [len(train), len(val), len(test)] == [21, 9, 6] and np.bincount(test.labels).tolist() == [2, 2, 2]
    assert len(set(names(train)) | set(names(val)) | set(names(test))) == 36


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_rank_reads_train_and_val_apart_and_both_backends_hold_out_alike(tmp_path, backend):
    """Device: CPU (DALI's CPU flavour for dali). Two ranks; each image's solid colour says which file
    it came from (write_numbered_dataset)."""
    root = write_numbered_dataset(tmp_path / "data", per_class=12, splits=("train",))
    train_index, val_index = indexes(held_out_config(root, {"of": "train", "fraction": 0.25}))
    seen = {"train": set(), "val": []}
    for rank in range(2):
        config = held_out_config(root, {"of": "train", "fraction": 0.25}, backend=backend,
                                 distributed={"rank": rank, "world_size": 2})
        for split in ("train", "val"):
            with build_loader(config, split) as loader:
                for images, _ in loader:
                    colours = identities(images)
                    seen["train"].update(colours) if split == "train" else seen["val"].extend(colours)
    assert len(seen["val"]) == len(set(seen["val"])) == len(val_index) == 9  # each held-out sample once
    assert not seen["train"] & set(seen["val"])
    assert len(seen["train"]) >= len(train_index) - 2 * 4  # drop_last leaves at most a batch a rank out


def test_a_resumed_train_loader_goes_on_with_the_same_held_out_split(tmp_path):
    root = write_numbered_dataset(tmp_path / "data", per_class=12, splits=("train",))
    config = held_out_config(root, {"of": "train", "fraction": 0.25})
    with build_loader(config, "train") as loader:
        batches = iter(loader)
        next(batches)
        state = loader.state_dict()
        rest = [identities(images) for images, _ in batches]
    with build_loader(config, "train") as resumed:
        resumed.load_state_dict(state)
        assert [identities(images) for images, _ in resumed] == rest


def test_holdout_keys_are_checked_when_the_config_loads(tmp_path):
    root = write_numbered_dataset(tmp_path / "data", per_class=4, splits=("train",))

    def error(holdout, **val) -> str:
        config = held_out_config(root, holdout)
        config["val"].update(val)
        with pytest.raises(ConfigError) as caught:
            load_config(config)
        return str(caught.value)
    assert error({"of": "trian", "fraction": 0.1}).endswith(
        "val.held_out.of: names no split of the config ('trian'); did you mean 'train'?; name the split whose "
        "samples are held out: one of train")
    assert error({"of": "train", "fraction": 0.1, "count": 3}).endswith(
        "val.held_out: takes a share of each class (val.held_out.fraction: 0.1) or a count of each class "
        "(val.held_out.count: 50), one of the two; both are set")
    assert error({"of": "train"}).endswith("one of the two; neither is set")
    assert error({"of": "train", "fraction": 1.0}).endswith("val.held_out.fraction: must be a fraction in (0, 1), "
                                                            "or null, got 1.0")
    assert error({"fraction": 0.1}).endswith("val.held_out.of: missing; it has no default")
    assert error({"of": "train", "fraction": 0.1}, folder="val").endswith(
        "val.folder: split 'val' is held out of split 'train' (val.held_out.of), whose samples it reads; remove "
        "val.folder, or remove val.held_out")


def test_the_config_pages_example_runs_as_written(tmp_path):
    """docs/config.md's example: photos in one folder of class folders (`train.folder: .`), val held out."""
    import re

    import yaml
    from conftest import REPO
    page = (REPO / "docs" / "config.md").read_text()
    section = page[page.index("## A split held out of another"):]
    example = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
    root = write_numbered_dataset(tmp_path / "photos", per_class=10, splits=("train",)) / "train"
    example["dataset"]["root"] = str(root)
    example["train"]["batch_size"] = example["val"]["batch_size"] = 4
    example.update(backend="torch", output={"device": "cpu"}, workers={"num_workers": 0})
    with build_loader(example, "train") as train, build_loader(example, "val") as val:
        assert (train.num_samples, val.num_samples) == (27, 3) and val.split.mode == "eval"
        assert sum(len(labels) for _, labels in val) == 3


def test_a_weights_file_for_the_whole_folder_names_the_held_out_samples_too(tmp_path):
    """train.weights written for every file of the folder (as `fastloader check` lists them) still fits
    a train split that val holds samples out of; a name that is in neither is refused as before."""
    root = write_numbered_dataset(tmp_path / "data", per_class=4, splits=("train",))
    weights = tmp_path / "weights.txt"
    names = sorted(str(path.relative_to(root)) for path in (root / "train").rglob("*.png"))
    weights.write_text("".join(f"{name} 1\n" for name in names))
    config = held_out_config(root, {"of": "train", "count": 1})
    config["train"]["weights"] = str(weights)
    with build_loader(config, "train") as loader:
        assert loader.num_samples == 9
    weights.write_text("".join(f"{name} 1\n" for name in [*names, "train/a_red/nowhere.png"]))
    with pytest.raises(ConfigError, match=r"weights.txt:13 names 'train/a_red/nowhere.png', which split 'train' "
                                          r"lacks \(1 name such\)"):
        build_loader(config, "train")
