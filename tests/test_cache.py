"""The uint8 cache: built once by `fastloader cache`, read by both backends with the contract's
semantics, refused when stale or unfinished."""
from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DEVICES, REPO, base_config, identities, write_numbered_dataset, write_textured_dataset
from PIL import Image
from torchvision.transforms.v2 import functional as F

from fastloader import build_loader, load_config
from fastloader.cache import open_split_cache
from fastloader.cache_write import build_split_cache
from fastloader.errors import BadImageError, CacheError
from fastloader.sources.formats import build_index

SHORT = 40  # >= floor(32 / 0.875) = 36, what eval at size 32 needs


def build(root: Path, cache: Path, split: str = "train", short_side: int = SHORT, **dataset) -> dict:
    config = load_config(base_config(root, dataset=dataset))
    return build_split_cache(config, config.split(split), build_index(config, config.split(split)), str(cache),
                             short_side, workers=2)


def cached_config(root: Path, cache: Path, **sections) -> dict:
    config = base_config(root, **sections)
    config["dataset"] = {**config["dataset"], "cache": str(cache)}
    return config


def batches(loader) -> list[tuple[list, list]]:
    return [(identities(x), y.tolist()) for x, y in loader]


@pytest.fixture(scope="module")
def numbered(tmp_path_factory) -> tuple[Path, Path]:
    """A numbered dataset (every image its own colour) and its cache, both splits."""
    base = tmp_path_factory.mktemp("numbered")
    root = write_numbered_dataset(base / "data", per_class=6)
    for split in ("train", "val"):
        build(root, base / "cache", split)
    return root, base / "cache"


def test_round_trip_pixels_equal_the_decoded_and_resized_images(tmp_path):
    root = write_textured_dataset(tmp_path / "data", per_class=5, splits=("train",))
    report = build(root, tmp_path / "cache", short_side=50)
    config = load_config(cached_config(root, tmp_path / "cache"))
    index = build_index(config, config.split("train"))
    opened = open_split_cache(config, config.split("train"), index)
    assert report["images"] == len(index) == 15 and not report["bad"]
    for sample in range(len(index)):
        decoded = torch.from_numpy(np.array(Image.open(index.path(sample)).convert("RGB"))).permute(2, 0, 1)
        expected = F.resize(decoded, [50], antialias=True) if min(decoded.shape[1:]) > 50 else decoded
        cached = opened.pixels.image(sample)
        assert cached.dtype == np.uint8 and min(cached.shape[:2]) == min(50, *decoded.shape[1:])
        assert np.array_equal(cached, expected.permute(1, 2, 0).numpy()), index.relpath(sample)
    assert os.path.getsize(tmp_path / "cache" / "train" / "pixels.u8") == report["bytes"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["torch", "dali"])
@pytest.mark.parametrize("split", ["train", "val"])
def test_both_backends_deliver_the_same_samples_labels_and_order_as_without_the_cache(numbered, backend, split,
                                                                                      device):
    root, cache = numbered
    workers = {"num_workers": 2 if backend == "torch" else 1}
    output = {"device": device}
    with build_loader(base_config(root, backend=backend, workers=workers, output=output), split) as files, \
            build_loader(cached_config(root, cache, backend=backend, workers=workers, output=output), split) as cached:
        assert cached.device.type == files.device.type == device
        assert (len(cached), cached.num_samples, cached.classes) == (len(files), files.num_samples, files.classes)
        assert cached.state_dict() == files.state_dict()  # same fingerprint: resume works across both
        for epoch in range(2):
            expected, got = batches(files), batches(cached)
            assert got == expected, f"epoch {epoch}"
        assert cached.bad_samples == []


@pytest.mark.parametrize("backend", ["torch", "dali"])
def test_eval_on_two_ranks_reads_every_cached_sample_exactly_once(numbered, backend):
    root, cache = numbered
    seen = []
    for rank in range(2):
        config = cached_config(root, cache, backend=backend, distributed={"rank": rank, "world_size": 2})
        with build_loader(config, "val") as loader:
            seen += [colour for colours, _ in batches(loader) for colour in colours]
    with build_loader(base_config(root, backend=backend), "val") as files:
        everything = [colour for colours, _ in batches(files) for colour in colours]
    assert sorted(seen) == sorted(everything) and len(set(everything)) == len(everything)


def test_an_epoch_of_several_passes_caches_each_file_once(tmp_path):
    root = write_numbered_dataset(tmp_path / "data", per_class=2, splits=("train",))
    passes = {"train": {"epoch_size": 18}}  # three passes of the 6 files (a file list names each file once)
    config = load_config(base_config(root, **passes))
    report = build_split_cache(config, config.split("train"), build_index(config, config.split("train")),
                               str(tmp_path / "cache"), SHORT, workers=0)
    assert report["images"] == 6
    with build_loader(cached_config(root, tmp_path / "cache", **passes), "train") as loader, \
            build_loader(base_config(root, **passes), "train") as files:
        assert loader.num_samples == 6 and len(loader) == 18 // 4 and batches(loader) == batches(files)


def _stale_message(root: Path, cache: Path, split: str = "train") -> str:
    with pytest.raises(CacheError) as error:
        build_loader(cached_config(root, cache), split)
    return str(error.value)


def test_a_stale_cache_is_refused_with_the_command_that_rebuilds_it(tmp_path):
    root = write_numbered_dataset(tmp_path / "data", per_class=3, splits=("train",))
    cache = tmp_path / "cache"
    build(root, cache)
    image = root / "train" / "a_red" / "n_00.png"
    added = root / "train" / "a_red" / "new.png"
    Image.new("RGB", (40, 40), (1, 2, 3)).save(added)
    message = _stale_message(root, cache)
    assert "1 file is not in the cache" in message and "a_red/new.png" in message
    assert f"fastloader cache CONFIG --split train --short-side {SHORT} --out {cache}" in message  # as built
    added.unlink()
    build_loader(cached_config(root, cache), "train").close()  # matches again
    (root / "train" / "b_green" / "n_01.png").unlink()
    assert "1 cached file is no longer in the split" in _stale_message(root, cache)
    build(root, cache)
    os.utime(image, ns=(image.stat().st_atime_ns, image.stat().st_mtime_ns + 10**9))
    assert "1 file changed" in _stale_message(root, cache) and "a_red/n_00.png" in _stale_message(root, cache)


def test_a_cache_too_small_for_the_transform_is_refused(tmp_path):
    root = write_numbered_dataset(tmp_path / "data", per_class=2, splits=("val",))
    build(root, tmp_path / "cache", split="val", short_side=24)
    message = _stale_message(root, tmp_path / "cache", "val")
    assert "--short-side 24" in message and "needs at least 36" in message
    assert f"Rebuild it with `fastloader cache CONFIG --split val --out {tmp_path / 'cache'}`" in message  # 256 serves


@pytest.mark.parametrize("backend", ["torch", "dali"])
@pytest.mark.parametrize("train, asks", [
    ({"transform": {"size": 32, "sizes": [32, 96]}}, r"sizes \[32, 96\]"),
    ({"transform": {"size": 32}, "views": [{"count": 1, "size": 32}, {"count": 2, "size": 96, "name": "big"}]},
     r"view group big of size 96")])
def test_a_cache_too_small_for_any_size_the_split_asks_is_refused(numbered, backend, train, asks):
    """Each size a train split may ask for is checked, not only transform.size: a 40 px cache served
    96 px batches of `sizes: [32, 96]` and 96 px views, enlarged (issue 68). A progressive ramp never
    passes transform.size (min_size above it is refused at load)."""
    root, cache = numbered
    config = cached_config(root, cache, backend=backend, train=train)
    with pytest.raises(CacheError, match=rf"built with --short-side {SHORT}, and split 'train' \(train, {asks}\) "
                                         rf"needs at least 96 not to enlarge images"):
        build_loader(config, "train")
    fits = cached_config(root, cache, backend=backend, train={"transform": {"size": 32, "sizes": [24, 40]}})
    assert sum(len(labels) for _, labels in build_loader(fits, "train")) == 16  # 18, in whole batches of 4


def test_an_unfinished_build_is_never_read(tmp_path, caplog):
    root = write_numbered_dataset(tmp_path / "data", per_class=2, splits=("train", "val"))
    cache = tmp_path / "cache"
    (cache / ".train.partial-4242").mkdir(parents=True)
    (cache / ".train.partial-4242" / "pixels.u8").write_bytes(b"\0" * 100)
    assert "was never finished" in _stale_message(root, cache)
    (cache / "train").mkdir()
    assert "not a complete cache" in _stale_message(root, cache)
    with caplog.at_level(logging.WARNING, logger="fastloader"):  # no cache for val: the files, said so
        with build_loader(cached_config(root, cache), "val") as loader:
            assert loader.num_samples == 6
    assert "no cache for split 'val'" in caplog.text and "fastloader cache" in caplog.text


def write_bad_file(root: Path) -> Path:
    bad = root / "train" / "b_green" / "broken.png"
    bad.write_bytes(b"<!DOCTYPE html> not an image")
    return bad


def test_bad_files_skip_is_listed_and_dropped_raise_names_the_file(tmp_path, caplog):
    root = write_numbered_dataset(tmp_path / "data", per_class=3, splits=("train",))
    bad = write_bad_file(root)
    refused = r"broken.png': not an image.*\(found while building the cache\)\. Set dataset.on_bad_image: skip"
    with pytest.raises(BadImageError, match=refused):
        build(root, tmp_path / "cache", on_bad_image="raise")
    assert not os.listdir(tmp_path / "cache")  # nothing half-written left behind
    report = build(root, tmp_path / "cache")
    assert report["images"] == 9 and report["bad"] == [("b_green/broken.png", report["bad"][0][1])]
    manifest = json.loads((tmp_path / "cache" / "train" / "manifest.json").read_text())
    assert manifest["bad"][0][0] == "b_green/broken.png" and "not an image" in manifest["bad"][0][1]
    assert "left out" in caplog.text and "found while building the cache" in caplog.text  # the build named it
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fastloader"):
        with build_loader(cached_config(root, tmp_path / "cache", train={"drop_last": False}), "train") as loader:
            assert loader.num_samples == 9 and [path for path, _ in loader.bad_samples] == [str(bad)]
            assert sum(len(y) for _, y in loader) == 9
    assert caplog.text.count("broken.png") == 1
    config = cached_config(root, tmp_path / "cache")
    config["dataset"]["on_bad_image"] = "raise"
    with pytest.raises(BadImageError, match=r"broken.png': not an image.*\(listed as bad in the cache .*\)\. Set"):
        build_loader(config, "train")


def test_reading_writes_nothing_in_the_cache(numbered):
    root, cache = numbered
    before = {path: path.stat().st_mtime_ns for path in cache.rglob("*")}
    with build_loader(cached_config(root, cache, workers={"num_workers": 2}), "train") as loader:
        list(loader)
    assert {path: path.stat().st_mtime_ns for path in cache.rglob("*")} == before


def test_cli_builds_the_cache_and_says_how_to_use_it(tmp_path):
    root = write_numbered_dataset(tmp_path / "data", per_class=2)
    config = tmp_path / "config.yaml"
    config.write_text(f"dataset: {{root: {root}}}\n"
                      "train: {transform: {size: 32}}\nval: {transform: {size: 32}}\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "fastloader.cli", "cache", str(config), "--split", "train", "--short-side", "40",
               "--out", str(tmp_path / "cache"), "--workers", "2"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "split train: 6 images" in done.stdout and f"dataset.cache={tmp_path / 'cache'}" in done.stdout
    assert sorted(os.listdir(tmp_path / "cache")) == ["train"]
    done = subprocess.run(command[:7], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and "Pass --out DIR" in done.stderr


@pytest.mark.parametrize("backend", ["torch", "dali"])
def test_a_cached_loaders_repr_names_the_cache_as_its_pixel_source(numbered, backend):
    if backend == "dali":
        pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")
    root, cache = numbered
    with build_loader(cached_config(root, cache, backend=backend, output={"device": "cpu"}), "train") as loader:
        assert repr(loader).endswith(f"pixels from the cache {cache / 'train'})")
        assert f"backend='{backend}'" in repr(loader)


# -- killed builds and full disks: real `fastloader cache` processes, real signals, real file systems --------------


def write_slow_dataset(root: Path, count: int = 400) -> Path:
    """Noise JPEGs whose build takes long enough (a second or more, even on many fast cores) for a
    test to act while it runs."""
    rng = np.random.default_rng(0)
    for name in ("a_red", "b_green"):
        (root / "train" / name).mkdir(parents=True)
        for i in range(count // 2):
            pixels = rng.integers(0, 255, (240, 320, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / "train" / name / f"n_{i:03d}.jpg", quality=90)
    return root


def start_cache_build(root: Path, out: Path, short_side: int = 100) -> subprocess.Popen:
    """`fastloader cache` in a process of its own; its output goes to files (out + .stdout, .stderr),
    which a process it leaves behind cannot hold open."""
    config = out.parent / "config.yaml"
    config.write_text(f"dataset: {{root: {root}}}\ntrain: {{transform: {{size: 32}}}}\n")
    command = [sys.executable, "-m", "fastloader.cli", "cache", str(config), "--out", str(out), "--workers", "2",
               "--short-side", str(short_side)]
    with open(f"{out}.stdout", "w") as stdout, open(f"{out}.stderr", "w") as stderr:
        return subprocess.Popen(command, stdout=stdout, stderr=stderr, text=True, cwd=REPO,
                                env={**os.environ, "PYTHONPATH": str(REPO)})


def finished(build: subprocess.Popen, out: Path, timeout: float = 120) -> tuple[int, str]:
    """The build's exit status and what it wrote on stderr."""
    code = build.wait(timeout=timeout)
    return code, Path(f"{out}.stderr").read_text()


def wait_mid_build(build: subprocess.Popen, out: Path) -> tuple[Path, list]:
    """The partial folder and the decoding processes of a build, once it writes pixels."""
    import psutil

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and build.poll() is None:
        partials = list(out.glob(".train.partial-*/pixels.u8")) if out.is_dir() else []
        workers = psutil.Process(build.pid).children(recursive=True)
        if partials and partials[0].stat().st_size and len(workers) >= 2:
            return partials[0].parent, workers
        time.sleep(0.005)
    raise AssertionError(f"the build never got going: {finished(build, out, 60)}")


def survivors(workers: list, within: float) -> list[int]:
    """The pids of `workers` still running after `within` seconds; those are then killed."""
    import psutil

    _, alive = psutil.wait_procs(workers, timeout=within)
    left = [worker for worker in alive if worker.status() != psutil.STATUS_ZOMBIE]
    for worker in left:
        worker.kill()
    return [worker.pid for worker in left]


@pytest.mark.timeout(240)
def test_a_cache_build_killed_leaves_no_process_and_the_next_build_removes_its_partial(tmp_path):
    """SIGKILL cannot be handled: the decoding processes die with the build (the kernel kills them),
    and the next build removes the unfinished folder, saying so."""
    root = write_slow_dataset(tmp_path / "data")
    out = tmp_path / "cache"
    build = start_cache_build(root, out)
    partial, workers = wait_mid_build(build, out)
    build.kill()
    build.wait(timeout=30)
    assert survivors(workers, within=2) == []
    assert partial.is_dir(), "the build ended before it was killed; give it more images"
    assert partial.name == f".train.partial-{socket.gethostname()}-{build.pid}"
    elsewhere = out / ".val.partial-another-host-999999"  # on storage hosts share: that build may be running
    elsewhere.mkdir()
    for image in sorted((root / "train").rglob("*.jpg"))[8:]:  # the next build: a quick one
        image.unlink()
    code, stderr = finished(start_cache_build(root, out), out)
    assert code == 0, stderr
    assert f"removed {partial}" in stderr and f"(pid {build.pid}) that was killed" in stderr, stderr
    assert sorted(os.listdir(out)) == [elsewhere.name, "train"]


@pytest.mark.timeout(240)
def test_a_cache_build_stopped_by_sigterm_removes_its_partial_and_its_processes(tmp_path):
    """SIGTERM (a scheduler's stop, `kill`) stops the build as Ctrl-C does: exit status 143, nothing
    half-written left, no process behind."""
    root = write_slow_dataset(tmp_path / "data")
    out = tmp_path / "cache"
    build = start_cache_build(root, out)
    partial, workers = wait_mid_build(build, out)
    build.terminate()
    code, stderr = finished(build, out, timeout=60)
    assert survivors(workers, within=2) == []
    assert code == 143 and "terminated (SIGTERM)" in stderr, stderr
    assert not partial.exists() and os.listdir(out) == []


@pytest.mark.timeout(240)
def test_a_cache_that_does_not_fit_is_refused_before_a_byte_is_written(tmp_path, small_disk):
    """A real 1 MB file system: the build says where, how much is needed and free (exit 2), and
    writes nothing."""
    root = write_slow_dataset(tmp_path / "data", count=40)  # 40 x 133 x 100 x 3 bytes: 1.5 MiB
    out = small_disk("1m")
    code, stderr = finished(start_cache_build(root, out), out)
    assert code == 2, stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith(f"fastloader: error: no room for the cache of split 'train' in {out}: it needs about "
                           f"1.6 MiB (from the headers of its files) and 1.0 MiB are free. Nothing was written"), line
    assert "--out DIR" in line and "--short-side" in line
    assert os.listdir(out) == []


@pytest.mark.timeout(240)
def test_a_disk_that_fills_up_while_the_cache_is_written_stops_the_build_cleanly(tmp_path, small_disk):
    """A real file system filled by another writer in the middle of a build: exit 2 with the words,
    the partial folder removed, no process left behind."""
    import psutil

    root = write_slow_dataset(tmp_path / "data")  # 400 x 133 x 100 x 3 bytes: 15 MiB
    out = small_disk("24m")
    build = start_cache_build(root, out)
    partial, workers = wait_mid_build(build, out)
    psutil.Process(build.pid).suspend()  # SIGSTOP: the build waits while another writer fills the disk
    # Unbuffered: a buffered file keeps the bytes of a short last write and raises again at close
    # (seen in CI when the free space was not a multiple of the writes).
    with open(out / "filler", "wb", buffering=0) as filler:
        with pytest.raises(OSError, match="No space left"):
            while True:
                filler.write(b"\0" * 65536)
    psutil.Process(build.pid).resume()
    code, stderr = finished(build, out)
    assert survivors(workers, within=2) == []
    assert code == 2, stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith(f"fastloader: error: the disk filled up while the cache of split 'train' was written to "
                           f"{out} (No space left on device): it needs about 15.3 MiB"), line
    assert sorted(os.listdir(out)) == ["filler"] and not partial.exists()


@pytest.mark.timeout(240)
def test_pack_on_a_full_disk_says_so_and_leaves_no_partial_shard(tmp_path, small_disk):
    """`fastloader pack` writes its own way (tar shards), on the same full 1 MB file system."""
    root = write_slow_dataset(tmp_path / "data", count=40)
    out = small_disk("1m")
    config = tmp_path / "config.yaml"
    config.write_text(f"dataset: {{root: {root}}}\ntrain: {{transform: {{size: 32}}}}\n")
    done = subprocess.run([sys.executable, "-m", "fastloader.cli", "pack", str(config), "--split", "train", "--out",
                           str(out)], capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2, done.stderr
    assert f"fastloader: error: the disk holding {out} is full (No space left on device;" in done.stderr
    assert not [name for name in os.listdir(out) if name.endswith(".partial")]
