"""Numbers that overflow or poison (issue 33, item 9): every number of a config is range-checked at load
with its key; labels past a stated bound are refused per member; a loader state is checked against the
loader it is loaded into. The CPU; errors are raised before any batch, the same on both backends."""
from __future__ import annotations

import logging
import subprocess
import sys
import tarfile

import pytest
from conftest import REPO, base_config, cpu_only_env, write_solid_dataset
from shardfiles import add_member, png_bytes

from fastloader import build_loader, load_config
from fastloader.errors import BadImageError, ConfigError

BACKENDS = ["torch", "dali"]

CONFIG_NUMBERS = {  # override: what the error says
    "train.mixup.mixup_alpha=.inf": "train.mixup.mixup_alpha: expected a finite number, got .inf",
    "train.mixup.cutmix_alpha=.nan": "train.mixup.cutmix_alpha: expected a finite number, got .nan",
    "train.transform.color_jitter=.inf": "train.transform.color_jitter: expected a finite number, got .inf",
    "train.transform.ratio=[0.5, .inf]": "train.transform.ratio[1]: expected a finite number, got .inf",
    f"train.transform.hflip={10 ** 400}": "train.transform.hflip: expected a finite number",
    "train.batch_size=1000000000": "train.batch_size: must be an integer in [1, 65536], got 1000000000",
    f"seed={2 ** 64}": f"seed: must be an integer in [0, 2**63 - 1], got {2 ** 64}",
    "seed=-1": "seed: must be an integer in [0, 2**63 - 1], got -1",
    "train.transform.size=100000": "train.transform.size: must be an integer in [1, 8192], got 100000",
    "workers.num_workers=100000": "workers.num_workers: must be 'auto' or an integer in [0, 1024], got 100000",
    "workers.prefetch_factor=1000000000": "workers.prefetch_factor: must be an integer in [1, 1024]",
    "distributed.world_size=0": "distributed.world_size: must be 'auto' or an integer in [1, 1048576], got 0",
    f"dataset.max_pixels={2 ** 64}": "dataset.max_pixels: must be a positive integer, at most 2**63 - 1",
    "train.aug_repeats=1000000": "train.aug_repeats: must be an integer in [1, 1024] (1: no repeats), got 1000000",
}


@pytest.mark.parametrize("override", CONFIG_NUMBERS)
def test_every_number_is_range_checked_at_load_with_its_key(tmp_path, override):
    with pytest.raises(ConfigError) as refused:
        load_config(base_config(tmp_path), [override])
    assert f"override '{override.split('=')[0]}': {CONFIG_NUMBERS[override]}" in str(refused.value)


def test_a_number_that_overflows_is_a_config_error_on_the_command_line_not_an_internal_one(tmp_path):
    """`fastloader bench` with seed 2**64 and batch_size 1e9 once ended in OverflowError and ENOMEM (exit 3)."""
    root = write_solid_dataset(tmp_path / "data", per_class=2, splits=("train",))
    config = tmp_path / "c.yaml"
    config.write_text(f"dataset: {{root: {root}}}\nworkers: {{num_workers: 0}}\ntrain: {{batch_size: 2}}\n")
    for override, message in ((f"seed={2 ** 64}", "seed: must be an integer in [0, 2**63 - 1]"),
                              ("train.batch_size=1000000000", "train.batch_size: must be an integer in [1, 65536]")):
        result = subprocess.run([sys.executable, "-m", "fastloader.cli", "bench", str(config), "--set", override,
                                 "--batches", "1", "--rounds", "1", "--seconds", "0"], cwd=REPO, capture_output=True,
                                text=True, env=cpu_only_env(tmp_path / "cache"), timeout=120)
        assert result.returncode == 2, result.stderr[-2000:]
        assert f"fastloader: error: override '{override.split('=')[0]}': {message}" in result.stderr


def write_shard(path, labels: dict[str, bytes]) -> None:
    with tarfile.open(path, "w") as archive:
        for key, label in labels.items():
            add_member(archive, f"{key}.png", png_bytes())
            add_member(archive, f"{key}.cls", label)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_huge_or_far_label_in_a_shard_is_one_refused_member_not_a_dead_loader(tmp_path, backend, caplog):
    """A .cls of 99999999999999999999999 raised OverflowError while indexing; one of 20000000 made
    20 million classes. Each is now a member left out under on_bad_image: skip, named with its reason."""
    write_shard(tmp_path / "s.tar", {"a": b"0", "b": b"1", "huge": b"99999999999999999999999", "far": b"20000000"})
    config = base_config(tmp_path, backend=backend, dataset={"format": "webdataset"},
                         val={"shards": str(tmp_path / "s.tar"), "batch_size": 2})
    with caplog.at_level(logging.WARNING, logger="fastloader"):
        loader = build_loader(config, "val")
    assert loader.classes == ("0", "1")
    assert sorted(label for _, labels in loader for label in labels.tolist()) == [0, 1]
    reasons = dict(loader.bad_samples)
    assert reasons[f"{tmp_path / 's.tar'}:huge.png"] == (
        "label 99999999999999999999999 of huge.cls is above 99,999, the largest label read without dataset.classes "
        "(the classes would be 0 .. 99999999999999999999999); set dataset.classes to the class names in label "
        "order, or fix the label")
    assert "label 20000000 of far.cls is above 99,999" in reasons[f"{tmp_path / 's.tar'}:far.png"]
    with pytest.raises(BadImageError, match="label 99999999999999999999999 of huge.cls is above 99,999"):
        build_loader({**config, "dataset": {"format": "webdataset", "on_bad_image": "raise"}}, "val")
    named = {**config, "dataset": {"format": "webdataset", "classes": ["x", "y"]}}
    assert "label 20000000 of far.cls out of range (dataset.classes has 2 names)" in dict(
        build_loader(named, "val").bad_samples)[f"{tmp_path / 's.tar'}:far.png"]


def test_check_reports_a_huge_label_as_a_problem_and_exits_1_not_3(tmp_path):
    write_shard(tmp_path / "s.tar", {"a": b"0", "huge": b"99999999999999999999999"})
    config = tmp_path / "c.yaml"
    config.write_text("dataset: {format: webdataset}\nval: {shards: s.tar}\n")
    result = subprocess.run([sys.executable, "-m", "fastloader.cli", "check", str(config), "--workers", "0"],
                            cwd=REPO, capture_output=True, text=True, env=cpu_only_env(tmp_path / "cache"), timeout=120)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "s.tar:huge.png: label 99999999999999999999999 of huge.cls is above 99,999" in result.stdout


def test_a_file_list_label_past_the_bound_names_the_line(tmp_path):
    root = write_solid_dataset(tmp_path / "data", per_class=1, splits=("val",))
    (root / "list.txt").write_text("val/a_red/img_00.png 0\nval/b_green/img_00.png 99999999999999999999999\n")
    with pytest.raises(ConfigError, match=r"list.txt:2: label 99999999999999999999999 is above 99,999, the largest "
                                          r"label read without dataset.classes"):
        build_loader(base_config(root, val={"file_list": str(root / "list.txt")}), "val")


STATES = {  # field: (bad value, what the error says)
    "position": (-8, "loader state: position -8 is not in [0, 15] (samples of the epoch's order consumed by all "
                     "ranks; split 'train' has 15 per epoch)"),
    "epoch": (-1, "loader state: epoch -1 is not in [0, 9223372036854775807] (epochs count from 0)"),
    "batch_size": (0, "loader state: batch_size 0 is not in [1, 65536]"),
    "world_size": ("2", "loader state: world_size must be an integer in [1, 1048576] (ranks), got str '2'"),
    "shuffle": (1, "loader state: shuffle must be true, false or 'block' (train.shuffle), got 1"),
}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_loader_state_is_checked_field_by_field_against_the_loader(tmp_path, backend):
    root = write_solid_dataset(tmp_path / "data", per_class=5, splits=("train",))
    config = base_config(root, backend=backend)
    loader = build_loader(config, "train")
    state = loader.state_dict()
    for field, (value, message) in STATES.items():
        with pytest.raises(ValueError) as refused:
            loader.load_state_dict({**state, field: value})
        assert str(refused.value).startswith(message), (field, str(refused.value))
    with pytest.raises(ValueError, match="loader state: epoch must be an integer in .*, got no such field"):
        loader.load_state_dict({k: v for k, v in state.items() if k != "epoch"})
    with pytest.raises(ValueError, match=r"loader state: epoch 18446744073709551616 is not in \[0, "):
        loader.load_state_dict({**state, "epoch": 2 ** 64})
    loader.load_state_dict({**state, "position": 8})  # a good state still resumes: 8 of 15 consumed, 1 batch left
    assert [len(labels) for _, labels in loader] == [4]


def test_counts_of_one_are_singular():
    """'1 shards', '1 ranks' (issue 33, item 18): one helper words every count."""
    from fastloader.words import plural
    assert [plural(1, "shard"), plural(2, "shard"), plural(1, "rank"), plural(3, "class"), plural(1, "batch"),
            plural(2, "batch"), plural(0, "problem", zero="no")] == [
        "1 shard", "2 shards", "1 rank", "3 classes", "1 batch", "2 batches", "no problems"]


def test_the_largest_epoch_size_that_does_not_fit_memory_is_refused_at_build_with_what_fits(tmp_path):
    """epoch_size 2**32 passed the range check and then failed with numpy's "Unable to allocate 32 GiB"
    (issue 41.16): refused at build, naming the key and the size that fits this machine."""
    from fastloader.machine import available_memory
    from fastloader.schema import MAX_EPOCH_SIZE

    if available_memory() // 2 >= MAX_EPOCH_SIZE * 16:
        pytest.skip("this machine has the memory for the largest epoch_size's order")
    root = write_solid_dataset(tmp_path / "d", per_class=2, splits=("train",))
    config = base_config(root, train={"batch_size": 4, "epoch_size": MAX_EPOCH_SIZE, "transform": {"size": 32}})
    with pytest.raises(ConfigError, match=r"train\.epoch_size: 4,294,967,296 positions make an epoch's order of "
                                          r"64\.0 GiB while it is drawn, more than half the memory .* set "
                                          r"train\.epoch_size to at most [\d,]+"):
        build_loader(config, "train")
