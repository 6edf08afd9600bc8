"""Peers that several benchmarks measure fastloader against, written out as their authors ship them.

- torchvision defaults: ImageFolder + DataLoader with the reference ImageNet transforms;
- NVIDIA RN50 example: the pipeline of DALI's docs/examples/use_cases/pytorch/resnet50/main.py,
  written out below as that example sets it (file reader, its crop ranges and 100 tries,
  triangular resize, nvJPEG hints) and read through DALIClassificationIterator;
- our graph + DALI reader: fastloader's own DALI graph fed by DALI's file reader instead of our
  sampler, which isolates what feeding from Python costs (the reader cannot keep the contract's order).

The DALI peers exist where NVIDIA DALI imports; elsewhere NO_DALI says why not.
"""
from __future__ import annotations

from pathlib import Path

import harness
import numpy as np
import torch
import torch.utils.data
from harness import CONFIG, Factory
from torchvision import datasets, transforms

import fastloader
from fastloader.config import IMAGENET_MEAN, IMAGENET_STD

NO_DALI = harness.missing_dali()
if NO_DALI is None:
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.pipeline import Pipeline
    from nvidia.dali.plugin.pytorch import DALIClassificationIterator, LastBatchPolicy

    from dali_loader.augment import feed_arrays
    from dali_loader.loader import graph_spec
    from dali_loader.pipeline import centre_boxes, decode_plan, decoder_options, feed_layout, image_graph
    from dali_loader.stack import dali_cuda_major, nvjpeg_version
    from fastloader.decoding.sizes import upright_size
    from fastloader.draws import Augmenter

TORCHVISION, NVIDIA, READER = "torchvision defaults", "NVIDIA RN50 example", "our graph + DALI reader"
EXAMPLE_SEED = 12  # the example's seed=12 + local_rank


def torchvision_transform(split: str, size: int) -> transforms.Compose:
    """The reference ImageNet recipe, as in torchvision's and timm's training scripts."""
    normalize = transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    if split == "train":
        steps = [transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip()]
    else:
        steps = [transforms.Resize(int(size / 0.875)), transforms.CenterCrop(size)]
    return transforms.Compose([*steps, transforms.ToTensor(), normalize])


def torchvision_factory(split: str, split_dir: Path, repeat: int, batch_size: int, size: int, workers: int) -> Factory:
    folder = datasets.ImageFolder(str(split_dir), transform=torchvision_transform(split, size))
    dataset = torch.utils.data.ConcatDataset([folder] * repeat)

    def build():
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=split == "train",
                                             num_workers=workers)
        return loader, lambda: None
    return build


def nvidia_example_pipeline(files: list[str], labels: list[int], train: bool, gpu: bool, crop: int, size: int,
                            batch_size: int, threads: int) -> Pipeline:
    """create_dali_pipeline of NVIDIA's example (its current revision adds the preallocation hints
    and hw_decoder_load to the mixed train decoder), one shard."""
    pipe = Pipeline(batch_size=batch_size, num_threads=threads, device_id=0 if gpu else None, seed=EXAMPLE_SEED)
    with pipe:
        images, label = fn.readers.file(files=files, labels=labels, shard_id=0, num_shards=1,
                                        random_shuffle=train, pad_last_batch=True, name="Reader")
        # as the example runs: its train decoder's nvJPEG hints per thread, its val decoder's DALI defaults,
        # nvJPEG's default chroma upsampling
        decoder = {**decoder_options(gpu, hw_decoder_load=0.65, train=train), "jpeg_fancy_upsampling": False}
        if train:
            images = fn.decoders.image_random_crop(images, output_type=types.RGB, random_aspect_ratio=[0.8, 1.25],
                                                   random_area=[0.1, 1.0], num_attempts=100, **decoder)
            images = fn.resize(images, resize_x=crop, resize_y=crop, interp_type=types.INTERP_TRIANGULAR)
            mirror = fn.random.coin_flip(probability=0.5)
        else:
            images = fn.decoders.image(images, output_type=types.RGB, **decoder)
            images = fn.resize(images, size=size, mode="not_smaller", interp_type=types.INTERP_TRIANGULAR)
            mirror = False
        images = fn.crop_mirror_normalize(images.gpu() if gpu else images, dtype=types.FLOAT, output_layout="CHW",
                                          crop=(crop, crop), mean=[m * 255 for m in IMAGENET_MEAN],
                                          std=[s * 255 for s in IMAGENET_STD], mirror=mirror)
        pipe.set_outputs(images, label.gpu() if gpu else label)
    pipe.build()
    return pipe


def our_graph_on_dali_reader(files: list[str], labels: list[int], split: str, gpu: bool, overrides: dict,
                             batch_size: int, threads: int) -> Pipeline:
    """fastloader's graph (dali_loader.pipeline.image_graph) with DALI's file reader as its input.
    The per-sample inputs the loader's feed would give (train: crops, flips and ops drawn for each
    image's size; eval: centre boxes) come from a second source in the reader's order: the reader
    reads its list in order (no shuffle: the host could not follow it), and the benchmark stays
    within the first epoch."""
    config = fastloader.load_config(str(CONFIG), overrides)
    split_config = config.split(split)
    augmenter = Augmenter(split_config.transform, config.normalize.mean) if split == "train" else None
    spec = graph_spec(config, split_config)
    layout = feed_layout(spec.train, "bytes", augmenter)[1:]  # what follows the encoded bytes
    nvjpeg = nvjpeg_version(dali_cuda_major()) if gpu else None
    plan = decode_plan(config.dali.fancy_upsampling, gpu, split == "train", nvjpeg)  # the loader's, on this stack

    def graph():
        encoded, label = fn.readers.file(files=files, labels=labels, pad_last_batch=True, name="Reader")
        arrays = fn.external_source(source=inputs_in_order(files, config, spec, augmenter, batch_size),
                                    num_outputs=len(layout), batch=True, dtype=[dtype for _, dtype in layout])
        inputs = dict(zip((name for name, _ in layout), arrays))
        images = image_graph(encoded, spec, gpu, inputs, augmenter, threads=threads, plan=plan)
        return images, label.gpu() if gpu else label

    conditionals = bool(augmenter and augmenter.slots)
    pipe = pipeline_def(graph, enable_conditionals=conditionals)(
        batch_size=batch_size, num_threads=threads, device_id=0 if gpu else None, seed=EXAMPLE_SEED)
    pipe.build()
    return pipe


def inputs_in_order(files: list[str], config, spec, augmenter, batch_size: int):
    """A batch source of the per-sample inputs of `files`, in list order, cycling: the centre boxes
    (eval), or the draws for each image's size with its position as its seed (train)."""
    known = {f: upright_size(f, config.dataset.exif_orientation) for f in dict.fromkeys(files)}
    sizes = np.array([known[f] for f in files])
    position = 0

    def source():
        nonlocal position
        rows = np.arange(position, position + batch_size) % len(files)
        position += batch_size
        if augmenter is None:
            return (centre_boxes(sizes[rows], spec.sizing),)
        return feed_arrays(augmenter, rows.astype(np.int64), sizes[rows])
    return source


class ExampleBatches:
    """A DALI pipeline read as the examples read it: DALIClassificationIterator, labels as int64.
    `prefetch_depth`: the pipeline's prefetch queue, the batches it holds ready ahead of its reader."""

    def __init__(self, pipe: Pipeline):
        self.prefetch_depth = pipe.prefetch_queue_depth if isinstance(pipe.prefetch_queue_depth, int) else None
        self.iterator = DALIClassificationIterator(pipe, reader_name="Reader",
                                                   last_batch_policy=LastBatchPolicy.PARTIAL)

    def __iter__(self):
        return ((batch[0]["data"], batch[0]["label"].squeeze(-1).long()) for batch in self.iterator)


def iterator_factory(make_pipeline) -> Factory:
    def build():
        return ExampleBatches(make_pipeline()), lambda: None
    return build


def nvidia_example_factory(files: list[str], labels: list[int], train: bool, gpu: bool, crop: int, batch_size: int,
                           threads: int) -> Factory:
    """NVIDIA's example over `files`, resizing eval images to crop / 0.875 as the example does."""
    size = int(crop / 0.875)
    return iterator_factory(lambda: nvidia_example_pipeline(files, labels, train, gpu, crop, size, batch_size,
                                                            threads))


def reader_factory(files: list[str], labels: list[int], split: str, gpu: bool, overrides: dict, batch_size: int,
                   threads: int) -> Factory:
    return iterator_factory(lambda: our_graph_on_dali_reader(files, labels, split, gpu, overrides, batch_size,
                                                             threads))
