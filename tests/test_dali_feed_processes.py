"""The DALI feed read by worker processes (dali.feed_processes): the batches of the feed that reads on
the driver thread, whatever the files, the source or the processes do.

Device: CPU (the DALI CPU flavour; the feed is the same on a GPU). Real files, real worker processes,
killed and stopped with real signals."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is installed on Linux x86_64 / aarch64 only")

from conftest import base_config, cpu_only_env, processes_end, write_textured_dataset  # noqa: E402
from oddfiles import ODD_FILES  # noqa: E402
from shardfiles import pack_folder_split  # noqa: E402

from fastloader import build_loader  # noqa: E402
from fastloader.decoding.shared_reads import shareable  # noqa: E402
from fastloader.errors import ConfigError  # noqa: E402

pytestmark = [pytest.mark.skipif(shareable() is not None, reason="memfd and /proc: Linux"),
              pytest.mark.timeout(180)]

ODD = ("cut_in_half.JPEG", "random_bytes.jpg", "anim.gif", "exif_rotated.JPEG", "progressive.JPEG")
"""Odd files put among the dataset's: two the feed refuses, a GIF it has converted, two it decodes."""
TRAIN = {"batch_size": 4, "transform": {"size": 32, "sizes": [24, 32], "auto_augment": "rand-m9-mstd0.5-inc1"}}


@pytest.fixture(scope="module")
def odd_root(tmp_path_factory):
    root = write_textured_dataset(tmp_path_factory.mktemp("feed") / "d", per_class=3)
    for number, name in enumerate(ODD):
        for split in ("train", "val"):
            folder = sorted((root / split).iterdir())[number % 3]
            next(odd for odd in ODD_FILES if odd.name == name).write(folder / name)
    return root


def as_jpeg(root: Path, out: Path, quality: int = 90) -> Path:
    """The dataset's images as JPEGs (a 4:2:0 file each; EXIF-turned ones rotated), odd files as they
    are: batches of nothing but JPEGs are unpacked by whole columns, the others sample by sample."""
    from PIL import Image
    for path in sorted(root.rglob("*")):
        if path.is_file():
            target = out / path.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            if path.suffix == ".png":
                Image.open(path).convert("RGB").save(target.with_suffix(".JPEG"), quality=quality)
            else:
                target.write_bytes(path.read_bytes())
    return out


def _config(root, processes: int, **sections) -> dict:
    """Screening off: the feed itself meets the odd files, as it does a file changed since screening."""
    return base_config(root, **{"backend": "dali", "dataset": {"screen": False},
                                "dali": {"feed_processes": processes}, "train": TRAIN, **sections})


def _epochs(config: dict, split: str, epochs: int = 2) -> tuple[list, list, list]:
    with build_loader(config, split) as loader:
        batches = []
        for number in range(epochs):
            loader.set_epoch(number)
            batches += [(images.clone(), labels.clone()) for images, labels in loader]
        return batches, loader.bad_samples, loader.describe()["feed_processes"]


def _same(batches, reference) -> None:
    assert len(batches) == len(reference)
    for (images, labels), (expected_images, expected_labels) in zip(batches, reference):
        assert torch.equal(labels, expected_labels)
        assert torch.equal(images, expected_images)


@pytest.mark.parametrize("source", ["folder", "jpeg folder", "shards"])
def test_worker_processes_feed_the_batches_the_driver_thread_feeds(odd_root, tmp_path, source):
    """Train (rand-m9, a size per batch, refilled slots) and val (a partial batch, files left out),
    two epochs: the same pixels, labels and left-out files, bit for bit, from folders (PNGs, JPEGs:
    their plain batches unpacked by whole columns) and tar shards."""
    sections = {}
    if source == "jpeg folder":
        odd_root = as_jpeg(odd_root, tmp_path / "jpeg")
    if source == "shards":
        shards = {split: [str(p) for p in pack_folder_split(odd_root / split, tmp_path / split, split, 7)]
                  for split in ("train", "val")}
        sections = {"dataset": {"format": "webdataset", "screen": False},
                    "train": {**TRAIN, "shards": shards["train"]}, "val": {"batch_size": 4, "shards": shards["val"]}}
    for split in ("train", "val"):
        reference, bad, _ = _epochs({**_config(odd_root, 0), **sections}, split)
        batches, bad_here, processes = _epochs({**_config(odd_root, 2), **sections}, split)
        assert processes == 2
        _same(batches, reference)
        assert sorted(bad_here) == sorted(bad) and len(bad) == 2, bad_here  # the cut JPEG, the random bytes
    assert sum(len(labels) for _, labels in batches) == 2 * (9 + 3)  # val: every decodable sample, twice


def test_the_next_epochs_first_batches_are_read_as_an_epoch_ends_and_kept_only_for_that_epoch(tmp_path):
    """As an epoch's batches run out, the workers read on into the first batches of the epoch after
    it (READS_AHEAD + 1 of them): the next loop starts with them read. They are that epoch's, bit for
    bit what the driver thread's feed gives; a loop of another epoch (set_epoch) or from a resumed
    position drops them and reads its own."""
    from dali_loader.batches_ahead import READS_AHEAD
    root = write_textured_dataset(tmp_path / "d", per_class=4, splits=("train",))
    train = {**TRAIN, "batch_size": 2}

    def run(processes: int) -> tuple[list, list]:
        guesses = []
        with build_loader(_config(root, processes, train=train), "train") as loader:
            batches = [(images.clone(), labels.clone()) for images, labels in loader]  # epoch 0
            if processes:
                guesses.append([planned.tolist() for planned, _ in loader._feed.ahead.upcoming])
                assert guesses[-1] == [planned.tolist() for planned in loader.order.batches(1)[:READS_AHEAD + 1]]
            batches += [(images.clone(), labels.clone()) for images, labels in loader]  # epoch 1, as guessed
            loader.set_epoch(5)  # not the epoch guessed: its first batches are read when it starts
            batches += [(images.clone(), labels.clone()) for images, labels in loader]
            for number, _ in enumerate(loader):  # epoch 6, left after two batches: resumed there
                if number == 1:
                    state = loader.state_dict()
                    break
            loader.load_state_dict(state)
            batches += [(images.clone(), labels.clone()) for images, labels in loader]
        return batches, guesses

    reference, _ = run(0)
    batches, guesses = run(2)
    assert len(reference) == 3 * 6 + 4
    _same(batches, reference)


def _slab_of(array: np.ndarray, feed) -> int | None:
    """The slab an array lies in (its number), or None."""
    for slab in feed.ahead.reads.slabs:
        base = slab.array.ctypes.data
        if base <= array.ctypes.data < base + slab.capacity:
            return slab.number
    return None


@pytest.mark.parametrize("processes", [0, 2])
def test_no_batch_is_read_into_memory_a_batch_in_flight_holds_even_after_an_empty_one(tmp_path, processes):
    """DALI reads the feed's arrays in place until a batch's outputs are out, `prefetch_factor` calls
    later. A planned batch whose every file is refused feeds nothing: the next one takes its call's
    memory, never that of a batch still in flight (read here: the arena of the call; by the worker
    processes: a slab). Each call gives each planned file's bytes exactly, from the workers' shared
    memory where they read it."""
    root = write_textured_dataset(tmp_path / "d", per_class=4, splits=("val",))
    second = sorted((root / "val").iterdir())[1]
    for name in ("aa.JPEG", "ab.JPEG"):  # the second class's first two files: batch 2 of 2 each, refused
        next(odd for odd in ODD_FILES if odd.name == "random_bytes.jpg").write(second / name)
    config = base_config(root, backend="dali", dataset={"screen": False}, dali={"feed_processes": processes},
                         val={"batch_size": 2}, workers={"prefetch_factor": 1})
    with build_loader(config, "val") as loader:
        feed = loader._feed
        planned = list(loader.order.batches(0))
        assert all(loader.index.path(int(sample)).endswith(("aa.JPEG", "ab.JPEG")) for sample in planned[2][:, 0])
        feed.start(planned)
        fed, spans, previous = [], [], []
        while True:
            try:
                data = feed()
            except StopIteration:
                break
            now = [(array.ctypes.data, array.ctypes.data + array.nbytes) for array in data[0]]
            in_flight = spans[-1] if spans else []  # the batch fed before: DALI may still read it
            assert not any(a < d and c < b for a, b in now for c, d in in_flight), len(fed)
            for _, sent in feed.ahead.ahead:  # the workers' reads ahead, done: none of them wrote over it either
                for worker, number in sent.pending.shares if sent is not None else ():
                    worker.arrived(number)
            if fed:  # nor written into while this batch was read, by this thread or by a worker ahead
                assert [bytes(array) for array in previous] == fed[-1], len(fed)
            spans.append(now)
            fed.append([bytes(array) for array in data[0]])
            previous = data[0]
            if processes:
                assert all(_slab_of(array, feed) is not None for array in data[0])
        assert len(fed) == len(planned) - 1  # the empty batch fed nothing
        expected = [open(loader.index.path(int(sample)), "rb").read()
                    for batch in planned for sample in batch[:, 0] if int(sample) not in loader._reader.bad]
        assert [data for batch in fed for data in batch] == expected and len(loader._reader.bad) == 2


def test_a_jpeg_changed_since_screening_is_named_and_cropped_for_its_size_now(tmp_path, caplog):
    """Device: CPU. A batch of JPEGs is unpacked by whole columns: the sizes are still those of the bytes
    fed (an EXIF-turned one's upright), each file changed since screening is named once, and the crops
    are those of the driver thread's feed that never screened, bit for bit."""
    from PIL import Image
    root = as_jpeg(write_textured_dataset(tmp_path / "png", per_class=4, splits=("train",)), tmp_path / "d")
    for folder in sorted((root / "train").iterdir()):
        next(odd for odd in ODD_FILES if odd.name == "exif_rotated.JPEG").write(folder / "exif_rotated.JPEG")
    config = base_config(root, backend="dali", train={"batch_size": 5, "transform": {"size": 16}},
                         dali={"feed_processes": 2})  # 15 samples: all in the epoch
    with caplog.at_level(logging.WARNING, logger="fastloader"), build_loader(config) as loader:  # screened now
        changed = sorted((root / "train").rglob("t_*.JPEG"))[::3]
        for path in changed:
            Image.open(path).resize((9, 7)).save(path, quality=90)
        batches = [(images.clone(), labels.clone()) for images, labels in loader]
        assert loader._feed.ahead.reads.failure is None
    named = [line for line in caplog.text.splitlines() if "changed since it was screened" in line]
    assert sorted(line.split()[2] for line in named) == sorted(map(str, changed))  # each once
    assert all("it is 7x9 (height x width) now" in line for line in named)
    with build_loader({**config, "dataset": {**config["dataset"], "screen": False}, "dali": {}}) as fresh:
        _same(batches, [(images.clone(), labels.clone()) for images, labels in fresh])


def test_a_killed_worker_is_logged_and_the_epoch_goes_on_read_by_the_driver_thread(tmp_path, caplog):
    root = write_textured_dataset(tmp_path / "d", per_class=8, splits=("train",))
    sections = {"train": {**TRAIN, "batch_size": 1}, "workers": {"prefetch_factor": 1}}
    reference, _, _ = _epochs(_config(root, 0, **sections), "train", epochs=1)
    with caplog.at_level(logging.WARNING, logger="fastloader"), build_loader(_config(root, 2, **sections)) as loader:
        batches = iter(loader)
        got = [next(batches)]  # the driver reads a few batches ahead, then waits for the trainer
        killed = loader._feed.ahead.reads.pids[0]
        os.kill(killed, signal.SIGKILL)
        got += list(batches)
        assert len(got) == 24
        assert loader.describe()["feed_processes"] == 0
    _same([(images, labels) for images, labels in got], reference)
    assert (f"the DALI feed's worker processes stopped reading (the feed's worker process {killed} ended (killed "
            f"by SIGKILL))") in caplog.text
    assert "reads and checks the samples on the driver thread from here (dali.feed_processes)" in caplog.text


def test_a_stopped_worker_is_named_when_no_batch_comes_and_close_ends_the_workers(odd_root):
    """A worker that never answers (stopped, or stuck in a read of a hung file system) stops the loader
    after workers.timeout with an error naming the worker processes; closing kills them, stopped or not.
    A batch a sample: the epoch's batches after the first few are sent to the workers only after they
    are stopped (whatever they read ahead before that)."""
    config = _config(odd_root, 2, workers={"timeout": 2, "prefetch_factor": 1}, val={"batch_size": 1})
    with build_loader(config, "val") as loader:
        batches = iter(loader)
        next(batches)
        pids = loader._feed.ahead.reads.pids
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=r"\(workers.timeout 2 s\): the loader has been waiting for the feed's "
                                               r"worker processes \[\d+, \d+\] to read a batch from \S+ for \d+ s"):
            list(batches)
        assert time.monotonic() - started < 30
    assert processes_end(pids)



def _left_early_and_resumed(config: dict) -> list:
    """A loop left after one batch, the next loop whole, a third left after two batches and its
    state resumed by a new loader: every batch delivered."""
    with build_loader(config) as loader:
        delivered = [next(iter(loader))]
        delivered += list(loader)
        batches = iter(loader)
        delivered += [next(batches), next(batches)]
        state = loader.state_dict()
    with build_loader(config) as resumed:
        resumed.load_state_dict(state)
        return delivered + list(resumed)


TRAINER = """
import json, sys, time
from fastloader import build_loader
loader = build_loader(json.loads(sys.argv[1]), "val")
next(iter(loader))
print(json.dumps(loader._feed.ahead.reads.pids), flush=True)
time.sleep(600)
"""


def test_the_workers_die_with_a_trainer_killed_by_sigkill(odd_root, tmp_path):
    """A trainer killed outright (the OOM killer, a scheduler's SIGKILL) runs no cleanup: its feed's
    worker processes notice its end and exit, rather than live on as orphans."""
    config = _config(odd_root, 2, val={"batch_size": 2})
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, json.dumps(config)], stdout=subprocess.PIPE,
                               text=True, env=cpu_only_env(tmp_path / "cache"))
    try:
        pids = json.loads(trainer.stdout.readline())
        assert len(pids) == 2 and not processes_end(pids, within=0.5)
        trainer.kill()
        trainer.wait(timeout=30)
        assert processes_end(pids)
    finally:
        trainer.kill()


def test_a_loop_left_early_and_a_resumed_epoch_give_the_planned_batches(odd_root):
    """The batches sent to the workers ahead of a `break` are dropped, not fed into the next loop; a
    run resumed from a saved state goes on where it stopped: the driver thread's batches, bit for bit."""
    _same(_left_early_and_resumed(_config(odd_root, 2)), _left_early_and_resumed(_config(odd_root, 0)))


def test_after_a_decode_failure_the_workers_read_into_new_slabs(tmp_path):
    """A file that passes the checks and that DALI cannot decode (a lossless JPEG) fails the pipeline,
    which is rebuilt without it: the batches the workers had read ahead are read again, into new
    slabs, never into the memory the failed pipeline was given; the epoch is every other sample."""
    root = write_textured_dataset(tmp_path / "d", per_class=4, splits=("val",))
    config = base_config(root, backend="dali", val={"batch_size": 2}, dali={"feed_processes": 2})
    with build_loader(config, "val") as loader:
        broken = int(loader.order.batches(0)[2][0, 0])
        next(odd for odd in ODD_FILES if odd.name == "lossless.JPEG").write(Path(loader.index.path(broken)))
        given = list(loader._feed.ahead.reads.slabs)
        labels = [label for _, batch in loader for label in batch.tolist()]
        assert labels == [loader.index.label(i) for i in range(len(loader.index)) if i != broken]
        assert broken in loader._reader.bad and loader.describe()["feed_processes"] == 2
        assert not {slab.number for slab in given} & {slab.number for slab in loader._feed.ahead.reads.slabs}


def test_feed_processes_is_checked_and_auto_reads_on_the_driver_thread_in_the_cpu_flavour(textured_root):
    with pytest.raises(ConfigError, match=r"dali.feed_processes.*'auto' or an integer in \[0, 32\]"):
        build_loader(base_config(textured_root, backend="dali", dali={"feed_processes": -1}), "val")
    with build_loader(base_config(textured_root, backend="dali"), "val") as loader:
        assert loader.describe()["feed_processes"] == 0 and loader._feed.ahead.reads is None
