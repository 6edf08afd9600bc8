"""torch's private API that the torch backend uses, in one place: above all what it needs of a
DataLoader's multiprocess iterator beyond its public surface (its worker processes, the worker a
batch was sent to, torch's SIGCHLD bookkeeping and its shutdown); then the uint8 resize kernels,
shared-memory storage for a worker's batch, and the wording of DataLoader's own errors. Each is read
with a fallback, so a torch that renames one loses a better message or a faster path, never a run.
`CHECKED_AGAINST` names the torch versions read for them (tests/test_live_iterator.py holds it).
"""
from __future__ import annotations

import os
import platform

import torch
import torch.utils.data

CHECKED_AGAINST = ("2.14",)
"""torch releases (major.minor) whose `_MultiProcessingDataLoaderIter` has every attribute used here."""

ATTRIBUTES = ("_workers", "_task_info", "_rcvd_idx", "_shutdown", "_shutdown_workers", "_index_queues",
              "_worker_result_queue", "_worker_pids_set")
"""The private attributes of a live multiprocess iterator this module reads or sets."""


def workers(live) -> list:
    """The iterator's worker processes ([] for a single-process one, or one half built)."""
    return list(getattr(live, "_workers", ()))


def awaited_workers(live) -> list:
    """The worker the batch the trainer waits for went to (torch's task bookkeeping); every worker
    where that bookkeeping cannot be read."""
    try:
        return [live._workers[live._task_info[live._rcvd_idx][0]]]
    except (AttributeError, KeyError, IndexError, TypeError):
        return workers(live)


def release_sigchld(live) -> None:
    """Take the iterator's workers out of torch's SIGCHLD handler, which raises its bare error wherever
    the trainer is when one dies; the loader names a dead worker itself, when the trainer next asks."""
    if getattr(live, "_worker_pids_set", False):
        torch.utils.data._utils.signal_handling._remove_worker_pids(id(live))
        live._worker_pids_set = False


def is_shut_down(live) -> bool:
    return not hasattr(live, "_shutdown_workers") or getattr(live, "_shutdown", False)


def shut_down(live) -> None:
    """torch's own orderly shutdown, where every worker still lives; `abandon` where one died."""
    if is_shut_down(live):
        return
    if all(worker.is_alive() for worker in workers(live)):
        live._shutdown_workers()
    else:
        abandon(live)


def abandon(live) -> None:
    """Stop a DataLoader iterator's workers after one died, without torch's shutdown. That sets the
    workers' shared done event first, whose lock a worker killed inside `Event.is_set()` holds for
    ever, and so waits for ever (torch counts on its SIGCHLD handler to interrupt it, and this
    loader's workers are taken out of that handler): the workers are killed instead, and the queues
    closed without waiting on their feeder threads, whose locks the dead worker may hold too."""
    live._shutdown = True  # torch's own shutdown, from its finalizer, does nothing more
    stop_unreaped(workers(live), os.getpid())
    for worker in workers(live):
        worker.join(timeout=1.0)
    if hasattr(live, "_pin_memory_thread"):
        live._pin_memory_thread_done_event.set()  # a thread's event; the thread ends within its poll
    for queue in [*getattr(live, "_index_queues", ()), *filter(None, [getattr(live, "_worker_result_queue", None)])]:
        queue.cancel_join_thread()
        queue.close()
    release_sigchld(live)


def stop_unreaped(processes: list, parent: int) -> None:
    """When a DataLoader iterator is collected: kill its workers that still run. Where the iterator
    dies of its last reference, torch's own shutdown has stopped them already. Where the cycle
    collector takes it, the worker queues' finalizers may run first, and torch's shutdown then sends
    the workers' stop signal into a closed queue and waits 5 s for each before it kills them, inside
    whatever the program does then. A worker whose exit was collected is not signalled: its pid may
    be another process's by now; nor are any in a forked copy of the iterator (they are not its children)."""
    if os.getpid() != parent:
        return
    for worker in processes:
        if worker.is_alive():
            worker.kill()


def quiet_half_built(error: BaseException) -> None:
    """A DataLoader iterator whose construction failed (no room for a semaphore): its workers that did
    start are killed, and its __del__, which would print a traceback about attributes it never set,
    is told it is shut down already."""
    traceback = error.__traceback__
    while traceback is not None:
        it = traceback.tb_frame.f_locals.get("self")
        if isinstance(it, torch.utils.data.dataloader._MultiProcessingDataLoaderIter):
            for worker in workers(it):
                if worker.is_alive():
                    worker.kill()
            it._shutdown = True
        traceback = traceback.tb_next


def uint8_resize_kernels() -> dict:
    """torch's antialiased uint8 kernels, the ones torch.nn.functional.interpolate calls for
    torchvision's resize of CPU uint8 tensors (without interpolate's checks and float detour):
    bilinear only where torch vectorizes it (elsewhere torchvision resizes through float32, and so do
    we, through torchvision); none that a torch release has renamed."""
    kernels = {"bicubic": getattr(torch._C._nn, "_upsample_bicubic2d_aa", None)}
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") or platform.machine() in ("aarch64", "arm64"):
        kernels["bilinear"] = getattr(torch._C._nn, "_upsample_bilinear2d_aa", None)
    return {mode: kernel for mode, kernel in kernels.items() if kernel is not None}


def shared_storage(nbytes: int) -> torch.UntypedStorage:
    """`nbytes` of shared memory, as DataLoader's collate allocates a worker's batch: handed to the
    main process as a file descriptor, not copied (the public `share_memory_()` copies a tensor made first)."""
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if new_shared is None:
        return torch.UntypedStorage(nbytes).share_memory_()
    return new_shared(nbytes)


def reports_dead_worker(error: BaseException) -> bool:
    """DataLoader's own words for a worker that exited ("DataLoader worker (pid N) exited unexpectedly")."""
    return isinstance(error, RuntimeError) and "DataLoader worker (pid" in str(error)


def is_poll_timeout(error: BaseException) -> bool:
    """DataLoader's RuntimeError when no batch came within its `timeout`: the loader polls with it."""
    return isinstance(error, RuntimeError) and str(error).startswith("DataLoader timed out")


def worker_error_message(error: BaseException) -> str | None:
    """The message a worker's error had, from torch's re-raised one ("Caught HookError in DataLoader
    worker process 0.\nOriginal Traceback (most recent call last): ... fastloader.errors.HookError:
    <message>"); None where it is not such a wrapper."""
    text = str(error)
    if not text.startswith(f"Caught {type(error).__name__} in DataLoader worker process"):
        return None
    marker = f"{type(error).__module__}.{type(error).__qualname__}: "
    for line_start in (0, *(i + 1 for i, c in enumerate(text) if c == "\n")):
        if text.startswith(marker, line_start):
            return text[line_start + len(marker):].rstrip("\n")
    return None
