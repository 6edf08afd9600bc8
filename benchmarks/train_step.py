"""Training steps per second, fed by each loader, against the model alone (the ceiling).

A loader's own images/s says little about training: on a GPU the loader shares the device (and the
host) with the trainer. Here every peer feeds the same training step, a torchvision model in bf16
autocast with channels_last inputs (SGD, cross-entropy), and images/s counts finished steps:
- model only: one synthetic batch already on the device, fed again and again (the ceiling);
- fastloader torch / dali, from the JPEGs and from a uint8 cache of them (`fastloader cache`,
  dataset.cache; built at the start, as cache.py does);
- NVIDIA RN50 example: the pipeline of DALI's ResNet-50 example (peer_loaders.py), as it ships.
Peers run in interleaved rounds (harness.py); the device is synchronized before the first and
after the last timed step. Prints images/s, each peer's ratio to the model alone, and on a GPU the
device memory in use and torch's peak allocation while the peer ran.

    python benchmarks/train_step.py --workers 14                       # GPU: ResNet-18 and ResNet-50, batch 256
    python benchmarks/train_step.py --device cpu --models resnet18 --batch-size 8 --size 64 --batches 2
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import Callable

import harness
import peer_loaders
import torch
import torchvision
from harness import Factory

from fastloader.cache_format import DEFAULT_SHORT_SIDE
from fastloader.samples import SampleIndex

PEERS = ("model", "torch", "dali", "torch-cache", "dali-cache", "nvidia")
NAMES = {"model": "model only", "torch": "fastloader torch JPEG", "dali": "fastloader dali JPEG",
         "torch-cache": "fastloader torch cached", "dali-cache": "fastloader dali cached",
         "nvidia": "NVIDIA RN50 example"}
MEMORY: dict[str, list[dict]] = {}
"""Peer -> per measurement, device memory in use at its end and torch's peak allocation (MiB)."""


def peer_name(model: str, peer: str) -> str:
    return f"{model}: {NAMES[peer]}"


def training_step(model_name: str, device: torch.device) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """A fresh model's step: channels_last input, bf16 autocast forward, backward, SGD update."""
    model = getattr(torchvision.models, model_name)(num_classes=1000)
    model = model.to(device, memory_format=torch.channels_last).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_of = torch.nn.CrossEntropyLoss()

    def step(images: torch.Tensor, labels: torch.Tensor) -> None:
        images = images.to(device, memory_format=torch.channels_last, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_of(model(images), labels.to(device, non_blocking=True))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return step


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def training(feed: Factory, name: str, model_name: str, device: torch.device, args: argparse.Namespace) -> Factory:
    """`feed`'s batches, each yielded after a training step on it: harness.measure then times steps.
    The device is synchronized at the batches where the harness starts and stops its clock."""
    def build():
        batches, close = feed()
        step = training_step(model_name, device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

        def steps():
            for number, (images, labels) in enumerate(batches, 1):
                step(images, labels)
                if number in (args.warmup, args.warmup + args.batches):
                    synchronize(device)
                yield images, labels

        def finish():
            if device.type == "cuda":
                free, total = torch.cuda.mem_get_info(device)
                MEMORY.setdefault(name, []).append({"device_used_mib": (total - free) / 2**20,
                                                     "torch_peak_mib": torch.cuda.max_memory_allocated(device) / 2**20})
            close()
        return steps(), finish
    return build


def model_only(device: torch.device, args: argparse.Namespace) -> Factory:
    """One normalized-looking batch on the device, fed warm-up + timed + 1 times."""
    def build():
        dtype = getattr(torch, args.dtype)
        images = torch.randn(args.batch_size, 3, args.size, args.size, device=device).to(
            dtype, memory_format=torch.channels_last)
        labels = torch.randint(0, 1000, (args.batch_size,), device=device)
        return itertools.repeat((images, labels), args.warmup + args.batches + 1), lambda: None
    return build


def feeds(split: str, split_dir: Path, index: SampleIndex, list_path: Path, repeat: int,
          args: argparse.Namespace, device: torch.device) -> dict[str, Factory]:
    """Every requested peer's batches (no training yet), by peer key."""
    overrides = harness.fastloader_overrides(
        split, split_dir, index, list_path, args, repeat, **{
            "output.device": device.type, "output.dtype": args.dtype, "output.channels_last": True,
            "workers.num_workers": args.workers, "dali.threads": max(1, args.workers)})
    cache_dir = list_path.parent / "cache"
    if {"torch-cache", "dali-cache"} & set(args.peers):
        harness.build_cache(split, overrides, cache_dir, index, args)
    made = {"model": model_only(device, args)}
    for backend in ("torch", "dali"):
        made[backend] = harness.fastloader_factory(split, {**overrides, "backend": backend})
        made[f"{backend}-cache"] = harness.fastloader_factory(
            split, {**overrides, "backend": backend, "dataset.cache": str(cache_dir)})
    if peer_loaders.NO_DALI is None:
        files, labels = harness.listed_files(index, repeat)
        made["nvidia"] = peer_loaders.nvidia_example_factory(files, labels, True, device.type == "cuda", args.size,
                                                             args.batch_size, max(1, args.workers))
    return {key: made[key] for key in args.peers}


def build_peers(device: torch.device):
    def build(split: str, split_dir: Path, index: SampleIndex, list_path: Path, repeat: int,
              args: argparse.Namespace) -> dict[str, Factory]:
        batches = feeds(split, split_dir, index, list_path, repeat, args, device)
        return {peer_name(model, key): training(feed, peer_name(model, key), model, device, args)
                for model in args.models for key, feed in batches.items()}
    return build


def memory_report(results: dict, hardware: dict) -> dict:
    if MEMORY:
        print("\nGPU memory per peer (median over rounds): device memory in use at its end, torch's peak allocation")
        width = max(len(name) for name in MEMORY)
        for name, samples in MEMORY.items():
            used = sorted(s["device_used_mib"] for s in samples)[len(samples) // 2]
            peak = sorted(s["torch_peak_mib"] for s in samples)[len(samples) // 2]
            print(f"  {name:<{width}} {used:9.0f} MiB in use {peak:9.0f} MiB torch peak")
    return {"gpu_memory": MEMORY}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = harness.base_parser(__doc__)
    parser.set_defaults(batch_size=256, split="train", rounds=3, batches=30, warmup=5)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where the model trains and the loaders deliver (default: cuda where available)")
    parser.add_argument("--models", type=lambda text: text.split(","), default=["resnet18", "resnet50"],
                        help="torchvision model names, comma-separated (default: resnet18,resnet50)")
    parser.add_argument("--peers", type=lambda text: text.split(","), default=list(PEERS),
                        help=f"comma-separated subset of {','.join(PEERS)} (default: all)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="bfloat16",
                        help="fastloader's output.dtype and the synthetic batch's (default: bfloat16)")
    parser.add_argument("--short-side", type=int, default=DEFAULT_SHORT_SIDE,
                        help=f"the uint8 cache's --short-side (default: {DEFAULT_SHORT_SIDE})")
    args = harness.check_args(parser, parser.parse_args(argv))
    if args.split != "train":
        parser.error("--split: training steps run on the train split only")
    if args.warmup < 1:
        parser.error("--warmup must be >= 1: the device is synchronized after the warm-up steps")
    unknown = [p for p in args.peers if p not in PEERS] + [m for m in args.models if not hasattr(torchvision.models, m)]
    if unknown:
        parser.error(f"unknown peer or model: {', '.join(unknown)}; peers are {', '.join(PEERS)}, models "
                     f"torchvision.models names such as resnet18")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here; pass --device cpu")
    if peer_loaders.NO_DALI:  # no DALI here: its peers are skipped, with the reason
        skipped = [p for p in args.peers if p in ("dali", "dali-cache", "nvidia")]
        if skipped:
            print(f"skipped {', '.join(skipped)}: {peer_loaders.NO_DALI}")
        args.peers = [p for p in args.peers if p not in skipped]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    ceiling = [(peer_name(m, p), peer_name(m, "model")) for m in args.models for p in args.peers if p != "model"]
    extra = f", model step on {torch.cuda.get_device_name(0) if device.type == 'cuda' else 'the CPU'}"
    return harness.main(args, build_peers(device), "train_step", extra, ratios=ceiling, report=memory_report)


if __name__ == "__main__":
    sys.exit(main())
