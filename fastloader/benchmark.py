"""`fastloader bench`: iterate a split as a trainer would and report what the trainer waited."""
from __future__ import annotations

import sys
import time

from .progress import Progress

HELP = "iterate a split and report images/s, stall and time to first batch"
EXAMPLES = """  fastloader bench configs/sample.yaml
  fastloader bench configs/imagenette.yaml --split val --set dataset.root=/data/imagenette2-320 --batches 50
"""


def add_arguments(parser) -> None:
    parser.add_argument("--split", default="train", help="split section to read (default: train)")
    parser.add_argument("--backend", choices=("auto", "torch", "dali"), help="override the config's backend")
    parser.add_argument("--batches", type=int, default=0,
                        help="batches to time (default: one epoch); epochs repeat as needed")
    parser.add_argument("--warmup", type=int, default=2, help="batches run before timing starts (default: 2)")


def run(args) -> int:
    from . import build_loader
    overrides = list(args.overrides) + ([f"backend={args.backend}"] if args.backend else [])
    started = time.perf_counter()
    with build_loader(args.config, split=args.split, overrides=overrides) as loader:
        built = time.perf_counter() - started
        per_epoch = len(loader)
        if per_epoch == 0:
            print(f"fastloader: error: split '{args.split}' yields no batch per epoch (see the warning above)",
                  file=sys.stderr)
            return 1
        total = args.batches or per_epoch
        progress = Progress(args.warmup + total)
        first_batch = shape = dtype = None
        seen = images = 0
        epoch_start = timed_from = time.perf_counter()
        while seen < args.warmup + total:
            for batch_images, labels in loader:
                if first_batch is None:
                    first_batch = time.perf_counter() - epoch_start
                    shape, dtype = list(batch_images.shape), batch_images.dtype
                seen += 1
                if seen <= args.warmup:
                    timed_from = time.perf_counter()
                else:
                    images += len(labels)
                progress.update(seen)
                if seen >= args.warmup + total:
                    break
        _synchronize(loader.device)
        elapsed = time.perf_counter() - timed_from
        progress.finish()
        rate = images / elapsed if elapsed > 0 else float("nan")
        print(f"split {args.split}: backend {loader.backend}, device {loader.device}, "
              f"{_parallelism(loader)}, {loader.num_samples} samples, "
              f"{per_epoch} batches/epoch")
        print(f"batches: {shape} {str(dtype).removeprefix('torch.')}, classes: {', '.join(loader.classes[:8])}"
              f"{' ...' if len(loader.classes) > 8 else ''}")
        print(f"build {built:.2f} s, first batch {first_batch:.2f} s, {images} images timed in {elapsed:.2f} s: "
              f"{rate:.0f} images/s")
    return 0


def _synchronize(device) -> None:
    if device.type == "cuda":
        import torch
        torch.cuda.synchronize(device)


def _parallelism(loader) -> str:
    """How the loader decodes in parallel: torch workers, or DALI's flavour and threads."""
    info = loader.describe()
    if "flavour" in info:
        return f"{info['flavour']} flavour, {info['threads']} threads"
    return f"{info['workers']} workers"
