"""Collate: per-sample uint8 [3, H, W] -> one batch tensor, written in place, no float on the way.

Samples the dataset skipped (see dataset.py) are left out and passed on, so the batch shrinks
by them. `fast_collate` (GPU output) stacks uint8 in NHWC memory, returned as an NCHW view: the samples'
own layout, so each copy is one memcpy, and the device converts to the configured memory format in
the same pass that normalizes. `NormalizingCollate` (CPU output) writes each image normalized
straight into the float batch. In a worker, either batch is allocated in shared memory directly,
as torch's default_collate does, so handing it to the main process copies nothing.
"""
from __future__ import annotations

import math

import torch
import torch.utils.data

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


Batch = tuple[torch.Tensor | None, torch.Tensor, tuple[tuple[int, Skipped], ...]]
"""(images, labels, skipped): images is None when every sample of the batch was skipped;
skipped holds (position in the planned batch, Skipped) for each dropped sample."""


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
    """(images uint8 [B, 3, H, W] in channels_last memory, labels int64 [B], skipped)."""
    decoded, skipped = _partition(samples)
    if not decoded:
        return None, _labels(decoded), skipped
    images = empty_batch(_check_shapes(decoded), torch.uint8, channels_last=True)
    for slot, (image, _) in zip(images, decoded):
        slot.copy_(image)
    return images, _labels(decoded), skipped


class NormalizingCollate:
    """(images normalized [B, 3, H, W] in the output dtype and memory format, labels int64 [B], skipped)."""

    def __init__(self, normalizer: Normalizer):
        self.normalizer = normalizer

    def __call__(self, samples: list) -> Batch:
        decoded, skipped = _partition(samples)
        if not decoded:
            return None, _labels(decoded), skipped
        images = empty_batch(_check_shapes(decoded), self.normalizer.dtype, self.normalizer.channels_last)
        for slot, (image, _) in zip(images, decoded):
            self.normalizer.into(slot, image)
        return images, _labels(decoded), skipped
