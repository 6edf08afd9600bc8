"""The DALI graph: encoded bytes -> decode (only the crop the host drew, for train) -> resize ->
flips and ops (train) -> normalize; or, from the uint8 cache, decoded pixels -> the same crop
(train) or centre box (eval) -> the same steps. One function builds both flavours:

- gpu: the decoders run as "mixed" operators (nvJPEG; the GPU's hardware JPEG decoder takes
  `hw_decoder_load` of each batch where it has one, its pool preallocated for the whole batch),
  everything after them on the GPU;
- cpu: the same operators with device="cpu" and no device_id, which DALI runs without any GPU.
  CI runs this flavour, so the two differ in the devices and the decoder's memory hints only.

The pipeline runs DALI's dynamic executor (exec_dynamic: DALI's default execution model, asked for
by name rather than relied on): an output lives in buffers of its own until it is released, so the
CPU flavour hands it to torch without a copy (loader.converter).

Every transform key means what it means for the torch backend, because every random parameter of a
sample (its crop box, flips, ops and their magnitudes) is drawn on the host from its seed by
fastloader.augment, which the torch workers use too, and fed in with the batch: `crop_pct` gives
the shorter side floor(size / crop_pct) before the centre crop (the same box,
fastloader.imaging.boxes), `interpolation` the filter, and shrinking is antialiased in both.
"""
from __future__ import annotations

import os
import warnings
import weakref
from typing import Callable, NamedTuple

import numpy as np
from nvidia.dali import fn, pipeline_def, types
from nvidia.dali.data_node import DataNode
from nvidia.dali.pipeline import Pipeline

from fastloader.draws import Augmenter
from fastloader.hooks import SplitHooks
from fastloader.imaging.boxes import centre_boxes as centre_box_array
from fastloader.views import ViewPlan

from .augment import augment_images, feed_inputs
from .stack import region_fancy_on_gpu, version_words
from .user_ops import NO_USER_OPS, UserOps, apply_user_ops, hook_inputs
from .view_ops import apply_group_ops
from .views import stacked_groups, view_inputs, view_layout, view_specs

INTERPOLATION = {"bilinear": types.INTERP_LINEAR, "bicubic": types.INTERP_CUBIC, "nearest": types.INTERP_NN}
OUTPUT_DTYPE = {"float32": types.FLOAT, "float16": types.FLOAT16, "bfloat16": types.FLOAT}  # bf16: cast in torch
Inputs = dict[str, DataNode]
"""The feed's per-sample arrays of a batch, by name (feed_layout)."""


class Sizing(NamedTuple):
    """What the graph resizes and flips by: a split's transform, or a view group's."""
    size: int
    crop_pct: float
    """Eval's centre box: the share of the shorter side it keeps."""
    interpolation: str
    hflip: float
    vflip: float


class GraphSpec(NamedTuple):
    """What a split's graph is built from, read from the config once (dali_loader.loader.graph_spec):
    the graph's functions take this, never the config."""
    train: bool
    sizing: Sizing
    """The split's transform's."""
    view_sizing: tuple[Sizing, ...]
    """Each view group's, in the order of its ViewPlan (empty without views)."""
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    """normalize's, of 0..1 pixels."""
    dtype: str
    """output.dtype."""
    channels_last: bool
    exif_orientation: bool
    """dataset.exif_orientation."""
    hw_decoder_load: float
    fancy_upsampling: bool | str
    """dali.hw_decoder_load and dali.fancy_upsampling."""

# nvJPEG's memory hints. DALI preallocates them per DALI thread: one device buffer of
# device_memory_padding and two pinned host buffers of host_memory_padding (double buffering) each
# (fn.decoders.image's documentation); nvJPEG adds the padding to any later reallocation too.
# NVIDIA's ResNet-50 example sizes its train decoder's for the largest ImageNet image at its default
# 4 threads (`-j 4`) and leaves its val decoder at DALI's defaults.
NVIDIA_DEVICE_PADDING = 211025920
NVIDIA_HOST_PADDING = 140544512
NVIDIA_THREADS = 4
DALI_DEVICE_PADDING = 16 << 20
DALI_HOST_PADDING = 8 << 20
PREALLOCATE_WIDTH_HINT = 5980  # the hardware decoder's pool: DALI 2.x preallocates it for the whole batch
PREALLOCATE_HEIGHT_HINT = 6430


def nvjpeg_padding(threads: int, train: bool) -> tuple[int, int]:
    """(device, host) bytes of padding for each of `threads` DALI threads. Train: NVIDIA's example's
    total at its 4 threads, spread over more threads (never more per thread than NVIDIA's), so 16
    threads per rank cost what 4 do: 0.8 GiB of device and 1.0 GiB of pinned memory, not 3.1 and
    4.2 (docs/performance.md#device-and-pinned-memory). Eval: DALI's defaults, as NVIDIA's val."""
    if not train:
        return DALI_DEVICE_PADDING, DALI_HOST_PADDING
    share = min(NVIDIA_THREADS, threads) / threads
    return int(NVIDIA_DEVICE_PADDING * share), int(NVIDIA_HOST_PADDING * share)


class DecodePlan(NamedTuple):
    """How a split's graph decodes its JPEGs: chroma interpolated as libjpeg-turbo does (`fancy`) or
    repeated (nvJPEG's default); train: the crop's region only (`region`), or the whole image with
    the crop taken in the resize. `why`: the reason, for the build's log."""
    fancy: bool
    region: bool
    why: str


def decode_plan(setting: bool | str, gpu: bool, train: bool, nvjpeg: tuple[int, int, int] | None) -> DecodePlan:
    """The plan for dali.fancy_upsampling's `setting` (auto, true, false) on the GPU flavour with
    `nvjpeg`, or the CPU flavour. Every plan keeps every baseline JPEG on nvJPEG: a region with
    interpolated chroma is asked only of an nvJPEG that decodes it on the GPU (cuda_libraries.ROI_FANCY_NVJPEG);
    below it, nvImageCodec leaves such a region of any subsampled JPEG to DALI's CPU decoder.

    - auto: interpolated wherever nvJPEG can on the GPU: whole images always, regions from 13.2;
      below, train regions with chroma repeated (within docs/semantics.md's bound);
    - true: interpolated always; below 13.2 train decodes whole images and crops in the resize;
    - false: repeated always (nvJPEG's default, NVIDIA's example's).
    The CPU flavour always interpolates and decodes train's regions."""
    if not gpu:
        return DecodePlan(True, train, "DALI's CPU decoder always interpolates")
    if setting is False:
        return DecodePlan(False, train, "dali.fancy_upsampling: false")
    if not train or region_fancy_on_gpu(nvjpeg):
        return DecodePlan(True, train, f"{version_words(nvjpeg)} interpolates chroma in "
                          f"{'regions and ' if train else ''}whole images on the GPU")
    refuses = (f"{version_words(nvjpeg)} decodes no region of a subsampled JPEG with interpolated chroma on the GPU "
               f"(13.2 and later do: nvidia-dali-cuda130)")
    if setting is True:
        return DecodePlan(True, False, f"dali.fancy_upsampling: true and {refuses}, so train decodes whole images "
                          f"and takes the crop in the resize")
    return DecodePlan(False, True, f"dali.fancy_upsampling: auto and {refuses}, so train's regions repeat chroma")


def decoder_options(gpu: bool, hw_decoder_load: float, threads: int = NVIDIA_THREADS, train: bool = True,
                    fancy_upsampling: bool = True) -> dict:
    """The decoder's device and, for nvJPEG, its memory hints and hardware decoder share.
    `fancy_upsampling` (the DecodePlan's): upsample JPEG chroma as libjpeg-turbo does, so that the
    pixels are the CPU's and the torch backend's (docs/semantics.md#pixels); DALI asks it of nvJPEG's
    CUDA and hardware decoders both. The cpu decoder always does, whatever the flag (DALI's imgcodec
    decoder sets it for nvJPEG only). The memory defaults are NVIDIA's example's train decoder
    (benchmarks/); the hardware decoder's pool is preallocated for the whole batch (DALI passes
    max_batch_size as nvImageCodec's preallocate_batch_size), whatever hw_decoder_load. `train`:
    the train graph's decoder (its memory hints), whether it decodes regions or whole images."""
    if not gpu:
        return {"device": "cpu", "jpeg_fancy_upsampling": True}
    device_padding, host_padding = nvjpeg_padding(threads, train)
    hints = {"preallocate_width_hint": PREALLOCATE_WIDTH_HINT, "preallocate_height_hint": PREALLOCATE_HEIGHT_HINT}
    return {"device": "mixed", "jpeg_fancy_upsampling": fancy_upsampling, "device_memory_padding": device_padding,
            "host_memory_padding": host_padding, **(hints if train else {}), "hw_decoder_load": hw_decoder_load}


def decoder_words(hw_decoder_load: float, gpu: bool, plan: DecodePlan, train: bool) -> str:
    """Which decoders the graph uses and how, for the loader's log: what DALI is asked, and why."""
    if not gpu:
        return "DALI's CPU decoder (libjpeg-turbo, chroma interpolated as the torch backend's)"
    chroma = "interpolated as libjpeg-turbo does" if plan.fancy else "repeated (nvJPEG's default)"
    crop = ("" if not train else "; each crop's region decoded" if plan.region else
            "; whole images decoded, the crop taken in the resize")
    return (f"nvJPEG for every baseline and progressive JPEG: the GPU's hardware JPEG decoder for "
            f"{hw_decoder_load:.0%} of each batch where the GPU has one (A100, H100, H200; its pool "
            f"preallocated for the whole batch), the CUDA decoder for the rest; subsampled chroma {chroma}{crop} "
            f"({plan.why}). Other formats (PNG, decoded images) and JPEGs nvJPEG refuses (arithmetic-coded, "
            f"lossless, 12-bit) go to DALI's CPU decoder, counted in loader.stats")


def image_graph(encoded: DataNode, spec: GraphSpec, gpu: bool, inputs: Inputs,
                augmenter: Augmenter | None = None, threads: int = NVIDIA_THREADS, user: UserOps = NO_USER_OPS,
                views: ViewPlan | None = None, plan: DecodePlan | None = None) -> DataNode | tuple[DataNode, ...]:
    """The images DataNode of one split's graph, from an encoded-file DataNode and the feed's
    per-sample `inputs` (feed_layout's names).

    Train decodes only the crop the host drew (ROI decode of `crop_anchor`, `crop_shape`) and
    resizes it, or, where the `plan` says (decode_plan: interpolated chroma asked of an nvJPEG that
    decodes no such region on the GPU), decodes the whole image and resizes the crop's box; eval
    decodes the whole image and resizes the centre `box` the host computed. Then the steps shared
    with the cache's graph (finish). With views, every view from one whole decode. `plan`: the
    loader's (default: dali.fancy_upsampling's on an nvJPEG of unknown version).
    """
    train = spec.train and views is None
    plan = plan or decode_plan(spec.fancy_upsampling, gpu, train, None)
    if views is not None:
        return view_graph(decode(encoded, spec, gpu, plan, threads=threads), spec, gpu, inputs, views, user)
    if not train:
        images = resize_box(decode(encoded, spec, gpu, plan, threads=threads), inputs["box"], spec.sizing)
    elif plan.region:  # the crop fits: drawn for the size of the very bytes fed (loader.py)
        images = decode(encoded, spec, gpu, plan, (inputs["crop_anchor"], inputs["crop_shape"]), threads)
        images = resize_to_size(images, spec.sizing, inputs.get("out_size"))
    else:
        images = decode(encoded, spec, gpu, plan, threads=threads, train=True)
        images = resize_to_size(images, spec.sizing, inputs.get("out_size"), crop_box(inputs))
    return finish(images, spec, spec.sizing, inputs, augmenter, user, gpu)


def decode(encoded: DataNode, spec: GraphSpec, gpu: bool, plan: DecodePlan,
           region: tuple[DataNode, DataNode] | None = None, threads: int = NVIDIA_THREADS,
           train: bool | None = None) -> DataNode:
    """RGB images from encoded files: whole, or only each one's `region` (the crop's (x, y) corner
    and (width, height) in upright source pixels). The one decoder call of the graph, which the
    probe that looks for bad files (probe.py) builds too. nvJPEG's memory hints follow the train
    graph (`train`, by default: a region is asked), spread over the pipeline's `threads`."""
    train = region is not None if train is None else train
    options = {"output_type": types.RGB, "adjust_orientation": spec.exif_orientation,
               **decoder_options(gpu, spec.hw_decoder_load, threads, train=train,
                                 fancy_upsampling=plan.fancy)}
    if region is None:
        return fn.decoders.image(encoded, **options)
    return fn.decoders.image_slice(encoded, *region, axis_names="WH", normalized_anchor=False,
                                   normalized_shape=False, **options)


def crop_box(inputs: Inputs) -> tuple[DataNode, DataNode]:
    """The crop's (roi_start, roi_end) in (y, x) order, for fn.resize, from its (x, y) corner and
    (width, height): the feed's crop_anchor and crop_shape."""
    anchor, shape = inputs["crop_anchor"], inputs["crop_shape"]
    start = fn.stack(anchor[1], anchor[0])
    return start, start + fn.stack(shape[1], shape[0])


def pixel_graph(pixels: DataNode, spec: GraphSpec, gpu: bool, inputs: Inputs,
                augmenter: Augmenter | None = None, user: UserOps = NO_USER_OPS,
                views: ViewPlan | None = None) -> DataNode | tuple[DataNode, ...]:
    """The same graph after the decoder, for decoded HWC uint8 pixels (the uint8 cache): train
    slices the crop the host drew, eval the same centre box."""
    images = pixels.gpu() if gpu else pixels
    if views is not None:
        return view_graph(images, spec, gpu, inputs, views, user)
    if spec.train:
        images = fn.slice(images, inputs["crop_anchor"], inputs["crop_shape"], axis_names="WH",
                          normalized_anchor=False, normalized_shape=False)
        images = resize_to_size(images, spec.sizing, inputs.get("out_size"))
    else:
        images = resize_box(images, inputs["box"], spec.sizing)
    return finish(images, spec, spec.sizing, inputs, augmenter, user, gpu)


def view_graph(images: DataNode, spec: GraphSpec, gpu: bool, inputs: Inputs, views: ViewPlan,
               user: UserOps = NO_USER_OPS) -> tuple[DataNode, ...]:
    """Every view of whole decoded images, one output per view: the view's crop sliced (its box drawn
    on the host for the size of the very bytes fed), resized to its group's size, then its group's
    flips, ops, the user's hooks (with the view's seed) and normalization (finish). A group whose ops
    stack (view_ops) runs them on its views as the frames of one sequence, before the flips."""
    outputs, stacking = [], stacked_groups(views)
    specs = view_specs(views, stacking)
    for number, group in enumerate(views.groups):
        resized = []
        for view in range(group.first, group.first + group.count):
            mine = view_inputs(inputs, view)
            crop = fn.slice(images, mine["crop_anchor"], mine["crop_shape"], axis_names="WH", normalized_anchor=False,
                            normalized_shape=False)
            resized.append(resize_to_size(crop, spec.view_sizing[number]))
        if stacking[number]:  # the ops on the group's views at once
            frames = apply_group_ops(fn.stack(*resized, axis=0, axis_name="F"), inputs, number, group.augmenter)
            resized = fn.element_extract(frames, element_map=list(range(group.count)))
            resized = resized if isinstance(resized, list) else [resized]
        outputs += [finish(image, spec, spec.view_sizing[number], view_inputs(inputs, view), specs[view], user, gpu)
                    for view, image in enumerate(resized, start=group.first)]
    return tuple(outputs)


def resize_to_size(images: DataNode, t: Sizing, out_size: DataNode | None = None,
                   box: tuple[DataNode, DataNode] | None = None) -> DataNode:
    """Train: the crop, stretched to size x size (RandomResizedCrop's resize); under a size schedule
    to the batch's size, a per-sample argument input (`out_size`: height, width) of the one graph.
    `box`: the crop's (roi_start, roi_end) in a whole image (crop_box), resized without a slice."""
    roi = {} if box is None else {"roi_start": box[0], "roi_end": box[1], "roi_relative": False}
    if out_size is not None:
        return fn.resize(images, size=out_size, **roi, **_resampling(t))
    return fn.resize(images, resize_x=t.size, resize_y=t.size, **roi, **_resampling(t))


def _resampling(t: Sizing) -> dict:
    return {"interp_type": INTERPOLATION[t.interpolation], "antialias": t.interpolation != "nearest"}


def resize_box(images: DataNode, box: DataNode, t: Sizing) -> DataNode:
    """Eval: resize each image's centre box (fractional source pixels, see fastloader.imaging.boxes;
    `box` per sample: roi_start then roi_end, in (y, x)) to size x size."""
    return fn.resize(images, resize_x=t.size, resize_y=t.size, roi_start=box[0:2], roi_end=box[2:4],
                     **_resampling(t))


def centre_boxes(sizes: np.ndarray, t: Sizing) -> np.ndarray:
    """float32 [n, 4]: (roi_start, roi_end) in DALI's (y, x) order, i.e. (top, left, bottom, right),
    of the centre boxes of images of upright (height, width) `sizes`: what the feed passes in with
    an eval batch."""
    boxes = centre_box_array(sizes[:, 1], sizes[:, 0], t.size, t.crop_pct)  # left, top, right, bottom
    return np.ascontiguousarray(boxes[:, [1, 0, 3, 2]], dtype=np.float32)


def finish(images: DataNode, spec: GraphSpec, t: Sizing, inputs: Inputs,
           augmenter: Augmenter | None = None, user: UserOps = NO_USER_OPS, gpu: bool = False) -> DataNode:
    """Train: the flips and the ops the host drew (dali_loader/augment.py). Then the user's sample
    hook and graph function (user_ops.py), where the torch backend runs its sample hook. Then
    normalize, cast and lay out size x size images; a horizontal flip that nothing comes between
    and the normalize is the normalize's `mirror` (flip_in_normalize).

    Images leave as the configured float dtype (bfloat16 as float32, cast by the loader), CHW, or
    HWC when the output is channels_last (NHWC memory, which torch sees as a channels_last NCHW
    tensor without a copy).
    """
    mirror = {}
    if spec.train:
        folded = flip_in_normalize(t, augmenter, user)
        images = augment_images(images, inputs, augmenter, nearest=t.interpolation == "nearest", flips=not folded)
        if folded and t.hflip > 0:
            mirror = {"mirror": inputs["hflip"]}
    images = apply_user_ops(images, inputs, user, gpu)
    mean = [m * 255 for m in spec.mean]
    std = [s * 255 for s in spec.std]
    return fn.crop_mirror_normalize(
        images, dtype=OUTPUT_DTYPE[spec.dtype], output_layout="HWC" if spec.channels_last else "CHW",
        mean=mean, std=std, **mirror)


def flip_in_normalize(t: Sizing, augmenter: Augmenter | None, user: UserOps) -> bool:
    """Whether a train split's flips can be crop_mirror_normalize's `mirror`, as in NVIDIA's example:
    no operator (and kernel launch per sample) of their own, and the same pixels (a mirror is exact).
    Only a horizontal flip can, and only where nothing between it and the normalize would see the
    image unflipped: no ops (a rotation or shear does not commute with a flip), no sample hook and
    no graph function (they are given the flipped image, as on the torch backend)."""
    ops = augmenter is not None and augmenter.slots
    return t.vflip == 0 and not ops and user.sample_hook is None and user.hooks.graph is None


FEEDS = ("bytes", "pixels")
"""What a pipeline is fed per sample: its encoded bytes (a file or a shard member, read and checked
by the feed), or the uint8 cache's decoded pixels."""


def feed_layout(train: bool, feed: str, augmenter: Augmenter | None, sized: bool = False,
                hooks: SplitHooks = SplitHooks(), views: ViewPlan | None = None
                ) -> list[tuple[str, types.DALIDataType]]:
    """(name, DALI dtype) of the arrays the feed gives with each batch, in order: the encoded bytes
    (a list of uint8 arrays), or the cache's pixels (a list of HWC uint8 arrays); then in eval mode
    the centre boxes (float32 [n, 4]: roi_start, roi_end in (y, x), from centre_boxes), in train mode the crops,
    flips and ops the host drew
    (dali_loader.augment.feed_inputs), with each sample's output size under a size schedule (`sized`);
    last, where the split has a sample hook or a graph function, each sample's (sample, seed). With
    views: every view's inputs in their place (views.view_layout)."""
    layout = {"pixels": [("pixels", types.UINT8)], "bytes": [("encoded", types.UINT8)]}[feed]
    if views is not None:
        return layout + view_layout(views, hooks)
    if train:
        return layout + feed_inputs(augmenter, sized) + hook_inputs(hooks)
    return layout + [("box", types.FLOAT)] + hook_inputs(hooks)


_HELD_IN_CHILD: list[Pipeline] = []
"""Filled just before a fork, emptied after it in the parent: a forked child keeps it."""


def _live_pipelines() -> list[Pipeline]:
    """Every DALI pipeline of this process still alive, ours or not: DALI's own registry of them
    (the list its exit hook shuts down)."""
    return [pipe for pipe in (ref() for ref in list(getattr(Pipeline, "_pipes", ()))) if pipe is not None]


def _hold_pipelines_over_fork() -> None:
    _HELD_IN_CHILD[:] = _live_pipelines()


def _forget_pipelines_in_child() -> None:
    for pipe in _HELD_IN_CHILD:  # off the list of pipelines DALI's exit hook shuts down
        getattr(Pipeline, "_pipes", set()).discard(weakref.ref(pipe))


os.register_at_fork(before=_hold_pipelines_over_fork, after_in_parent=_HELD_IN_CHILD.clear,
                    after_in_child=_forget_pipelines_in_child)
"""Why: a process forked while a DALI pipeline lives (a torch backend's DataLoader worker, a pool)
holds a copy of it whose executor threads did not come along. If the child ever drops its last
reference (a garbage collection of an inherited cycle), the pipeline's destructor waits for those
threads forever or crashes: the worker hangs or dies, and with it the training run. The child keeps
a reference to every pipeline instead, and exits without running destructors, as forked workers do.
Every pipeline, not only the loaders': a pipeline of the user's own (or of a benchmark's peer)
dropped in a cycle that the parent has not collected yet killed a plain DataLoader worker forked
after it (SIGSEGV, SIGABRT or a hang, `benchmarks/peers.py`). DALI's own exit hook would shut the
copies down as a child that exits normally ends, with the same wait: the child takes them off
DALI's list."""


def build_pipeline(spec: GraphSpec, source: Callable, *, device_id: int | None,
                   batch_size: int, num_threads: int, prefetch_queue_depth: int, seed: int,
                   feed: str = "bytes", augmenter: Augmenter | None = None, sized: bool = False,
                   user: UserOps = NO_USER_OPS, views: ViewPlan | None = None,
                   plan: DecodePlan | None = None) -> Pipeline:
    """A built pipeline whose output is the images of the batches it pulls from `source`, the
    arrays of feed_layout for `feed` (FEEDS). Files and shard members come as bytes, read and
    checked by the feed on the driver thread, so that no decoder sees bytes the host has not
    checked (a non-image or a file shrunk since screening crashes DALI's CPU decoder).
    Every random choice was made on the host (fastloader.augment), so DALI draws nothing and both
    backends, and a resumed run, apply the same crops, flips and ops; eval's box is host arithmetic
    on the image size, which as DALI operators halved the GPU eval rate. Labels stay on the host.

    `source` is called once per batch, ahead of use by `prefetch_queue_depth` batches, on the
    thread that runs the pipeline (driver.py); raising StopIteration ends the epoch. DALI reads what
    it returns in place (no_copy): the source keeps each batch's memory unchanged and alive for
    `prefetch_queue_depth` more calls (feed.Feed.arenas). device_id None
    builds the cpu flavour. A train split with ops needs DALI's conditionals (auto_aug's `select`),
    which only a @pipeline_def function gets. `sized`: each batch comes with its output size (a size
    schedule), which the same graph takes as an argument input: no pipeline per size. `user`: the
    split's hooks (user_ops.py). `views`: the split's view groups, one output per view (view_graph).
    `plan`: how JPEGs are decoded (decode_plan, from the nvJPEG the GPU flavour's decoders load).
    """
    pipe = define_pipeline(spec, source, device_id=device_id, batch_size=batch_size,
                           num_threads=num_threads, prefetch_queue_depth=prefetch_queue_depth, seed=seed, feed=feed,
                           augmenter=augmenter, sized=sized, user=user, views=views, plan=plan)
    with warnings.catch_warnings():
        if hook_inputs(user.hooks):  # a graph function need not use the seeds it is given: no warning for it
            warnings.filterwarnings("ignore", message=r"The external source node .* is not used")
        pipe.build()
    return pipe


def define_pipeline(spec: GraphSpec, source: Callable, *, device_id: int | None,
                    batch_size: int, num_threads: int, prefetch_queue_depth: int, seed: int,
                    feed: str = "bytes", augmenter: Augmenter | None = None, sized: bool = False,
                    user: UserOps = NO_USER_OPS, views: ViewPlan | None = None,
                    plan: DecodePlan | None = None) -> Pipeline:
    """build_pipeline's pipeline, not built: its graph can be defined (and read) without a GPU."""
    gpu = device_id is not None
    layout = feed_layout(spec.train, feed, augmenter, sized, user.hooks, views)

    def graph():
        arrays = fn.external_source(source=source, num_outputs=len(layout), batch=True, no_copy=True,
                                    dtype=[dtype for _, dtype in layout],
                                    layout=["HWC" if name == "pixels" else "" for name, _ in layout])
        inputs = dict(zip((name for name, _ in layout), arrays))
        if feed == "pixels":
            return pixel_graph(inputs["pixels"], spec, gpu, inputs, augmenter, user, views)
        return image_graph(inputs["encoded"], spec, gpu, inputs, augmenter, num_threads, user, views, plan)

    conditionals = bool(spec.train and augmenter is not None and augmenter.slots) or bool(
        views and views.has_ops)
    return pipeline_def(graph, enable_conditionals=conditionals)(
        batch_size=batch_size, num_threads=num_threads, device_id=device_id,
        prefetch_queue_depth=prefetch_queue_depth, seed=seed, exec_dynamic=True)
