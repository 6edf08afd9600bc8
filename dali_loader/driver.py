"""Runs a DALI pipeline one epoch ahead of the trainer, on a thread of its own.

Why a thread: on a GPU the thread that runs `for images, labels in loader` also launches the
model, and every microsecond the loader spends on it is one the GPU does not train. Calling
`pipe.run()` there costs that thread the external source's callback (the feed's numpy work), DALI's
Python around feeding its inputs and wrapping its outputs, and the hand-over to torch: 1-2 ms a
batch of 256 on a busy 2-core machine. Here a driver thread does all of it while the trainer works,
and the trainer only takes a finished batch from a queue (benchmarks/trainer_thread.py). The driver
spends most of its time inside DALI, which releases the GIL, so it rarely holds the trainer up.

The thread holds no reference to the loader (only the pipeline, the feed and a converter), so a
dropped loader is collected, and its `close` stops the thread. Errors are passed to the trainer's
thread, which recovers from a bad file (dali_loader/loader.py) while the driver is stopped.

Never a hang: whatever ends the thread (an error in its set-up, in DALI, in the hand-over or the
finisher, a failed hand-over of its own end) reaches the trainer's `get()` within POLL_S, which
also notices a thread gone without a word. Nothing waits on the thread where it cannot end: on the
thread itself (a finalizer run there by the cycle collector), in a forked child (the thread did not
come along), during interpreter shutdown (daemon threads no longer run), or from a finalizer.
"""
from __future__ import annotations

import os
import queue
import sys
import threading
import time
import weakref
from typing import Callable, NamedTuple

import torch

from fastloader import exits
from fastloader.errors import LoaderError

from .stall_watch import StallWatch

POLL_S = 1.0
"""How often a trainer waiting for a batch checks that the driver thread still lives: each check
wakes the training thread (0.2 s cost it 1-2 us a sample on a loaded 2-core machine), so not often."""
JOIN_S = 60.0
"""The longest wait for a stopped thread to end: its current DALI call (one batch) and the batches
DALI prefetched. A thread that takes longer is stuck inside DALI, and its loader says so."""


class Delivered(NamedTuple):
    """One batch ready for the trainer: its tensors and what the feed knew of it."""
    images: torch.Tensor
    labels: torch.Tensor
    fed: object
    """The feed's record of the batch (loader.Fed)."""
    ready: torch.cuda.Event | None
    """GPU: recorded on the driver's stream after the copies; the trainer's stream waits for it."""


class Ended(NamedTuple):
    """The epoch ended (StopIteration), or the driver failed (`error`)."""
    error: BaseException | None = None
    in_pipeline: bool = False
    """The error came out of `pipe.run()` (DALI's operators, or the feed DALI calls), not from the
    set-up, the hand-over to torch or the finisher: only such an error can be a bad file's."""


def _stop_at_exit(driver: "Driver") -> None:
    """Before the interpreter finalizes (after that a daemon thread no longer runs, and DALI should
    not be decoding while the process exits), the thread is told to stop at once..."""
    driver.close(wait=False)


def _wait_at_exit(driver: "Driver", seconds: float) -> None:
    """...and all drivers together get exits.WAIT_S to return from DALI. One still inside a batch
    (256 photos decoded on a loaded machine take seconds) is waited for until workers.timeout says
    that batch is stuck: a pipeline left off DALI's exit hook while its executor still decodes
    aborts the process as it exits ("terminate called without an active exception")."""
    if not (driver.join(seconds) or driver.join(driver.patience_at_exit())):
        driver.leave_pipeline()


class Driver:
    """Runs `pipe.run()` on a thread for one epoch, converting each output with `convert(outputs)`
    -> (images, labels, fed) and queueing it; `get()` hands the next item to the trainer.

    `stop()` (the feed's) makes the pipeline's next call for data end the epoch. `ahead` bounds the
    converted batches waiting in the queue (DALI's own prefetch queue holds more). On a GPU,
    `stream` is the loader's side stream (one for the loader's life, so that the caching allocator's
    blocks stay on one stream): the conversion runs there, and each batch carries an event that the
    consumer's stream waits for.
    """

    def __init__(self, pipe, convert: Callable, stop: Callable[[], None], device: torch.device,
                 stream: torch.cuda.Stream | None = None, ahead: int = 1, stall_s: float | None = None,
                 stuck: Callable[[], str] | None = None):
        self.queue: queue.Queue = queue.Queue(maxsize=ahead)
        self._stalls = StallWatch(stall_s, stuck)  # workers.timeout; what the feed is doing, for a stall's message
        self.device = device
        self._stop = stop
        self._end: Ended | None = None  # what get() returned last: the end, again on every later call
        self._last_word: Ended | None = None  # the thread's end, kept here in case handing it over fails
        self._draining = False  # an epoch ended early: run the pipeline through its prefetched batches
        self._abandoned = False  # closed: stop at once, nobody takes anything any more
        self._pid = os.getpid()
        self._pipe = weakref.ref(pipe)
        self._thread = threading.Thread(target=self._run_pipeline, args=(pipe, convert, stream),
                                        name="fastloader-dali-driver", daemon=True)
        self._thread.start()
        exits.stop_at_exit(self, _stop_at_exit, _wait_at_exit)

    def _run_pipeline(self, pipe, convert: Callable, stream: torch.cuda.Stream | None) -> None:
        end = Ended()
        try:
            if stream is not None:
                torch.cuda.set_device(self.device)
            while not self._abandoned:
                self._stalls.batch_started = time.monotonic()
                try:
                    outputs = pipe.run()
                except StopIteration:
                    break
                except BaseException as error:  # the trainer's thread decides what it means (loader.py)
                    end = Ended(error, in_pipeline=True)
                    break
                if self._draining:
                    continue  # a batch DALI prefetched for an epoch left early
                item = self._hand_over(convert, outputs, stream)
                outputs = None  # DALI's buffers are not held while the queue is full
                self._put(item)
        except BaseException as error:  # set-up, hand-over, finisher: the trainer's thread raises it as it is
            end = Ended(error)
        self._last_word = end
        try:
            self._put(end)
        except BaseException:  # noqa: S110 - the trainer finds the thread gone and takes _last_word
            pass

    def _hand_over(self, convert: Callable, outputs, stream: torch.cuda.Stream | None) -> Delivered:
        if stream is None:
            return Delivered(*convert(outputs), None)
        with torch.cuda.stream(stream):
            images, labels, fed = convert(outputs)
            ready = torch.cuda.Event()
            ready.record(stream)
        return Delivered(images, labels, fed, ready)

    def _put(self, item: Delivered | Ended) -> None:
        """Queue an item for the trainer, waiting while the queue is full; dropped once nobody
        takes it (the epoch is being drained, or the driver closed: both empty the queue after
        saying so, so that a put waiting for room returns)."""
        if not (self._abandoned or self._draining):
            self.queue.put(item)

    def get(self) -> Delivered | Ended:
        """The next batch, or the end of the epoch (again on every later call); on a GPU the
        batch is safe to use on the caller's current stream."""
        if self._end is not None:
            return self._end
        item = self._next()
        if isinstance(item, Ended):
            self._end = item
            if not self._stalls.reported:
                self.join(JOIN_S)  # its last word said: it only returns
        elif item.ready is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(item.ready)
            for images in item.images if isinstance(item.images, list) else [item.images]:  # views: a list
                images.record_stream(current)
            item.labels.record_stream(current)
        return item

    def _next(self) -> Delivered | Ended:
        """The thread's next item; its last word, or an error, once it is gone."""
        if os.getpid() != self._pid:
            return Ended(LoaderError("this DALI loader was inherited by a forked process, where its driver thread "
                                      "does not run: build a new loader in this process"))
        started = time.monotonic()
        while True:
            try:
                item = self.queue.get(timeout=POLL_S)
                self._stalls.first = False
                return item
            except queue.Empty:
                if not self._thread.is_alive():
                    break
                if self._stalls.overdue(started):
                    return self._stalled(time.monotonic() - started)
        try:
            return self.queue.get_nowait()  # queued just before it ended
        except queue.Empty:
            return self._last_word or Ended(LoaderError("the DALI driver thread ended without handing over a "
                                                         "batch or an error"))

    def _stalled(self, waited: float) -> Ended:
        """No batch for workers.timeout: the thread is abandoned where it is stuck (a read that never
        returns cannot be stopped from outside), and the trainer gets an error that says where."""
        self._abandoned = True
        self._stop()
        return Ended(self._stalls.report(waited))

    def end_epoch(self) -> None:
        """End the epoch early (a loop left with `break`, a new loop): stop the feed, let the thread
        run the pipeline through the batches DALI prefetched without converting them, and wait for
        it, so that the pipeline can be reset. Raises if it does not end within JOIN_S."""
        self._stop()
        self._draining = True
        self._drain_queue()  # a hand-over waiting for room gives up at once
        if self._stalls.reported or self.join(JOIN_S):
            return
        raise LoaderError(f"the DALI driver thread did not end within {JOIN_S:.0f} s of being stopped: DALI is stuck "
                           f"in a batch (a file on a hung file system?). Build a new loader")

    def close(self, wait: bool = True) -> None:
        """Stop for good, from any thread and process: the thread ends after its current DALI call
        and drops the pipeline. With `wait`, waits for that (at most JOIN_S) where the thread can
        end meanwhile: not on the thread itself (a finalizer the cycle collector runs there), not
        in a forked child (the thread stayed in the parent), not while the interpreter finalizes."""
        self._stop()
        self._abandoned = True
        if os.getpid() != self._pid or threading.current_thread() is self._thread:
            return
        self._drain_queue()
        if wait and not sys.is_finalizing() and not self._stalls.reported:
            self.join(JOIN_S)

    def join(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the thread to end, where it can end meanwhile; whether it has."""
        if os.getpid() != self._pid:
            return True  # a forked child: the thread is not here
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        exits.forget(self)
        return True

    def patience_at_exit(self) -> float:
        """How much longer the exit hook waits for the thread's current DALI call (stall_watch.py)."""
        return self._stalls.patience_at_exit()

    def leave_pipeline(self) -> None:
        """At exit, for a thread that did not return from DALI: its pipeline off DALI's list of those
        its own exit hook shuts down (which runs after this one). Its executor may be stuck in the
        user's Python (a sample hook that hangs, on a DALI thread), and shutting it down would wait
        for that thread for ever: the process would never exit."""
        pipe = self._pipe()
        if pipe is not None:
            getattr(type(pipe), "_pipes", set()).discard(weakref.ref(pipe))

    def _drain_queue(self) -> None:
        """Drop what waits in the queue, so that a hand-over blocked on it returns."""
        try:
            while True:
                self.queue.get_nowait()
        except queue.Empty:
            pass
