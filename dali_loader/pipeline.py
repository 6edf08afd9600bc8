"""The DALI graph: encoded bytes -> decode (with the random crop for train) -> resize ->
crop / mirror / normalize; or, from the uint8 cache, decoded pixels -> random-resized crop (train)
or the centre box (eval) -> the same flip and normalize. One function builds both flavours:

- gpu: the decoders run as "mixed" operators (nvJPEG; the GPU's hardware JPEG decoder takes
  `hw_decoder_load` of each batch where it has one), everything after them on the GPU;
- cpu: the same operators with device="cpu" and no device_id, which DALI runs without any GPU.
  CI runs this flavour, so the two differ in the devices and the decoder's memory hints only.

Every transform key means what it means for the torch backend: `scale` and `ratio` are
RandomResizedCrop's area and aspect ranges (10 tries), `hflip` the coin's probability, `crop_pct`
the shorter side floor(size / crop_pct) before the centre crop (the same box, see centre_box),
`interpolation` the filter, and shrinking is antialiased in both.
"""
from __future__ import annotations

import math
from typing import Callable

import nvidia.dali.math as dmath
from nvidia.dali import fn, types
from nvidia.dali.data_node import DataNode
from nvidia.dali.pipeline import Pipeline

from fastloader.config import Config, SplitConfig

INTERPOLATION = {"bilinear": types.INTERP_LINEAR, "bicubic": types.INTERP_CUBIC, "nearest": types.INTERP_NN}
OUTPUT_DTYPE = {"float32": types.FLOAT, "float16": types.FLOAT16, "bfloat16": types.FLOAT}  # bf16: cast in torch
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


def _round_half_even(twice: DataNode) -> DataNode:
    """round(twice / 2) as Python rounds (half to even), for whole numbers held as floats."""
    half = dmath.floor(twice / 2)
    return half + (twice - 2 * half) * (half - 2 * dmath.floor(half / 2))


def centre_box(shape: DataNode, size: int, crop_pct: float) -> tuple[DataNode, DataNode]:
    """(roi_start, roi_end) in source pixels, (y, x): the box that torchvision's Resize(floor(size /
    crop_pct)) + CenterCrop(size) keeps, with its rounding, from the image's (height, width, ...)
    shape (read from the file's header, or the cached pixels' shape).

    Resizing this fractional box straight to size x size samples the very positions that resizing
    the whole image and cropping would, without computing the pixels the crop throws away. (DALI's
    own resize_shorter keeps the exact aspect ratio, not torchvision's truncated long side, and its
    centre crop rounds halves up: both shift pixels by a fraction, visible on fine textures.)
    """
    shape = fn.cast(shape, dtype=types.FLOAT)
    height, width = shape[0], shape[1]
    short = math.floor(size / crop_pct)
    portrait = width <= height
    resized_w = portrait * short + (1 - portrait) * dmath.floor(short * width / height + 1e-3)
    resized_h = (1 - portrait) * short + portrait * dmath.floor(short * height / width + 1e-3)
    scale_y, scale_x = height / resized_h, width / resized_w
    top = _round_half_even(resized_h - size) * scale_y
    left = _round_half_even(resized_w - size) * scale_x
    return fn.stack(top, left), fn.stack(top + size * scale_y, left + size * scale_x)


def image_graph(encoded, labels, config: Config, split: SplitConfig, gpu: bool):
    """(images, labels) DataNodes of one split's graph, from encoded-file and label DataNodes.

    Train decodes only the random crop (ROI decode); eval decodes the whole image and takes the
    centre box from the file's header. Then the steps shared with the cache's graph (finish).
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
        images = resize_centre(images, fn.peek_image_shape(encoded, adjust_orientation=exif), split)
    return finish(images, labels, config, split, gpu)


def pixel_graph(pixels, labels, config: Config, split: SplitConfig, gpu: bool):
    """The same graph after the decoder, for decoded HWC uint8 pixels (the uint8 cache): train takes
    a random-resized crop with the decoder's area, aspect and tries; eval the same centre box."""
    t = split.transform
    shape = pixels.shape()  # on the host, where DALI wants argument inputs
    images = pixels.gpu() if gpu else pixels
    if split.mode == "train":
        images = fn.random_resized_crop(images, size=[t.size, t.size], random_area=list(t.scale),
                                        random_aspect_ratio=list(t.ratio), num_attempts=RANDOM_CROP_ATTEMPTS,
                                        **_resampling(t))
    else:
        images = resize_centre(images, shape, split)
    return finish(images, labels, config, split, gpu)


def _resampling(t) -> dict:
    return {"interp_type": INTERPOLATION[t.interpolation], "antialias": t.interpolation != "nearest"}


def resize_centre(images: DataNode, shape: DataNode, split: SplitConfig) -> DataNode:
    """Eval: resize the centre box of each image (see centre_box) to size x size."""
    t = split.transform
    roi_start, roi_end = centre_box(shape, t.size, t.crop_pct)
    return fn.resize(images, resize_x=t.size, resize_y=t.size, roi_start=roi_start, roi_end=roi_end,
                     **_resampling(t))


def finish(images: DataNode, labels: DataNode, config: Config, split: SplitConfig, gpu: bool):
    """Flip (train), normalize, cast and lay out size x size images; labels to the images' device.

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
    return images, (labels.gpu() if gpu else labels)


def build_pipeline(config: Config, split: SplitConfig, source: Callable, *, device_id: int | None,
                   batch_size: int, num_threads: int, prefetch_queue_depth: int, seed: int,
                   cached: bool = False) -> Pipeline:
    """A built pipeline that pulls (list of UTF-8 file paths as uint8 arrays, int64 labels) batches
    from `source`; DALI's threads read the files (Python reading them costs 6% of throughput).
    With `cached`, `source` gives (list of HWC uint8 pixel arrays, int64 labels) instead.

    `source` is called on the host, once per batch, ahead of use by `prefetch_queue_depth`
    batches; raising StopIteration ends the epoch. device_id None builds the cpu flavour.
    """
    pipe = Pipeline(batch_size=batch_size, num_threads=num_threads, device_id=device_id,
                    prefetch_queue_depth=prefetch_queue_depth, seed=seed)
    gpu = device_id is not None
    with pipe:
        data, labels = fn.external_source(source=source, num_outputs=2, batch=True, dtype=[types.UINT8, types.INT64],
                                          layout=["HWC" if cached else "", ""])
        if cached:
            outputs = pixel_graph(data, labels, config, split, gpu)
        else:
            outputs = image_graph(fn.io.file.read(data), labels, config, split, gpu)
        pipe.set_outputs(*outputs)
    pipe.build()
    return pipe
