"""What the torch backend needs of a DataLoader's multiprocess iterator beyond its public surface,
in one place: its worker processes, the worker a batch was sent to, torch's SIGCHLD bookkeeping and
its shutdown. These are private attributes of `torch.utils.data.dataloader`; each is read with a
fallback, so a torch that renames one loses a better message, never a run. `CHECKED_AGAINST` names
the torch versions whose iterator was read for them (tests/test_live_iterator.py holds it).
"""
from __future__ import annotations

import os

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
