"""Collate: per-sample uint8 [3, H, W] -> one batch tensor, written in place, no float on the way.

Samples the dataset skipped (see dataset.py) are left out and passed on, so the batch shrinks
by them. `fast_collate` (GPU output) stacks uint8 in NHWC memory, returned as an NCHW view: the samples'
own layout, so each copy is one memcpy, and the device converts to the configured memory format in
the same pass that normalizes. `NormalizingCollate` (CPU output) writes each image normalized
straight into the float batch. In a worker, either batch is allocated in shared memory directly,
as torch's default_collate does, so handing it to the main process copies nothing.

A fresh shared-memory batch costs its page faults: 0.33-0.42 ms per 224 px float32 image here, a
fifth of a worker's time. `BatchPool` lets each worker write into the memory of a batch that the
main process has dropped instead (+20% images/s on train with 2 workers, benchmarks/peers.py).
"""
from __future__ import annotations

import math

import torch
import torch.utils.data
from torch.multiprocessing.reductions import StorageWeakRef

from .dataset import Skipped
from .prefetch import Normalizer


def empty_batch(shape: tuple[int, int, int, int], dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    """An uninitialized [B, C, H, W] tensor; in shared memory when called in a DataLoader worker."""
    if torch.utils.data.get_worker_info() is None:
        memory_format = torch.channels_last if channels_last else torch.contiguous_format
        return torch.empty(shape, dtype=dtype, memory_format=memory_format)
    b, c, h, w = shape
    stride = (h * w * c, 1, w * c, c) if channels_last else (c * h * w, h * w, w, 1)
    storage = torch.UntypedStorage._new_shared(math.prod(shape) * dtype.itemsize)
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape, stride)


Batch = tuple[torch.Tensor | None, torch.Tensor, tuple[tuple[int, Skipped], ...], int]
"""(images, labels, skipped, buffer number): images is None when every sample of the batch was
skipped; skipped holds (position in the planned batch, Skipped) for each dropped sample; the
buffer number is the BatchPool's (-1: a fresh batch)."""


def _partition(samples: list) -> tuple[list[tuple[torch.Tensor, int]], tuple[tuple[int, Skipped], ...]]:
    """The decoded samples, and the skipped ones with their positions in the batch."""
    skipped = tuple((i, s) for i, s in enumerate(samples) if isinstance(s, Skipped))
    if not skipped:
        return samples, ()
    return [s for s in samples if not isinstance(s, Skipped)], skipped


def _labels(samples) -> torch.Tensor:
    return torch.tensor([label for _, label in samples], dtype=torch.int64)


def _check_shapes(samples) -> tuple[int, int, int, int]:
    shape = tuple(samples[0][0].shape)
    for i, (image, _) in enumerate(samples):
        if tuple(image.shape) != shape:
            raise ValueError(f"sample {i} of the batch has shape {tuple(image.shape)}, expected {shape}")
    return (len(samples), *shape)


def fast_collate(samples: list) -> Batch:
    """(images uint8 [B, 3, H, W] in channels_last memory, labels int64 [B], skipped, -1: no BatchPool)."""
    decoded, skipped = _partition(samples)
    if not decoded:
        return None, _labels(decoded), skipped, -1
    images = empty_batch(_check_shapes(decoded), torch.uint8, channels_last=True)
    for slot, (image, _) in zip(images, decoded):
        slot.copy_(image)
    return images, _labels(decoded), skipped, -1


class BatchPool:
    """Shared-memory batches that workers reuse once the main process has dropped them.

    Each worker owns `slots` buffers; `busy` (shared by all processes) says which are in use. A
    worker marks a buffer busy when it fills it; the main process `track`s each batch it receives
    and, once no tensor of it is left (a weak reference to its storage has expired), `sweep` marks
    it free again. A batch that the trainer keeps therefore keeps its buffer; when a worker has no
    free buffer, or the batch has another shape (the last one of an epoch), it allocates a fresh one.
    """

    def __init__(self, num_workers: int, slots: int):
        self.slots = slots
        self.busy = torch.zeros(max(1, num_workers) * slots, dtype=torch.int8).share_memory_()
        self._buffers: list[torch.Tensor | None] = [None] * slots  # this worker's, allocated on first use
        self._received: list[tuple[int, StorageWeakRef]] = []  # main process: batches handed out

    def __getstate__(self) -> dict:  # a worker starts with no buffers of its own
        return {**self.__dict__, "_buffers": [None] * self.slots, "_received": []}

    def take(self, shape: tuple[int, int, int, int], dtype: torch.dtype,
             channels_last: bool) -> tuple[torch.Tensor, int]:
        """In a worker: (an uninitialized batch, its buffer number, or -1 for a fresh one)."""
        worker = torch.utils.data.get_worker_info()
        if worker is not None:
            for slot, buffer in enumerate(self._buffers):
                number = worker.id * self.slots + slot
                if self.busy[number]:
                    continue
                if buffer is None:
                    buffer = self._buffers[slot] = empty_batch(shape, dtype, channels_last)
                if buffer.shape == shape and buffer.dtype == dtype:
                    self.busy[number] = 1
                    return buffer, number
        return empty_batch(shape, dtype, channels_last), -1

    def track(self, images: torch.Tensor, number: int) -> None:
        """In the main process: a batch received from buffer `number`; frees the dropped ones."""
        self.sweep()
        if number >= 0:
            self._received.append((number, StorageWeakRef(images.untyped_storage())))

    def sweep(self) -> None:
        still_used = []
        for number, storage in self._received:
            if storage.expired():
                self.busy[number] = 0
            else:
                still_used.append((number, storage))
        self._received = still_used

    def forget(self) -> None:
        """The workers stopped (their buffers died with them): every slot of the next ones is free."""
        self._received = []
        self.busy.zero_()


class NormalizingCollate:
    """(images normalized [B, 3, H, W] in the output dtype and memory format, labels int64 [B],
    skipped, the BatchPool buffer number)."""

    def __init__(self, normalizer: Normalizer, pool: BatchPool):
        self.normalizer, self.pool = normalizer, pool

    def __call__(self, samples: list) -> Batch:
        decoded, skipped = _partition(samples)
        if not decoded:
            return None, _labels(decoded), skipped, -1
        images, number = self.pool.take(_check_shapes(decoded), self.normalizer.dtype, self.normalizer.channels_last)
        for slot, (image, _) in zip(images, decoded):
            self.normalizer.into(slot, image)
        return images, _labels(decoded), skipped, number
