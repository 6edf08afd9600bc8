"""Map-style dataset over the SampleIndex: decode and crop to uint8 in the worker, or crop the
already decoded pixels of the uint8 cache (dataset.cache), read through its memmap.

Items are (sample index, sample seed) pairs from `fastloader.order`, so the crop a sample gets
depends on the seed, the epoch and the sample only, never on which worker decodes it.

A file that fails to decode follows dataset.on_bad_image: `raise` stops the run with an error that
names the file and the decoder's reason; `skip` hands a `Skipped` record to the collate in place of
the sample, so the main process learns which file was dropped and why.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch.utils.data

from fastloader.cache import CachedPixels
from fastloader.errors import BadImageError, CacheError, refused_file
from fastloader.samples import SampleIndex

from .transforms import SampleOps, SampleTransform


class Skipped(NamedTuple):
    """A sample dropped from its batch: its file and why."""
    path: str
    reason: str


class ImageDataset(torch.utils.data.Dataset):
    def __init__(self, index: SampleIndex, transform: SampleTransform, pixels: CachedPixels | None = None,
                 skip_bad: bool = True, source: str = "the config"):
        self.index = index
        self.transform = transform
        self.pixels = pixels
        self.skip_bad = skip_bad
        self.source = source

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, item, ops: SampleOps | None = None) -> tuple[torch.Tensor, int, int] | Skipped:
        sample, seed = int(item[0]), int(item[1])
        path = self.index.path(sample)
        try:
            if self.pixels is None:
                image = self.transform(self.index.location(sample), seed, ops)
            else:
                image = self.transform.from_pixels(self.pixels.image(sample), seed, ops)
        except CacheError:
            raise  # the cache, not this sample's file: skipping would blame the file, sample after sample
        except Exception as error:  # any decoder's failure; the decoder's own message rarely names the file
            reason = f"{type(error).__name__}: {error}"
            if self.skip_bad:
                return Skipped(path, reason)
            raise BadImageError(refused_file(path, reason, self.source)) from error
        return image, self.index.label(sample), seed

    def __getitems__(self, batch: np.ndarray) -> list[tuple[torch.Tensor, int, int] | Skipped]:
        """A whole batch per call: the DataLoader hands us the [k, 2] array from the sampler. The
        batch's flips and ops are drawn at once, as a sample alone would draw them (per row)."""
        ops = self.transform.sample_ops(np.asarray(batch)[:, 1])
        return [self.__getitem__(pair, row) for pair, row in zip(batch, ops)]
