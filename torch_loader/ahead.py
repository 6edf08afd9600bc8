"""A loop's batches made on a thread of their own, one ahead of the trainer.

Why: on a GPU the thread that runs `for images, labels in loader` also launches the model, so what
the loader does on it is time the GPU does not train. Receiving a batch from a DataLoader worker
(its queue, the batch buffer's views, the labels), the CUDA prefetcher's copy, normalization,
erasing, mixing and the batch hook used to run there: 3-4 us a sample on the CPU, 4-10 on an H200,
against DALI's driver thread's 1-1.5. Here a producer thread does all of it, `depth` batches ahead,
and the trainer's `next` only takes the next finished batch (and, on a GPU, makes its own stream wait
for the event the producer recorded on the side stream: tensors are used on the stream that waited).

One producer at a time per loader (Ahead): a new loop stops the last one's first, so that the
workers and their iterator are only ever driven from one thread. The producer thread holds neither
the loop's consumer nor the Ahead: a loop the trainer drops (a `break`) lets its producer end at the
next batch, and a dropped loader is collected.
"""
from __future__ import annotations

import queue
import threading
import weakref
from typing import Callable, Iterator, NamedTuple


class _Failed(NamedTuple):
    error: BaseException


_END, _STOPPED = object(), object()


def _produce(make: Callable[[], Iterator], items: queue.Queue, room: queue.SimpleQueue,
             stopping: threading.Event) -> None:
    """The producer thread: `make()`'s items into `items`, each after room for it is given (a True
    in `room`; anything else stops it); always a last item (the end, the error, or that it stopped),
    so that a consumer never waits for ever."""
    last = _END
    iterator = None
    try:
        iterator = iter(make())
        while True:
            if room.get() is not True or stopping.is_set():
                last = _STOPPED
                break
            try:
                item = next(iterator)
            except StopIteration:
                break
            items.put(item)
    except BaseException as error:  # noqa: BLE001 - the trainer's next() raises it
        last = _Failed(error)
    finally:
        if iterator is not None and hasattr(iterator, "close"):
            try:
                iterator.close()  # its `finally`s run here, on the thread that ran it
            except BaseException as error:  # noqa: BLE001
                last = last if isinstance(last, _Failed) else _Failed(error)
        items.put(last)


class Run:
    """The consumer's side of one loop: its batches in order, each handed over by `hand_over`;
    the producer's error, raised; after a newer loop took over, `superseded()`'s error.

    A Run the consumer drops stops its producer through a weak reference whose callback is `room`'s
    own `put` (Ahead.run), not through a `__del__`: code of ours run from a deallocation loses a
    Ctrl-C that lands in it (Python prints "Exception ignored" and the trainer goes on), and a loop
    is dropped at every epoch's end."""

    def __init__(self, make: Callable[[], Iterator], depth: int, name: str,
                 hand_over: Callable | None, superseded: Callable[[], BaseException]):
        self.items: queue.Queue = queue.Queue()
        self.room: queue.SimpleQueue = queue.SimpleQueue()  # a True per batch the producer may make ahead
        for _ in range(depth):
            self.room.put(True)
        self.stopping = threading.Event()
        self.hand_over, self.superseded = hand_over, superseded
        self.replaced = False
        self.done = False
        self.thread = threading.Thread(target=_produce, args=(make, self.items, self.room, self.stopping),
                                       name=name, daemon=True)
        self.thread.start()

    def __iter__(self) -> "Run":
        return self

    def __next__(self):
        if self.replaced:
            raise self.superseded()
        if self.done:
            raise StopIteration
        item = self.items.get()
        if item is _END:
            self.done = True
            raise StopIteration
        if item is _STOPPED:
            self.done = True
            raise self.superseded() if self.replaced else StopIteration
        if isinstance(item, _Failed):
            self.done = True
            raise item.error
        self.room.put(True)
        return self.hand_over(item) if self.hand_over is not None else item

    def stop(self) -> None:
        """Let the producer end before its next batch (no wait: it may be this very thread)."""
        self.stopping.set()
        self.room.put(False)


class Ahead:
    """A loader's producer: `run` starts a loop's, after the last one's has ended."""

    def __init__(self, name: str, depth: int = 1):
        self.name, self.depth = name, depth
        self._run: weakref.ref | None = None
        self._thread: threading.Thread | None = None
        self._stopping: threading.Event | None = None

    def run(self, make: Callable[[], Iterator], hand_over: Callable | None,
            superseded: Callable[[], BaseException]) -> Run:
        self.stop()
        run = Run(make, self.depth, self.name, hand_over, superseded)
        # dropped by its consumer: the reference puts itself into `room`, which stops the producer;
        # a C callable, so that no Python code runs where the consumer drops it
        self._run, self._thread, self._stopping = weakref.ref(run, run.room.put), run.thread, run.stopping
        return run

    def stop(self, timeout: float | None = None) -> bool:
        """End the current loop's producer (its consumer is told a newer loop took over) and wait for
        it, at most `timeout` seconds; whether it ended."""
        run = self._run() if self._run is not None else None
        if run is not None:
            run.replaced = True
            run.stop()
        elif self._stopping is not None:
            self._stopping.set()
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout)
        if thread.is_alive():
            return False
        self._run = self._thread = self._stopping = None
        return True

    def signal(self) -> None:
        """Ask the producer to end, without waiting (a finalizer, an exit hook)."""
        run = self._run() if self._run is not None else None
        if run is not None:
            run.stop()
        elif self._stopping is not None:
            self._stopping.set()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
