"""Throughput of fastloader's DALI backend against NVIDIA's own ResNet-50 example pipeline.

Peers, measured in interleaved rounds on the same JPEGs, threads and device (see harness.py):
- fastloader dali: build_loader(backend: dali), fed from fastloader's sampler (external source);
- NVIDIA RN50 example: the pipeline of DALI's docs/examples/use_cases/pytorch/resnet50/main.py,
  written out below as that example sets it (file reader, its crop ranges and 100 tries,
  triangular resize, nvJPEG hints) and read through DALIClassificationIterator;
- our graph + DALI reader: fastloader's own graph fed by DALI's file reader instead of our sampler,
  which isolates what feeding from Python costs (the reader cannot keep the contract's order).

cpu flavour (no GPU; --device cpu): every operator on the CPU, device_id None. gpu flavour: mixed
decoders (nvJPEG, hardware decoder) and GPU operators on cuda:0.

    python benchmarks/compare_dali.py
    python benchmarks/compare_dali.py --device gpu --workers 8 --batch-size 256
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from nvidia.dali import __version__ as dali_version
from nvidia.dali import fn, types
from nvidia.dali.pipeline import Pipeline
from nvidia.dali.plugin.pytorch import DALIClassificationIterator, LastBatchPolicy

import harness
from harness import CONFIG, Factory

import fastloader
from dali_loader.pipeline import centre_boxes, decoder_options, image_graph
from dali_loader.sizes import upright_size
from fastloader.config import IMAGENET_MEAN, IMAGENET_STD
from fastloader.samples import SampleIndex

OURS, NVIDIA, READER = "fastloader dali", "NVIDIA RN50 example", "our graph + DALI reader"
EXAMPLE_SEED = 12  # the example's seed=12 + local_rank


def listed_files(index: SampleIndex, repeat: int) -> tuple[list[str], list[int]]:
    """The split's files and labels `repeat` times over: the long epoch every peer reads."""
    paths = [index.path(i) for i in range(len(index))]
    labels = [index.label(i) for i in range(len(index))]
    return paths * repeat, labels * repeat


def nvidia_example_pipeline(files: list[str], labels: list[int], train: bool, gpu: bool, crop: int, size: int,
                            args: argparse.Namespace) -> Pipeline:
    """create_dali_pipeline of NVIDIA's example (its current revision adds the preallocation hints
    and hw_decoder_load to the mixed decoder), one shard."""
    pipe = Pipeline(batch_size=args.batch_size, num_threads=args.workers, device_id=0 if gpu else None,
                    seed=EXAMPLE_SEED)
    with pipe:
        images, label = fn.readers.file(files=files, labels=labels, shard_id=0, num_shards=1,
                                        random_shuffle=train, pad_last_batch=True, name="Reader")
        decoder = decoder_options(gpu, hw_decoder_load=0.65)
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
                             args: argparse.Namespace) -> Pipeline:
    """fastloader's graph (dali_loader.pipeline.image_graph) with DALI's file reader as its input.
    Eval's centre boxes come from a second source in the reader's order (eval reads its list in
    order, and the benchmark stays within the first epoch)."""
    config = fastloader.load_config(str(CONFIG), overrides)
    pipe = Pipeline(batch_size=args.batch_size, num_threads=args.workers, device_id=0 if gpu else None,
                    seed=EXAMPLE_SEED)
    with pipe:
        encoded, label = fn.readers.file(files=files, labels=labels, random_shuffle=split == "train",
                                         pad_last_batch=True, name="Reader")
        box = None
        if split != "train":
            box = fn.external_source(source=boxes_in_order(files, config, split, args.batch_size), num_outputs=2,
                                     batch=True, dtype=[types.FLOAT, types.FLOAT])
        pipe.set_outputs(*image_graph(encoded, label, config, config.split(split), gpu, box))
    pipe.build()
    return pipe


def boxes_in_order(files: list[str], config, split: str, batch_size: int):
    """A batch source of the centre boxes of `files`, in list order, cycling."""
    known = {f: upright_size(f, config.dataset.exif_orientation) for f in dict.fromkeys(files)}
    sizes = np.array([known[f] for f in files])
    position = 0

    def source():
        nonlocal position
        rows = np.arange(position, position + batch_size) % len(files)
        position += batch_size
        return centre_boxes(sizes[rows], config.split(split))
    return source


def iterator_factory(make_pipeline) -> Factory:
    def build():
        iterator = DALIClassificationIterator(make_pipeline(), reader_name="Reader",
                                              last_batch_policy=LastBatchPolicy.PARTIAL)
        batches = ((batch[0]["data"], batch[0]["label"].squeeze(-1).long()) for batch in iterator)
        return batches, lambda: None
    return build


def build_peers(split: str, split_dir: Path, index: SampleIndex, list_path: Path, repeat: int,
                args: argparse.Namespace) -> dict[str, Factory]:
    gpu = args.device == "gpu"
    overrides = harness.fastloader_overrides(
        split, split_dir, index, list_path, args, backend="dali",
        **{"output.device": "cuda" if gpu else "cpu", "dali.threads": args.workers, "workers.prefetch_factor": 2})
    files, labels = listed_files(index, repeat)
    train = split == "train"
    size = int(args.size / 0.875)
    return {OURS: harness.fastloader_factory(split, overrides),
            NVIDIA: iterator_factory(lambda: nvidia_example_pipeline(files, labels, train, gpu, args.size, size, args)),
            READER: iterator_factory(lambda: our_graph_on_dali_reader(files, labels, split, gpu, overrides, args))}


if __name__ == "__main__":
    parser = harness.base_parser(__doc__)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="gpu" if torch.cuda.is_available() else "cpu",
                        help="DALI flavour (default: gpu where CUDA is available, else cpu)")
    arguments = harness.check_args(parser, parser.parse_args())
    if arguments.workers < 1:
        parser.error("--workers must be >= 1: DALI needs at least one CPU thread")
    flavour = f", DALI {dali_version} ({arguments.device} flavour)"
    if arguments.device == "gpu":
        flavour += f", GPU {torch.cuda.get_device_name(0)}"
    sys.exit(harness.main(arguments, build_peers, "compare_dali", flavour))
