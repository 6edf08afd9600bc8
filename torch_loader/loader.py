"""The torch backend: DataLoader workers decode to uint8, fast_collate stacks, the prefetcher
copies and normalizes on the device. Wired into the shared Loader contract.
"""
from __future__ import annotations

import logging
from typing import Iterator

import numpy as np
import torch
import torch.utils.data

from fastloader.config import Config, SplitConfig
from fastloader.contract import Loader
from fastloader.device_ops import erasing_enabled, random_erasing
from fastloader.distributed import RankInfo, cpu_workers_per_rank
from fastloader.cache import CachedPixels
from fastloader.index_screen import BadImageError
from fastloader.samples import SampleIndex

from .collate import NormalizingCollate, fast_collate
from .dataset import ImageDataset
from .prefetch import Normalizer, prefetch_to_cuda
from .transforms import SampleTransform

log = logging.getLogger("fastloader")


class _EpochBatches(torch.utils.data.Sampler):
    """The DataLoader's batch sampler: replays whatever batches the Loader planned for this epoch."""

    def __init__(self):
        self.batches: list = []

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class TorchLoader(Loader):
    backend = "torch"

    def __init__(self, config: Config, split: SplitConfig, index: SampleIndex, ranks: RankInfo,
                 device: torch.device, pixels: CachedPixels | None = None):
        super().__init__(config, split, index, ranks, device)
        workers = config.workers
        num_workers = workers.num_workers
        if num_workers == "auto":
            num_workers = cpu_workers_per_rank(ranks, workers.max_workers)
        pin = device.type == "cuda" if workers.pin_memory == "auto" else workers.pin_memory
        self.num_workers = num_workers
        self._sampler = _EpochBatches()
        transform = SampleTransform(split, exif_orientation=config.dataset.exif_orientation,
                                    max_pixels=config.dataset.max_pixels)
        self._normalizer = Normalizer(config.normalize, config.output, device)
        self._erasing = erasing_enabled(split.transform, split.mode)
        on_cuda = device.type == "cuda"
        self._dataloader = torch.utils.data.DataLoader(
            ImageDataset(index, transform, pixels, skip_bad=config.dataset.on_bad_image == "skip",
                         source=config.source),
            batch_sampler=self._sampler,
            collate_fn=fast_collate if on_cuda else NormalizingCollate(self._normalizer),
            num_workers=num_workers,
            pin_memory=pin and torch.cuda.is_available(),
            persistent_workers=workers.persistent and num_workers > 0,
            prefetch_factor=workers.prefetch_factor if num_workers > 0 else None,
        )
        log.info("torch loader for split '%s': %d samples, %d batches/epoch on rank %d/%d (%s), %d workers, "
                 "device %s, pixels from %s", split.name, len(index), len(self), ranks.rank, ranks.world_size,
                 ranks.source, num_workers, device, "the cache" if pixels is not None else "the image files")

    def describe(self) -> dict:
        return {**super().describe(), "workers": self.num_workers}

    def _iter_batches(self, batches: list) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if not batches:
            return iter(())
        self._sampler.batches = batches
        delivered = self._drop_skipped(self._from_workers(), batches)
        if self.device.type == "cuda":  # workers give uint8; the GPU normalizes on a side stream
            delivered = prefetch_to_cuda(delivered, self._normalizer)
        # on the CPU the workers normalized already (NormalizingCollate)
        if not self._erasing:
            return ((images, labels) for images, labels, _ in delivered)
        return ((random_erasing(images, seeds, self.split.transform), labels) for images, labels, seeds in delivered)

    def _from_workers(self) -> Iterator:
        """The DataLoader's batches; a worker that died becomes an error that says so, not a hang."""
        batches = iter(self._dataloader)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except RuntimeError as error:
                if isinstance(error, BadImageError) or "DataLoader worker (pid" not in str(error):
                    raise
                self._drop_workers()  # the next loop starts new ones
                raise RuntimeError(
                    f"a decoding worker of the torch loader for split '{self.split.name}' died: {error}. Killed by "
                    f"signal 9 (SIGKILL) most often means the kernel's out-of-memory killer (see `dmesg`): lower "
                    f"workers.num_workers or workers.prefetch_factor. A segmentation fault (signal 11) is a crash in "
                    f"a native decoder: `fastloader check CONFIG --deep` finds the file that causes it") from error
            yield batch

    def _drop_skipped(self, batches: Iterator, planned: list) -> Iterator:
        """(images, labels, seeds of the delivered samples), recording every skipped sample; a batch
        whose samples were all skipped is left out (logged)."""
        for (images, labels, skipped), plan in zip(batches, planned):
            seeds = plan[:, 1]
            if skipped:
                keep = np.ones(len(plan), dtype=bool)
                for position, record in skipped:
                    keep[position] = False
                    self._skip_sample(record.path, record.reason)
                seeds = seeds[keep]
            if images is None:
                log.warning("split '%s', epoch %d: a batch of %d samples was left out: none of its files can be "
                            "decoded", self.split.name, self.epoch, len(plan))
                continue
            yield images, labels, seeds

    def _drop_workers(self) -> None:
        iterator = getattr(self._dataloader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        if self._dataloader is not None:
            self._dataloader._iterator = None

    def _close(self) -> None:
        self._drop_workers()
        self._dataloader = None
