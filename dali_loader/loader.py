"""The DALI backend behind the Loader contract.

The pipeline is fed from the shared sampler (fastloader.order) through an external source, not by
DALI's file reader: the reader shards contiguously, rotates shards between epochs and shuffles
through a 1024-sample buffer, so it can neither replay the torch backend's order nor resume at a
batch offset. Feeding our own batches gives both backends the same samples, labels and order on
every rank, a partial last batch in eval mode (DALI takes batches of any size up to the maximum),
and a cost this backend's benchmark measures against NVIDIA's reader-based pipeline.

The loop drives the pipeline itself rather than through DALI's PyTorch iterator, whose reset
refuses an unfinished epoch (NVIDIA/DALI #1615): leaving a loop early and starting another must
work, so an abandoned epoch is ended by draining the few batches DALI prefetched. A driver thread
runs the pipeline, the feed, the hand-over to torch and the batch finisher (erasing, mixing) a batch
ahead, so that the training thread only takes finished batches (driver.py).
"""
from __future__ import annotations

import collections
import itertools
import logging
import os
import traceback
from typing import Callable, Iterable, Iterator, NamedTuple

import numpy as np
import torch
from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

from fastloader.augment.draws import Augmenter
from fastloader.cache import CachedPixels
from fastloader.contract import Loader
from fastloader.device_ops import BatchFinisher
from fastloader.distributed import RankInfo
from fastloader.errors import BadImageError, add_note, refused_file
from fastloader.prepared import PreparedSplit
from fastloader.samples import SampleIndex
from fastloader.schema import Config, SplitConfig
from fastloader.sources.reading import Location, read_bytes
from fastloader.transfer import to_device

from .augment import feed_arrays
from .driver import Driver, Ended
from .pipeline import build_pipeline, centre_boxes
from .probe import DecodeProbe, dali_reason, out_of_memory
from .sizes import SizeTable
from .transcode import transcoded_for_dali

log = logging.getLogger("fastloader")


class _Feed:
    """The pipeline's source: each planned batch as a few dense arrays, one batch a call.

    Files: the samples' paths as rows of one byte matrix and each row's length (DALI's threads read
    the files). Shard members: their bytes, one array per sample, read here (pread, off the training
    thread). The cache: the decoded pixels (one array per sample). Then, from each image's
    upright size (kept from screening, see sizes.py, or the cached pixels' shape): in eval mode its
    centre box, in train mode its crop box, flips and ops, drawn from its seed (fastloader.augment,
    as the torch backend draws them). Labels are not fed: the loader takes them from the index.
    DALI calls this on the thread that runs the pipeline (the driver thread, driver.py), where dense
    arrays cost a few numpy operations per batch rather than Python per sample.

    Samples found broken earlier (`known_bad`) are left out of what is fed, and `fed` keeps, in
    order, the (sample, seed) rows of each batch fed and not yet delivered, with the sizes its boxes
    were drawn for: DALI calls the source `prefetch_queue_depth` batches ahead of the batch it
    delivers.
    """

    def __init__(self, index: SampleIndex, split: SplitConfig, substitutes: dict[int, str],
                 pixels: CachedPixels | None = None, exif_orientation: bool = True,
                 stored_sizes: np.ndarray | None = None, augmenter: Augmenter | None = None):
        self.index = index
        self.pixels = pixels
        self.split, self.augmenter = split, augmenter
        self.sizes = SizeTable(len(index), exif_orientation, stored_sizes) if pixels is None else None
        self.substitutes = substitutes  # sample -> a file DALI can decode in its place (transcode.py)
        self.substituted = np.fromiter(substitutes, dtype=np.int64, count=len(substitutes))
        self.known_bad: dict[int, str] = {}  # sample -> why DALI could not decode it
        self.skipped: list[int] = []  # known-bad samples left out and not yet attached to a fed batch
        self.batches: Iterator[np.ndarray] = iter(())
        self.fed: collections.deque[Fed] = collections.deque()
        self.stopping = False
        self.kind = "pixels" if pixels is not None else "bytes" if index.ranges is not None else "paths"
        """What the pipeline is fed (pipeline.feed_layout): decoded pixels, encoded bytes or file paths."""

    def start(self, batches: Iterable[np.ndarray]) -> None:
        """Feed these batches next (only while no driver runs the pipeline)."""
        self.batches = iter(batches)
        self.fed.clear()
        self.skipped = []
        self.stopping = False

    def stop(self) -> None:
        """End the epoch at the next call, from any thread (a loop left with `break`, close)."""
        self.stopping = True

    def __call__(self) -> tuple:
        while True:
            batch = None if self.stopping else next(self.batches, None)
            if batch is None:
                raise StopIteration  # ends DALI's epoch
            if self.known_bad:
                bad = np.isin(batch[:, 0], list(self.known_bad))
                self.skipped += batch[bad, 0].tolist()
                batch = batch[~bad]
            if len(batch) and self.kind == "bytes":
                batch, encoded = self.read_members(batch)
            if len(batch):
                break
        indices = batch[:, 0]
        if self.pixels is not None:
            data = ([self.pixels.image(i) for i in indices],)
            sizes = self.pixels.shapes[self.pixels.rows[indices]]
        elif self.kind == "bytes":
            data = (encoded,)
            sizes = self.sizes.of(indices, self.location)
        else:
            data = self.path_rows(indices)
            sizes = self.sizes.of(indices, self.location)
        if self.split.mode == "train":  # every random choice of each sample, drawn from its seed
            data += feed_arrays(self.augmenter, batch[:, 1], sizes)
        else:
            data += (centre_boxes(sizes, self.split),)
        self.fed.append(Fed(batch, sizes, self.skipped))
        self.skipped = []
        return data

    def read_members(self, batch: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """The batch's shard members' bytes; a member that cannot be read (its shard cut short or
        gone since it was indexed) is left out as known-bad, with the reason, like a file that broke
        the pipeline."""
        kept, encoded = [], []
        for row, sample in enumerate(batch[:, 0].tolist()):
            try:
                encoded.append(np.frombuffer(read_bytes(self.location(sample)), dtype=np.uint8))
                kept.append(row)
            except OSError as error:
                self.known_bad[sample] = f"unreadable: {error.strerror or error}"
                self.skipped.append(sample)
        return batch[kept], encoded

    def path_rows(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The files DALI reads for these samples: (uint8 [n, width] paths, int32 [n, 1] lengths)."""
        if not len(self.substituted) or not np.isin(indices, self.substituted).any():
            return self.index.path_rows(indices)
        paths = [os.fsencode(self.location(sample).file) for sample in indices.tolist()]  # a batch with a GIF: rare
        rows = np.zeros((len(paths), max(map(len, paths))), dtype=np.uint8)
        for row, path in zip(rows, paths):
            row[:len(path)] = np.frombuffer(path, dtype=np.uint8)
        return rows, np.array([[len(path)] for path in paths], dtype=np.int32)

    def location(self, sample: int) -> Location:
        """Where the bytes DALI decodes for a sample are: its file or shard member, or a substitute."""
        substitute = self.substitutes.get(sample)
        return Location(substitute, substitute) if substitute else self.index.location(sample)

    def check_sizes(self, fed: Fed, decoded) -> None:
        """Each image's size as DALI decoded it against the size its box came from. A file changed
        since it was screened got a box for its old size in this batch: name it, and keep its new
        size for the next epochs."""
        sizes = np.asarray(decoded.as_tensor())[:, :2]
        changed = np.flatnonzero((sizes != fed.sizes).any(axis=1))
        for row in changed.tolist():
            sample = int(fed.plan[row, 0])
            _warn_resized(self.location(sample).name, tuple(fed.sizes[row]), tuple(sizes[row]), "in this batch")
            self.sizes.correct(sample, tuple(sizes[row]))

    def reread_sizes(self, samples: np.ndarray) -> int:
        """After the pipeline failed: read these files' headers again. A file rewritten at another
        size since it was screened got a crop out of its bounds: name it, keep its new size (its
        batch, fed again, gets a crop drawn for it); how many there were."""
        if self.sizes is None:
            return 0
        changed = 0
        for sample in np.unique(samples).tolist():
            sizes = self.sizes.reread(sample, self.location(sample))
            if sizes is not None:
                _warn_resized(self.location(sample).name, *sizes, "when it failed the pipeline")
                changed += 1
        return changed


def _warn_resized(path: str, held: tuple[int, int], now: tuple[int, int], when: str) -> None:
    log.warning("%s changed since it was screened: it decodes to %dx%d (height x width), the screening result "
                "said %dx%d, so its crop %s came from the old size; it is corrected from now on (the screening "
                "result is renewed when the dataset's files are added, removed or renamed)", path, *now, *held, when)


class Fed(NamedTuple):
    """A batch handed to the pipeline: its (sample, seed) rows; the upright (height, width) its crop
    or centre boxes were drawn for; the known-bad samples left out just before it."""
    plan: np.ndarray
    sizes: np.ndarray
    skipped: list[int]


def converter(feed: _Feed, labels: np.ndarray, device: torch.device, channels_last: bool,
              bfloat16: bool, finisher: BatchFinisher | None) -> Callable:
    """The driver thread's work on each pipeline output: (images, labels, Fed) as torch tensors on
    `device`, in the configured dtype and memory format, finished (erasing, mixing, soft targets)
    there rather than on the training thread. A function of these values, not of the loader, so
    that the driver thread does not keep a dropped loader alive.

    The GPU flavour copies its images once where DLPack could share them. DALI documents that the
    default (dynamic) executor's outputs may be kept indefinitely and that `__dlpack__(stream)` makes
    the stream given there wait for them (its own PyTorch iterator shares them so). That stream would
    be the driver's; once the torch tensor dies the buffer goes back to DALI, which knows nothing of
    the trainer's stream, where kernels reading it may still be queued (torch's `record_stream`
    covers only its own allocator's blocks). One device copy into torch's allocator (some 0.1 ms for
    256 x 3 x 224 x 224 float32 at an H100's 3 TB/s) makes the lifetime torch's. DALI orders its
    buffer's reuse after a non-blocking copy (`copy_to_external`), so the driver lets the output go
    right after the hand-over."""
    def convert(outputs) -> tuple[torch.Tensor, torch.Tensor, Fed]:
        images, *decoded_sizes = outputs
        fed = feed.fed.popleft()
        if decoded_sizes:
            feed.check_sizes(fed, decoded_sizes[0])
        images = images.as_tensor()
        if device.type == "cuda":  # on the driver's stream; a copy, not DLPack: see above
            stream = torch.cuda.current_stream(device)
            images = feed_ndarray(images, torch.empty(images.shape(), dtype=to_torch_type[images.dtype],
                                                      device=device), cuda_stream=stream)
        else:  # DALI's executor does not reuse output buffers still referenced: no copy needed
            images = torch.from_dlpack(images)
        if channels_last:
            images = images.permute(0, 3, 1, 2)  # NHWC memory seen as a channels_last NCHW tensor
        if bfloat16:
            images = images.to(torch.bfloat16)
        batch_labels = to_device(torch.from_numpy(labels[fed.plan[:, 0]]), device)
        if finisher is not None:
            images, batch_labels = finisher(images, batch_labels, fed.plan[:, 1])
        return images, batch_labels, fed
    return convert


class DaliLoader(Loader):
    backend = "dali"

    def __init__(self, config: Config, split: SplitConfig, prepared: PreparedSplit, ranks: RankInfo,
                 device: torch.device):
        super().__init__(config, split, prepared, ranks, device)
        self.flavour = "gpu" if device.type == "cuda" else "cpu"
        self.num_threads = prepared.workers
        self._bfloat16 = config.output.dtype == "bfloat16"
        substitutes = transcoded_for_dali(prepared.index, prepared.needs_substitute)
        self._feed = _Feed(prepared.index, split, substitutes, prepared.pixels, config.dataset.exif_orientation,
                           prepared.sizes, self.augmentation)
        self._pipe = self._build()
        self._pid = os.getpid()  # a forked child cannot run the pipeline: DALI's threads stay here
        self._stream = torch.cuda.Stream(device) if self.flavour == "gpu" else None
        """The driver's side stream, one for the loader's life: a new stream per epoch would strand
        the caching allocator's blocks cached on the old ones."""
        self._epoch_open = False  # the pipeline holds batches of an epoch not yet drained
        self._driver: Driver | None = None  # the thread running the pipeline during an epoch
        self._run = 0  # which loop owns the pipeline
        self._broken = ""  # why the pipeline cannot run any more
        self._announce()

    def _build(self):
        return build_pipeline(
            self.config, self.split, self._feed, device_id=self.device.index if self.flavour == "gpu" else None,
            batch_size=self.split.batch_size, num_threads=self.num_threads,
            prefetch_queue_depth=self.config.workers.prefetch_factor,
            seed=self.config.seed, feed=self._feed.kind,
            check_sizes=self._feed.sizes is not None, augmenter=self.augmentation)

    def describe(self) -> dict:
        return {**super().describe(), "flavour": self.flavour, "threads": self.num_threads}

    @property
    def prefetch_depth(self) -> int:
        """Batches this loader may hold prepared ahead of its consumer: DALI's prefetch queue
        (workers.prefetch_factor), the batch being assembled, and the one the driver thread holds
        converted for the trainer."""
        return self.config.workers.prefetch_factor + 2

    def _parallelism(self) -> str:
        decoder = "nvJPEG on the GPU" if self.flavour == "gpu" else "decoding on the CPU"
        return f"flavour={self.flavour!r} ({decoder}), threads={self.num_threads}"

    def _iter_batches(self, batches: list) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._broken:
            raise RuntimeError(self._broken)
        if os.getpid() != self._pid:
            raise RuntimeError(f"this DALI loader of split '{self.split.name}' was built in process {self._pid} and "
                               f"inherited by this forked one, where DALI's threads do not run: build a new loader "
                               f"here (fastloader.build_loader)")
        self._end_epoch()
        if not batches:
            return
        self._run += 1
        run = self._run
        self._feed.start(batches)
        self._epoch_open = True
        self._driver = self._drive()
        delivered = 0
        while self._run == run:  # else a newer loop took the pipeline over, or the loader closed
            item = self._driver.get()
            if isinstance(item, Ended):
                self._driver = None
                if self._closed:  # from another thread, or a finalizer on the driver's
                    raise self._closed_error()
                if item.error is None:
                    break
                if not (item.in_pipeline and isinstance(item.error, RuntimeError) and not out_of_memory(item.error)):
                    raise self._stopped(item.error)
                self._recover(item.error, delivered)
                self._driver = self._drive()
                continue
            delivered += 1
            self._record_skips(item.fed.skipped)
            yield item.images, item.labels
        if self._run == run:
            self._record_skips(self._feed.skipped)
            self._end_epoch()
        elif self._closed:
            raise self._closed_error()

    def _drive(self) -> Driver:
        """A driver thread running the pipeline over the feed's batches (see driver.py)."""
        convert = converter(self._feed, self.index.labels, self.device, self.config.output.channels_last,
                            self._bfloat16, self.finisher)
        return Driver(self._pipe, convert, self._feed.stop, self.device, self._stream)

    def _stopped(self, error: BaseException) -> BaseException:
        """A failure no bad file explains (a CUDA error, running out of memory, an error of the
        hand-over or the finisher, or one that is not DALI's) ends the loader: the pipeline's epoch
        is in no known state, so it is let go and later loops are refused. The error itself goes to
        the trainer, unchanged (out of memory: with a note on what to lower)."""
        self._epoch_open = False
        self._pipe = None
        self._broken = (f"the DALI loader of split '{self.split.name}' stopped on {type(error).__name__}: "
                        f"{str(error)[:500]}; build a new loader")
        if out_of_memory(error):
            add_note(error, self._memory_hint())
        return error

    def _memory_hint(self) -> str:
        """What to lower when a batch does not fit, with the device's memory where it can be read."""
        figures = ""
        if self.flavour == "gpu":
            try:
                free, total = torch.cuda.mem_get_info(self.device)
                held = torch.cuda.memory_reserved(self.device)
                figures = (f" ({free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB on {self.device}, "
                           f"{held / 2**30:.1f} GiB of it held by torch)")
            except Exception:  # noqa: BLE001 - the figures are a courtesy; a broken context may not give them
                pass
        name = self.split.name
        return (f"fastloader: the DALI loader of split '{name}' ran out of memory{figures}. Lower {name}.batch_size "
                f"(now {self.split.batch_size}) or dali.threads (now {self.num_threads}; on the GPU each DALI thread "
                f"keeps nvJPEG buffers of its own) in {self.config.source}")

    def _record_skips(self, samples: list[int]) -> None:
        """Known-bad samples the feed left out (it holds no reference back to the loader, so that a
        dropped loader frees its pipeline at once rather than at the next garbage collection)."""
        for sample in samples:
            path, reason = self.index.path(sample), self._feed.known_bad[sample]
            if self.config.dataset.on_bad_image == "raise":  # found by the feed (a shard member cut short)
                self._broken = refused_file(path, reason, self.config.source)
                self._end_epoch()  # the driver stops; the pipeline rewinds
                raise BadImageError(self._broken)
            self._skip_sample(path, reason)

    def _recover(self, error: RuntimeError, number: int) -> None:
        """After DALI failed: find the files that broke it, then go on without them in a new pipeline
        (dataset.on_bad_image: skip) or stop naming them (raise). Never retries blindly, never hangs.
        The failed pipeline goes first, so that its buffers are free before the probe's and the new
        pipeline's are taken (on a GPU, nvJPEG's)."""
        fed = list(self._feed.fed)  # the failed batch and those DALI had started after it
        for batch in fed:
            self._record_skips(batch.skipped)  # left out before the failure, not reported yet
        self._epoch_open = False
        traceback.clear_frames(error.__traceback__)  # the driver's frames in it hold the failed pipeline
        self._pipe = None  # freed now, with its buffers, before the probe and the new pipeline take theirs
        suspects = [batch.plan for batch in fed]
        samples = np.concatenate(suspects)[:, 0] if suspects else np.zeros(0, dtype=np.int64)
        resized = self._feed.reread_sizes(samples)
        probe = DecodeProbe(self.config, self.device.index if self.flavour == "gpu" else None, self.split.batch_size,
                            self._regions if self.split.mode == "train" and self._feed.sizes is not None else None)
        try:
            culprits = probe.culprits(suspects, self._feed.location)
        except BaseException as failure:  # out of memory, say: no file to blame, no pipeline left
            raise self._stopped(failure) from error
        del probe  # its pipeline goes before the new one is built
        if not culprits and not resized:
            raise self._failed(error, number, suspects[0] if suspects else np.zeros((0, 2), dtype=np.int64))
        if culprits and self.config.dataset.on_bad_image == "raise":
            first = min(culprits)
            self._broken = refused_file(self.index.path(first), culprits[first], self.config.source)
            raise BadImageError(self._broken) from error
        log.info("split '%s': the DALI pipeline failed at batch %d of epoch %d on %d files that cannot be decoded "
                 "and %d that changed size since screening; rebuilding it without the former", self.split.name,
                 number, self.epoch, len(culprits), resized)
        self._feed.known_bad.update(culprits)
        rest = self._feed.batches
        self._pipe = self._build()
        self._feed.start(itertools.chain(suspects, rest))
        self._epoch_open = True

    def _regions(self, plan: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Train: the crop regions (anchor, shape) the feed draws for these (sample, seed) rows from
        the sizes it holds now, which the probe decodes as the train graph does."""
        sizes = self._feed.sizes.of(plan[:, 0], self._feed.location)
        anchor, shape = feed_arrays(self.augmentation, plan[:, 1], sizes)[:2]
        return anchor, shape

    def _failed(self, error: RuntimeError, number: int, batch: np.ndarray) -> RuntimeError:
        """DALI cannot go on after an operator fails: say where, and refuse later loops clearly."""
        files = ", ".join(self.index.path(i) for i in batch[:3, 0]) + (" ..." if len(batch) > 3 else "")
        self._broken = (f"the DALI pipeline of split '{self.split.name}' failed at batch {number} of epoch "
                        f"{self.epoch} (files {files}, or a batch DALI had started after it), and these files "
                        f"decode, in their batches as the pipeline decodes them and alone. DALI says: "
                        f"{dali_reason(error)[:1500]}. A DALI pipeline cannot continue after an error: build a "
                        f"new loader")
        return RuntimeError(self._broken)

    def _end_epoch(self) -> None:
        """Stop feeding, drop the batches DALI prefetched (after a `break`) and rewind its epoch."""
        if not self._epoch_open:
            return
        self._epoch_open = False
        driver, self._driver = self._driver, None
        if driver is not None:
            try:
                driver.end_epoch()  # an error now belongs to an epoch nobody reads any more
            except RuntimeError as error:  # stuck inside DALI: the pipeline cannot be reset under it
                self._broken, self._pipe = str(error), None
                raise
        self._pipe.reset()

    def _close(self) -> None:
        self._let_go(wait=True)

    def _drop(self) -> None:
        self._let_go(wait=False)

    def _let_go(self, wait: bool) -> None:
        """Stop the driver and free the pipeline: DALI frees its threads and buffers when the
        pipeline is destroyed, here or, when the driver thread still holds it, as that thread ends.
        `wait`: for that thread, where it can end meanwhile (driver.py); never from a finalizer."""
        self._run += 1  # a loop still open ends (loops check it), and says the loader is closed
        self._epoch_open = False
        driver, self._driver, self._pipe = self._driver, None, None
        if driver is not None:
            driver.close(wait)
