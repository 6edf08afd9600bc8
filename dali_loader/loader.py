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

The loader builds the pieces and runs the loop; each piece does one job: pipeline_life.py the
pipeline across epochs (which loop owns it, its driver, why it stopped), failures.py the table of
what each way a driver ends leads to, recovery.py the probe and rebuild after DALI failed on files.
"""
from __future__ import annotations

import functools
import logging
from typing import Callable, Iterator

import numpy as np
import torch
from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

from fastloader.contract import Loader
from fastloader.cuda_install import torch_cuda_major
from fastloader.decoding.shared_reads import SharedReads, shareable
from fastloader.device_ops import BatchFinisher
from fastloader.distributed import RankInfo
from fastloader.errors import BadImageError, LoaderError, error_text, refused_file
from fastloader.hooks import Hook
from fastloader.parallel import available_cores
from fastloader.prepared import PreparedSplit
from fastloader.read_ahead import epochs_after
from fastloader.schema import Config, SplitConfig
from fastloader.transfer import to_device
from fastloader.views import ViewPlan

from .bad_samples import BadSamples
from .batch_reader import BatchReader
from .batches_ahead import READS_AHEAD, BatchesAhead
from .driver import Driver, Ended
from .failures import Ending, Then, case_of, memory_hint
from .feed import Fed, Feed
from .hook_processes import HookProcesses, hook_context
from .in_progress import InProgress
from .inputs import input_plan
from .pipeline import GraphSpec, Sizing, build_pipeline, decode_plan, decoder_words
from .pipeline_life import PipelineLife
from .probe import DecodeProbe
from .recovery import Recovery, crop_regions
from .stack import GpuDecoding, cpu_decode_fix, dali_cuda_major, plan_nvjpeg, stack_problem
from .transcode import transcoded_for_dali
from .user_ops import PythonSampleHook, UserOps, graph_size_check, hook_inputs
from .views import HostBuffers, join_views

log = logging.getLogger("fastloader")


_WARNED: set[str] = set()


def _warn_once(problem: str | None) -> None:
    """A problem of the process's set-up, said once however many loaders it builds."""
    if problem and problem not in _WARNED:
        _WARNED.add(problem)
        log.warning(problem)


def converter(feed: Feed, in_progress: InProgress, labels: np.ndarray, device: torch.device, channels_last: bool,
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
                in_progress.begin(f"running {hook.label} on", f"a batch of {len(fed.plan)}")
            try:
                images, batch_labels = finisher(images, batch_labels, fed.plan[:, 1])
            finally:
                in_progress.end()
        return images, batch_labels, fed
    return convert


def graph_spec(config: Config, split: SplitConfig, views: ViewPlan | None = None) -> GraphSpec:
    """What the split's DALI graph is built from (pipeline.GraphSpec): the one place the DALI
    backend's graph reads the config; `views`: the split's view groups (its plan's)."""
    def sizing(t) -> Sizing:
        return Sizing(t.size, t.crop_pct, t.interpolation, t.hflip, t.vflip)

    return GraphSpec(split.mode == "train", sizing(split.transform),
                     tuple(sizing(group.split.transform) for group in views.groups) if views is not None else (),
                     tuple(config.normalize.mean), tuple(config.normalize.std), config.output.dtype,
                     config.output.channels_last, config.dataset.exif_orientation, config.dali.hw_decoder_load,
                     config.dali.fancy_upsampling)


class DaliLoader(Loader):
    backend = "dali"

    def __init__(self, config: Config, split: SplitConfig, prepared: PreparedSplit, ranks: RankInfo,
                 device: torch.device):
        super().__init__(config, split, prepared, ranks, device)
        self._feed: Feed | None = None  # what letting go reads, should the build fail before they are made
        self._sample_hook: PythonSampleHook | None = None
        self._pipeline: PipelineLife | None = None
        try:
            self._set_up(config, split, prepared)
        except BaseException:
            self._closed = True  # create_loader lets go of the split's store and source
            self._drop()  # the feed's worker processes and slabs, the hook's processes, a pipeline built
            raise

    def _set_up(self, config: Config, split: SplitConfig, prepared: PreparedSplit) -> None:
        """The backend's part of the build; where it fails (a graph hook's error, no memory for the
        pipeline), what it started is let go before the error goes on."""
        device = self.device
        self.flavour = "gpu" if device.type == "cuda" else "cpu"
        self.num_threads = prepared.workers
        gpu = self.flavour == "gpu"
        if gpu:
            _warn_once(stack_problem(dali_cuda_major(), torch_cuda_major()))
        nvjpeg = plan_nvjpeg() if gpu else None
        self.decoding = decode_plan(config.dali.fancy_upsampling, gpu, split.mode == "train" and self.views is None,
                                    nvjpeg)
        """How the graph decodes JPEGs (pipeline.DecodePlan): chroma, and train's regions or whole images,
        by what the nvJPEG the GPU flavour's decoders bind in this process does on the GPU."""
        left_out = BadSamples()  # which samples the feed leaves out, and why: the probe's refusals, the reads' findings
        in_progress = InProgress()  # what the loader's own code does inside the pipeline: what a stall names
        self._reader = BatchReader(prepared.index, transcoded_for_dali(prepared.index, prepared.needs_transcoding),
                                   left_out, in_progress, prepared.pixels, config.dataset.exif_orientation,
                                   prepared.sizes, config.dataset.max_pixels,
                                   refill=split.mode == "train" and config.dataset.on_bad_image == "skip",
                                   draws=prepared.draws,
                                   gpu=GpuDecoding(self.decoding.region, self.decoding.fancy, nvjpeg) if gpu else None)
        graph = graph_spec(config, split, self.views)  # the config read once for the graph
        inputs = input_plan(graph.train, graph.sizing, self.augmentation, self.views, bool(hook_inputs(prepared.hooks)),
                            sized=self.order.resolution is not None)
        ahead = BatchesAhead(self._shared_reads(prepared), split.name, self._reader.locations, left_out,
                             in_progress.during)
        self._feed = Feed(ahead, self._reader, inputs, in_flight=config.workers.prefetch_factor)
        hook = prepared.hooks.sample
        if hook is not None:
            self._sample_hook = PythonSampleHook(hook, prepared.index.path, in_progress,
                                                 self._processes_for(hook, prepared))
        if hook is not None and self._sample_hook.apart is None:
            log.warning("split '%s': %s runs through DALI's Python-function operator, one Python call per sample on "
                        "a DALI thread holding the GIL%s: an identity function cost 4-7%% of the images/s on 2 CPU "
                        "cores, torchvision's RandAugment half of fastloader's rand-m9's "
                        "(docs/performance.md#your-own-transforms); for DALI's speed give the op as dali.graph_hook",
                        split.name, hook.label,
                        ", each batch copied to the host and back" if self.flavour == "gpu" else "")
        device_id = device.index if gpu else None
        build = functools.partial(
            build_pipeline, graph, self._feed, device_id=device_id, batch_size=split.batch_size,
            num_threads=self.num_threads, prefetch_queue_depth=config.workers.prefetch_factor, seed=config.seed,
            feed=self._feed.kind, augmenter=self.augmentation, sized=inputs.sized,
            user=UserOps(self.hooks, self._sample_hook), views=self.views, plan=self.decoding)
        self._pipeline = PipelineLife(build, device)
        self._view_buffers = HostBuffers(self.prefetch_depth) if self.views and self.flavour == "cpu" else None
        """The CPU flavour's view groups, in memory reused across batches and epochs (views.HostBuffers)."""
        self._recovery = self._recovery_for(graph, device_id)
        self._cpu_said: set[str] = set()  # the reasons for decoding on the CPU said so far (_count_cpu_decodes)
        self._announce()
        if self._feed.kind == "bytes":
            log.info("split '%s': DALI decodes with %s", split.name,
                     decoder_words(graph.hw_decoder_load, self.flavour == "gpu", self.decoding, graph.train))

    def _recovery_for(self, graph: GraphSpec, device_id: int | None) -> Recovery:
        """What stops the pipeline on a failure, or probes it for files and rebuilds it: made of
        values, not of the loader. The probe decodes as the graph does: train's crop regions where
        the plan decodes regions (views, eval and a whole-image plan decode whole images)."""
        config, split, sizes = self.config, self.split, self._reader.sizes
        regions = (functools.partial(crop_regions, self._feed.inputs, sizes)
                   if self.decoding.region and sizes is not None else None)
        return Recovery(self._pipeline, self._feed,
                        functools.partial(DecodeProbe, graph, config.dataset.max_pixels, device_id, split.batch_size,
                                          self.decoding, regions),
                        self.index.path, split.name, skip=config.dataset.on_bad_image != "raise", source=config.source,
                        memory_hint=functools.partial(memory_hint, self.device, split.name, split.batch_size,
                                                      self.num_threads, config.source))

    def _drive(self, pipe, stream: torch.cuda.Stream | None) -> Driver:
        """A driver thread running the pipeline over the feed's batches (see driver.py), made of
        values, not of the loader, which the driver thread must not keep alive."""
        check = graph_size_check(self.hooks.graph, self.split.transform.size, self.split.name, self._feed.inputs.sized,
                                 self.views)
        in_progress = self._reader.in_progress
        output = self.config.output
        convert = converter(self._feed, in_progress, self.index.labels, self.device, output.channels_last,
                            output.dtype == "bfloat16", self.finisher, check, self.views, self._view_buffers)
        return Driver(pipe, convert, self._feed.stop, self.device, stream, stall_s=self.config.workers.timeout,
                      stuck=in_progress.stuck_words)

    def _processes_for(self, hook: Hook | None, prepared: PreparedSplit) -> HookProcesses | None:
        """The processes that run a sample hook drawing from the global generators (with_global_rng),
        one for each DALI thread up to the cores: on DALI's threads it would reseed the trainer's
        generators under it (hook_processes.py). None for any other hook."""
        if hook is None or not hook.draws_globally:
            return None
        if hook_context().get_start_method() != "fork":
            hook.check_picklable("on DALI a hook that draws from the global generators runs in processes of its "
                                 "own, started clean here")
        processes = max(1, min(self.num_threads, available_cores()))
        log.info("split '%s': %s draws from the global generators: it runs in %d processes of its own, a batch at a "
                 "time, never on DALI's threads beside the trainer's", self.split.name, hook.label, processes)
        return HookProcesses(hook, processes, prepared.index.path)

    def _shared_reads(self, prepared: PreparedSplit) -> SharedReads | None:
        """The worker processes that read the feed's next batches (dali.feed_processes), if any."""
        processes = self.config.dali.feed_processes
        if processes == "auto":
            processes = 0 if self.flavour == "cpu" else min(4, prepared.workers // 4)
        if not processes or prepared.pixels is not None:  # the cache's pixels are not read
            return None
        why_not = shareable()
        if why_not:
            log.warning("split '%s': dali.feed_processes=%d asked for worker processes, but %s: the feed reads on "
                        "the driver thread", self.split.name, processes, why_not)
            return None
        slabs = self.config.workers.prefetch_factor + 1 + READS_AHEAD  # in DALI, being taken, sent ahead
        reads = None
        try:
            reads = SharedReads(processes, slabs, self.split.batch_size, self.config.dataset.max_pixels,
                                self.config.workers.timeout)
            reads.start()  # while the pipeline is built
        except OSError as error:  # no memory or descriptors for the slabs, no process to start
            if reads is not None:
                reads.close(settled=True)  # its slabs' memfds: nothing else would ever close them
            log.warning("split '%s': dali.feed_processes=%d asked for worker processes, but %s: the feed reads on "
                        "the driver thread", self.split.name, processes, error_text(error))
            return None
        return reads


    def describe(self) -> dict:
        return {**super().describe(), "flavour": self.flavour, "threads": self.num_threads,
                "feed_processes": self._feed_processes}

    @classmethod
    def depth_for(cls, config: Config, workers: int) -> int:
        """DALI's prefetch queue (workers.prefetch_factor), the batch being assembled, and the one the
        driver thread holds converted for the trainer, whatever its threads."""
        return config.workers.prefetch_factor + 2

    def _parallelism(self) -> str:
        decoder = "nvJPEG on the GPU" if self.flavour == "gpu" else "decoding on the CPU"
        feed = f", feed read by {self._feed_processes} processes" if self._feed_processes else ""
        return f"flavour={self.flavour!r} ({decoder}), threads={self.num_threads}{feed}"

    @property
    def _feed_processes(self) -> int:
        return self._feed.ahead.processes

    def _iter_batches(self, batches: list) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        pipeline = self._pipeline
        refusal = pipeline.refusal(self.split.name)
        if refusal:
            raise LoaderError(refusal)
        pipeline.end_epoch()
        if not batches:
            return
        loop = pipeline.take_over()
        following = functools.partial(epochs_after, self.order, self.epoch)  # what most loops run next; not `self`,
        self._feed.start(batches, following)  # which the feed (on the driver thread) must not keep alive
        pipeline.start_epoch(self._drive)
        delivered = 0
        while pipeline.owner == loop:  # else a newer loop took the pipeline over, or the loader closed
            item = pipeline.driver.get()
            if isinstance(item, Ended):  # the end, or a failure: what follows is failures.py's table
                pipeline.driver = None  # its thread has ended
                ending = Ending(item.error, item.in_pipeline, self._closed, self.hooks.graph,
                                self._sample_hook.failure if self._sample_hook is not None else None,
                                self._reader.failure)
                case = case_of(ending)
                if case.then is Then.CLOSED:
                    raise self._closed_error()
                if case.then is Then.END:
                    break
                if case.then is Then.STOP:
                    raise self._recovery.stop(case.raised(ending))
                for fed in list(self._feed.fed):  # Then.PROBE: the batches in the failed pipeline
                    self._record_skips(fed.skipped)  # left out before the failure, not reported yet
                self._recovery.recover(item.error, delivered, self.epoch)
                pipeline.start_epoch(self._drive)
                continue
            self._record_skips(item.fed.skipped)
            self._count_cpu_decodes(item.fed.on_cpu)
            for planned in item.fed.empty:  # DALI takes no empty batch: yielded here, in their place
                delivered += 1
                yield self._empty_batch(len(planned))
            delivered += 1
            yield item.images, item.labels
        if pipeline.owner == loop:
            skipped, empty = self._feed.skipped, self._feed.empty
            pipeline.end_epoch()
            self._record_skips(skipped)
            for planned in empty:
                yield self._empty_batch(len(planned))
        elif self._closed:
            raise self._closed_error()
        else:  # a newer loop took the pipeline over while this one was paused (a callback's next(iter(loader)))
            raise self._superseded()

    def _record_skips(self, skipped: list[tuple[int, str]]) -> None:
        """Known-bad samples the feed left out, with why (it holds no reference back to the loader, so
        that a dropped loader frees its pipeline at once rather than at the next garbage collection)."""
        for sample, reason in skipped:
            path = self.index.path(sample)
            if self.config.dataset.on_bad_image == "raise":  # found by the feed (a shard member cut short)
                why = refused_file(path, reason, self.config.source)
                self._pipeline.stop_after_draining(why)  # the driver stops; the pipeline rewinds
                raise BadImageError(why)
            self._skipped.skip(path, reason)

    def _count_cpu_decodes(self, on_cpu: dict[str, int]) -> None:
        """What the GPU flavour decoded on the CPU, in this loop's stats; each reason said once a loader."""
        for reason, count in on_cpu.items():
            self.stats.cpu_decoded[reason] = self.stats.cpu_decoded.get(reason, 0) + count
            if reason not in self._cpu_said:
                self._cpu_said.add(reason)
                log.warning("split '%s': DALI decodes %s on the CPU, not with nvJPEG (%d in this batch; "
                            "loader.stats.cpu_decoded counts them per epoch); %s", self.split.name, reason, count,
                            cpu_decode_fix(reason))

    def _close(self) -> None:
        self._let_go(wait=True)

    def _drop(self) -> None:
        self._let_go(wait=False)

    def _let_go(self, wait: bool) -> None:
        """Stop the driver and free the pipeline (pipeline_life.py); then, where no thread is left in
        the pipeline, the feed's processes and memory go now, and the sample hook's processes."""
        settled = self._pipeline.let_go(wait) if self._pipeline is not None else True
        if self._feed is not None:
            self._feed.close(settled)
        if self._sample_hook is not None and self._sample_hook.apart is not None:
            self._sample_hook.apart.close()
