"""Map a function over a stream of items in chunks, in worker processes, results in input order.

Why one place: checking files (imaging/screen.py) and decoding them into the cache (cache_write.py) share
the same needs. The items are a stream (a million paths are never listed whole), a bounded number
of chunks is in flight, and the results come back in order. Ctrl-C stops the parent, not a
traceback per worker, and a caller that stops early drops the queued chunks.

No pool here ever runs the user's script again: a training script without an
`if __name__ == "__main__":` guard, `python -c` and a notebook must all work (see
`script_safe_forkserver`). A worker that dies breaks the pool with an error, never a wait.
"""
from __future__ import annotations

import collections
import contextlib
import multiprocessing
import multiprocessing.context
import os
import sys
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
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=initializer)
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
