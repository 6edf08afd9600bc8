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

import functools
import itertools
import logging
import os
import traceback
from typing import Callable, Iterator

import numpy as np
import torch
from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

from fastloader.contract import Loader
from fastloader.cuda_install import torch_cuda_major
from fastloader.decoding.shared_reads import SharedReads, shareable
from fastloader.device_ops import BatchFinisher
from fastloader.distributed import RankInfo
from fastloader.errors import (
    NOT_A_SAMPLES_FAULT,
    BadImageError,
    HookError,
    LoaderError,
    add_note,
    error_text,
    refused_file,
)
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
from .doings import Doings
from .driver import Driver, Ended
from .feed import Fed, Feed
from .hook_processes import HookProcesses, hook_context
from .inputs import batch_inputs, input_plan
from .pipeline import GraphSpec, Sizing, build_pipeline, decode_plan, decoder_words
from .probe import DecodeProbe, dali_reason, out_of_memory
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


def converter(feed: Feed, doings: Doings, labels: np.ndarray, device: torch.device, channels_last: bool,
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
                doings.begin(f"running {hook.label} on", f"a batch of {len(fed.plan)}")
            try:
                images, batch_labels = finisher(images, batch_labels, fed.plan[:, 1])
            finally:
                doings.end()
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
        self._run, self._driver, self._epoch_open, self._feed = 0, None, False, None  # what closing reads
        self._hook_processes: HookProcesses | None = None
        try:
            self._set_up(config, split, prepared)
        except BaseException:
            self._closed = True  # create_loader lets go of the split's store and source
            if self._feed is not None:
                self._feed.close(settled=True)  # no pipeline ran: the worker processes and slabs go now
            if self._hook_processes is not None:
                self._hook_processes.close()
            raise

    def _set_up(self, config: Config, split: SplitConfig, prepared: PreparedSplit) -> None:
        """The backend's part of the build; where it fails (a graph hook's error, no memory for the
        pipeline), the feed's worker processes and slabs are given back before the error goes on."""
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
        self._bfloat16 = config.output.dtype == "bfloat16"
        self._bad = BadSamples()
        """Which samples the feed leaves out, and why (bad_samples.py): the probe's refusals, the reads' findings."""
        self._doings = Doings()
        """What the loader's own code does now inside the pipeline (reading, a user's hook): what a stall names."""
        self._reader = BatchReader(prepared.index, transcoded_for_dali(prepared.index, prepared.needs_transcoding),
                                   self._bad, self._doings, prepared.pixels, config.dataset.exif_orientation,
                                   prepared.sizes, config.dataset.max_pixels,
                                   refill=split.mode == "train" and config.dataset.on_bad_image == "skip",
                                   draws=prepared.draws,
                                   gpu=GpuDecoding(self.decoding.region, self.decoding.fancy, nvjpeg) if gpu else None)
        self._graph = graph_spec(config, split, self.views)
        """What the graph is built from (pipeline.GraphSpec): the config read once for it."""
        self._inputs = input_plan(self._graph.train, self._graph.sizing, self.augmentation, self.views,
                                  bool(hook_inputs(prepared.hooks)), sized=self.order.resolution is not None)
        ahead = BatchesAhead(self._shared_reads(prepared), split.name, self._reader.locations, self._bad,
                             self._doings.during)
        self._feed = Feed(ahead, self._reader, self._inputs, in_flight=config.workers.prefetch_factor)
        hook = prepared.hooks.sample
        self._hook_processes = self._processes_for(hook, prepared)
        self._sample_hook = PythonSampleHook(hook, prepared.index.path, self._doings, self._hook_processes
                                             ) if hook is not None else None
        if hook is not None and self._hook_processes is None:
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
        self._cpu_said: set[str] = set()  # the reasons for decoding on the CPU said so far (_count_cpu_decodes)
        self._announce()
        if self._feed.kind == "bytes":
            log.info("split '%s': DALI decodes with %s", split.name,
                     decoder_words(self._graph.hw_decoder_load, self.flavour == "gpu", self.decoding,
                                   self._graph.train))

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

    def _build(self):
        return build_pipeline(
            self._graph, self._feed, device_id=self.device.index if self.flavour == "gpu" else None,
            batch_size=self.split.batch_size, num_threads=self.num_threads,
            prefetch_queue_depth=self.config.workers.prefetch_factor,
            seed=self.config.seed, feed=self._feed.kind, augmenter=self.augmentation, sized=self._inputs.sized,
            user=UserOps(self.hooks, self._sample_hook), views=self.views, plan=self.decoding)

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
        if self._broken:
            raise LoaderError(self._broken)
        if os.getpid() != self._pid:
            raise LoaderError(f"this DALI loader of split '{self.split.name}' was built in process {self._pid} and "
                               f"inherited by this forked one, where DALI's threads do not run: build a new loader "
                               f"here (fastloader.build_loader)")
        self._end_epoch()
        if not batches:
            return
        self._run += 1
        run = self._run
        following = functools.partial(epochs_after, self.order, self._epoch)  # what most loops run next; not `self`,
        self._feed.start(batches, following)  # which the feed (on the driver thread) must not keep alive
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
                if item.in_pipeline and (failure := self._graph_function_failure(item.error)) is not None:
                    raise self._stopped(failure) from None
                if not (item.in_pipeline and isinstance(item.error, RuntimeError) and not out_of_memory(item.error)
                        and not isinstance(item.error, NOT_A_SAMPLES_FAULT)):  # a store's failure: no file's
                    raise self._stopped(item.error)
                if self._sample_hook is not None and self._sample_hook.failure is not None:  # no file's fault
                    raise self._stopped(self._sample_hook.failure) from item.error
                if self._reader.failure is not None:  # a source that changed: no file's fault either
                    raise self._stopped(self._reader.failure) from item.error
                self._recover(item.error, delivered)
                self._driver = self._drive()
                continue
            self._record_skips(item.fed.skipped)
            self._count_cpu_decodes(item.fed.on_cpu)
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
        else:  # a newer loop took the pipeline over while this one was paused (a callback's next(iter(loader)))
            raise self._superseded()

    def _drive(self) -> Driver:
        """A driver thread running the pipeline over the feed's batches (see driver.py)."""
        check = graph_size_check(self.hooks.graph, self.split.transform.size, self.split.name, self._inputs.sized,
                                 self.views)
        convert = converter(self._feed, self._doings, self.index.labels, self.device, self.config.output.channels_last,
                            self._bfloat16, self.finisher, check, self.views, self._view_buffers)
        return Driver(self._pipe, convert, self._feed.stop, self.device, self._stream,
                      stall_s=self.config.workers.timeout, stuck=self._doings.stuck_words)

    def _graph_function_failure(self, error: BaseException) -> HookError | None:
        """A pipeline failure after the decoder where the graph has the user's graph function: what
        it returned is what DALI could not use (the seeds' DataNode, one channel for three), never a
        file's fault; said as the function's error, with what is expected and DALI's words. None
        without a graph function, and for a decoder's failure (a file's, found by the probe)."""
        hook = self.hooks.graph
        reason = dali_reason(error) if isinstance(error, Exception) else ""
        if hook is None or "decoders" in reason or out_of_memory(error):
            return None
        return HookError(f"{hook.label} returned a DataNode the rest of the graph cannot take as the images: a graph "
                         f"function returns its images' DataNode changed, HWC uint8 of 3 channels and the size it is "
                         f"given (called as function(images, seeds, **dali.graph_hook_args); the seeds are no "
                         f"images). DALI says: {reason[:800]}")

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

    def _record_skips(self, skipped: list[tuple[int, str]]) -> None:
        """Known-bad samples the feed left out, with why (it holds no reference back to the loader, so
        that a dropped loader frees its pipeline at once rather than at the next garbage collection)."""
        for sample, reason in skipped:
            path = self.index.path(sample)
            if self.config.dataset.on_bad_image == "raise":  # found by the feed (a shard member cut short)
                self._broken = refused_file(path, reason, self.config.source)
                self._end_epoch()  # the driver stops; the pipeline rewinds
                raise BadImageError(self._broken)
            self._skip_sample(path, reason)

    def _count_cpu_decodes(self, on_cpu: dict[str, int]) -> None:
        """What the GPU flavour decoded on the CPU, in this loop's stats; each reason said once a loader."""
        for reason, count in on_cpu.items():
            self.stats.cpu_decoded[reason] = self.stats.cpu_decoded.get(reason, 0) + count
            if reason not in self._cpu_said:
                self._cpu_said.add(reason)
                log.warning("split '%s': DALI decodes %s on the CPU, not with nvJPEG (%d in this batch; "
                            "loader.stats.cpu_decoded counts them per epoch); %s", self.split.name, reason, count,
                            cpu_decode_fix(reason))

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
        probe = DecodeProbe(self._graph, self.config.dataset.max_pixels,
                            self.device.index if self.flavour == "gpu" else None, self.split.batch_size,
                            self.decoding, self._regions if self.decoding.region and self._reader.sizes is not None
                            else None)  # views, eval and a whole-image train plan decode whole images
        try:
            culprits = probe.culprits(suspects, self._reader.location)
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
        self._bad.refuse(culprits)
        self._feed.new_arenas()
        again, rest = self._feed.unfinished(), self._feed.ahead.batches
        self._pipe = self._build()
        self._feed.start(itertools.chain(again, rest), self._feed.ahead.following)
        self._epoch_open = True

    def _regions(self, plan: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Train: the crop regions (anchor, shape) the feed drew for these (sample, seed) rows, from
        the sizes of the bytes it fed (kept in its size table), which the probe decodes as the train
        graph does."""
        anchor, shape = batch_inputs(self._inputs, plan, plan, self._reader.sizes.sizes[plan[:, 0]])[:2]
        return anchor, shape

    def _failed(self, error: RuntimeError, number: int, batch: np.ndarray) -> RuntimeError:
        """DALI cannot go on after an operator fails: say where, and refuse later loops clearly."""
        files = ", ".join(self.index.path(i) for i in batch[:3, 0]) + (" ..." if len(batch) > 3 else "")
        self._broken = (f"the DALI pipeline of split '{self.split.name}' failed at batch {number} of epoch "
                        f"{self.epoch} (files {files}, or a batch DALI had started after it), and these files "
                        f"decode, in their batches as the pipeline decodes them and alone. DALI says: "
                        f"{dali_reason(error)[:1500]}. A DALI pipeline cannot continue after an error: build a "
                        f"new loader")
        return LoaderError(self._broken)

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
        # no thread runs the pipeline any more (none stuck in it): the feed's processes and memory go now
        settled = driver.join(0) if driver is not None and wait else driver is None and not self._broken
        self._feed.close(settled)
        if self._hook_processes is not None:
            self._hook_processes.close()
