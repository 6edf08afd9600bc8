"""Throughput of fastloader's torch backend against torchvision's default ImageNet pipeline.

Both loaders read the same JPEGs, produce normalized float32 batches on the CPU and use the same
number of workers, measured in interleaved rounds (see harness.py).

    python benchmarks/compare_loaders.py
    python benchmarks/compare_loaders.py --split val --rounds 3 --json results.json
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.utils.data
from torchvision import datasets, transforms

import harness
from harness import Factory

from fastloader.config import IMAGENET_MEAN, IMAGENET_STD
from fastloader.samples import SampleIndex

OURS, THEIRS = "fastloader torch", "torchvision defaults"


def torchvision_transform(split: str, size: int) -> transforms.Compose:
    """The reference ImageNet recipe, as in torchvision's and timm's training scripts."""
    normalize = transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    if split == "train":
        steps = [transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip()]
    else:
        steps = [transforms.Resize(int(size / 0.875)), transforms.CenterCrop(size)]
    return transforms.Compose([*steps, transforms.ToTensor(), normalize])


def torchvision_factory(split: str, split_dir: Path, repeat: int, args: argparse.Namespace) -> Factory:
    folder = datasets.ImageFolder(str(split_dir), transform=torchvision_transform(split, args.size))
    dataset = torch.utils.data.ConcatDataset([folder] * repeat)

    def build():
        loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=split == "train",
                                             num_workers=args.workers)
        return loader, lambda: None
    return build


def build_peers(split: str, split_dir: Path, index: SampleIndex, list_path: Path, repeat: int,
                args: argparse.Namespace) -> dict[str, Factory]:
    overrides = harness.fastloader_overrides(split, split_dir, index, list_path, args, backend="torch",
                                             **{"output.device": "cpu", "workers.num_workers": args.workers})
    return {OURS: harness.fastloader_factory(split, overrides),
            THEIRS: torchvision_factory(split, split_dir, repeat, args)}


if __name__ == "__main__":
    parser = harness.base_parser(__doc__)
    sys.exit(harness.main(harness.check_args(parser, parser.parse_args()), build_peers, "compare_loaders"))
