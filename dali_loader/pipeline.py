"""The DALI graph: encoded bytes -> decode (with the random crop for train) -> resize ->
crop / mirror / normalize; or, from the uint8 cache, decoded pixels -> random-resized crop (train)
or the centre box (eval) -> the same flip and normalize. One function builds both flavours:

- gpu: the decoders run as "mixed" operators (nvJPEG; the GPU's hardware JPEG decoder takes
  `hw_decoder_load` of each batch where it has one), everything after them on the GPU;
- cpu: the same operators with device="cpu" and no device_id, which DALI runs without any GPU.
  CI runs this flavour, so the two differ in the devices and the decoder's memory hints only.

Every transform key means what it means for the torch backend: `scale` and `ratio` are
RandomResizedCrop's area and aspect ranges (10 tries), `hflip` the coin's probability, `crop_pct`
the shorter side floor(size / crop_pct) before the centre crop (the same box, fastloader.imaging.boxes),
`interpolation` the filter, and shrinking is antialiased in both.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from nvidia.dali import fn, types
from nvidia.dali.data_node import DataNode
from nvidia.dali.pipeline import Pipeline

from fastloader.imaging.boxes import centre_boxes as centre_box_array
from fastloader.schema import Config, SplitConfig

INTERPOLATION = {"bilinear": types.INTERP_LINEAR, "bicubic": types.INTERP_CUBIC, "nearest": types.INTERP_NN}
OUTPUT_DTYPE = {"float32": types.FLOAT, "float16": types.FLOAT16, "bfloat16": types.FLOAT}  # bf16: cast in torch
Box = tuple[DataNode, DataNode]
"""(roi_start, roi_end) of an eval batch: per-sample (y, x) in source pixels, fed from the host."""
RANDOM_CROP_ATTEMPTS = 10  # torchvision's RandomResizedCrop; NVIDIA's example uses 100

# nvJPEG buffer hints from NVIDIA's ResNet-50 example: sized for the largest ImageNet image, so
# that decoding never reallocates mid-epoch.
DEVICE_MEMORY_PADDING = 211025920
HOST_MEMORY_PADDING = 140544512
PREALLOCATE_WIDTH_HINT = 5980
PREALLOCATE_HEIGHT_HINT = 6430


def decoder_options(gpu: bool, hw_decoder_load: float) -> dict:
    """The decoder's device and, for nvJPEG, its memory hints and hardware decoder share."""
    if not gpu:
        return {"device": "cpu"}
    return {"device": "mixed", "device_memory_padding": DEVICE_MEMORY_PADDING,
            "host_memory_padding": HOST_MEMORY_PADDING, "preallocate_width_hint": PREALLOCATE_WIDTH_HINT,
            "preallocate_height_hint": PREALLOCATE_HEIGHT_HINT, "hw_decoder_load": hw_decoder_load}


def image_graph(encoded, config: Config, split: SplitConfig, gpu: bool, box: Box | None = None) -> DataNode:
    """The images DataNode of one split's graph, from an encoded-file DataNode.

    Train decodes only the random crop (ROI decode); eval decodes the whole image and resizes the
    centre `box` (roi_start, roi_end DataNodes computed on the host, see build_pipeline). Then the
    steps shared with the cache's graph (finish).
    """
    t = split.transform
    decoder = decoder_options(gpu, config.dali.hw_decoder_load)
    exif = config.dataset.exif_orientation
    if split.mode == "train":
        images = fn.decoders.image_random_crop(
            encoded, output_type=types.RGB, random_area=list(t.scale), random_aspect_ratio=list(t.ratio),
            num_attempts=RANDOM_CROP_ATTEMPTS, adjust_orientation=exif, **decoder)
        images = fn.resize(images, resize_x=t.size, resize_y=t.size, **_resampling(t))
    else:
        images = fn.decoders.image(encoded, output_type=types.RGB, adjust_orientation=exif, **decoder)
        images = resize_box(images, box, split)
    return finish(images, config, split)


def pixel_graph(pixels, config: Config, split: SplitConfig, gpu: bool, box: Box | None = None) -> DataNode:
    """The same graph after the decoder, for decoded HWC uint8 pixels (the uint8 cache): train takes
    a random-resized crop with the decoder's area, aspect and tries; eval the same centre box."""
    t = split.transform
    images = pixels.gpu() if gpu else pixels
    if split.mode == "train":
        images = fn.random_resized_crop(images, size=[t.size, t.size], random_area=list(t.scale),
                                        random_aspect_ratio=list(t.ratio), num_attempts=RANDOM_CROP_ATTEMPTS,
                                        **_resampling(t))
    else:
        images = resize_box(images, box, split)
    return finish(images, config, split)


def _resampling(t) -> dict:
    return {"interp_type": INTERPOLATION[t.interpolation], "antialias": t.interpolation != "nearest"}


def resize_box(images: DataNode, box: Box, split: SplitConfig) -> DataNode:
    """Eval: resize each image's centre box (fractional source pixels, see fastloader.imaging.boxes) to size x size."""
    t = split.transform
    roi_start, roi_end = box
    return fn.resize(images, resize_x=t.size, resize_y=t.size, roi_start=roi_start, roi_end=roi_end,
                     **_resampling(t))


def centre_boxes(sizes: np.ndarray, split: SplitConfig) -> np.ndarray:
    """float32 [n, 4]: (roi_start, roi_end) in DALI's (y, x) order, i.e. (top, left, bottom, right),
    of the centre boxes of images of upright (height, width) `sizes`: what the feed passes in with
    an eval batch."""
    t = split.transform
    boxes = centre_box_array(sizes[:, 1], sizes[:, 0], t.size, t.crop_pct)  # left, top, right, bottom
    return np.ascontiguousarray(boxes[:, [1, 0, 3, 2]], dtype=np.float32)


def finish(images: DataNode, config: Config, split: SplitConfig) -> DataNode:
    """Flip (train), normalize, cast and lay out size x size images.

    Images leave as the configured float dtype (bfloat16 as float32, cast by the loader), CHW, or
    HWC when the output is channels_last (NHWC memory, which torch sees as a channels_last NCHW
    tensor without a copy).
    """
    mirror = fn.random.coin_flip(probability=split.transform.hflip) if split.mode == "train" else 0
    mean = [m * 255 for m in config.normalize.mean]
    std = [s * 255 for s in config.normalize.std]
    images = fn.crop_mirror_normalize(
        images, dtype=OUTPUT_DTYPE[config.output.dtype], output_layout="HWC" if config.output.channels_last else "CHW",
        mean=mean, std=std, mirror=mirror)
    return images


def build_pipeline(config: Config, split: SplitConfig, source: Callable, *, device_id: int | None,
                   batch_size: int, num_threads: int, prefetch_queue_depth: int, seed: int,
                   cached: bool = False, check_sizes: bool = False) -> Pipeline:
    """A built pipeline whose first output is the images of the batches it pulls from `source`:
    (uint8 [n, width] file paths, one per row, int32 [n, 1] their lengths); DALI's threads read the
    files (Python reading them costs 6% of throughput). With `cached`, `source` gives (list of HWC
    uint8 pixel arrays,) instead. In eval mode `source` also gives each batch's centre boxes, float32
    [n, 4] (roi_start, roi_end) from centre_boxes: the box is host arithmetic on the image size,
    which as DALI operators halved the GPU eval rate. With `check_sizes` (eval, files) the second
    output is each image's upright shape from its header, which the loader compares with the size
    its box came from. Labels stay on the host: the loader knows them.

    `source` is called on the host, once per batch, ahead of use by `prefetch_queue_depth`
    batches; raising StopIteration ends the epoch. device_id None builds the cpu flavour. Each
    array `source` returns is one call into DALI on the training thread, so they are few and dense.
    """
    pipe = Pipeline(batch_size=batch_size, num_threads=num_threads, device_id=device_id,
                    prefetch_queue_depth=prefetch_queue_depth, seed=seed)
    gpu = device_id is not None
    names = ["pixels"] if cached else ["paths", "lengths"]
    if split.mode != "train":
        names += ["box"]
    dtypes = {"pixels": types.UINT8, "paths": types.UINT8, "lengths": types.INT32, "box": types.FLOAT}
    with pipe:
        inputs = fn.external_source(source=source, num_outputs=len(names), batch=True,
                                    dtype=[dtypes[name] for name in names],
                                    layout=["HWC" if name == "pixels" else "" for name in names])
        inputs = dict(zip(names, inputs))
        box = (inputs["box"][0:2], inputs["box"][2:4]) if split.mode != "train" else None
        if cached:
            outputs = [pixel_graph(inputs["pixels"], config, split, gpu, box)]
        else:  # each row of the path matrix cut to its length: one file name per sample
            paths = fn.slice(inputs["paths"], start=types.Constant(np.zeros(1, dtype=np.int32)),
                             shape=inputs["lengths"], axes=[0])
            encoded = fn.io.file.read(paths)
            outputs = [image_graph(encoded, config, split, gpu, box)]
            if check_sizes:
                outputs.append(fn.peek_image_shape(encoded, adjust_orientation=config.dataset.exif_orientation))
        pipe.set_outputs(*outputs)
    pipe.build()
    return pipe
