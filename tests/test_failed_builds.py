"""What a failed build and a closed loader leave behind: nothing. A build that fails lets go of the
user's source (the process's table of opened sources), and a DALI loader with feed processes
(dali.feed_processes) gives back its worker processes, pipes and shared memory when its build
fails or when it is closed, not when the loader object is collected (issue 68.11, 68.12, 68.14).
Descriptors counted in /proc/self/fd, the feed's memfds by their link ('memfd:fastloader-feed').
Device: CPU (torch, and DALI's CPU flavour; the feed is the same on a GPU)."""
from __future__ import annotations

import gc
import inspect
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
from conftest import base_config, write_textured_dataset

from fastloader import build_loader
from fastloader.errors import CacheError, HookError
from fastloader.sources import protocol

HAS_DALI = __import__("importlib").util.find_spec("nvidia.dali") is not None


class ListSource:
    """A user's source over image files: what build_loader(source=...) is given."""

    def __init__(self, root: Path):
        self.paths = sorted(p for p in (root / "train").rglob("*.png"))
        self.name = f"list of {len(self.paths)}"

    def samples(self):
        classes = sorted({p.parent.name for p in self.paths})
        names = [f"{p.parent.name}/{p.name}" for p in self.paths]
        return names, [classes.index(p.parent.name) for p in self.paths], classes

    def read(self, item):
        return self.paths[item].read_bytes()

    def identity(self):
        return self.name


def _held(source) -> int:
    """How many entries of this process's source table hold `source`."""
    return sum(held is source for held in list(protocol._opened.values()))


def test_a_build_that_fails_after_opening_the_source_lets_go_of_it(tmp_path):
    root = write_textured_dataset(tmp_path / "d", per_class=2)
    source = ListSource(root)
    config = base_config(root, dataset={"root": str(root), "cache": str(tmp_path / "no-such-cache")})
    for _ in range(3):
        with pytest.raises(CacheError, match="no-such-cache"):
            build_loader(config, "train", source=source)
    assert _held(source) == 0
    gone = weakref.ref(source)
    del source
    gc.collect()
    assert gone() is None


def _feed_memfds() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:fastloader-feed")
        except OSError:
            pass
    return count


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def _raises_at_build(images, seeds):
    raise ValueError("this graph function fails when the graph is defined")


@pytest.fixture(scope="module")
def dali_config(tmp_path_factory) -> dict:
    root = write_textured_dataset(tmp_path_factory.mktemp("feed") / "d", per_class=4)
    config = base_config(root, backend="dali", dali={"feed_processes": 2},
                         train={"batch_size": 4, "transform": {"size": 32}})
    with build_loader(config, "train") as warm:  # DALI imported, the forkserver started: the baseline
        assert warm.describe()["feed_processes"] == 2
        sum(len(labels) for _, labels in warm)
    gc.collect()
    return config


@pytest.mark.skipif(not HAS_DALI, reason="NVIDIA DALI is not installed")
@pytest.mark.timeout(180)
def test_a_dali_build_that_fails_gives_back_its_feeds_processes_and_memory_at_once(dali_config):
    before, source = _descriptors(), ListSource(Path(dali_config["dataset"]["root"]))
    others = _feed_memfds()  # another test file's loader, not yet collected, in this pytest process
    failures = []
    for _ in range(3):
        with pytest.raises(HookError) as raised:
            build_loader(dali_config, "train", source=source, graph_hook=_raises_at_build)
        failures.append(raised)  # their tracebacks keep the half-built loaders alive
    assert _feed_memfds() == others
    assert _descriptors() <= before, sorted(os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd"))
    assert _held(source) == 0


@pytest.mark.skipif(not HAS_DALI, reason="NVIDIA DALI is not installed")
@pytest.mark.timeout(180)
def test_closing_a_dali_loader_with_feed_processes_gives_back_its_descriptors_and_memory(dali_config):
    before, others = _descriptors(), _feed_memfds()
    kept = []
    for _ in range(2):
        loader = build_loader(dali_config, "train")
        assert sum(len(labels) for _, labels in loader) == 12
        assert _feed_memfds() > others  # each slab's descriptor, and its mapping's
        pids = loader._feed.ahead.reads.pids
        loader.close()
        kept.append(loader)  # a sweep's list of closed loaders
        assert _feed_memfds() == others
        assert _descriptors() <= before, sorted(os.readlink(f"/proc/self/fd/{fd}")
                                                for fd in os.listdir("/proc/self/fd"))
        assert not any(Path(f"/proc/{pid}").exists() for pid in pids)  # reaped, not zombies


OUT_OF_DESCRIPTORS = """
import gc, json, os, resource, sys
from fastloader import build_loader
config = json.loads(sys.argv[1])
""" + inspect.getsource(_feed_memfds) + """
with build_loader(config, "train") as warm:  # DALI imported, the forkserver started
    sum(len(labels) for _, labels in warm)
gc.collect()
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
opened = len(os.listdir("/proc/self/fd"))
seen = []
for extra in range(4, 64, 3):  # from too few descriptors for the slabs to enough for the workers too
    resource.setrlimit(resource.RLIMIT_NOFILE, (opened + extra, hard))
    try:
        with build_loader(config, "train") as loader:
            processes = loader.describe()["feed_processes"]
    except Exception as error:
        processes = type(error).__name__
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    gc.collect()
    seen.append((processes, _feed_memfds()))
    if processes == 2:
        break
print(json.dumps(seen))
"""


@pytest.mark.skipif(not HAS_DALI, reason="NVIDIA DALI is not installed")
@pytest.mark.timeout(300)
def test_feed_processes_that_cannot_start_give_back_their_slabs(dali_config, tmp_path):
    """Feed processes that cannot start (no descriptor left for their pipes) leave the feed to read
    on the driver thread, with a warning; the slabs made for them go at once, not for the life of
    the process (each failed start kept 5 memfds, 10 descriptors with their mappings). Device: CPU."""
    from conftest import REPO, cpu_only_env

    ran = subprocess.run([sys.executable, "-c", OUT_OF_DESCRIPTORS, json.dumps(dali_config)], capture_output=True,
                         text=True, timeout=280, env=cpu_only_env(tmp_path / "cache", PYTHONPATH=str(REPO)))
    assert ran.returncode == 0, ran.stderr[-3000:]
    seen = json.loads(ran.stdout.strip().splitlines()[-1])
    assert 0 in [processes for processes, _ in seen], seen  # some build fell back to reading on the driver thread
    assert "asked for worker processes, but [Errno 24] Too many open files" in ran.stderr
    assert [memfds for _, memfds in seen] == [0] * len(seen), seen
