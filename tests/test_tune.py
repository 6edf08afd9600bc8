"""`fastloader tune` and the tuned file it writes: only keys that change how fast batches come, the
same samples, labels and order from the tuned loader as from the config as given, a file with any
other key refused, a warning where the file was measured on another kind of machine, ranks that
agree on one file. Outcomes, not speeds: speeds are benchmarks/tune.py's. CPU-only: the commands
run with no GPU visible (cpu_only_env), the loaders with output.device: cpu."""
from __future__ import annotations

import logging
import threading
import time

import pytest
import torch
import yaml
from conftest import base_config, everything, identities, write_numbered_dataset
from test_cli import run

from fastloader import build_loader, load_config
from fastloader.commands.tuning import data_bound, step_ms_of
from fastloader.config_tuned import TUNABLE_KEYS, flat, machine_key
from fastloader.errors import ConfigError

FAST = ["--seconds", "0.2", "--time-limit", "4"]


@pytest.fixture
def numbered(tmp_path):
    """A config with hand settings (torch, no workers) over images whose colours name their files."""
    root = write_numbered_dataset(tmp_path / "data", per_class=6, splits=("train",))
    config = base_config(root, train={"batch_size": 4, "transform": {"size": 32, "auto_augment": "rand-m9"}})
    path = tmp_path / "hand.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_tune_writes_only_tunable_keys_and_the_tuned_loader_delivers_the_same(numbered, tmp_path):
    out = tmp_path / "tuned.yaml"
    result = run("tune", str(numbered), "--out", str(out), "--step-ms", "1000", *FAST, cache_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    written = flat(yaml.safe_load(out.read_text()))
    assert set(written) - {"tuned.measured_on"} <= set(TUNABLE_KEYS) and "backend" in written
    measured_on = written["tuned.measured_on"]
    assert measured_on["gpu"] == "none" and measured_on["data_format"] == "folder" and measured_on["cores"] >= 1
    assert measured_on["ranks_per_node"] == 1 and measured_on["torch"] == torch.__version__
    # the report: what it tried against the config as given, what it chose, where the time goes
    assert "torch: 0 workers, prefetch 2" in result.stdout and "as given" in result.stdout
    assert "chosen: " in result.stdout and "x the config as given" in result.stdout
    assert "where the time goes" in result.stdout
    for stage in ("read", "decode", "ops", "collate", "feed + copy"):
        assert f"{stage} " in result.stdout
    assert "a model step of 1000 ms takes 4 images/s" in result.stdout and "not data-bound" in result.stdout
    assert f"wrote {out}" in result.stdout

    hand = load_config(numbered)
    tuned = load_config(numbered, {"tuned": str(out)})
    assert tuned.backend == written["backend"] and tuned.origin("backend") == f"tuned file {out}"
    with build_loader(hand, "train") as given, build_loader(tuned, "train") as faster:
        assert faster.backend == written["backend"]
        for epoch in (0, 1):
            given.set_epoch(epoch)
            faster.set_epoch(epoch)
            labels, images = everything(given)
            tuned_labels, tuned_images = everything(faster)
            assert tuned_labels == labels and len(labels) == 4 * len(given) > 0  # the same labels, same order
            assert [identities(b) for b in tuned_images] == [identities(b) for b in images]  # the same files
            if faster.backend == "torch":  # within a backend, the same pixels
                assert all(torch.equal(a, b) for a, b in zip(images, tuned_images))


def test_a_config_names_its_tuned_file_and_overrides_still_win(numbered, tmp_path):
    tuned = tmp_path / "tuned.yaml"
    tuned.write_text("backend: torch\nworkers: {num_workers: 2, prefetch_factor: 3}\n")
    raw = yaml.safe_load(numbered.read_text())
    raw["workers"]["max_workers"] = 5
    named = tmp_path / "named.yaml"
    named.write_text(yaml.safe_dump({**raw, "tuned": "tuned.yaml"}))  # relative to the config's folder
    config = load_config(named)
    assert (config.workers.num_workers, config.workers.prefetch_factor, config.workers.max_workers) == (2, 3, 5)
    assert config.tuned.file == str(tuned) and config.origin("workers.num_workers") == f"tuned file {tuned}"
    overridden = load_config(named, ["workers.num_workers=1"])
    assert (overridden.workers.num_workers, overridden.workers.prefetch_factor) == (1, 3)
    # a loaded Config keeps its override when loaded again (a command adds its own overrides)
    assert load_config(overridden, {"stats.log_level": "none"}).workers.num_workers == 1
    # the file's nested mapping as build_loader's overrides: those keys set, the section's others kept
    as_overrides = load_config(numbered, yaml.safe_load(tuned.read_text()) | {"workers.max_workers": 5})
    assert (as_overrides.workers.num_workers, as_overrides.workers.max_workers) == (2, 5)


@pytest.mark.parametrize("backend, tuned", [("torch", "workers: {num_workers: 2, prefetch_factor: 3}"),
                                            ("dali", "dali: {threads: 2}\nworkers: {prefetch_factor: 1}")])
def test_within_a_backend_a_tuned_file_keeps_every_pixel(numbered, tmp_path, backend, tuned):
    """The hand settings (no workers; DALI: one thread) against a tuned file's wider, shallower or deeper loader."""
    if backend == "dali":
        pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")
    path = tmp_path / "tuned.yaml"
    path.write_text(f"backend: {backend}\n{tuned}\n")
    given = {"backend": backend}  # the config: no workers
    with build_loader(numbered, "train", given) as plain, \
            build_loader(numbered, "train", {**given, "tuned": str(path)}) as faster:
        assert faster.prefetch_depth != plain.prefetch_depth  # the tuned file did change the loader
        labels, images = everything(plain)
        tuned_labels, tuned_images = everything(faster)
        assert tuned_labels == labels and len(tuned_images) == len(images) > 0
        assert all(torch.equal(a, b) for a, b in zip(images, tuned_images))


@pytest.mark.parametrize("key, text", [("train.batch_size", "train: {batch_size: 8}\n"),
                                       ("seed", "seed: 3\nbackend: torch\n"),
                                       ("workers.persistent", "workers: {persistent: false}\n")])
def test_a_tuned_file_that_changes_what_is_delivered_is_refused(numbered, tmp_path, key, text):
    tuned = tmp_path / "bad.yaml"
    tuned.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_config(numbered, {"tuned": str(tuned)})
    assert f"tuned file {str(tuned)!r} sets {key!r}: a tuned file sets only keys that change how" in str(error.value)
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError, match=r"tuned file .*missing\.yaml' not found; run `fastloader tune"):
        load_config(numbered, {"tuned": str(missing)})


def test_build_loader_warns_where_the_file_was_measured_elsewhere(numbered, tmp_path, caplog):
    here = tmp_path / "here.yaml"  # as `fastloader tune` writes it here (the first test holds that it does)
    written = {"backend": "torch", "workers": {"num_workers": 1},
               "tuned": {"measured_on": machine_key(1, "folder")}}
    here.write_text(yaml.safe_dump(written))
    with caplog.at_level(logging.WARNING, logger="fastloader"):
        build_loader(numbered, "train", {"tuned": str(here)}).close()
    assert "measured on another kind" not in caplog.text  # measured here: no warning
    written["tuned"]["measured_on"]["cores"] = 512
    written["tuned"]["measured_on"]["gpu"] = "NVIDIA H100 80GB HBM3"
    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text(yaml.safe_dump(written))
    with caplog.at_level(logging.WARNING, logger="fastloader"):
        build_loader(numbered, "train", {"tuned": str(elsewhere)}).close()
    assert (f"tuned settings from {elsewhere} were measured on another kind of machine or data (cores: 512 there"
            in caplog.text)
    assert "gpu: NVIDIA H100 80GB HBM3 there, none here" in caplog.text


def test_ranks_other_than_0_wait_for_rank_0s_file(numbered, tmp_path):
    out = tmp_path / "tuned.yaml"

    def rank_0_writes():
        time.sleep(3)
        out.write_text("backend: torch\n")
    writer = threading.Thread(target=rank_0_writes)
    writer.start()
    result = run("tune", str(numbered), "--out", str(out), *FAST, cache_dir=tmp_path, RANK="1", WORLD_SIZE="2",
                 LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")
    writer.join()
    assert result.returncode == 0, result.stderr
    assert f"rank 1: rank 0 wrote {out}; every rank uses it" in result.stdout
    assert "trials" not in result.stdout  # it measured nothing itself


def test_tune_refuses_bad_options_with_exit_2(numbered, tmp_path):
    result = run("tune", str(numbered), "--seconds", "0", cache_dir=tmp_path)
    assert result.returncode == 2 and "--seconds must be > 0, got 0.0" in result.stderr
    result = run("tune", str(numbered), "--split", "vall", *FAST, cache_dir=tmp_path)
    assert result.returncode == 2 and "no split 'vall'" in result.stderr


def test_data_bound_says_whether_tuning_matters():
    assert "not data-bound, and tuning the loader does not make it faster" in data_bound(100, 150, 200, 320)
    assert "no longer data-bound" in data_bound(100, 50, 120, 320)
    assert "the model waits 50% of the time" in data_bound(100, 50, 120, 320)
    assert "data-bound: tuned the loader delivers 80, so the model still waits 20%" in data_bound(100, 50, 80, 320)


def test_a_model_step_from_python_is_timed_on_real_batches(numbered):
    def step(images):  # a model of 30 ms a batch
        assert images.shape == (4, 3, 32, 32)
        time.sleep(0.03)
    assert 30 <= step_ms_of(step, numbered, batches=3) < 1000
