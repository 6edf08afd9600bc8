"""The DALI backend behind the Loader contract.

The pipeline is fed from the shared sampler (fastloader.order) through an external source, not by
DALI's file reader: the reader shards contiguously, rotates shards between epochs and shuffles
through a 1024-sample buffer, so it can neither replay the torch backend's order nor resume at a
batch offset. Feeding our own batches gives both backends the same samples, labels and order on
every rank, a partial last batch in eval mode (DALI takes batches of any size up to the maximum),
and a cost this backend's benchmark measures against NVIDIA's reader-based pipeline.

The loop drives the pipeline itself rather than through DALI's PyTorch iterator, whose reset
refuses an unfinished epoch (NVIDIA/DALI #1615): leaving a loop early and starting another must
work, so an abandoned epoch is ended by draining the few batches DALI prefetched.
"""
from __future__ import annotations

import collections
import itertools
import logging
import os
from typing import Iterable, Iterator

import numpy as np
import torch
from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

from fastloader.cache import CachedPixels
from fastloader.contract import Loader
from fastloader.distributed import RankInfo
from fastloader.errors import BadImageError, refused_file
from fastloader.order import seeded_uniform
from fastloader.prepared import PreparedSplit
from fastloader.samples import SampleIndex
from fastloader.schema import Config, SplitConfig

from .pipeline import build_pipeline, centre_boxes
from .probe import DecodeProbe, dali_reason
from .sizes import SizeTable
from .transcode import transcoded_for_dali

log = logging.getLogger("fastloader")

_SEED_SALT = 0xDA11


class _Feed:
    """The pipeline's source: file paths (or, from the cache, decoded pixels) and labels of the
    planned batches, one batch a call; in eval mode also each image's centre box, from its size
    (read from the file's header once per sample, or the cached pixels' shape).

    Samples found broken earlier (`known_bad`) are left out of what is fed, and `fed` keeps, in
    order, the (sample, seed) rows of each batch fed and not yet delivered: DALI calls the source
    `prefetch_queue_depth` batches ahead of the batch it delivers.
    """

    def __init__(self, index: SampleIndex, substitutes: dict[int, str], pixels: CachedPixels | None = None,
                 eval_split: SplitConfig | None = None, exif_orientation: bool = True):
        self.index = index
        self.pixels = pixels
        self.eval_split = eval_split  # eval: each batch also carries its centre boxes (centre_boxes)
        self.sizes = SizeTable(len(index), exif_orientation) if eval_split and pixels is None else None
        self.substitutes = substitutes  # sample -> a file DALI can decode in its place (transcode.py)
        self.known_bad: dict[int, str] = {}  # sample -> why DALI could not decode it
        self.skipped: list[int] = []  # known-bad samples left out since the loader last looked
        self.batches: Iterator[np.ndarray] = iter(())
        self.fed: collections.deque[np.ndarray] = collections.deque()

    def start(self, batches: Iterable[np.ndarray]) -> None:
        self.batches = iter(batches)
        self.fed.clear()

    def __call__(self) -> tuple:
        while True:
            batch = next(self.batches)  # StopIteration ends DALI's epoch
            if self.known_bad:
                bad = np.isin(batch[:, 0], list(self.known_bad))
                self.skipped += batch[bad, 0].tolist()
                batch = batch[~bad]
            if len(batch):
                break
        self.fed.append(batch)
        indices = batch[:, 0]
        if self.pixels is not None:
            data = [self.pixels.image(i) for i in indices]
        else:
            data = [np.frombuffer(os.fsencode(self.file(i)), dtype=np.uint8) for i in indices.tolist()]
        if self.eval_split is None:
            return data, self.index.labels[indices]
        if self.pixels is not None:
            sizes = self.pixels.shapes[self.pixels.rows[indices]]
        else:
            sizes = self.sizes.of(indices, self.file)
        return (data, self.index.labels[indices], *centre_boxes(sizes, self.eval_split))

    def file(self, sample: int) -> str:
        """The file DALI reads for a sample."""
        return self.substitutes.get(sample) or self.index.path(sample)


def pipeline_seed(seed: int, rank: int) -> int:
    """DALI's seed for its random operators: a function of the config's seed and the rank."""
    return int(seeded_uniform(np.array([seed]), _SEED_SALT + rank, 1)[0, 0] * (2**31 - 1))


class DaliLoader(Loader):
    backend = "dali"

    def __init__(self, config: Config, split: SplitConfig, prepared: PreparedSplit, ranks: RankInfo,
                 device: torch.device):
        super().__init__(config, split, prepared, ranks, device)
        self.flavour = "gpu" if device.type == "cuda" else "cpu"
        self.num_threads = prepared.workers
        self._bfloat16 = config.output.dtype == "bfloat16"
        substitutes = transcoded_for_dali(prepared.index, prepared.needs_substitute)
        self._feed = _Feed(prepared.index, substitutes, prepared.pixels, split if split.mode != "train" else None,
                           config.dataset.exif_orientation)
        self._pipe = self._build()
        self._epoch_open = False  # the pipeline holds batches of an epoch not yet drained
        self._run = 0  # which loop owns the pipeline
        self._broken = ""  # why the pipeline cannot run any more
        self._announce()

    def _build(self):
        return build_pipeline(
            self.config, self.split, self._feed, device_id=self.device.index if self.flavour == "gpu" else None,
            batch_size=self.split.batch_size, num_threads=self.num_threads,
            prefetch_queue_depth=self.config.workers.prefetch_factor,
            seed=pipeline_seed(self.config.seed, self.ranks.rank), cached=self._feed.pixels is not None)

    def describe(self) -> dict:
        return {**super().describe(), "flavour": self.flavour, "threads": self.num_threads}

    @property
    def prefetch_depth(self) -> int:
        """Batches this loader may hold prepared ahead of its consumer: DALI's prefetch queue
        (workers.prefetch_factor), plus the batch being assembled."""
        return self.config.workers.prefetch_factor + 1

    def _parallelism(self) -> str:
        decoder = "nvJPEG on the GPU" if self.flavour == "gpu" else "decoding on the CPU"
        return f"flavour={self.flavour!r} ({decoder}), threads={self.num_threads}"

    def _iter_batches(self, batches: list) -> Iterator[tuple[torch.Tensor, torch.Tensor, np.ndarray]]:
        if self._broken:
            raise RuntimeError(self._broken)
        self._end_epoch()
        if not batches:
            return
        self._run += 1
        run = self._run
        self._feed.start(batches)
        self._epoch_open = True
        delivered = 0
        while self._run == run:  # else a newer loop took the pipeline over
            try:
                images, labels = self._pipe.run()
            except StopIteration:
                break
            except RuntimeError as error:
                self._recover(error, delivered)
                continue
            plan = self._feed.fed.popleft()
            delivered += 1
            self._record_feed_skips()
            yield (*self._to_torch(images, labels), plan[:, 1])
        if self._run == run:
            self._record_feed_skips()
            self._end_epoch()

    def _record_feed_skips(self) -> None:
        """Known-bad samples the feed left out (it holds no reference back to the loader, so that a
        dropped loader frees its pipeline at once rather than at the next garbage collection)."""
        for sample in self._feed.skipped:
            self._skip_sample(self.index.path(sample), self._feed.known_bad[sample])
        self._feed.skipped.clear()

    def _recover(self, error: RuntimeError, number: int) -> None:
        """After DALI failed: find the files that broke it, then go on without them in a new pipeline
        (dataset.on_bad_image: skip) or stop naming them (raise). Never retries blindly, never hangs."""
        suspects = list(self._feed.fed)  # the failed batch and those DALI had started after it
        probe = DecodeProbe(self.config, self.device.index if self.flavour == "gpu" else None)
        culprits = {}
        for sample in np.concatenate(suspects)[:, 0].tolist() if suspects else []:
            problem = probe.problem(self._feed.file(sample))
            if problem:
                culprits[sample] = problem
        self._epoch_open = False
        if not culprits:
            raise self._failed(error, number, suspects[0] if suspects else np.zeros((0, 2), dtype=np.int64))
        if self.config.dataset.on_bad_image == "raise":
            first = min(culprits)
            self._broken = refused_file(self.index.path(first), culprits[first], self.config.source)
            raise BadImageError(self._broken) from error
        log.info("split '%s': the DALI pipeline failed at batch %d of epoch %d on %d files; rebuilding it "
                 "without them", self.split.name, number, self.epoch, len(culprits))
        self._feed.known_bad.update(culprits)
        rest = self._feed.batches
        self._pipe = self._build()
        self._feed.start(itertools.chain(suspects, rest))
        self._epoch_open = True

    def _failed(self, error: RuntimeError, number: int, batch: np.ndarray) -> RuntimeError:
        """DALI cannot go on after an operator fails: say where, and refuse later loops clearly."""
        files = ", ".join(self.index.path(i) for i in batch[:3, 0]) + (" ..." if len(batch) > 3 else "")
        self._broken = (f"the DALI pipeline of split '{self.split.name}' failed at batch {number} of epoch "
                        f"{self.epoch} (files {files}, or a batch DALI had started after it), and each of these "
                        f"files decodes alone. DALI says: {dali_reason(error)[:1500]}. A DALI pipeline cannot "
                        f"continue after an error: build a new loader")
        return RuntimeError(self._broken)

    def _end_epoch(self) -> None:
        """Stop feeding, drop the batches DALI prefetched (after a `break`) and rewind its epoch."""
        if not self._epoch_open:
            return
        self._feed.start(())
        while True:
            try:
                self._pipe.run()
            except StopIteration:
                break
        self._pipe.reset()
        self._epoch_open = False

    def _to_torch(self, images, labels) -> tuple[torch.Tensor, torch.Tensor]:
        """DALI's batch -> torch tensors on self.device, in the configured dtype and memory format."""
        images, labels = images.as_tensor(), labels.as_tensor()
        if self.flavour == "gpu":  # copy on the trainer's stream, as DALI's own iterator does
            stream = torch.cuda.current_stream(self.device)
            images = feed_ndarray(images, torch.empty(images.shape(), dtype=to_torch_type[images.dtype],
                                                      device=self.device), cuda_stream=stream)
            labels = feed_ndarray(labels, torch.empty(labels.shape(), dtype=torch.int64, device=self.device),
                                  cuda_stream=stream)
        else:  # DALI's executor does not reuse output buffers still referenced: no copy needed
            images, labels = torch.from_dlpack(images), torch.from_dlpack(labels)
        if self.config.output.channels_last:
            images = images.permute(0, 3, 1, 2)  # NHWC memory seen as a channels_last NCHW tensor
        if self._bfloat16:
            images = images.to(torch.bfloat16)
        return images, labels

    def _close(self) -> None:
        self._feed.start(())
        self._pipe = None  # DALI frees its threads and buffers when the pipeline is destroyed
