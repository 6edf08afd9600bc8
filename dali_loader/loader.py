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
import time
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
from fastloader.errors import BadImageError, add_note, error_text, refused_file
from fastloader.imaging.screen import DALI_FORMATS, Screened, read_screened
from fastloader.order import WeightedDraws, output_size, substitutes
from fastloader.prepared import PreparedSplit
from fastloader.samples import SampleIndex
from fastloader.schema import BOMB_PIXELS, Config, SplitConfig
from fastloader.sources.locations import Location, ReadArena
from fastloader.transfer import to_device
from fastloader.views import ViewPlan

from .augment import feed_arrays
from .driver import Driver, Ended
from .pipeline import build_pipeline, centre_boxes, decoder_words
from .probe import DecodeProbe, dali_reason, out_of_memory
from .sizes import SizeTable
from .transcode import transcoded_for_dali
from .user_ops import PythonSampleHook, UserOps, graph_size_check, hook_inputs
from .views import HostBuffers, join_views, view_arrays

log = logging.getLogger("fastloader")


class _Feed:
    """The pipeline's source: each planned batch's samples and their draws, one batch a call.

    Image files and shard members: their bytes, read here (one read per sample, off the training
    thread) and checked before DALI sees them (fastloader.imaging.screen.read_screened: the magic
    bytes, the header's size against dataset.max_pixels, the end marker), whether or not the split
    was screened: a file that is no image, a bomb or truncated would crash or exhaust DALI's
    decoder, and one changed since it was screened gets its crop or box drawn for its size now.
    What DALI decodes is exactly what was checked. The cache: the decoded pixels (one array per
    sample). Then, from each image's upright size: in eval mode its centre box, in train mode its
    crop box, flips and ops, drawn from its seed (fastloader.augment, as the torch backend draws
    them). Labels are not fed: the loader takes them from the index. DALI calls this on the thread
    that runs the pipeline (the driver thread, driver.py).

    A sample that cannot be used (found here, or `known_bad` from earlier) is left out of what is
    fed; in train mode its slot takes the first substitute of `fastloader.order.substitutes` that
    can be, as the torch backend's workers do. `fed` keeps, in order, the batches fed and not yet
    delivered (DALI calls the source `prefetch_queue_depth` batches ahead of the batch it delivers),
    each with the planned batches before it that came out empty (DALI takes no empty batch).
    """

    def __init__(self, index: SampleIndex, split: SplitConfig, substitutes: dict[int, str],
                 pixels: CachedPixels | None = None, exif_orientation: bool = True,
                 stored_sizes: np.ndarray | None = None, augmenter: Augmenter | None = None,
                 max_pixels: int = BOMB_PIXELS, refill: bool = False, sized: bool = False,
                 draws: WeightedDraws | None = None, hooked: bool = False, views: ViewPlan | None = None,
                 in_flight: int = 2):
        self.index = index
        self.views = views
        """A train split's view groups: every view's draws are fed (views.view_arrays)."""
        self.hooked = hooked
        """The graph runs the user's sample hook or graph function: each batch's (sample, seed) rows are fed."""
        self.draws = draws
        """The split's weighted draws, if any: a refilled slot's substitutes are drawn by them."""
        self.sized = sized
        """The planned batches carry their output size (a size schedule): fed with the draws."""
        self.pixels = pixels
        self.split, self.augmenter = split, augmenter
        self.max_pixels, self.refill = max_pixels, refill
        self.sizes = SizeTable(len(index), exif_orientation, stored_sizes) if pixels is None else None
        self.substitutes = substitutes  # sample -> a file DALI can decode in its place (transcode.py)
        self.known_bad: dict[int, str] = {}  # sample -> why it cannot be fed or decoded
        self.skipped: list[int] = []  # known-bad samples left out and not yet attached to a fed batch
        self.empty: list[np.ndarray] = []  # planned batches left empty, not yet attached to a fed batch
        self.batches: Iterator[np.ndarray] = iter(())
        self.fed: collections.deque[Fed] = collections.deque()
        self.stopping = False
        self.arenas = collections.deque(ReadArena() for _ in range(in_flight + 1))
        """Where the batches' bytes are read, one arena a batch in turn. DALI reads what a call returns
        where it lies (external_source's no_copy) until the batch's outputs are out, `in_flight`
        (the pipeline's prefetch_queue_depth) calls later: a batch's arena is reused only after
        that, and the arrays a call returns are held as long (`held`)."""
        self.held: collections.deque[tuple] = collections.deque(maxlen=in_flight + 1)
        self.kind = "pixels" if pixels is not None else "bytes"
        """What the pipeline is fed (pipeline.feed_layout): decoded pixels or encoded bytes."""
        self.busy: tuple[str, str, float] | None = None
        """(doing, on what, monotonic start) of what the loader's own code does now inside the pipeline
        (reading a sample, running a user's hook): what a stalled pipeline names. Words built only
        when a stall is reported: the read path sets it for every sample."""

    def start(self, batches: Iterable[np.ndarray]) -> None:
        """Feed these batches next (only while no driver runs the pipeline)."""
        self.batches = iter(batches)
        self.fed.clear()
        self.skipped, self.empty = [], []
        self.stopping = False

    def new_arenas(self) -> None:
        """Read the next batches into new memory: after a pipeline failed, the memory it was given
        is left to it, whatever of it DALI's threads may still read while it is torn down."""
        self.arenas = collections.deque(ReadArena() for _ in self.arenas)

    def stop(self) -> None:
        """End the epoch at the next call, from any thread (a loop left with `break`, close)."""
        self.stopping = True

    def unfinished(self) -> list[np.ndarray]:
        """The batches fed and not delivered, with those left empty before them, in order: what a
        new pipeline is fed again after this one failed."""
        return [*itertools.chain.from_iterable((*fed.empty, fed.plan) for fed in self.fed), *self.empty]

    def __call__(self) -> tuple:
        while True:
            planned = None if self.stopping else next(self.batches, None)
            if planned is None:
                raise StopIteration  # ends DALI's epoch
            batch, data, sizes = self.take_batch(planned)
            if len(batch):
                break
            self.empty.append(planned)
        if self.views is not None:  # every view's draws, from the view's seed (hooked: its (sample, seed) too)
            data += view_arrays(self.views, batch, sizes, self.hooked)
        elif self.split.mode == "train":  # every random choice of each sample, drawn from its seed
            side = output_size(planned, self.split.transform.size) if self.sized else None
            data += feed_arrays(self.augmenter, batch[:, 1], sizes, side)
        else:
            data += (centre_boxes(sizes, self.split),)
        if self.hooked and self.views is None:  # user_ops.HOOK_INPUTS
            data += (np.ascontiguousarray(batch[:, :2], dtype=np.int64),)
        self.fed.append(Fed(batch, self.skipped, self.empty))
        self.skipped, self.empty = [], []
        self.held.append(data)  # DALI neither copies them (no_copy) nor keeps them alive: held until the batch is out
        return data

    def take_batch(self, planned: np.ndarray) -> tuple[np.ndarray, tuple[list[np.ndarray]], np.ndarray]:
        """(the (sample, seed) rows fed, (their data,), int64 [n, 2] upright sizes): the planned rows
        that can be used, a train slot that cannot refilled by a substitute."""
        batch, rows, data, sizes = planned, [], [], []
        self.arenas.rotate(-1)
        arena = self.arenas[0]  # the batch fed `in_flight + 1` calls ago is out of the pipeline
        arena.reset()
        locations = self.locations(planned[:, 0]) if self.pixels is None else itertools.repeat(None)
        for row, (sample, location) in enumerate(zip(planned[:, 0].tolist(), locations)):
            taken = self.take(sample, arena, location)
            if taken is None and self.refill:
                sample, taken = self.substitute(int(planned[row, 1]), arena)
                if taken is not None:  # the substitute keeps the slot's seed
                    batch = batch.copy() if batch is planned else batch
                    batch[row, 0] = sample
            if taken is not None:
                rows.append(row)
                data.append(taken[0])
                sizes.append(taken[1])
        return batch[rows], (data,), np.array(sizes, dtype=np.int64).reshape(-1, 2)

    def substitute(self, seed: int, into: ReadArena | None = None
                   ) -> tuple[int, tuple[np.ndarray, tuple[int, int]] | None]:
        """The first substitute for a train slot of this seed that can be fed, and what `take` gave
        for it; (-1, None) where none can."""
        for sample in substitutes(seed, len(self.index), self.draws):
            taken = self.take(sample, into)
            if taken is not None:
                return sample, taken
        return -1, None

    def stuck_words(self) -> str:
        """What the feed is doing, for a pipeline that sent no batch for workers.timeout."""
        busy = self.busy
        if busy is None:
            return "the feed is not reading a sample: DALI is stuck in a batch (a file on a hung file system?)"
        return f"the loader has been {busy[0]} {busy[1]} for {time.monotonic() - busy[2]:.0f} s"

    def take(self, sample: int, into: ReadArena | None = None, location: Location | None = None
             ) -> tuple[np.ndarray, tuple[int, int]] | None:
        """What DALI is fed for a sample, and its upright size; None, noted in `skipped`, where it
        cannot be used: known bad, or its bytes fail the check now (then known bad, with the reason).
        `into`: the arena the bytes are read into (valid until the next batch); `location`: the
        sample's, where the batch's were looked up together (`locations`)."""
        if sample in self.known_bad:
            self.skipped.append(sample)
            return None
        if self.pixels is not None:
            return self.pixels.image(sample), tuple(self.pixels.shapes[self.pixels.rows[sample]].tolist())
        location = location or self.location(sample)
        self.busy = "reading", location.name, time.monotonic()
        data, screened = read_screened(location, self.max_pixels, into)
        self.busy = None
        if screened.problem is None and screened.format not in DALI_FORMATS:  # a GIF of a split not screened
            data, screened = self.transcoded(sample, screened.format or "unknown")
        if screened.problem:
            self.known_bad[sample] = screened.problem
            self.skipped.append(sample)
            return None
        size = self.sizes.keep(sample, screened)
        if size.held is not None:
            _warn_resized(screened.path, size.held, size.now)
        return np.frombuffer(data, dtype=np.uint8), size.now

    def transcoded(self, sample: int, fmt: str) -> tuple[bytearray | None, Screened]:
        """The bytes of a PNG copy of a file in a format DALI cannot decode (transcode.py), checked."""
        try:
            self.substitutes.update(transcoded_for_dali(self.index, {sample: fmt}))
        except Exception as error:  # Pillow could not decode the file either
            return None, Screened(self.index.path(sample), problem=f"cannot be converted for DALI: {error_text(error)}")
        return read_screened(self.location(sample), self.max_pixels)

    def locations(self, samples: np.ndarray) -> list[Location]:
        """`location` of each of a batch's samples, looked up together."""
        found = self.index.locations(samples)
        if self.substitutes:
            found = [self.location(sample) if sample in self.substitutes else location
                     for sample, location in zip(samples.tolist(), found)]
        return found

    def location(self, sample: int) -> Location:
        """Where the bytes DALI decodes for a sample are: its file or shard member, or a substitute."""
        substitute = self.substitutes.get(sample)
        return Location(substitute, substitute) if substitute else self.index.location(sample)


def _warn_resized(path: str, held: tuple[int, int], now: tuple[int, int]) -> None:
    log.warning("%s changed since it was screened: it is %dx%d (height x width) now, the screening result said "
                "%dx%d; its crop or box is drawn for its size now, read from the bytes DALI decodes", path, *now, *held)


class Fed(NamedTuple):
    """A batch handed to the pipeline: its (sample, seed) rows (a substitute in a refilled slot);
    the known-bad samples left out just before it; the planned batches just before it that came out
    empty (none of their samples could be fed)."""
    plan: np.ndarray
    skipped: list[int]
    empty: list[np.ndarray]


def converter(feed: _Feed, labels: np.ndarray, device: torch.device, channels_last: bool,
              bfloat16: bool, finisher: BatchFinisher | None, check: Callable | None = None,
              views: ViewPlan | None = None, buffers: HostBuffers | None = None) -> Callable:
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
    right after the hand-over. `check(sizes, plan)`: a graph function's outputs' (height, width)
    checked. `views`: the outputs are a batch's views, joined into one tensor per view group
    (views.join_views; on the host into `buffers`)."""
    hook = getattr(finisher, "hook", None)  # the user's batch hook, named where a pipeline stalls in it

    def to_torch(images) -> torch.Tensor:
        if device.type == "cuda":  # on the driver's stream; a copy, not DLPack: see above
            stream = torch.cuda.current_stream(device)
            images = feed_ndarray(images, torch.empty(images.shape(), dtype=to_torch_type[images.dtype],
                                                      device=device), cuda_stream=stream)
        else:  # DALI's executor does not reuse output buffers still referenced: no copy needed
            images = torch.from_dlpack(images)
        return layout(images)

    def layout(images: torch.Tensor) -> torch.Tensor:
        if channels_last:
            images = images.permute(0, 3, 1, 2)  # NHWC memory seen as a channels_last NCHW tensor
        return images.to(torch.bfloat16) if bfloat16 else images

    def convert(outputs) -> tuple[torch.Tensor | list[torch.Tensor], torch.Tensor, Fed]:
        fed = feed.fed.popleft()
        tensors = [output.as_tensor() for output in outputs]
        if check is not None:  # each output's (height, width), before anything is copied
            check([tuple(t.shape()[1:3] if channels_last else t.shape()[2:4]) for t in tensors], fed.plan)
        if views is not None:  # each view copied once, into its rows of its group's tensor
            stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
            images = [layout(group) for group in join_views(views, tensors, device, stream, buffers)]
        else:
            images = to_torch(tensors[0])
        batch_labels = to_device(torch.from_numpy(labels[fed.plan[:, 0]]), device)
        if finisher is not None:
            if hook is not None:
                feed.busy = f"running {hook.label} on", f"a batch of {len(fed.plan)}", time.monotonic()
            images, batch_labels = finisher(images, batch_labels, fed.plan[:, 1])
            feed.busy = None
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
                           prepared.sizes, self.augmentation, config.dataset.max_pixels,
                           refill=split.mode == "train" and config.dataset.on_bad_image == "skip",
                           sized=self.order.resolution is not None, draws=prepared.draws,
                           hooked=bool(hook_inputs(prepared.hooks)), views=self.views,
                           in_flight=config.workers.prefetch_factor)
        hook = prepared.hooks.sample
        self._sample_hook = PythonSampleHook(hook, prepared.index.path, self._feed) if hook is not None else None
        if hook is not None:
            log.warning("split '%s': %s runs through DALI's Python-function operator, one Python call per sample on "
                        "a DALI thread holding the GIL%s: an identity function cost 4-7%% of the images/s on 2 CPU "
                        "cores, torchvision's RandAugment half of fastloader's rand-m9's "
                        "(docs/performance.md#your-own-transforms); for DALI's speed give the op as dali.graph_hook",
                        split.name, hook.label,
                        ", each batch copied to the host and back" if self.flavour == "gpu" else "")
        self._pipe = self._build()
        self._pid = os.getpid()  # a forked child cannot run the pipeline: DALI's threads stay here
        self._stream = torch.cuda.Stream(device) if self.flavour == "gpu" else None
        """The driver's side stream, one for the loader's life: a new stream per epoch would strand
        the caching allocator's blocks cached on the old ones."""
        self._view_buffers = HostBuffers(self.prefetch_depth) if self.views and self.flavour == "cpu" else None
        """The CPU flavour's view groups, in memory reused across batches and epochs (views.HostBuffers)."""
        self._epoch_open = False  # the pipeline holds batches of an epoch not yet drained
        self._driver: Driver | None = None  # the thread running the pipeline during an epoch
        self._run = 0  # which loop owns the pipeline
        self._broken = ""  # why the pipeline cannot run any more
        self._announce()
        if self._feed.kind == "bytes":
            log.info("split '%s': DALI decodes with %s", split.name, decoder_words(config, self.flavour == "gpu"))

    def _build(self):
        return build_pipeline(
            self.config, self.split, self._feed, device_id=self.device.index if self.flavour == "gpu" else None,
            batch_size=self.split.batch_size, num_threads=self.num_threads,
            prefetch_queue_depth=self.config.workers.prefetch_factor,
            seed=self.config.seed, feed=self._feed.kind, augmenter=self.augmentation, sized=self._feed.sized,
            user=UserOps(self.hooks, self._sample_hook), views=self.views)

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
                if self._sample_hook is not None and self._sample_hook.failure is not None:  # no file's fault
                    raise self._stopped(self._sample_hook.failure) from item.error
                self._recover(item.error, delivered)
                self._driver = self._drive()
                continue
            self._record_skips(item.fed.skipped)
            for planned in item.fed.empty:  # DALI takes no empty batch: yielded here, in their place
                delivered += 1
                yield self._empty_batch(len(planned))
            delivered += 1
            yield item.images, item.labels
        if self._run == run:
            skipped, empty = self._feed.skipped, self._feed.empty
            self._end_epoch()
            self._record_skips(skipped)
            for planned in empty:
                yield self._empty_batch(len(planned))
        elif self._closed:
            raise self._closed_error()

    def _drive(self) -> Driver:
        """A driver thread running the pipeline over the feed's batches (see driver.py)."""
        check = graph_size_check(self.hooks.graph, self.split, self._feed.sized, self.views)
        convert = converter(self._feed, self.index.labels, self.device, self.config.output.channels_last,
                            self._bfloat16, self.finisher, check, self.views, self._view_buffers)
        return Driver(self._pipe, convert, self._feed.stop, self.device, self._stream,
                      stall_s=self.config.workers.timeout, stuck=self._feed.stuck_words)

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
        probe = DecodeProbe(self.config, self.device.index if self.flavour == "gpu" else None, self.split.batch_size,
                            self._regions if self.split.mode == "train" and self._feed.sizes is not None
                            and self.views is None else None)  # views decode whole images
        try:
            culprits = probe.culprits(suspects, self._feed.location)
        except BaseException as failure:  # out of memory, say: no file to blame, no pipeline left
            raise self._stopped(failure) from error
        del probe  # its pipeline goes before the new one is built
        if not culprits:
            raise self._failed(error, number, suspects[0] if suspects else np.zeros((0, 2), dtype=np.int64))
        if culprits and self.config.dataset.on_bad_image == "raise":
            first = min(culprits)
            self._broken = refused_file(self.index.path(first), culprits[first], self.config.source)
            raise BadImageError(self._broken) from error
        log.info("split '%s': the DALI pipeline failed at batch %d of epoch %d on %d files that cannot be decoded; "
                 "rebuilding it without them", self.split.name, number, self.epoch, len(culprits))
        self._feed.known_bad.update(culprits)
        self._feed.new_arenas()
        again, rest = self._feed.unfinished(), self._feed.batches
        self._pipe = self._build()
        self._feed.start(itertools.chain(again, rest))
        self._epoch_open = True

    def _regions(self, plan: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Train: the crop regions (anchor, shape) the feed drew for these (sample, seed) rows, from
        the sizes of the bytes it fed (kept in its size table), which the probe decodes as the train
        graph does."""
        sizes = self._feed.sizes.sizes[plan[:, 0]]
        side = output_size(plan, self.split.transform.size) if self._feed.sized else None
        anchor, shape = feed_arrays(self.augmentation, plan[:, 1], sizes, side)[:2]
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
