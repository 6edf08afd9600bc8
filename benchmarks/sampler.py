"""What weighted sampling costs the sampler, against today's uniform permutation: at each of
--samples, the time to draw an epoch's order, the time to plan one rank's batches (the order, the
rank's share and the augmentation seeds: what a loader does once an epoch), the memory the order
keeps between epochs and the peak it allocates while drawing; and, once, what turning a weights file
and class weights into the draws costs at --file-samples.

The orders: `shuffle: true` (uniform_permutation), `epoch_size` without weights (Passes, one and a
half passes), and weighted draws (WeightedDraws) over long-tailed weights (--classes classes, Pareto
sizes) at the split's size. Every draw is timed 3 times, the fastest kept. Memory is numpy's
allocations as tracemalloc sees them. The order lives in the training process: workers receive
their batches' (sample, seed) pairs and never read it, so a worker holds none of it.

    python benchmarks/sampler.py
    python benchmarks/sampler.py --samples 1281167,10000000 --json sampler.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from fastloader.machine import hardware
from fastloader.order import EpochOrder, Passes, WeightedDraws, uniform_permutation
from fastloader.samples import IndexBuilder

MB = 1 << 20


def timed(call) -> tuple[float, int]:
    """(the fastest of 3 calls in ms, the peak bytes numpy allocated during one)."""
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - began)
    tracemalloc.start()
    call()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return best * 1000, peak


def long_tail(samples: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(each sample's label, each sample's class-balancing weight): Pareto class sizes, as a long-tailed
    split (iNaturalist's shape), and 1 / class size (`class_weights: inverse`)."""
    rng = np.random.default_rng(seed)
    sizes = rng.pareto(1.0, classes) + 1
    labels = np.minimum(np.searchsorted(np.cumsum(sizes) / sizes.sum(), rng.random(samples)), classes - 1)
    counts = np.bincount(labels, minlength=classes)
    return labels, 1.0 / counts[labels]


def measure(samples: int, classes: int, world: int, batch: int, seed: int) -> dict:
    labels, weights = long_tail(samples, classes, seed)
    began = time.perf_counter()
    draws = WeightedDraws(weights, samples)
    built_ms = (time.perf_counter() - began) * 1000
    passes = Passes(uniform_permutation, samples * 3 // 2)
    orders = {"shuffle: true": (uniform_permutation, None, None, 0),
              "epoch_size 1.5 N (passes)": (passes, None, samples * 3 // 2, 0),
              "weighted draws": (draws, draws, None, draws.cumulative.nbytes)}
    rows = {}
    for name, (order, weighted, size, kept) in orders.items():
        draw_ms, draw_peak = timed(lambda: order(seed, 1, samples))
        plan = EpochOrder(samples, batch, mode="train", shuffle=True, drop_last=True, seed=seed, rank=0,
                          world_size=world, draws=weighted, epoch_size=size)
        plan_ms, plan_peak = timed(lambda: plan.batches(1))
        rows[name] = {"draw_ms": draw_ms, "draw_peak_bytes": draw_peak, "plan_ms": plan_ms,
                      "plan_peak_bytes": plan_peak, "kept_bytes": kept, "positions": plan.length}
    uniform = rows["shuffle: true"]
    for row in rows.values():
        row["draw_ratio"] = row["draw_ms"] / uniform["draw_ms"]
        row["plan_ratio"] = row["plan_ms"] / uniform["plan_ms"]
    return {"samples": samples, "build_ms": built_ms, "orders": rows}


def measure_file(samples: int, classes: int, seed: int) -> dict:
    """A weights file of `samples` lines and class weights turned into draws, as a loader is built
    (weights.read_weights_file, then sample_weights against the index)."""
    from fastloader.config import load_config
    from fastloader.weights import read_weights_file, sample_weights
    labels, weights = long_tail(samples, classes, seed)
    builder = IndexBuilder()
    for i, label in enumerate(labels.tolist()):
        builder.add(f"n{label:05d}/img_{i:08d}.JPEG", label)
    with tempfile.TemporaryDirectory(prefix="sampler_") as work:
        index = builder.build(os.path.join(work, "train"), [f"n{c:05d}" for c in range(classes)])
        path = Path(work) / "weights.txt"
        with open(path, "w") as handle:
            handle.writelines(f"train/n{label:05d}/img_{i:08d}.JPEG {w!r}\n"
                              for i, (label, w) in enumerate(zip(labels.tolist(), weights.tolist())))
        config = load_config({"dataset": {"root": work}, "train": {"weights": str(path)}})
        split = config.split("train")
        began = time.perf_counter()
        table = read_weights_file(config, split)
        read_ms = (time.perf_counter() - began) * 1000
        began = time.perf_counter()
        sample_weights(config, split, index, table)
        match_ms = (time.perf_counter() - began) * 1000
        inverse = load_config({"dataset": {"root": work}, "train": {"class_weights": "inverse"}})
        began = time.perf_counter()
        sample_weights(inverse, inverse.split("train"), index)
        class_ms = (time.perf_counter() - began) * 1000
    return {"samples": samples, "read_file_ms": read_ms, "match_names_ms": match_ms, "class_weights_ms": class_ms}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", default="1281167,10000000",
                        help="split sizes, comma-separated (default: 1281167,10000000: ImageNet's train, and 10M)")
    parser.add_argument("--classes", type=int, default=1000, help="default: 1000")
    parser.add_argument("--world-size", type=int, default=8, help="ranks the plan is dealt to (default: 8)")
    parser.add_argument("--batch-size", type=int, default=256, help="per rank (default: 256)")
    parser.add_argument("--file-samples", type=int, default=1_281_167,
                        help="lines of the weights file measured (default: 1,281,167; 0: skip)")
    parser.add_argument("--seed", type=int, default=0, help="default: 0")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    sizes = [int(text) for text in args.samples.split(",")]
    if min(sizes) < args.classes or args.classes < 1 or args.world_size < 1 or args.batch_size < 1:
        parser.error("every --samples must be at least --classes; --classes, --world-size, --batch-size at least 1")
    results = {"settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
               "hardware": hardware(), "sizes": []}
    for samples in sizes:
        result = measure(samples, args.classes, args.world_size, args.batch_size, args.seed)
        results["sizes"].append(result)
        print(f"\n{samples:,} samples, {args.classes} classes (long-tailed); plans for rank 0 of {args.world_size} "
              f"at batch {args.batch_size}; the weights' running sum built in {result['build_ms']:.0f} ms")
        print(f"  {'order':<27} {'draw ms':>8} {'x uniform':>9} {'plan ms':>8} {'x uniform':>9} {'kept MiB':>9} "
              f"{'peak MiB':>9}")
        for name, row in result["orders"].items():
            print(f"  {name:<27} {row['draw_ms']:>8.0f} {row['draw_ratio']:>9.2f} {row['plan_ms']:>8.0f} "
                  f"{row['plan_ratio']:>9.2f} {row['kept_bytes'] / MB:>9.1f} {row['draw_peak_bytes'] / MB:>9.1f}")
    if args.file_samples:
        made = measure_file(args.file_samples, args.classes, args.seed)
        results["file"] = made
        print(f"\nbuilding the weights of {made['samples']:,} samples, once per loader: a weights file read in "
              f"{made['read_file_ms']:.0f} ms, its names matched to the index in {made['match_names_ms']:.0f} ms; "
              f"class_weights: inverse in {made['class_weights_ms']:.0f} ms")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
