"""Map-style dataset over the SampleIndex: decode and crop to uint8 in the worker.

Items are (sample index, sample seed) pairs from `fastloader.order`, so the crop a sample gets
depends on the seed, the epoch and the sample only, never on which worker decodes it.
"""
from __future__ import annotations

import numpy as np
import torch.utils.data

from fastloader.samples import SampleIndex

from .transforms import SampleTransform


class ImageDataset(torch.utils.data.Dataset):
    def __init__(self, index: SampleIndex, transform: SampleTransform):
        self.index = index
        self.transform = transform

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, item) -> tuple[np.ndarray, int]:
        sample, seed = int(item[0]), int(item[1])
        path = self.index.path(sample)
        try:
            image = self.transform(path, seed)
        except Exception as error:  # name the file: the decoder's own message rarely does
            raise RuntimeError(f"cannot load image {path!r} (sample {sample}, label "
                               f"{self.index.label(sample)}): {type(error).__name__}: {error}") from error
        return image, self.index.label(sample)

    def __getitems__(self, batch: np.ndarray) -> list[tuple[np.ndarray, int]]:
        """A whole batch per call: the DataLoader hands us the [k, 2] array from the sampler."""
        return [self[pair] for pair in batch]
