"""The DALI backend's driver thread (dali_loader/driver.py), made to fail: every way it can end
reaches the training thread as an error from `next(loader)` within a second or two, never a hang;
errors that are not a bad file's reach it as themselves; closing is safe from any thread and from a
forked child. Device: CPU (DALI's CPU flavour); the GPU flavour's twin is in test_cuda.py."""
from __future__ import annotations

import gc
import queue
import subprocess
import sys
import textwrap
import threading
import time
import types
import weakref

import pytest
import torch

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is installed on Linux x86_64 / aarch64 only")

from conftest import REPO, base_config  # noqa: E402
from oddfiles import ODD_FILES  # noqa: E402

import dali_loader.driver  # noqa: E402
import dali_loader.inputs  # noqa: E402
import dali_loader.loader  # noqa: E402
import dali_loader.probe  # noqa: E402
from fastloader import build_loader  # noqa: E402
from fastloader.device_ops import BatchFinisher  # noqa: E402

pytestmark = pytest.mark.timeout(60)  # a hang fails the test, it does not stall the suite

MIXING = {"mixup": {"mixup_alpha": 0.8, "cutmix_alpha": 1.0}, "batch_size": 4, "transform": {"size": 16}}
"""A train split whose batch finisher (mixup, cutmix, soft targets) runs on the driver thread."""


def dali_config(root, **sections) -> dict:
    return base_config(root, backend="dali", **sections)


def raising(error: BaseException):
    """A BatchFinisher.pixels that raises `error` (on the driver thread, where the finisher runs)."""
    def pixels(self, images, seeds):
        raise error
    return pixels


def failure_of(loader) -> tuple[BaseException, float]:
    """The error a full epoch raises, and how long `next` took to raise it."""
    began = time.monotonic()
    with pytest.raises(BaseException) as failure:
        for _ in loader:
            began = time.monotonic()
    return failure.value, time.monotonic() - began


class FailingQueue(queue.Queue):
    """A queue whose every put fails: the driver can hand over neither a batch nor its own end."""

    def put(self, item, block=True, timeout=None):
        raise RuntimeError("the hand-over queue is broken")


def test_a_driver_that_cannot_hand_anything_over_fails_next_instead_of_hanging(textured_root, monkeypatch):
    monkeypatch.setattr(dali_loader.driver, "queue", types.SimpleNamespace(
        Queue=FailingQueue, Empty=queue.Empty, Full=queue.Full))
    loader = build_loader(dali_config(textured_root), "val")
    error, took = failure_of(loader)
    assert type(error) is RuntimeError and str(error) == "the hand-over queue is broken"
    assert took < 3, took
    with pytest.raises(RuntimeError, match="stopped on RuntimeError: the hand-over queue is broken; build a new"):
        next(iter(loader))


def test_an_error_inside_the_pipelines_run_reaches_next_as_itself(textured_root, monkeypatch):
    """The feed runs inside `pipe.run()` (DALI calls it for each batch): an error of its own is no
    bad file's, and reaches the trainer unchanged."""
    def broken(sizes, sizing):
        raise ValueError("the feed broke")
    loader = build_loader(dali_config(textured_root), "val")
    monkeypatch.setattr(dali_loader.inputs, "centre_boxes", broken)
    error, took = failure_of(loader)
    assert type(error) is ValueError and str(error) == "the feed broke" and took < 3


class Halt(BaseException):
    """Not an Exception: as KeyboardInterrupt or SystemExit, which no `except Exception` stops."""


def test_a_base_exception_in_the_finisher_reaches_next(textured_root, monkeypatch):
    monkeypatch.setattr(BatchFinisher, "pixels", raising(Halt("stop here")))
    loader = build_loader(dali_config(textured_root, train=MIXING), "train")
    error, took = failure_of(loader)
    assert type(error) is Halt and str(error) == "stop here" and took < 3


@pytest.mark.parametrize("error", [
    RuntimeError("CUDA error: an illegal memory access was encountered"),
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")], ids=["cuda-error", "oom"])
def test_a_finisher_error_reaches_next_as_itself_not_as_a_bad_file(textured_root, monkeypatch, error):
    """A RuntimeError from the finisher (or the copy to the GPU) was taken for a bad file: the loader
    probed every file of the batches in flight, found none, and ended with "each of these files
    decodes alone". It now reaches the trainer as it was raised; running out of memory with a note
    on what to lower."""
    probes = []
    monkeypatch.setattr(dali_loader.probe.DecodeProbe, "culprits", lambda *args: probes.append(args) or {})
    monkeypatch.setattr(BatchFinisher, "pixels", raising(error))
    loader = build_loader(dali_config(textured_root, train=MIXING), "train")
    raised, took = failure_of(loader)
    assert raised is error and str(raised) == str(error.args[0]) and took < 3
    assert probes == []
    notes = "\n".join(getattr(raised, "__notes__", []))
    if isinstance(error, torch.cuda.OutOfMemoryError):
        assert "ran out of memory. Lower train.batch_size (now 4) or dali.threads (now 1;" in notes
    else:
        assert notes == ""


def lossless_jpeg_in(folder) -> str:
    """Write a lossless JPEG (SOF3) there: it passes the header check, DALI cannot decode it."""
    odd = next(odd for odd in ODD_FILES if odd.name == "lossless.JPEG")
    odd.write(folder / odd.name)
    return str(folder / odd.name)


def test_a_bad_file_still_goes_through_recovery_with_a_finisher_on(textured_root):
    """Train mode: the probe decodes the suspects' crop regions in batches, as the train graph
    does, finds the file, and the epoch goes on without it, mixed as usual."""
    bad = lossless_jpeg_in(textured_root / "train" / "a_red")
    loader = build_loader(dali_config(textured_root, train={**MIXING, "drop_last": False}), "train")
    batches = list(loader)
    assert sum(len(labels) for _, labels in batches) == 25  # its slot refilled by a substitute: equal batches
    assert all(labels.dtype == torch.float32 and labels.shape[1] == 3 for _, labels in batches)  # mixed
    [(path, reason)] = loader.bad_samples
    assert path == bad and reason.startswith("DALI cannot decode it: "), reason


def test_recovery_frees_the_failed_pipeline_before_the_probe_builds_its_own(textured_root, monkeypatch):
    """On a GPU both hold nvJPEG buffers: the failed pipeline's go first."""
    bad = lossless_jpeg_in(textured_root / "val" / "a_red")
    loader = build_loader(dali_config(textured_root), "val")
    failed = weakref.ref(loader._pipeline.pipe)
    seen = []
    build = dali_loader.probe.DecodeProbe._build
    monkeypatch.setattr(dali_loader.probe.DecodeProbe, "_build", lambda self: seen.append(failed()) or build(self))
    assert sum(len(labels) for _, labels in loader) == 24
    assert seen and all(pipe is None for pipe in seen)
    assert [path for path, _ in loader.bad_samples] == [bad]


def test_close_on_the_driver_thread_does_not_wait_for_itself(textured_root):
    """A finalizer or a callback may close the loader from the driver thread itself: it must not
    wait for that thread to end. The trainer's `next` then says the loader is closed."""
    loader = build_loader(dali_config(textured_root, train={"batch_size": 4, "transform": {"size": 16}}), "train")
    closed_on = []

    def close_here(images, labels, seeds):
        closed_on.append(threading.current_thread().name)
        loader.close()
        return images, labels
    loader.finisher = close_here
    began = time.monotonic()
    with pytest.raises(RuntimeError, match="dali loader for split 'train' is closed"):
        list(loader)
    assert closed_on == ["fastloader-dali-driver"] and time.monotonic() - began < 5


def test_a_loader_collected_on_its_driver_thread_lets_it_end(textured_root):
    """The cycle collector runs finalizers on whichever thread allocates: here the driver's, inside
    the finisher. The loader's finalizer must not wait for that thread; the thread ends and frees
    the pipeline."""
    loader = build_loader(dali_config(textured_root, train={"batch_size": 4, "transform": {"size": 16}}), "train")
    loader.itself = loader  # only the cycle collector frees it
    collected_on = []
    alive = weakref.ref(loader)

    def collect(images, labels, seeds):
        gc.collect()
        if alive() is None and not collected_on:
            collected_on.append(threading.current_thread().name)
        return images, labels
    loader.finisher = collect
    batches = iter(loader)
    next(batches)
    driver, pipe = loader._pipeline.driver, weakref.ref(loader._pipeline.pipe)
    del batches, loader
    deadline = time.monotonic() + 10
    while driver._thread.is_alive() and time.monotonic() < deadline:
        try:  # take its batches as a trainer would, so that it goes on to the next finisher call
            driver.queue.get(timeout=0.1)
        except queue.Empty:
            pass
    assert collected_on == ["fastloader-dali-driver"]
    assert not driver._thread.is_alive()
    assert pipe() is None


FORKED = textwrap.dedent("""
    import gc, os, sys, time
    sys.path.insert(0, "tests")
    from conftest import base_config, write_textured_dataset
    from fastloader import build_loader

    root = write_textured_dataset(__import__("pathlib").Path(sys.argv[1]))
    loader = build_loader(base_config(root, backend="dali", val={"batch_size": 2}), "val")
    batches = iter(loader)
    for how in ("close", "drop"):
        for ending in ("_exit", "exit"):
            next(batches)
            time.sleep(0.3)  # the driver has the next batch ready and waits on the full queue
            child = os.fork()
            if child == 0:
                try:
                    next(batches)
                except RuntimeError as error:
                    print("child:", str(error)[:60], flush=True)
                if how == "close":
                    loader.close()
                else:
                    del batches, loader
                    gc.collect()
                if ending == "_exit":
                    os._exit(0)  # as forked workers end
                sys.exit(0)  # the exit hooks run: ours, and DALI's
            began = time.monotonic()
            while time.monotonic() - began < 15:
                done, status = os.waitpid(child, os.WNOHANG)
                if done:
                    print(how, ending, "exit", os.waitstatus_to_exitcode(status), flush=True)
                    break
                time.sleep(0.02)
            else:
                os.kill(child, 9)
                os.waitpid(child, 0)
                print(how, ending, "hung", flush=True)
    print("parent:", sum(1 for _ in batches), "batches more", flush=True)
""")


def test_a_forked_child_that_closes_or_drops_an_inherited_loader_exits(tmp_path):
    """A process forked while the driver runs has the loader but not its thread: `next` there says
    so at once, and closing or dropping the loader, then exiting as forked workers do (os._exit) or
    through the exit hooks (ours, DALI's), waits for nothing. The parent's loader goes on."""
    done = subprocess.run([sys.executable, "-c", FORKED, str(tmp_path / "data")], cwd=REPO,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    said = "child: this DALI loader was inherited by a forked process, where it"
    assert done.stdout.splitlines() == [
        said, "close _exit exit 0", said, "close exit exit 0", said, "drop _exit exit 0", said, "drop exit exit 0",
        "parent: 8 batches more"], done.stdout + done.stderr[-3000:]


DROPPED_PIPELINE = textwrap.dedent("""
    import gc, os, sys, time
    import numpy as np
    from nvidia.dali import fn, pipeline_def
    import dali_loader.loader  # noqa: F401  (the fork hook)

    @pipeline_def(batch_size=2, num_threads=2, device_id=None, prefetch_queue_depth=2)
    def own():
        return fn.random.uniform(shape=[64, 64])

    gc.disable()  # the dropped cycle stays uncollected in the parent, as between two collections
    pipe = own()
    pipe.build()
    pipe.run()
    cycle = [pipe]
    cycle.append(cycle)
    del pipe, cycle
    child = os.fork()
    if child == 0:  # a DataLoader worker's first garbage collection, then its exit
        gc.collect()
        os._exit(0)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            print("child", "exit", os.waitstatus_to_exitcode(status), flush=True)
            break
        time.sleep(0.05)
    else:
        os.kill(child, 9)
        os.waitpid(child, 0)
        print("child hung", flush=True)
""")


def test_a_forked_child_survives_a_users_own_pipeline_dropped_in_an_uncollected_cycle():
    """Any DALI pipeline of the process, not only the loaders', is held over a fork: a forked child
    that collects an inherited pipeline would wait for executor threads it does not have, or crash
    (a plain DataLoader worker of benchmarks/peers.py died of SIGSEGV, SIGABRT or hung so)."""
    done = subprocess.run([sys.executable, "-c", DROPPED_PIPELINE], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.splitlines() == ["child exit 0"], done.stdout + done.stderr[-3000:]
