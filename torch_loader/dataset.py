"""Map-style dataset over the SampleIndex: decode and crop to uint8 in the worker, or crop the
already decoded pixels of the uint8 cache (dataset.cache), read through its memmap.

Items are (sample index, sample seed) pairs from `fastloader.order`, so the crop a sample gets
depends on the seed, the epoch and the sample only, never on which worker decodes it.
"""
from __future__ import annotations

import numpy as np
import torch.utils.data

from fastloader.cache import CachedPixels
from fastloader.samples import SampleIndex

from .transforms import SampleTransform


class ImageDataset(torch.utils.data.Dataset):
    def __init__(self, index: SampleIndex, transform: SampleTransform, pixels: CachedPixels | None = None):
        self.index = index
        self.transform = transform
        self.pixels = pixels

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, item) -> tuple[np.ndarray, int]:
        sample, seed = int(item[0]), int(item[1])
        path = self.index.path(sample)
        try:
            if self.pixels is None:
                image = self.transform(path, seed)
            else:
                image = self.transform.from_pixels(self.pixels.image(sample), seed)
        except Exception as error:  # name the file: the decoder's own message rarely does
            raise RuntimeError(f"cannot load image {path!r} (sample {sample}, label "
                               f"{self.index.label(sample)}): {type(error).__name__}: {error}") from error
        return image, self.index.label(sample)

    def __getitems__(self, batch: np.ndarray) -> list[tuple[np.ndarray, int]]:
        """A whole batch per call: the DataLoader hands us the [k, 2] array from the sampler."""
        return [self[pair] for pair in batch]
