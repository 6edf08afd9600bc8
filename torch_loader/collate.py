"""Collate: per-sample uint8 [3, H, W] -> one batch tensor, written in place, no float on the way.

Slots whose file failed (see dataset.py) hold their substitute (train), or are left out (the batch
shrinks by them); the files that failed are passed on. `fast_collate` (GPU output) stacks uint8 in
NHWC memory, returned as an NCHW view: the samples' own layout, so each copy is one memcpy, and the
device converts to the configured memory format in the same pass that normalizes.
`NormalizingCollate` (CPU output) writes each image normalized straight into the float batch. In a
worker, either batch is allocated in shared memory directly, as torch's default_collate does, so
handing it to the main process copies nothing.

A fresh shared-memory batch costs its page faults: 0.33-0.42 ms per 224 px float32 image here, a
fifth of a worker's time, and its hand-over costs the training thread a file descriptor's round trip.
`BatchPool` lets each worker write into buffers the main process mapped before the workers forked,
reusing those the trainer has dropped (+20% images/s on train with 2 workers, benchmarks/peers.py),
and send only a buffer's number.
"""
from __future__ import annotations

import math
import mmap
import weakref

import numpy as np
import torch
import torch.utils.data

from fastloader.device_ops import BatchFinisher

from .dataset import Decoded, Missed, Skipped
from .live_iterator import shared_storage
from .prefetch import Normalizer


def _strides(shape: tuple[int, int, int, int], channels_last: bool) -> tuple[int, int, int, int]:
    """The strides of a dense [B, C, H, W] batch in NHWC (channels_last) or NCHW memory."""
    b, c, h, w = shape
    return (h * w * c, 1, w * c, c) if channels_last else (c * h * w, h * w, w, 1)


def empty_batch(shape: tuple[int, int, int, int], dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    """An uninitialized [B, C, H, W] tensor; in shared memory when called in a DataLoader worker."""
    if torch.utils.data.get_worker_info() is None:
        memory_format = torch.channels_last if channels_last else torch.contiguous_format
        return torch.empty(shape, dtype=dtype, memory_format=memory_format)
    storage = shared_storage(math.prod(shape) * dtype.itemsize)
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape, _strides(shape, channels_last))


Batch = tuple[torch.Tensor | None, np.ndarray, tuple[tuple[int, Skipped, bool], ...], int, np.ndarray | None]
"""(images, labels, skipped, pool slot, targets) as a worker sends it: labels int64 [B] as numpy, which
pickles inline (a tensor would be passed as a shared-memory file descriptor, through a connection of
its own, on the training thread: half its cost per batch); skipped holds (position in the planned
batch, Skipped, whether a substitute filled the slot) for each file that failed; a slot >= 0 means
the images are in that BatchPool slot and `images` is None (and the soft targets are in the slot
too), else `images` is a fresh batch, or None when no slot holds a sample; targets: the float32 soft
targets [B, classes] where the split has them (fastloader.device_ops.BatchFinisher) and no slot
holds them, else None."""


def partition(samples: list) -> tuple[list[Decoded], tuple[tuple[int, Skipped, bool], ...]]:
    """The decoded samples (a substitute in its slot), and each file that failed: (its position in
    the batch, Skipped, whether the slot was filled)."""
    if not any(isinstance(s, Missed) for s in samples):
        return samples, ()
    decoded, skipped = [], []
    for position, sample in enumerate(samples):
        if isinstance(sample, Missed):
            skipped += [(position, record, sample.filled is not None) for record in sample.skipped]
            sample = sample.filled
        if sample is not None:
            decoded.append(sample)
    return decoded, tuple(skipped)


def labels_of(samples) -> np.ndarray:
    return np.array([label for _, label, _ in samples], dtype=np.int64)


def _check_shapes(samples) -> tuple[int, int, int, int]:
    shape = tuple(samples[0][0].shape)
    for i, (image, *_) in enumerate(samples):
        if tuple(image.shape) != shape:
            raise ValueError(f"sample {i} of the batch has shape {tuple(image.shape)}, expected {shape}")
    return (len(samples), *shape)


def fast_collate(samples: list) -> Batch:
    """A Batch of uint8 [B, 3, H, W] images in channels_last memory, fresh in shared memory (the
    DataLoader's pin-memory thread receives and pins it, off the training thread)."""
    decoded, skipped = partition(samples)
    if not decoded:
        return None, labels_of(decoded), skipped, -1, None
    images = empty_batch(_check_shapes(decoded), torch.uint8, channels_last=True)
    for slot, (image, *_) in zip(images, decoded):
        slot.copy_(image)
    return images, labels_of(decoded), skipped, -1, None


class BatchPool:
    """Batch buffers in memory the main process maps before the workers fork, so that a worker
    writes a batch where the trainer will read it and sends only the buffer's number.

    Why: a batch tensor sent from a worker travels as a shared-memory file descriptor, which the
    receiving (training) thread fetches over a connection of its own and maps: about half of the
    torch backend's cost to that thread per batch (benchmarks/trainer_thread.py). And a fresh
    shared-memory batch costs the worker its page faults, 0.33-0.42 ms per 224 px float32 image here.

    Each worker owns `slots` buffers of one full batch (and, with `classes`, its soft targets);
    `busy` (shared by all processes) says which are in use. A worker marks a buffer busy when it
    fills it; the main process hands the trainer tensors over it, and frees it again once their last
    reference is gone (swept as the next batch arrives). A batch the trainer keeps therefore keeps
    its buffer; a worker with no free buffer sends a fresh batch instead.
    """

    def __init__(self, num_workers: int, slots: int, shape: tuple[int, int, int, int], dtype: torch.dtype,
                 channels_last: bool, classes: int = 0):
        self.slots, self.shape, self.dtype, self.channels_last = slots, shape, dtype, channels_last
        self.classes = classes
        self.count = max(1, num_workers) * slots
        self.image_bytes = -(-math.prod(shape) * dtype.itemsize // 4) * 4  # float32 targets follow, aligned
        self.nbytes = self.image_bytes + shape[0] * classes * 4
        # MAP_SHARED | MAP_ANONYMOUS: forked workers write these very pages; none is touched until used
        self.memory = mmap.mmap(-1, self.count * self.nbytes) if self.count else None
        self.busy = np.frombuffer(mmap.mmap(-1, max(1, self.count)), dtype=np.uint8)
        self._handed: dict[int, weakref.ref] = {}
        """Main process: slot -> a weak reference to the view the trainer's tensors hold over it."""

    def __getstate__(self) -> dict:
        """A spawned worker (macOS, Windows) cannot map the main process's buffers: it gets a pool of
        no slots, and sends fresh batches, as a worker with no free buffer does."""
        return {**self.__dict__, "memory": None, "busy": np.zeros(0, dtype=np.uint8), "slots": 0, "_handed": {}}

    def fits(self, shape: tuple[int, int, int, int]) -> bool:
        """Whether a batch of this shape fits a slot: as many channels, no larger a side (a size
        schedule's smaller batches use the front of the largest one's buffer)."""
        return shape[1] == self.shape[1] and shape[2] <= self.shape[2] and shape[3] <= self.shape[3]

    def take(self, count: int, side: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        """In a worker (or the main process without workers): (an uninitialized batch of `count`
        images of `side` x `side` (default the pool's), room for their soft targets or None, its
        slot), or a fresh batch in shared memory, None and -1."""
        worker = torch.utils.data.get_worker_info()
        first = (worker.id if worker is not None else 0) * self.slots
        for slot in range(first, first + self.slots):
            if not self.busy[slot]:
                self.busy[slot] = 1
                flat = torch.frombuffer(self.memory, dtype=torch.uint8, count=self.nbytes, offset=slot * self.nbytes)
                return (*self._views(flat, count, side), slot)
        side = side or self.shape[2]
        return empty_batch((count, self.shape[1], side, side), self.dtype, self.channels_last), None, -1

    def batch(self, slot: int, count: int, side: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """In the main process: the batch of `count` images of `side` x `side` a worker wrote into
        `slot` (and their soft targets, or None), as tensors whose storage holds a numpy view of the
        slot; once the trainer has dropped the last of them the view is dead, and the next batch
        received frees the slot (sweep)."""
        self.sweep()
        view = np.frombuffer(self.memory, dtype=np.uint8, count=self.nbytes, offset=slot * self.nbytes)
        self._handed[slot] = weakref.ref(view)
        return self._views(torch.from_numpy(view), count, side)

    def sweep(self) -> None:
        """Free the slots whose views are dead. Checked as a batch arrives, never by a callback when
        the trainer drops one: code run from a deallocation loses a Ctrl-C that lands in it (Python
        prints "Exception ignored" and the trainer goes on), and the trainer drops a batch every step."""
        for slot, view in list(self._handed.items()):
            if view() is None:
                del self._handed[slot]
                self.busy[slot] = 0

    def _views(self, flat: torch.Tensor, count: int, side: int | None = None) -> tuple[torch.Tensor,
                                                                                     torch.Tensor | None]:
        b, c, h, w = self.shape
        shape = (b, c, side or h, side or w)
        stride = _strides(shape, self.channels_last)
        images = flat[:self.image_bytes].view(self.dtype)[:math.prod(shape)]
        images = images.as_strided(shape, stride)[:count]
        if not self.classes:
            return images, None
        return images, flat[self.image_bytes:].view(torch.float32).view(self.shape[0], self.classes)[:count]

    def forget(self) -> None:
        """The workers stopped: the slots they filled and never sent are free; those the trainer
        holds stay busy until it drops them."""
        self.sweep()
        self.busy[:] = 0
        self.busy[list(self._handed)] = 1


class NormalizingCollate:
    """A Batch of images normalized [B, 3, H, W] in the output dtype and memory format, written
    into a BatchPool slot where one is free, then erased and mixed, with their soft targets, by the
    split's finisher: here in the worker, while the pixels are in its cache, not on the training
    thread."""

    def __init__(self, normalizer: Normalizer, pool: BatchPool, finisher: BatchFinisher | None = None):
        self.normalizer, self.pool, self.finisher = normalizer, pool, finisher

    def __call__(self, samples: list) -> Batch:
        decoded, skipped = partition(samples)
        if not decoded:
            return None, labels_of(decoded), skipped, -1, None
        shape = _check_shapes(decoded)
        if self.pool.fits(shape) and shape[2] == shape[3]:
            images, room, slot = self.pool.take(len(decoded), shape[2])
        else:  # only if the transform's output is larger than the pool's largest size (it is not)
            images, room, slot = empty_batch(shape, self.normalizer.dtype, self.normalizer.channels_last), None, -1
        for view, (image, *_) in zip(images, decoded):
            self.normalizer.into(view, image)
        labels, targets = labels_of(decoded), None
        if self.finisher is not None:
            seeds = np.array([seed for *_, seed in decoded], dtype=np.int64)
            finished, out = self.finisher(images, torch.from_numpy(labels), seeds, borrowed=slot >= 0)
            if finished is not images:  # the batch hook's own tensor (of the same shape and dtype)
                images.copy_(finished)
            if self.finisher.mixer is None:
                labels = out.numpy()
            elif room is not None:
                room.copy_(out)
            else:
                targets = out.numpy()
        return None if slot >= 0 else images, labels, skipped, slot, targets
