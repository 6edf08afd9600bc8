"""A worker that dies and a Ctrl-C: both end promptly with a clear message, never a hang, and leave
no process behind. Real workers, real signals."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, base_config, write_solid_dataset

from fastloader import build_loader


def children(pid: int) -> set[int]:
    """The child processes of `pid`, from /proc."""
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(child) for child in (task / "children").read_text().split()}
    return found


def alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


@pytest.mark.parametrize("signal_number", [signal.SIGKILL, signal.SIGSEGV], ids=["killed", "segfault"])
def test_a_worker_that_dies_is_reported_within_seconds_and_the_next_loop_recovers(tmp_path, signal_number):
    root = write_solid_dataset(tmp_path / "data", per_class=40, splits=("val",))
    before = children(os.getpid())
    loader = build_loader(base_config(root, workers={"num_workers": 2}, val={"batch_size": 2}), "val")
    batches = iter(loader)
    next(batches)
    workers = children(os.getpid()) - before
    assert len(workers) == 2
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid") as failure:
        os.kill(min(workers), signal_number)
        for _ in batches:
            time.sleep(0.01)
    assert time.monotonic() - started < 30
    # torch's SIGCHLD handler may raise its own error wherever the main thread is; when the loader
    # notices first, it adds what to do
    message = str(failure.value)
    assert re.search(rf"DataLoader worker \(pid(\(s\))? {min(workers)}\) (is killed by signal: "
                     rf"{signal.strsignal(signal_number)}|exited unexpectedly)", message), message
    if message.startswith("a decoding worker"):
        assert "workers.num_workers" in message and "fastloader check CONFIG --deep" in message
    assert sum(len(labels) for _, labels in loader) == 120  # new workers read the next epoch whole


LOOP_FOREVER = """
import json, os, sys, time
from pathlib import Path
from fastloader import build_loader
loader = build_loader(json.loads(sys.argv[1]), "train")
batches = iter(loader)
next(batches)
pids = [int(c) for t in Path(f"/proc/{os.getpid()}/task").iterdir() for c in (t / "children").read_text().split()]
print(json.dumps(pids), flush=True)
while True:
    for images, labels in loader:
        time.sleep(0.01)
"""


@pytest.mark.parametrize("backend", ["torch", "dali"])
def test_ctrl_c_during_iteration_exits_promptly_and_leaves_no_process(tmp_path, backend):
    root = write_solid_dataset(tmp_path / "data", per_class=20, splits=("train",))
    config = base_config(root, backend=backend, workers={"num_workers": 2})
    proc = subprocess.Popen([sys.executable, "-c", LOOP_FOREVER, json.dumps(config)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        workers = json.loads(proc.stdout.readline() or "null")
        assert workers is not None, proc.stderr.read()
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
        started = time.monotonic()
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert time.monotonic() - started < 15
    assert proc.returncode != 0 and "KeyboardInterrupt" in stderr
    if backend == "torch":
        assert len(workers) == 2
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in workers if alive(pid)]


@pytest.mark.parametrize("backend", ["torch", "dali"])
def test_a_dropped_loader_stops_its_workers_at_once(tmp_path, backend):
    """No reference cycle keeps a loader alive until the garbage collector runs (where stopping
    workers takes seconds, inside whatever the program does then)."""
    import weakref
    root = write_solid_dataset(tmp_path / "data", per_class=4, splits=("train",))
    before = children(os.getpid())
    loader = build_loader(base_config(root, backend=backend, workers={"num_workers": 2}, train={"batch_size": 2}))
    for _ in loader:  # the torch workers go on with the next epoch's first batches
        pass
    workers = children(os.getpid()) - before
    assert len(workers) == (2 if backend == "torch" else 0)
    gone = weakref.ref(loader)
    del loader
    assert gone() is None
    assert not [pid for pid in workers if alive(pid)]
