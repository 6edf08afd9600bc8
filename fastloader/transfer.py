"""Small host arrays to the device, asynchronously as documented.

PyTorch documents `tensor.to("cuda", non_blocking=True)` as asynchronous only from pinned memory;
from pageable memory CUDA first stages the bytes through a driver buffer of its own before the call
returns (CUDA's API synchronization behaviour), a copy the caller cannot overlap or see. The
labels, erasing boxes and mixing weights a loader sends with each batch are a few KB, so they are
pinned first: torch's caching host allocator reuses the pinned block and keeps it until the copy
that reads it has run, so the source may be dropped or overwritten at once.
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
