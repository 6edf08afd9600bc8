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
import psutil

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


def cpu_seconds() -> float:
    """User + system CPU time of this process and its children alive now (the torch workers; DALI's
    threads are this process's): what a loader costs the machine, which other jobs on a shared box
    do not inflate as they do the wall time."""
    total = 0.0
    me = psutil.Process()
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def epochs_timed(cfg: dict, epochs: int) -> tuple[float, int, float]:
    """(seconds from each epoch's first batch to its last, summed; images after the first batches;
    CPU seconds of the process tree over the same spans)."""
    seconds, images, cpu = 0.0, 0, 0.0
    with fastloader.build_loader(cfg, "train") as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            started = None
            for batch, _ in loader:
                if started is None:
                    started, cpu_started = time.perf_counter(), cpu_seconds()
                    continue
                images += len(batch)
            if started is None:
                raise SystemExit(f"an epoch of split 'train' has no batch at batch size {cfg['train']['batch_size']}: "
                                 f"lower --batch-size")
            seconds += time.perf_counter() - started
            cpu += cpu_seconds() - cpu_started
    return seconds, images, cpu


def run_time(cfg: dict, epochs: int) -> tuple[float, float]:
    """(seconds to iterate every epoch of a run, start-up included: what the run waits for, no model;
    CPU seconds of the process tree meanwhile, the workers' counted before they stop)."""
    started, cpu_started = time.perf_counter(), cpu_seconds()
    with fastloader.build_loader(cfg, "train") as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for _ in loader:
                pass
        cpu = cpu_seconds() - cpu_started
    return time.perf_counter() - started, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_data_argument(parser)
    installed = [b for b in harness.BACKENDS if b != "dali" or importlib.util.find_spec("nvidia.dali") is not None]
    parser.add_argument("--backends", nargs="+", default=installed, choices=harness.BACKENDS,
                        help="default: both where DALI is installed")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="the sizes whose rates to measure")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every measurement (median)")
    parser.add_argument("--rate-epochs", type=int, default=3, help="epochs timed per rate measurement")
    parser.add_argument("--epochs", type=int, default=8, help="epochs of the scaled run (FFCV's: 88)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    data = harness.check_data(parser, args.data, ["train"])
    report = {"hardware": hardware(), "args": {k: str(v) for k, v in vars(args).items()}, "rates": {}, "runs": {}}
    print(f"{report['hardware']}\nsettings: batch {args.batch_size}, {args.workers} workers/threads, data {data}")

    rates: dict[str, list[float]] = {f"{b} {s}": [] for b in args.backends for s in args.sizes}
    cpu_ms: dict[str, list[float]] = {name: [] for name in rates}
    for number in range(args.rounds):  # interleaved, the order reversed every other round: noise hits all alike
        cases = [(b, s) for b in args.backends for s in args.sizes]
        for backend, size in cases[::-1] if number % 2 else cases:
            cfg = config(data, backend, args.workers, args.batch_size, {"size": size})
            seconds, images, cpu = epochs_timed(cfg, args.rate_epochs)
            rates[f"{backend} {size}"].append(images / seconds)
            cpu_ms[f"{backend} {size}"].append(1000 * cpu / images)
    report["cpu_ms_per_image"] = {}
    for name, values in rates.items():
        report["rates"][name] = statistics.median(values)
        report["cpu_ms_per_image"][name] = statistics.median(cpu_ms[name])
        print(f"  {name:>12} px: {statistics.median(values):7.1f} images/s (rounds: "
              f"{', '.join(f'{r:.1f}' for r in values)}), CPU {statistics.median(cpu_ms[name]):.2f} ms per image "
              f"(rounds: {', '.join(f'{c:.2f}' for c in cpu_ms[name])})", flush=True)

    start, end = round(FFCV["start"] * args.epochs), round(FFCV["end"] * args.epochs)
    ramp = {"size": FFCV["size"], "progressive": {"min_size": FFCV["min_size"], "start_epoch": start,
                                                  "end_epoch": max(end, start + 1), "multiple": 32}}
    schedule = [ramp_size(e, FFCV["min_size"], FFCV["size"], start, max(end, start + 1), 32)
                for e in range(args.epochs)]
    print(f"FFCV's schedule over {args.epochs} epochs: {schedule}")
    runs: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float]] = {}
    for number in range(args.rounds):
        cases = [(b, kind) for b in args.backends for kind in ("fixed", "ffcv")]
        for backend, kind in cases[::-1] if number % 2 else cases:
            transform = {"size": 224} if kind == "fixed" else ramp
            cfg = config(data, backend, args.workers, args.batch_size, transform)
            wall, cpu = run_time(cfg, args.epochs)
            runs.setdefault((backend, kind), []).append(wall)
            cpus.setdefault((backend, kind), []).append(cpu)
    for backend in args.backends:
        fixed, ffcv = (statistics.median(runs[backend, kind]) for kind in ("fixed", "ffcv"))
        cpu_fixed, cpu_ffcv = (statistics.median(cpus[backend, kind]) for kind in ("fixed", "ffcv"))
        report["runs"][backend] = {"fixed_224_s": fixed, "ffcv_schedule_s": ffcv, "schedule": schedule,
                                   "fixed_224_cpu_s": cpu_fixed, "ffcv_schedule_cpu_s": cpu_ffcv,
                                   "rounds": {kind: runs[backend, kind] for kind in ("fixed", "ffcv")}}
        print(f"  {backend:6} whole run: fixed 224 px {fixed:.1f} s, FFCV's schedule {ffcv:.1f} s "
              f"({ffcv / fixed:.2f}x; rounds {', '.join(f'{t:.1f}' for t in runs[backend, 'fixed'])} against "
              f"{', '.join(f'{t:.1f}' for t in runs[backend, 'ffcv'])}); CPU {cpu_fixed:.1f} s against "
              f"{cpu_ffcv:.1f} s ({cpu_ffcv / cpu_fixed:.2f}x)", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
