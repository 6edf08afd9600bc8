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

from fastloader.errors import ConfigError
from fastloader.imaging.boxes import centre_box
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


def refuse_unwired_keys(config: Config, split: SplitConfig) -> None:
    """The train keys this graph does not apply yet (auto_augment, color_jitter, vflip: the feed
    passes their draws once issue 25's second part lands): an error, never a silent skip."""
    t = split.transform
    keys = [key for key, on in (("auto_augment", t.auto_augment), ("color_jitter", t.color_jitter is not None),
                                ("vflip", t.vflip > 0)) if on]
    if split.mode == "train" and keys:
        raise ConfigError(f"{config.source}: {', '.join(f'{split.name}.transform.{key}' for key in keys)}: the DALI "
                          f"backend does not apply {'it' if len(keys) == 1 else 'them'} yet; set backend: torch, "
                          f"or leave {'it' if len(keys) == 1 else 'them'} out")


def image_graph(encoded, labels, config: Config, split: SplitConfig, gpu: bool, box: Box | None = None):
    """(images, labels) DataNodes of one split's graph, from encoded-file and label DataNodes.

    Train decodes only the random crop (ROI decode); eval decodes the whole image and resizes the
    centre `box` (roi_start, roi_end DataNodes computed on the host, see build_pipeline). Then the
    steps shared with the cache's graph (finish).
    """
    refuse_unwired_keys(config, split)
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
    return finish(images, labels, config, split, gpu)


def pixel_graph(pixels, labels, config: Config, split: SplitConfig, gpu: bool, box: Box | None = None):
    """The same graph after the decoder, for decoded HWC uint8 pixels (the uint8 cache): train takes
    a random-resized crop with the decoder's area, aspect and tries; eval the same centre box."""
    refuse_unwired_keys(config, split)
    t = split.transform
    images = pixels.gpu() if gpu else pixels
    if split.mode == "train":
        images = fn.random_resized_crop(images, size=[t.size, t.size], random_area=list(t.scale),
                                        random_aspect_ratio=list(t.ratio), num_attempts=RANDOM_CROP_ATTEMPTS,
                                        **_resampling(t))
    else:
        images = resize_box(images, box, split)
    return finish(images, labels, config, split, gpu)


def _resampling(t) -> dict:
    return {"interp_type": INTERPOLATION[t.interpolation], "antialias": t.interpolation != "nearest"}


def resize_box(images: DataNode, box: Box, split: SplitConfig) -> DataNode:
    """Eval: resize each image's centre box (fractional source pixels, see fastloader.imaging.boxes) to size x size."""
    t = split.transform
    roi_start, roi_end = box
    return fn.resize(images, resize_x=t.size, resize_y=t.size, roi_start=roi_start, roi_end=roi_end,
                     **_resampling(t))


def centre_boxes(sizes: np.ndarray, split: SplitConfig) -> tuple[np.ndarray, np.ndarray]:
    """(roi_start, roi_end), float32 [n, 2] each in DALI's (y, x) order, of the centre boxes of
    images of upright (height, width) `sizes`: what the feed passes in with an eval batch."""
    t = split.transform
    boxes = np.array([centre_box(width, height, t.size, t.crop_pct) for height, width in sizes.tolist()],
                     dtype=np.float32).reshape(-1, 4)  # left, top, right, bottom
    return boxes[:, 1::-1].copy(), boxes[:, :1:-1].copy()


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
    With `cached`, `source` gives (list of HWC uint8 pixel arrays, int64 labels) instead. In eval
    mode `source` also gives each batch's centre boxes, (roi_start, roi_end) from centre_boxes:
    the box is host arithmetic on the image size, which as DALI operators halved the GPU eval rate.

    `source` is called on the host, once per batch, ahead of use by `prefetch_queue_depth`
    batches; raising StopIteration ends the epoch. device_id None builds the cpu flavour.
    """
    pipe = Pipeline(batch_size=batch_size, num_threads=num_threads, device_id=device_id,
                    prefetch_queue_depth=prefetch_queue_depth, seed=seed)
    gpu = device_id is not None
    inputs = 2 if split.mode == "train" else 4
    with pipe:
        data, labels, *box = fn.external_source(
            source=source, num_outputs=inputs, batch=True,
            dtype=[types.UINT8, types.INT64, types.FLOAT, types.FLOAT][:inputs],
            layout=["HWC" if cached else "", "", "", ""][:inputs])
        if cached:
            outputs = pixel_graph(data, labels, config, split, gpu, box)
        else:
            outputs = image_graph(fn.io.file.read(data), labels, config, split, gpu, box)
        pipe.set_outputs(*outputs)
    pipe.build()
    return pipe
