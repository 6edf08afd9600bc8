"""Collate: per-sample uint8 [3, H, W] -> one batch tensor, written in place, no float on the way.

`fast_collate` (GPU output) stacks uint8 in NHWC memory, returned as an NCHW view: the samples'
own layout, so each copy is one memcpy, and the device converts to the configured memory format in
the same pass that normalizes. `NormalizingCollate` (CPU output) writes each image normalized
straight into the float batch. In a worker, either batch is allocated in shared memory directly,
as torch's default_collate does, so handing it to the main process copies nothing.
"""
from __future__ import annotations

import math

import torch
import torch.utils.data

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


def _labels(samples) -> torch.Tensor:
    return torch.tensor([label for _, label in samples], dtype=torch.int64)


def _check_shapes(samples) -> tuple[int, int, int, int]:
    if not samples:
        raise ValueError("collate got an empty batch")
    shape = tuple(samples[0][0].shape)
    for i, (image, _) in enumerate(samples):
        if tuple(image.shape) != shape:
            raise ValueError(f"sample {i} of the batch has shape {tuple(image.shape)}, expected {shape}")
    return (len(samples), *shape)


def fast_collate(samples: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(images uint8 [B, 3, H, W] in channels_last memory, labels int64 [B])."""
    images = empty_batch(_check_shapes(samples), torch.uint8, channels_last=True)
    for slot, (image, _) in zip(images, samples):
        slot.copy_(image)
    return images, _labels(samples)


class NormalizingCollate:
    """(images normalized [B, 3, H, W] in the output dtype and memory format, labels int64 [B])."""

    def __init__(self, normalizer: Normalizer):
        self.normalizer = normalizer

    def __call__(self, samples: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        images = empty_batch(_check_shapes(samples), self.normalizer.dtype, self.normalizer.channels_last)
        for slot, (image, _) in zip(images, samples):
            self.normalizer.into(slot, image)
        return images, _labels(samples)
