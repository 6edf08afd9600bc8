"""A sample hook that draws from the global generators (fastloader.with_global_rng), run on DALI in
processes of the loader's own, never on DALI's threads.

Why: with_global_rng seeds torch's, Python's and numpy's global generators with each sample's seed
and puts them back after. Those generators are the process's: on DALI's threads, inside the
trainer's process, each reseed and restore lands among the trainer's own draws (its seeded
`random.random()` stream on the main thread differed in ~11k of 14,400 draws, issue 68), and no lock
can keep the trainer from drawing meanwhile; a lock held while a torch loader's workers fork also
hung them. The torch backend runs sample hooks in its worker processes, or on the training thread
itself between the trainer's own draws; here each batch's samples go to processes of their own, a
contiguous share each, where the hook draws what a torch worker draws for the sample.

They are forked (Linux; elsewhere started from a clean forkserver, and the hook must pickle), as
the torch backend's workers are, before this loader's pipeline is built: a fresh interpreter spends
5 s of CPU importing torch and torchvision again (measured on this 2-core machine, 20 s of wall time
under load), which the first batch would wait for. They run only the hook's Python and torch on the
CPU, nothing of DALI or CUDA that a fork could find half-held in another thread.

A batch's images travel down a pipe and back (a 224 px image is 150 KB: tens of microseconds each
way), and the processes hook a batch's shares at once, where DALI's Python-function operator runs
its per-sample calls one at a time. What the hook raises comes back as its HookError's words (the
traceback formatted where it ran); a process that dies is the hook's failure, named with the sample.
"""
from __future__ import annotations

import os
import queue
from typing import Callable

import numpy as np

from fastloader import exits
from fastloader.errors import HookError
from fastloader.hooks import Hook
from fastloader.parallel import (
    die_with,
    fork_context,
    how_it_ended,
    in_main_thread,
    piped_process,
    script_safe_forkserver,
)


class _HookProcess:
    """One process running the hook, and this end of its pipe."""

    def __init__(self, context, hook: Hook, owner: int):
        forked_by_main_thread = context.get_start_method() == "fork" and in_main_thread()
        self.conn, self.process = piped_process(context, serve, (hook, owner, forked_by_main_thread),
                                                "fastloader-sample-hook")


class HookProcesses:
    """`processes` processes running `hook` (a Hook whose function draws from the global generators)
    for the process `owner` that starts them; `batch` hooks a batch's samples across them."""

    def __init__(self, hook: Hook, processes: int, name_of: Callable[[int], str]):
        self.hook, self.name_of = hook, name_of
        self.owner = os.getpid()
        context = hook_context()
        self.workers: list[_HookProcess] = []
        try:
            for _ in range(max(1, processes)):
                self.workers.append(_HookProcess(context, hook, self.owner))
        except BaseException:
            self.close()
            raise
        self.idle: queue.SimpleQueue[list[_HookProcess]] = queue.SimpleQueue()
        self.idle.put(self.workers)
        """The processes, taken by one batch at a time (DALI calls the operator from one thread at a
        time, but a second caller would wait here rather than mix replies)."""
        exits.stop_at_exit(self, HookProcesses.close)

    @property
    def pids(self) -> list[int]:
        return [worker.process.pid for worker in self.workers]

    def batch(self, images: list[np.ndarray], samples: list[int], seeds: list[int]) -> list[np.ndarray]:
        """The hook's HWC uint8 images for these (HWC uint8 images, their samples' numbers, their
        seeds), in order. HookError where the hook failed, or its process ended."""
        workers = self.idle.get()
        try:
            shares = [(worker, share) for worker, share in zip(workers, np.array_split(np.arange(len(images)),
                                                                                    len(workers))) if len(share)]
            failures, sent = [], []
            for worker, share in shares:
                names = [self.name_of(samples[row]) for row in share]
                try:
                    worker.conn.send([(images[row], seeds[row], name) for row, name in zip(share, names)])
                    sent.append((worker, names))
                except OSError:
                    failures.append(self._ended(worker, names))
            out: list[np.ndarray] = []
            for worker, names in sent:  # every reply read, so that each pipe is clean for the next batch
                try:
                    done, result = worker.conn.recv()
                except (EOFError, OSError):
                    done, result = False, self._ended(worker, names)
                if not done:
                    failures.append(result)
                out += result if done else []
            if failures:
                raise HookError(failures[0])
            return out
        finally:
            self.idle.put(workers)

    def _ended(self, worker: _HookProcess, names: list[str]) -> str:
        return (f"{self.hook.label}: its process {worker.process.pid} ended ({how_it_ended(worker.process)}) while "
                f"it ran on sample {names[0]!r} and on; a hook that draws from the global generators runs in "
                f"processes of its own on DALI: fix the hook")

    def close(self) -> None:
        """Kill the processes (only the process that started them does; a forked copy leaves them)."""
        workers, self.workers = self.workers, []
        exits.forget(self)
        if os.getpid() != self.owner:
            return
        for worker in workers:  # its pipe closes when nothing holds it (a DALI thread may be reading it now)
            if worker.process.exitcode is None:
                worker.process.kill()
                worker.process.join(5)


def hook_context():
    """How the hook's processes start: forked on Linux (fast; nothing to pickle), else from a clean
    forkserver (the hook must then pickle: Hook.check_picklable)."""
    return fork_context() or script_safe_forkserver()


# In a hook process


def serve(conn, hook: Hook, owner: int, forked_by_main_thread: bool) -> None:
    """A hook process's life: each share of samples hooked in turn, the images or the hook's error
    sent back, until the caller's end of the pipe closes. It dies with `owner`."""
    die_with(owner, forked_by_main_thread=forked_by_main_thread)
    import torch
    torch.set_num_threads(1)  # a process per share already: as a DataLoader worker
    while True:
        try:
            share = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply = True, [np.ascontiguousarray(hook.on_sample(torch.from_numpy(image).permute(2, 0, 1), seed, name)
                                                .permute(1, 2, 0).numpy()) for image, seed, name in share]
        except HookError as error:
            reply = False, str(error)
        conn.send(reply)
