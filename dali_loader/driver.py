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
thread, which recovers (dali_loader/loader.py) while the driver is stopped.
"""
from __future__ import annotations

import atexit
import queue
import threading
import weakref
from typing import Callable, NamedTuple

import torch


class Delivered(NamedTuple):
    """One batch ready for the trainer: its tensors and what the feed knew of it."""
    images: torch.Tensor
    labels: torch.Tensor
    fed: object
    """The feed's record of the batch (loader.Fed)."""
    ready: torch.cuda.Event | None
    """GPU: recorded on the driver's stream after the copies; the trainer's stream waits for it."""


class Ended(NamedTuple):
    """The epoch ended (StopIteration), or the pipeline failed (`error`)."""
    error: BaseException | None = None


_RUNNING: weakref.WeakSet = weakref.WeakSet()
"""The drivers whose thread may still run."""


@atexit.register
def _stop_running_drivers() -> None:
    """Stop every driver thread before the interpreter finalizes: after that a daemon thread can no
    longer run, so a loader closed from a finalizer (a script interrupted by Ctrl-C) would wait for
    it forever. One hook for all drivers."""
    for driver in list(_RUNNING):
        driver.close()


class Driver:
    """Runs `pipe.run()` on a thread for one epoch, converting each output with `convert(outputs)`
    -> (images, labels, fed) and queueing it; `get()` hands the next item to the trainer.

    `stop()` (the feed's) makes the pipeline's next call for data end the epoch. `ahead` bounds the
    converted batches waiting in the queue (DALI's own prefetch queue holds more). On a GPU,
    `device` names it: the conversion runs on a stream of the driver's own, and each batch carries
    an event that the consumer's stream waits for.
    """

    def __init__(self, pipe, convert: Callable, stop: Callable[[], None], device: torch.device, ahead: int = 1):
        self.queue: queue.Queue = queue.Queue(maxsize=ahead)
        self.device = device
        self._stop = stop
        self._end: Ended | None = None
        self._thread = threading.Thread(target=self._run, args=(pipe, convert), name="fastloader-dali-driver",
                                        daemon=True)
        self._thread.start()
        _RUNNING.add(self)

    def _run(self, pipe, convert: Callable) -> None:
        stream = None
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            stream = torch.cuda.Stream(self.device)
        while True:
            try:
                outputs = pipe.run()
            except StopIteration:
                self.queue.put(Ended())
                return
            except BaseException as error:  # the trainer's thread decides what it means (loader._recover)
                self.queue.put(Ended(error))
                return
            try:
                if stream is None:
                    self.queue.put(Delivered(*convert(outputs), None))
                    continue
                with torch.cuda.stream(stream):
                    images, labels, fed = convert(outputs)
                    ready = torch.cuda.Event()
                    ready.record(stream)
                self.queue.put(Delivered(images, labels, fed, ready))
            except BaseException as error:
                self.queue.put(Ended(error))
                return

    def get(self) -> Delivered | Ended:
        """The next batch, or the end of the epoch (again on every later call); on a GPU the
        batch is safe to use on the caller's current stream."""
        if self._end is not None:
            return self._end
        item = self.queue.get()
        if isinstance(item, Ended):
            self._end = item
            self._thread.join()
            _RUNNING.discard(self)
        elif item.ready is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(item.ready)
            item.images.record_stream(current)
            item.labels.record_stream(current)
        return item

    def close(self) -> BaseException | None:
        """End the epoch early (a loop left with `break`, close, exit): stop the feed and drop what
        the thread still delivers until it ends; the pipeline's error, if it failed meanwhile."""
        self._stop()
        while not isinstance(item := self.get(), Ended):
            pass
        return item.error
