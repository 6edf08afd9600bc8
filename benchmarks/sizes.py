"""What a smaller output size buys: train images/s at 160, 192 and 224 px on both backends, and the
whole-run loader time of FFCV's progressive schedule against a fixed 224 px (docs/performance.md).

Each measurement builds a fresh train loader (CPU output, `--workers` workers or DALI threads) over
the split's files and times whole epochs after the first batch. The run comparison iterates every
epoch of a run scaled to `--epochs` (FFCV's ResNet-50 ramp: 160 px through 65/88 of the run, 192 px
from 76/88, configs/recipes/ffcv-rn50.yaml) against the same epochs at 224 px, with no model: the
loader's time alone, which is what the ramp saves where the loader is the bottleneck (a CPU box).

    python benchmarks/sizes.py --data ../shared/data/realphotos
    python benchmarks/sizes.py --backends torch --rounds 1 --json sizes.json
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import harness

import fastloader
from fastloader.machine import hardware
from fastloader.resolution import ramp_size

SIZES = (160, 192, 224)
FFCV = {"min_size": 160, "size": 192, "start": 65 / 88, "end": 76 / 88}
"""FFCV's rn50_88_epochs.yaml ramp, as fractions of the run."""


def config(data: Path, backend: str, workers: int, batch: int, transform: dict) -> dict:
    return {"backend": backend, "seed": 0, "dataset": {"root": str(data)}, "output": {"device": "cpu"},
            "workers": {"num_workers": workers}, "dali": {"threads": workers},
            "train": {"batch_size": batch, "transform": {"interpolation": "bilinear", **transform}}}


def epochs_timed(cfg: dict, epochs: int) -> tuple[float, int]:
    """(seconds from each epoch's first batch to its last, summed; images after the first batches)."""
    seconds, images = 0.0, 0
    with fastloader.build_loader(cfg, "train") as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            started = None
            for batch, _ in loader:
                if started is None:
                    started = time.perf_counter()
                    continue
                images += len(batch)
            if started is None:
                raise SystemExit(f"an epoch of split 'train' has no batch at batch size {cfg['train']['batch_size']}: "
                                 f"lower --batch-size")
            seconds += time.perf_counter() - started
    return seconds, images


def run_time(cfg: dict, epochs: int) -> float:
    """Seconds to iterate every epoch of a run, start-up included (what the run waits for, no model)."""
    started = time.perf_counter()
    with fastloader.build_loader(cfg, "train") as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for _ in loader:
                pass
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_data_argument(parser)
    installed = [b for b in harness.BACKENDS if b != "dali" or importlib.util.find_spec("nvidia.dali") is not None]
    parser.add_argument("--backends", nargs="+", default=installed, choices=harness.BACKENDS,
                        help="default: both where DALI is installed")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="the sizes whose rates to measure")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the per-size rates (median)")
    parser.add_argument("--epochs", type=int, default=8, help="epochs of the scaled run (FFCV's: 88)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    data = harness.check_data(parser, args.data, ["train"])
    report = {"hardware": hardware(), "args": {k: str(v) for k, v in vars(args).items()}, "rates": {}, "runs": {}}
    print(f"{report['hardware']}\nsettings: batch {args.batch_size}, {args.workers} workers/threads, data {data}")

    for backend in args.backends:
        for size in args.sizes:
            rates = []
            for _ in range(args.rounds):
                seconds, images = epochs_timed(config(data, backend, args.workers, args.batch_size, {"size": size}), 1)
                rates.append(images / seconds)
            report["rates"][f"{backend} {size}"] = statistics.median(rates)
            print(f"  {backend:6} {size} px: {statistics.median(rates):7.1f} images/s  (rounds: "
                  f"{', '.join(f'{r:.1f}' for r in rates)})", flush=True)

    start, end = round(FFCV["start"] * args.epochs), round(FFCV["end"] * args.epochs)
    ramp = {"size": FFCV["size"], "progressive": {"min_size": FFCV["min_size"], "start_epoch": start,
                                                  "end_epoch": max(end, start + 1), "multiple": 32}}
    schedule = [ramp_size(e, FFCV["min_size"], FFCV["size"], start, max(end, start + 1), 32)
                for e in range(args.epochs)]
    print(f"FFCV's schedule over {args.epochs} epochs: {schedule}")
    for backend in args.backends:
        fixed = run_time(config(data, backend, args.workers, args.batch_size, {"size": 224}), args.epochs)
        ffcv = run_time(config(data, backend, args.workers, args.batch_size, ramp), args.epochs)
        report["runs"][backend] = {"fixed_224_s": fixed, "ffcv_schedule_s": ffcv, "schedule": schedule}
        print(f"  {backend:6} whole run: fixed 224 px {fixed:.1f} s, FFCV's schedule {ffcv:.1f} s "
              f"({ffcv / fixed:.2f}x)", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
