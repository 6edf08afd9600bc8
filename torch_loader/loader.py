"""The torch backend: DataLoader workers decode to uint8, fast_collate stacks, the prefetcher
copies and normalizes on the device. Wired into the shared Loader contract.
"""
from __future__ import annotations

import logging
from typing import Iterator

import torch
import torch.utils.data

from fastloader.config import Config, SplitConfig
from fastloader.contract import Loader
from fastloader.device_ops import erasing_enabled, random_erasing
from fastloader.distributed import RankInfo, cpu_workers_per_rank
from fastloader.cache import CachedPixels
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
        transform = SampleTransform(split, exif_orientation=config.dataset.exif_orientation)
        self._normalizer = Normalizer(config.normalize, config.output, device)
        self._erasing = erasing_enabled(split.transform, split.mode)
        on_cuda = device.type == "cuda"
        self._dataloader = torch.utils.data.DataLoader(
            ImageDataset(index, transform, pixels),
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
        if self.device.type == "cuda":  # workers give uint8; the GPU normalizes on a side stream
            normalized = prefetch_to_cuda(iter(self._dataloader), self._normalizer)
        else:
            normalized = iter(self._dataloader)  # workers normalized already (NormalizingCollate)
        if not self._erasing:
            return normalized
        return ((random_erasing(images, batch[:, 1], self.split.transform), labels)
                for (images, labels), batch in zip(normalized, batches))

    def _close(self) -> None:
        iterator = getattr(self._dataloader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        self._dataloader = None
