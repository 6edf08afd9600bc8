"""fast_collate: uint8 HWC samples -> one uint8 [B, 3, H, W] tensor, without a float in sight.

The batch is laid out NHWC in memory (the samples' own layout, so stacking is one memcpy each) and
returned as an NCHW view: logically NCHW, physically channels_last. The conversion to float on
the device then writes whichever memory format the config asks for, in the same pass. In a worker
the batch is allocated in shared memory directly, as torch's default_collate does, so handing it to
the main process copies nothing.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.utils.data


def _empty_uint8(shape: tuple[int, ...]) -> torch.Tensor:
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=torch.uint8)
    storage = torch.UntypedStorage._new_shared(int(np.prod(shape)))
    return torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)


def fast_collate(samples: list[tuple[np.ndarray, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(images uint8 [B, 3, H, W] in channels_last memory, labels int64 [B])."""
    if not samples:
        raise ValueError("fast_collate got an empty batch")
    height, width = samples[0][0].shape[:2]
    nhwc = _empty_uint8((len(samples), height, width, 3))
    target = nhwc.numpy()
    labels = torch.empty(len(samples), dtype=torch.int64)
    for i, (image, label) in enumerate(samples):
        if image.shape != (height, width, 3):
            raise ValueError(f"sample {i} of the batch has shape {image.shape}, expected {(height, width, 3)}")
        target[i] = image
        labels[i] = label
    return nhwc.permute(0, 3, 1, 2), labels
