"""A worker that dies and a Ctrl-C: both end promptly with a clear message, never a hang, and leave
no process behind. Real workers, real signals."""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, alive, base_config, cpu_only_env, write_solid_dataset

import torch_loader.loader
from fastloader import LoaderError, build_loader


def children(pid: int) -> set[int]:
    """The child processes of `pid`. psutil, not /proc/PID/task/*/children: a thread that ends
    between listing the tasks and reading its file made that helper fail (seen in CI)."""
    import psutil

    return {child.pid for child in psutil.Process(pid).children()}


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
    message = str(failure.value)  # the loader's words, with what to do, never torch's bare error
    assert re.search(rf"DataLoader worker \(pid {min(workers)}\) is killed by signal: "
                     rf"{signal.strsignal(signal_number)}", message), message
    assert message.startswith("a decoding worker of the torch loader for split 'val' died")
    assert "workers.num_workers" in message and "fastloader check CONFIG --deep" in message
    assert sum(len(labels) for _, labels in loader) == 120  # new workers read the next epoch whole


LOOP_FOREVER = """
import faulthandler, signal
faulthandler.register(signal.SIGUSR1, all_threads=True)  # where it hangs, if it does (hung_stacks)
# Ctrl-C as a terminal's foreground process gets it: a suite started in the background (`nohup ... &`)
# passes SIGINT on ignored, and Python then leaves it ignored (a CI run hung so, its loop running on)
signal.signal(signal.SIGINT, signal.default_int_handler)
import json, os, sys, time
import psutil
from fastloader import build_loader
loader = build_loader(json.loads(sys.argv[1]), "train")
batches = iter(loader)
next(batches)
pids = [child.pid for child in psutil.Process().children()]
print(json.dumps(pids), flush=True)
while True:
    for images, labels in loader:
        time.sleep(0.01)
"""


def hung_stacks(proc: subprocess.Popen) -> str:
    """A hung LOOP_FOREVER's threads' stacks (faulthandler, on SIGUSR1) and whatever else it wrote to
    stderr, then the process killed: a hang in CI says where it is."""
    os.kill(proc.pid, signal.SIGUSR1)
    time.sleep(2)
    os.killpg(proc.pid, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=30)
    return stderr[-8000:]


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
        try:
            _, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit 30 s after Ctrl-C; its threads:\n{hung_stacks(proc)}")
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


def test_a_loader_collected_in_a_reference_cycle_stops_its_workers_at_once(tmp_path):
    """Device: CPU. A loader caught in a cycle (an error's traceback holding the frame that held it,
    say) is collected by the cycle collector, which runs the queues' finalizers before the DataLoader
    iterator's: torch's shutdown then sends its workers' stop signal into a closed queue and waits
    5 s for each worker before it kills them, inside whatever the program does when the collector
    runs (10 s here with 2 workers). The outcome is checked, not the machine's speed: every worker
    is gone when the collection returns, and none was terminated by torch's SIGTERM after that wait
    (each either stopped on its own, exit 0, or was killed by the loader's finalizer, SIGKILL)."""
    import gc
    import multiprocessing
    root = write_solid_dataset(tmp_path / "data", per_class=4, splits=("train",))
    before = children(os.getpid())
    loader = build_loader(base_config(root, workers={"num_workers": 2}, train={"batch_size": 2}))
    for _ in loader:  # the workers go on with the next epoch's first batches
        pass
    workers = children(os.getpid()) - before
    processes = [process for process in multiprocessing.active_children() if process.pid in workers]
    assert len(workers) == 2 and len(processes) == 2
    loader.cycle = loader
    del loader
    gc.collect()
    assert not [pid for pid in workers if alive(pid)]
    assert sorted(process.exitcode for process in processes) in ([0, 0], [-signal.SIGKILL, -signal.SIGKILL],
                                                                  [-signal.SIGKILL, 0])


DROP_IN_A_FORK = """
import gc, json, os, sys, time
from fastloader import build_loader
loader = build_loader(json.loads(sys.argv[1]), "val")
next(iter(loader))  # its driver thread runs the pipeline a batch ahead
pipeline = loader._pipeline.pipe
del loader  # closed: the pipeline's last reference is ours
pid = os.fork()  # as a torch DataLoader worker forks
if pid == 0:
    del pipeline
    gc.collect()
    os._exit(0)
deadline = time.monotonic() + 20
while not os.waitpid(pid, os.WNOHANG)[0]:
    if time.monotonic() > deadline:
        os.kill(pid, 9)
        sys.exit("the forked child hung")
    time.sleep(0.05)
print("the child exited")
"""


def test_a_process_forked_beside_a_dali_pipeline_never_hangs_on_it(tmp_path):
    """Device: CPU (DALI's CPU flavour). A forked child that drops its copy of a DALI pipeline would
    wait forever in its destructor for executor threads that did not come along (a torch worker
    forked while a DALI loader lives, then collecting garbage); the child keeps it instead."""
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is installed on Linux x86_64 / aarch64 only")
    root = write_solid_dataset(tmp_path / "data", per_class=4, splits=("val",))
    config = base_config(root, backend="dali")
    result = subprocess.run([sys.executable, "-c", DROP_IN_A_FORK, json.dumps(config)], cwd=REPO,
                            capture_output=True, text=True, timeout=90)
    assert result.returncode == 0 and "the child exited" in result.stdout, result.stderr[-2000:]


def _worker_pids(before: set[int]) -> list[int]:
    return sorted(children(os.getpid()) - before)


@pytest.mark.timeout(90)
def test_a_stopped_worker_is_named_within_workers_timeout_and_the_next_loop_recovers(tmp_path):
    """Torch backend, CPU. A worker stopped with SIGSTOP never answers and is alive: the loader
    waits workers.timeout for a batch, then names the worker, its state and what to do."""
    root = write_solid_dataset(tmp_path / "data", per_class=40, splits=("val",))
    before = children(os.getpid())
    config = base_config(root, workers={"num_workers": 2, "timeout": 2}, val={"batch_size": 2})
    loader = build_loader(config, "val")
    batches = iter(loader)
    next(batches)
    stopped = min(_worker_pids(before))
    os.kill(stopped, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=rf"worker \(pid {stopped}\), which is stopped") as failure:
            for _ in batches:
                pass
        waited = time.monotonic() - started
        assert 2 <= waited < 20, waited
        message = str(failure.value)
        assert "split 'val'" in message and "SIGCONT" in message and "workers.timeout" in message, message
        deadline = time.monotonic() + 10
        while alive(stopped) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(stopped)  # not left behind, stopped for ever
        assert sum(len(labels) for _, labels in loader) == 120  # new workers read the next epoch whole
    finally:
        if alive(stopped):
            os.kill(stopped, signal.SIGKILL)
        loader.close()


SLOW_HOOK = """
import os, time

def slow(image, generator):
    time.sleep(float(os.environ["SLOW_HOOK_S"]))  # a decode, a hook or a file system this slow
    return image
"""


@pytest.mark.timeout(90)
def test_a_new_loop_after_a_break_waits_for_a_slow_worker_instead_of_killing_it(tmp_path, monkeypatch, caplog):
    """Torch backend, CPU. A sample hook that sleeps makes each batch take 1.2 s, more than the wait
    the new loop gave the last one's producer (POLL_S, 0.5 s here instead of 5): that loop killed the
    workers and started new ones, with nothing logged. workers.timeout is what marks a batch stuck."""
    (tmp_path / "slow_hook.py").write_text(SLOW_HOOK)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SLOW_HOOK_S", "0.6")
    monkeypatch.setattr(torch_loader.loader, "POLL_S", 0.5)
    root = write_solid_dataset(tmp_path / "data", per_class=4, splits=("val",))
    before = children(os.getpid())
    config = base_config(root, workers={"num_workers": 1, "timeout": 30},
                         val={"batch_size": 2, "transform": {"size": 32, "sample_hook": "slow_hook:slow"}})
    with build_loader(config, "val") as loader, caplog.at_level(logging.WARNING, logger="fastloader"):
        for _ in loader:
            break  # the worker is decoding the next batch
        workers = _worker_pids(before)
        assert len(workers) == 1
        loader.set_epoch(0)
        images, labels = next(iter(loader))
        assert labels.tolist() == loader.index.labels[loader.order.batches(0)[0][:, 0]].tolist()
        assert _worker_pids(before) == workers  # the same worker, alive
    assert "fastloader" not in caplog.text, caplog.text


GREEN_HANGS = """
import time

def green_hangs(image, generator):
    if image[1].float().mean() > image[0].float().mean() + 50:  # b_green (20, 180, 60)
        time.sleep(30)
    return image
"""


@pytest.mark.timeout(90)
def test_a_batch_stuck_past_workers_timeout_after_a_break_is_logged_when_the_new_loop_starts(tmp_path, monkeypatch,
                                                                                              caplog):
    """Torch backend, CPU. After a `break`, the left loop's next batch has a hook that hangs: its
    producer, or the new loop's start dropping it, waits workers.timeout, which names and kills the
    worker; as no loop wants that batch, the error is logged (it was lost, or raised by the new
    loop), and the new loop reads from new workers."""
    (tmp_path / "green_hook.py").write_text(GREEN_HANGS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(torch_loader.loader, "POLL_S", 0.5)
    root = write_solid_dataset(tmp_path / "data", per_class=2, splits=("val",))
    config = base_config(root, workers={"num_workers": 1, "timeout": 1},
                         val={"batch_size": 2, "transform": {"size": 32, "sample_hook": "green_hook:green_hangs"}})
    with build_loader(config, "val") as loader, caplog.at_level(logging.WARNING, logger="fastloader"):
        assert [b[:, 0].tolist() for b in loader.order.batches(0)] == [[0, 1], [2, 3], [4, 5]]  # red, green, blue
        for _ in loader:
            break  # the producer waits for the green batch
        loader.set_epoch(0)
        _, labels = next(iter(loader))
        assert labels.tolist() == [0, 0]
    assert re.search(r"WARNING .*the torch loader for split 'val' waited \d s for a batch from its decoding worker "
                     r"\(pid \d+\), which is alive but silent.*The workers run your val\.transform\.sample_hook",
                     caplog.text), caplog.text


@pytest.mark.timeout(90)
def test_a_worker_killed_while_the_trainer_is_in_its_own_code_is_reported_by_the_loader_with_its_hint(tmp_path):
    """Torch backend, CPU. The trainer's own code (a model step: here a sleep) is never interrupted
    by a worker's death; the next batch it asks for raises the loader's error, which says what to do."""
    root = write_solid_dataset(tmp_path / "data", per_class=40, splits=("val",))
    before = children(os.getpid())
    loader = build_loader(base_config(root, workers={"num_workers": 2}, val={"batch_size": 2}), "val")
    batches = iter(loader)
    next(batches)
    killed = min(_worker_pids(before))
    os.kill(killed, signal.SIGKILL)
    time.sleep(1.5)  # the trainer's step: torch's own SIGCHLD handler raised its bare error in here
    with pytest.raises(LoaderError, match=r"a decoding worker of the torch loader for split 'val' died") as failure:
        for _ in batches:
            time.sleep(0.01)
    message = str(failure.value)
    assert f"(pid {killed}) is killed by signal: Killed" in message and "workers.num_workers" in message, message
    assert sum(len(labels) for _, labels in loader) == 120
    loader.close()


@pytest.mark.timeout(90)
def test_the_workers_of_a_trainer_killed_with_sigkill_die_at_once(tmp_path):
    """Torch backend, CPU. The kernel kills each DataLoader worker when its trainer dies
    (PR_SET_PDEATHSIG), where torch's own watchdog takes up to 5 s."""
    root = write_solid_dataset(tmp_path / "data", per_class=20, splits=("train",))
    config = base_config(root, workers={"num_workers": 2})
    proc = subprocess.Popen([sys.executable, "-c", LOOP_FOREVER, json.dumps(config)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        workers = json.loads(proc.stdout.readline() or "null")
        assert workers is not None and len(workers) == 2, proc.stderr.read()
        proc.kill()
        proc.wait(timeout=10)
        killed = time.monotonic()
        while any(alive(pid) for pid in workers) and time.monotonic() < killed + 10:
            time.sleep(0.02)
        assert time.monotonic() - killed < 1.0, "the workers outlived their trainer"
    finally:
        if proc.poll() is None:
            proc.kill()


SCREEN_FROM_A_SERVER = """
import json, sys, time
import psutil
from fastloader.decoding.screen import screen_files
results = screen_files([sys.argv[1]] * 100000, workers=2, chunk=1, fork=False)  # as screening a large split does
next(results)
print(json.dumps([child.pid for child in psutil.Process().children(recursive=True)]), flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(90)
def test_the_screening_processes_of_a_process_killed_with_sigkill_die_with_it(tmp_path):
    """Large splits are screened in processes started from a forkserver (as `check` does). Their
    parent is the server, which lives as long as any of them: each follows the process that asked
    for it instead, and with them gone the server and multiprocessing's resource tracker end too."""
    import psutil
    image = write_solid_dataset(tmp_path / "data", per_class=1, splits=("train",)) / "train" / "a_red" / "img_00.png"
    proc = subprocess.Popen([sys.executable, "-c", SCREEN_FROM_A_SERVER, str(image)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        processes = [psutil.Process(pid) for pid in json.loads(proc.stdout.readline() or "null") or []]
        assert len(processes) >= 3, proc.stderr.read()  # the server and its two workers, the resource tracker
        proc.kill()
        proc.wait(timeout=10)
        _, alive = psutil.wait_procs(processes, timeout=3)
        left = [(process.pid, process.cmdline()[-1][:60]) for process in alive]
        for process in alive:
            process.kill()
        assert left == [], "processes outlived the one that started them"
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.timeout(90)
def test_a_worker_killed_between_loops_is_logged_with_its_hint_and_replaced(tmp_path, caplog):
    """Torch backend, CPU. Persistent workers decode the next epoch's first batches between loops;
    one killed then is named when the next loop starts, which reads its epoch whole."""
    root = write_solid_dataset(tmp_path / "data", per_class=8, splits=("val",))
    before = children(os.getpid())
    with build_loader(base_config(root, workers={"num_workers": 2}, val={"batch_size": 2}), "val") as loader:
        assert sum(len(labels) for _, labels in loader) == 24
        killed = min(_worker_pids(before))
        os.kill(killed, signal.SIGKILL)
        time.sleep(0.5)
        with caplog.at_level(logging.WARNING, logger="fastloader"):
            assert sum(len(labels) for _, labels in loader) == 24
    assert f"DataLoader worker (pid {killed}) is killed by signal: Killed" in caplog.text, caplog.text
    assert "workers.num_workers" in caplog.text and "starting new workers" in caplog.text


def _hold_and_die(event) -> None:
    """In a forked child: take the lock of the workers' shared done event, and die holding it, as a
    worker killed inside `Event.is_set()` does."""
    event._cond.acquire()
    os._exit(0)


@pytest.mark.timeout(60)
def test_a_worker_killed_holding_the_workers_shared_lock_does_not_hang_the_next_loop(tmp_path, caplog):
    """Torch backend, CPU. Workers poll a done event whose lock they share; one killed while it
    holds that lock leaves it taken for ever. torch's shutdown sets the event first (it counts on its
    SIGCHLD handler, which this loader's workers are taken out of), so it would wait for ever: the
    next loop names the dead worker and starts new ones instead, and reads its epoch whole."""
    import multiprocessing
    root = write_solid_dataset(tmp_path / "data", per_class=8, splits=("val",))
    before = children(os.getpid())
    with build_loader(base_config(root, workers={"num_workers": 2}, val={"batch_size": 2}), "val") as loader:
        assert sum(len(labels) for _, labels in loader) == 24
        holder = multiprocessing.get_context("fork").Process(target=_hold_and_die,
                                                             args=(loader._live._workers_done_event,))
        holder.start()
        holder.join()
        killed = min(_worker_pids(before))  # the holder is reaped: not a child any more
        os.kill(killed, signal.SIGKILL)
        time.sleep(0.5)
        with caplog.at_level(logging.WARNING, logger="fastloader"):
            assert sum(len(labels) for _, labels in loader) == 24
    assert f"DataLoader worker (pid {killed}) is killed by signal: Killed" in caplog.text, caplog.text


FREED_ON_RETURN = """
import gc, json, sys, weakref
from fastloader import build_loader
refs = []

def one_epoch():
    loader = build_loader(json.loads(sys.argv[1]), "train")
    refs.append(weakref.ref(loader))
    for _ in loader:
        pass

gc.disable()
one_epoch()
print("freed" if refs[0]() is None else "alive")
"""


@pytest.mark.parametrize("backend", ["torch", "dali"])
def test_a_loader_is_freed_when_the_function_that_used_it_returns(tmp_path, backend):
    """In a fresh process (the backend's first import), from a config as config_to_dict writes it
    (nulls in `str | None` keys): two kinds of cyclic garbage held the frames that built the loader,
    and through them the caller's frame and its loader, which then lived on until the garbage
    collector ran and stopped its workers in the middle of whatever the program did (two of torch's
    5-s joins): each refused option of a key (its traceback held the loading frames), and the
    backend's first import (torch's and DALI's modules leave frames in cycles). Freed on return,
    with no collection."""
    root = write_solid_dataset(tmp_path / "data", per_class=4, splits=("train",))
    config = base_config(root, backend=backend, workers={"num_workers": 2},
                         train={"batch_size": 2, "block_size": None, "weights": None, "file_list": None})
    done = subprocess.run([sys.executable, "-c", FREED_ON_RETURN, json.dumps(config)], capture_output=True, text=True,
                          env=cpu_only_env(tmp_path / "cache"), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "freed"


LIMITED = """
import json, sys
sys.path.insert(0, {tests!r})
from conftest import base_config, write_solid_dataset
from pathlib import Path
from fastloader import build_loader
from fastloader.errors import ConfigError
root = write_solid_dataset(Path({root!r}))
{squeeze}
try:
    build_loader(base_config(root, workers={{"num_workers": 2}}), "train")
    print(json.dumps({{"error": None}}))
except ConfigError as error:
    print(json.dumps({{"error": str(error)}}))
"""


def run_limited(tmp_path, squeeze: str, wrapper: list[str] | None = None) -> tuple[dict, str]:
    script = LIMITED.format(tests=str(REPO / "tests"), root=str(tmp_path / "data"), squeeze=squeeze)
    result = subprocess.run([*(wrapper or []), sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, env=cpu_only_env(tmp_path / "cache"))
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def test_a_full_dev_shm_is_named_with_its_size_and_the_fixes(tmp_path):
    """A container's 64 MB /dev/shm filled by another process: the torch backend failed to build with
    a bare 'OSError: [Errno 28] No space left on device' from a multiprocessing semaphore (and torch's
    half-built iterator printed tracebacks). A real tmpfs of 64 KiB mounted over /dev/shm, filled."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to mount a small tmpfs over /dev/shm")
    fill = ("with open('/dev/shm/filler', 'wb', buffering=0) as f:\n    try:\n        while True: "
            "f.write(b'x' * 4096)\n    except OSError: pass")
    script = LIMITED.format(tests=str(REPO / "tests"), root=str(tmp_path / "data"), squeeze=fill)
    result = subprocess.run(["unshare", "--mount", "sh", "-c", 'mount -t tmpfs -o size=64k tmpfs /dev/shm && '
                             'exec "$0" -c "$1"', sys.executable, script], capture_output=True, text=True,
                            timeout=120, env=cpu_only_env(tmp_path / "cache"))
    assert result.returncode == 0, result.stderr[-2000:]
    error = json.loads(result.stdout.strip().splitlines()[-1])["error"]
    assert error.startswith("the torch loader for split 'train' cannot start its workers: /dev/shm is full (0 B "
                            "free of 64.0 KiB)"), error
    assert "--shm-size" in error and "workers.num_workers" in error and "backend: dali" in error
    assert "Traceback" not in result.stderr, result.stderr[-2000:]


def test_a_descriptor_limit_too_low_for_the_workers_is_named_with_the_fixes(tmp_path):
    """At a limit of 12 open files: a bare 'Too many open files'."""
    squeeze = "import resource, torch, numpy, PIL.Image\nresource.setrlimit(resource.RLIMIT_NOFILE, (12, 12))"
    outcome, stderr = run_limited(tmp_path, squeeze)
    assert outcome["error"].startswith("the torch loader for split 'train' cannot start its workers: this process "
                                       "may open 12 files at once (`ulimit -n`"), outcome
    assert "ulimit -n 65536" in outcome["error"] and "Traceback" not in stderr, stderr[-2000:]


DROPPED_CODE = ("__del__", "_free")
"""Names of code that once ran where the trainer drops a batch or a loop (a finalizer, `__del__`)."""


def python_calls(action) -> list[str]:
    """The Python functions (file:name) called while `action()` runs on this thread, in order."""
    calls = []

    def profile(frame, event, arg):
        if event == "call":
            calls.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}")
    sys.setprofile(profile)
    try:
        action()
    finally:
        sys.setprofile(None)
    return calls


@pytest.mark.parametrize("backend, views", [("torch", False), ("torch", True), ("dali", True)],
                         ids=["torch", "torch-views", "dali-views"])
def test_the_trainer_dropping_a_batch_or_a_loop_runs_no_python_code_of_ours(tmp_path, backend, views):
    """Device: CPU. A Ctrl-C that lands in code run from a deallocation (a weakref finalizer, a
    `__del__`) is lost: Python prints "Exception ignored" and the trainer goes on. Seen under load:
    the torch Ctrl-C test's process looped for ever after its workers died, the KeyboardInterrupt
    swallowed by the finalizer that freed a batch's buffer. The trainer drops a batch every step and
    a loop every epoch, so neither may run Python code: buffers are swept as the next batch arrives
    (BatchPool, HostBuffers), and a dropped loop stops its producer through a C callback."""
    if backend == "dali":
        pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is installed on Linux x86_64 / aarch64 only")
    root = write_solid_dataset(tmp_path / "data", per_class=6, splits=("train",))
    train = {"batch_size": 2}
    if views:
        train["views"] = [{"count": 2, "size": 32, "name": "global"}, {"count": 2, "size": 16, "name": "local"}]
    config = base_config(root, backend=backend, workers={"num_workers": 2}, train=train)
    with build_loader(config, "train") as loader:
        for _ in range(2):  # buffers lent, dropped and lent again
            batches = iter(loader)
            held = [next(batches)]
            assert python_calls(held.clear) == []  # a batch dropped: nothing runs
            rest = []
            calls = python_calls(lambda: rest.extend(len(labels) for _, labels in batches))  # to the loop's end
            assert len(rest) + 1 == len(loader) and not [call for call in calls if call.endswith(DROPPED_CODE)], calls
            assert not [call for call in calls if call == "weakref.py:__call__"], calls  # no weakref.finalize
            assert "contract.py:_run_epoch" in calls  # what the loop itself runs is seen
