"""Small host arrays to the device without a hidden synchronization.

`tensor.to("cuda", non_blocking=True)` from pageable memory is not asynchronous: CUDA first stages
the bytes through a pinned buffer of its own, and the calling thread waits for that (PyTorch's
and CUDA's documented semantics; only a copy from pinned memory overlaps). The labels, erasing
boxes and mixing weights a loader sends with each batch are a few KB, so they are pinned first:
torch's caching host allocator reuses the pinned block, and keeps it until the copy that reads it
has run, so the source may be dropped or overwritten at once.
"""
from __future__ import annotations

import torch


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` (on the host) on `device`; to a GPU, an asynchronous copy from pinned memory on the
    current stream."""
    if device.type != "cuda":
        return tensor.to(device)
    if not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)
