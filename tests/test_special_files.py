"""What is not a regular file, and links that lead back: a FIFO named `.JPEG` is named and skipped
(or raised), never opened blocking; a symbolic link loop or a link into another class folder is
named and not followed, so each file is indexed once under its own label. Real FIFOs (os.mkfifo),
real links; on both backends (CPU) and through `fastloader check`. The faults these tests guard
against were hangs: each FIFO has a watchdog that lets a stuck reader go and fails the test."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest
from conftest import REPO, base_config, cpu_only_env, write_solid_dataset
from shardfiles import pack_folder_split

from fastloader import build_loader
from fastloader.errors import BadImageError, ConfigError
from fastloader.sources.reading import open_bytes, read_bytes

BACKENDS = ["torch", pytest.param("dali", marks=pytest.mark.skipif(
    not __import__("importlib").util.find_spec("nvidia.dali"), reason="NVIDIA DALI is not installed"))]
FIFO_REASON = "not a regular file: a FIFO"
RELEASE_AFTER = 30
"""Seconds after which the watchdog lets go whatever waits on a test's FIFO (and fails the test)."""


def labels_of(loader) -> list[int]:
    return sorted(label for _, labels in loader for label in labels.tolist())


@contextlib.contextmanager
def watched(fifo: Path) -> Iterator[Path]:
    """Fail rather than hang: pytest's timeout cannot interrupt a read blocked in open() while
    other threads (torch's, DALI's) take the alarm signal, so after RELEASE_AFTER seconds a writer
    opens and closes the FIFO whenever a reader holds it open (the reader then sees an empty file),
    and the test fails for it."""
    os.mkfifo(fifo)
    stop, released = threading.Event(), []

    def watch() -> None:
        if stop.wait(RELEASE_AFTER):
            return
        while not stop.is_set():
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # ENXIO while no reader waits
                released.append(fifo)
            except OSError:
                pass
            stop.wait(0.1)

    watchdog = threading.Thread(target=watch, daemon=True)
    watchdog.start()
    try:
        yield fifo
    finally:
        stop.set()
        watchdog.join()
    assert not released, f"a reader opened {fifo} and waited on it"


@contextlib.contextmanager
def with_fifo(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    root = write_solid_dataset(tmp_path / "data", per_class=2, splits=("val",))
    with watched(root / "val" / "a_red" / "pipe.JPEG") as fifo:
        yield root, fifo


def test_reading_a_fifo_raises_at_once_naming_it(tmp_path):
    from fastloader.locations import NotRegularFile
    with watched(tmp_path / "pipe.JPEG") as fifo:
        for read in (read_bytes, open_bytes):
            with pytest.raises(NotRegularFile, match=FIFO_REASON) as caught:
                read(str(fifo))
            assert caught.value.filename == str(fifo)


@pytest.mark.parametrize("screen", [True, False])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fifo_in_a_class_folder_is_named_and_skipped(tmp_path, backend, screen):
    """Screened or not, the FIFO is found by the index (it is never opened), listed with its
    reason, and the epoch delivers every image."""
    with with_fifo(tmp_path) as (root, fifo):
        loader = build_loader(base_config(root, backend=backend, dataset={"screen": screen}), "val")
        assert labels_of(loader) == [0, 0, 1, 1, 2, 2]
        assert loader.bad_samples == [(str(fifo), FIFO_REASON)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fifo_under_raise_stops_the_build_naming_it(tmp_path, backend):
    with with_fifo(tmp_path) as (root, fifo), pytest.raises(BadImageError, match=f"{fifo}.*{FIFO_REASON}"):
        build_loader(base_config(root, backend=backend, dataset={"on_bad_image": "raise"}), "val")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fifo_in_a_file_list_is_named_by_screening(tmp_path, backend):
    listing = tmp_path / "val.txt"
    listing.write_text("val/a_red/pipe.JPEG 0\nval/a_red/img_00.png 0\nval/c_blue/img_01.png 2\n")
    with with_fifo(tmp_path) as (root, fifo):
        config = base_config(root, backend=backend)
        config["val"] = {**config["val"], "file_list": str(listing)}
        loader = build_loader(config, "val")
        assert labels_of(loader) == [0, 2]
        assert loader.bad_samples == [(str(fifo), FIFO_REASON)]


def test_a_fifo_in_a_file_list_unscreened_is_skipped_by_the_torch_workers(tmp_path):
    """Not screened, the torch backend's reader refuses it when its batch comes (workers forked)."""
    listing = tmp_path / "val.txt"
    listing.write_text("val/a_red/pipe.JPEG 0\nval/a_red/img_00.png 0\nval/c_blue/img_01.png 2\n")
    with with_fifo(tmp_path) as (root, fifo):
        config = base_config(root, dataset={"screen": False}, workers={"num_workers": 2})
        config["val"] = {**config["val"], "file_list": str(listing)}
        loader = build_loader(config, "val")
        assert labels_of(loader) == [0, 2]
        assert [path for path, _ in loader.bad_samples] == [str(fifo)] and FIFO_REASON in loader.bad_samples[0][1]


def test_a_file_list_that_is_a_fifo_is_a_config_error(tmp_path):
    root = write_solid_dataset(tmp_path / "data", per_class=1, splits=("val",))
    with watched(tmp_path / "val.txt") as listing, pytest.raises(ConfigError, match=f"{listing}'?: {FIFO_REASON}"):
        build_loader(base_config(root, val={"file_list": str(listing)}), "val")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fifo_among_the_shards_is_named_not_waited_on(tmp_path, backend):
    root = write_solid_dataset(tmp_path / "data", per_class=2, splits=("val",))
    shards = pack_folder_split(root / "val", tmp_path / "shards", "val", per_shard=4)
    with watched(tmp_path / "shards" / "val-000009.tar") as fifo:
        config = base_config("unused", backend=backend)
        config["dataset"] = {"format": "webdataset"}
        config["val"] = {**config["val"], "shards": [*map(str, shards), str(fifo)]}
        loader = build_loader(config, "val")
        assert labels_of(loader) == [0, 0, 1, 1, 2, 2]
        assert loader.bad_samples == [(str(fifo), f"shard {FIFO_REASON}")]


def check(config_path: Path, cache_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fastloader.cli", "check", str(config_path)], cwd=REPO,
                          env=cpu_only_env(cache_dir), capture_output=True, text=True, timeout=RELEASE_AFTER * 2)


def test_check_names_a_fifo_and_a_link_loop_and_counts_each_file_once(tmp_path):
    with with_fifo(tmp_path) as (root, fifo):
        os.symlink(".", root / "val" / "b_green" / "loop")
        config = tmp_path / "check.yaml"
        config.write_text(f"dataset: {{root: {root}}}\nval: {{mode: eval}}\n")
        done = check(config, tmp_path / "cache")
    assert done.returncode == 1, done.stderr
    assert "split val: 6 images in 3 classes" in done.stdout
    assert f"val/a_red/pipe.JPEG: {FIFO_REASON}" in done.stdout
    assert f"{root / 'val' / 'b_green' / 'loop'}: not followed: a link to class folder 'b_green'" in done.stderr


# ---------------------------------------------------------------------------------------------
# Links
# ---------------------------------------------------------------------------------------------


def indexed(loader) -> dict[str, int]:
    index = loader.index
    return {index.relpath(i): index.label(i) for i in range(len(index))}


EACH_ONCE = {f"{name}/img_{i:02d}.png": label for label, name in enumerate(("a_red", "b_green", "c_blue"))
             for i in range(2)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_link_loop_indexes_each_file_once_and_is_named(tmp_path, backend, caplog):
    root = write_solid_dataset(tmp_path / "data", per_class=2, splits=("val",))
    os.symlink(".", root / "val" / "a_red" / "loop")
    loader = build_loader(base_config(root, backend=backend), "val")
    assert indexed(loader) == EACH_ONCE and labels_of(loader) == [0, 0, 1, 1, 2, 2]
    assert f"{root / 'val' / 'a_red' / 'loop'}: not followed: a link to class folder 'a_red'" in caplog.text


@pytest.mark.parametrize("backend", BACKENDS)
def test_mutual_links_between_classes_keep_each_file_its_own_label(tmp_path, backend):
    root = write_solid_dataset(tmp_path / "data", per_class=2, splits=("val",))
    os.symlink("../b_green", root / "val" / "a_red" / "to_green")
    os.symlink("../a_red", root / "val" / "b_green" / "to_red")
    loader = build_loader(base_config(root, backend=backend), "val")
    assert indexed(loader) == EACH_ONCE
    pixels = {label: images[i] for images, labels in loader for i, label in enumerate(labels.tolist())}
    assert pixels[0][0].mean() > pixels[0][2].mean() and pixels[1][1].mean() > pixels[1][0].mean()  # red, green


@pytest.mark.timeout(60)  # os.walk followed two self-loops for ever
def test_two_self_loops_and_a_loop_outside_the_split_end(tmp_path, caplog):
    """Loops outside any class folder (a linked folder that links back up) end at the first folder
    read twice; a folder linked from two classes is read once, under the first class."""
    root = write_solid_dataset(tmp_path / "data", per_class=2, splits=("val",))
    os.symlink(".", root / "val" / "a_red" / "self1")
    os.symlink(".", root / "val" / "a_red" / "self2")
    outside = tmp_path / "outside" / "deep"
    outside.mkdir(parents=True)
    (outside / "extra.png").write_bytes((root / "val" / "c_blue" / "img_00.png").read_bytes())
    os.symlink("..", outside / "up")
    os.symlink(outside, root / "val" / "b_green" / "more")
    os.symlink(outside, root / "val" / "c_blue" / "again")
    loader = build_loader(base_config(root), "val")
    assert indexed(loader) == {**EACH_ONCE, "b_green/more/extra.png": 1}
    assert caplog.text.count("not followed") == 4  # self1, self2, up (back to deep), again
    assert f"{root / 'val' / 'c_blue' / 'again'}: not followed: it leads to a folder already read" in caplog.text


def test_a_class_folder_that_links_outside_is_read_and_one_into_another_class_is_not(tmp_path, caplog):
    root = write_solid_dataset(tmp_path / "data", per_class=2, splits=("val",))
    pool = tmp_path / "pool"
    (root / "val" / "c_blue").rename(pool)
    os.symlink(pool, root / "val" / "c_blue")  # a class folder kept elsewhere: indexed as usual
    os.symlink("a_red", root / "val" / "d_alias")  # the same folder as another class: not indexed twice
    loader = build_loader(base_config(root), "val")
    assert indexed(loader) == EACH_ONCE and loader.classes == ("a_red", "b_green", "c_blue", "d_alias")
    assert "d_alias: not followed: a link to class folder 'a_red'" in caplog.text
