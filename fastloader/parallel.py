"""Map a function over a stream of items in chunks, in worker processes, results in input order.

Why one place: checking files (decoding/screen.py) and decoding them into the cache (cache_write.py) share
the same needs. The items are a stream (a million paths are never listed whole), a bounded number
of chunks is in flight, and the results come back in order. Ctrl-C stops the parent, not a
traceback per worker, and a caller that stops early drops the queued chunks.

No pool here ever runs the user's script again: a training script without an
`if __name__ == "__main__":` guard, `python -c` and a notebook must all work (see
`script_safe_forkserver`). A worker that dies breaks the pool with an error, never a wait, and
a worker dies with the process it works for (`die_with`): a killed build leaves no process behind.
"""
from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import multiprocessing
import multiprocessing.context
import os
import select
import signal
import sys
import threading
import time
import types
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Callable, Iterable, Iterator


def map_chunks(function: Callable[..., list], items: Iterable, args: tuple = (), *, workers: int, chunk: int,
               in_flight: int, initializer: Callable[[], None] | None = None, fork: bool = True,
               on_progress: Callable[[int], None] | None = None) -> Iterator:
    """`function(chunk_of_items, *args)` returns a list of results; yields every result in order.

    workers=0 runs here. in_flight: chunks queued per worker. `on_progress(done)` follows each chunk.
    fork=False starts the workers from a fresh server process (about a second more): a process
    that runs other native threads (a DALI pipeline) must not fork, since a lock one of them holds
    at the fork stays locked forever in the child.
    """
    done = 0
    if workers == 0:
        for part in chunks(items, chunk):
            results = function(part, *args)
            yield from results
            done += len(results)
            if on_progress:
                on_progress(done)
        return
    context = fork_context() if fork else script_safe_forkserver()
    start = functools.partial(_start_worker, os.getpid(), fork and context is not None and in_main_thread(),
                              initializer)
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=start)
    pending: collections.deque[Future] = collections.deque()
    try:
        for part in chunks(items, chunk):
            pending.append(pool.submit(function, part, *args))
            if len(pending) >= in_flight * workers:
                done = yield from _drain(pending.popleft(), done, on_progress)
        while pending:
            done = yield from _drain(pending.popleft(), done, on_progress)
    finally:  # also when the caller stops early: drop the queued chunks rather than finish them
        pool.shutdown(wait=True, cancel_futures=True)


def _start_worker(owner: int, forked_by_main_thread: bool, initializer: Callable[[], None] | None) -> None:
    die_with(owner, forked_by_main_thread=forked_by_main_thread)
    if initializer is not None:
        initializer()


PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal the kernel sends this process when the thread that forked it ends."""


def die_with(owner: int, *_, forked_by_main_thread: bool = True) -> None:
    """The first call in a worker process: it dies when `owner`, the process it works for, dies, even
    by SIGKILL, where it would otherwise live on, orphaned (a pool's worker), or for seconds until it
    notices (torch's watchdog polls every 5 s). SIGTERM kills it again (a fork inherits its parent's
    handler). Linux only; elsewhere only SIGTERM changes.

    A worker forked by the owner's main thread asks the kernel (PR_SET_PDEATHSIG, sent when the
    forking *thread* ends, so only the main thread, which ends with the process, will do) and checks
    that the owner did not die before that. Any other (forked from another thread, or the child of
    a forkserver, which lives as long as any of its workers) runs a thread that waits for the owner's
    end. As a DataLoader's worker_init_fn:
    `functools.partial(die_with, os.getpid(), forked_by_main_thread=in_main_thread())`.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform != "linux":
        return
    if not forked_by_main_thread:
        threading.Thread(target=_wait_for_end, args=(owner,), name="fastloader-die-with", daemon=True).start()
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != owner:  # it died before the kernel was asked
        os._exit(1)


def piped_process(context, target: Callable, args: tuple, name: str):
    """(this end of a pipe, a started process given the other end first among its `args`). Not a
    daemon: multiprocessing's exit hook in a fork of this process would kill it."""
    conn, theirs = context.Pipe()
    try:
        process = context.Process(target=target, args=(theirs, *args), name=name)
        process.start()
    except BaseException:
        conn.close()
        raise
    finally:
        theirs.close()
    return conn, process


def how_it_ended(process: multiprocessing.process.BaseProcess) -> str:
    """How a process whose pipe just closed ended, in words: its signal or exit code."""
    process.join(1.0)  # its pipe closed as it died: the exit status follows at once
    code = process.exitcode
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return "still running" if code is None else f"exit code {code}"


def in_main_thread() -> bool:
    """Whether this is the main thread, which ends only with the process (see die_with)."""
    return threading.current_thread() is threading.main_thread()


def _wait_for_end(pid: int) -> None:
    """Wait for process `pid` to end (its pidfd becomes readable), then end this process."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(1)
    except (OSError, AttributeError):  # a kernel before 5.3: look every second
        while running(pid):
            time.sleep(1)
        os._exit(1)
    select.select([handle], [], [])
    os._exit(1)


def running(pid: int) -> bool:
    """Whether process `pid` runs on this machine (signal 0: a check, nothing sent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def fork_context() -> multiprocessing.context.BaseContext | None:
    """Fork on Linux: the workers need nothing but the modules already imported, and a fork starts
    them in milliseconds, where spawn or forkserver (Python 3.14's default) would re-import
    `fastloader`, and with it torch, in each one. They never touch CUDA, so forking after CUDA is
    initialized is safe, as it is for DataLoader workers."""
    return multiprocessing.get_context("fork") if sys.platform == "linux" else None


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """While a process starts, `__main__` is a blank module, so multiprocessing's preparation data
    names no script to import. Without this, forkserver and spawn import the user's script in the
    server and in every worker: an unguarded script then builds its loader again in there, which
    breaks the pool (BrokenProcessPool) or waits forever on the server it is itself starting."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


class _ScriptSafeProcess(multiprocessing.context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj):
        with _main_module_hidden():  # also covers the server's own first start (ensure_running)
            return multiprocessing.context.ForkServerProcess._Popen(process_obj)


class _ScriptSafeForkServer(multiprocessing.context.ForkServerContext):
    Process = _ScriptSafeProcess


def script_safe_forkserver() -> multiprocessing.context.BaseContext:
    """A forkserver context whose workers start from a clean server, without the user's script.
    What they run must be importable (a function of this package), as it always is here."""
    return _ScriptSafeForkServer()


def chunks(items: Iterable, size: int) -> Iterator[list]:
    part: list = []
    for item in items:
        part.append(item)
        if len(part) == size:
            yield part
            part = []
    if part:
        yield part


def _drain(future: Future, done: int, on_progress: Callable[[int], None] | None) -> Iterator:
    results = future.result()
    yield from results
    done += len(results)
    if on_progress:
        on_progress(done)
    return done
