"""Map-style dataset over the SampleIndex: decode and crop to uint8 in the worker, or crop the
already decoded pixels of the uint8 cache (dataset.cache), read through its memmap.

Items are (sample index, sample seed) pairs from `fastloader.order`, so the crop a sample gets
depends on the seed, the epoch and the sample only, never on which worker decodes it.

A file that fails to decode follows dataset.on_bad_image: `raise` stops the run with an error that
names the file and the decoder's reason; `skip` hands the collate a `Missed` record in place of the
sample, which names the file and why, so the main process learns what was dropped. In train mode
the slot is refilled: the substitutes that `fastloader.order.substitutes` draws from the slot's seed
are tried in turn, as the DALI backend's feed tries them, so batches keep their size and both
backends deliver the same samples.

The user's sample hook (fastloader.hooks) runs on each crop, with the slot's seed; what it raises
stops the run as a HookError, never a skip.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch.utils.data

from fastloader.cache import CachedPixels
from fastloader.errors import NOT_A_SAMPLES_FAULT, AugmentError, BadImageError, decoder_reason, refused_file
from fastloader.hooks import Hook
from fastloader.order import WeightedDraws, output_size, substitutes
from fastloader.samples import SampleIndex
from fastloader.sources.protocol import adopt_source, opened
from fastloader.sources.reading import fetch_again

from .transforms import SampleOps, SampleTransform

Decoded = tuple[torch.Tensor | tuple[torch.Tensor, ...], int, int]
"""(uint8 image, or a tuple of one per view, label, seed) of one slot."""


class Skipped(NamedTuple):
    """A file that failed to decode, and why."""
    path: str
    reason: str


class Missed(NamedTuple):
    """A batch slot whose file failed to decode: each file that failed in it (its own, then the
    substitutes tried), and the substitute that filled it (train), or None: the slot stays empty."""
    skipped: tuple[Skipped, ...]
    filled: Decoded | None


class ImageDataset(torch.utils.data.Dataset):
    def __init__(self, index: SampleIndex, transform: SampleTransform, pixels: CachedPixels | None = None,
                 skip_bad: bool = True, source: str = "the config", draws: WeightedDraws | None = None,
                 sample_hook: Hook | None = None):
        self.index = index
        self.sample_hook = sample_hook
        """The user's sample hook (fastloader.hooks), run on each decoded crop; its errors are its own."""
        self.draws = draws
        """The split's weighted draws, if any: a refilled slot's substitutes are drawn by them."""
        self.transform = transform
        """The crop of each sample, or every view of it (torch_loader.views.ViewsTransform: a tuple)."""
        self.pixels = pixels
        self.skip_bad = skip_bad
        self.refill = skip_bad and transform.train
        self.source = source

    def __len__(self) -> int:
        return len(self.index)

    def __getstate__(self) -> dict:
        """Pickled for a spawned worker (a forked one inherits the process's table of opened sources):
        the user's source travels with the dataset, to be opened there under its token."""
        state = dict(self.__dict__)
        if self.index.reader:
            state["_source"] = opened(self.index.reader)
        return state

    def __setstate__(self, state: dict) -> None:
        source = state.pop("_source", None)
        self.__dict__.update(state)
        if source is not None:
            adopt_source(self.index.reader, source)

    def __getitem__(self, item, ops: SampleOps | None = None, size: int | None = None) -> Decoded | Missed:
        sample, seed = int(item[0]), int(item[1])
        size = size or (int(item[2]) if len(item) > 2 else None)
        decoded = self._decode(sample, seed, ops, size)
        if not isinstance(decoded, Skipped):
            return decoded
        failed = [decoded]
        for substitute in substitutes(seed, len(self.index), self.draws) if self.refill else ():
            decoded = self._decode(substitute, seed, ops, size)  # the slot's seed: its crop, flips and ops
            if not isinstance(decoded, Skipped):
                return Missed(tuple(failed), decoded)
            failed.append(decoded)
        return Missed(tuple(failed), None)

    def _decode(self, sample: int, seed: int, ops: SampleOps | None, size: int | None = None) -> Decoded | Skipped:
        try:
            if self.pixels is None:
                image = self.transform(self.index.location(sample), seed, ops, size)
            else:
                image = self.transform.from_pixels(self.pixels.image(sample), seed, ops, size)
        except AugmentError as error:  # an op's, not the file's: named with the sample, never skipped
            raise AugmentError(f"sample {self.index.path(sample)!r}: {error}") from error
        except NOT_A_SAMPLES_FAULT:
            raise  # the cache or the source, not this sample's file: skipping would blame sample after sample
        except Exception as error:  # any decoder's failure; the decoder's own message rarely names the file
            reason = decoder_reason(error)
            if self.pixels is None and fetch_again(self.index.location(sample), reason):
                return self._decode(sample, seed, ops, size)  # from a new copy of its shard, before it is blamed
            if self.skip_bad:
                return Skipped(self.index.path(sample), reason)
            raise BadImageError(refused_file(self.index.path(sample), reason, self.source)) from error
        if self.sample_hook is not None:  # outside the decoder's try: a hook's error is no bad file
            image = self._hooked(image, seed, self.index.path(sample))
        return image, self.index.label(sample), seed

    def _hooked(self, image, seed: int, path: str):
        """The sample hook on the crop, or on each view with the view's seed (views: a tuple)."""
        if not isinstance(image, tuple):
            return self.sample_hook.on_sample(image, seed, path)
        return tuple(self.sample_hook.on_sample(view, view_seed, path)
                     for view, view_seed in zip(image, self.transform.view_seeds(seed)))

    def __getitems__(self, batch: np.ndarray) -> list[Decoded | Missed]:
        """A whole batch per call: the DataLoader hands us the [k, 2] array from the sampler ([k, 3]
        with the batch's output size under a size schedule). The batch's flips and ops are drawn at
        once, as a sample alone would draw them (per row)."""
        batch = np.asarray(batch)
        size = output_size(batch, self.transform.size)
        ops = self.transform.sample_ops(batch[:, 1], size)
        return [self.__getitem__(pair, row, size) for pair, row in zip(batch, ops)]
