"""What the bad-input screening costs (see fastloader/screening.py), against an epoch's time.

Per split: the header check of every file when a loader is built with nothing cached (in this
process, as for small splits, and in --workers processes, as for splits of more than
`IN_PROCESS_UP_TO` files), reading the cached result, and one epoch of each backend with --workers
workers / threads (screening off, after a first epoch that warms the page cache). The check is paid
once per dataset and machine, so "share of 1 epoch" is the worst case (a run of a single epoch);
over a 90-epoch run it is 1/90 of that.

    python benchmarks/screening.py --data DIR
    python benchmarks/screening.py --split train --backends torch --json screening.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import harness

from fastloader import build_loader, screening
from fastloader.config import load_config
from fastloader.machine import hardware
from fastloader.samples import SampleIndex
from fastloader.sources.formats import build_index


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_data_argument(parser)
    parser.add_argument("--split", choices=("train", "val", "both"), default="both", help="default: both")
    parser.add_argument("--workers", type=int, default=2,
                        help="screening processes, and each backend's workers / DALI threads (default: 2)")
    parser.add_argument("--batch-size", type=int, default=64, help="default: 64")
    harness.add_backends_argument(parser)
    parser.add_argument("--json", type=Path, help="write the measurements to this file")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.batch_size < 1:
        parser.error("--workers and --batch-size must be >= 1")
    args.backends = harness.usable_backends(parser, args.backends)
    args.data = harness.check_data(parser, args.data, harness.splits_of(args))
    return args


def screen_seconds(config, split: str, index: SampleIndex, workers: int) -> tuple[float, float]:
    """(first screening, cached screening) in seconds, in a fresh cache folder; workers=0: in this process."""
    with tempfile.TemporaryDirectory() as cache:
        os.environ["FASTLOADER_CACHE_DIR"] = cache
        screening.IN_PROCESS_UP_TO = len(index) if workers == 0 else 0
        started = time.perf_counter()
        screening.screen_index(index, config.on_bad_image, config.dataset.max_pixels, split, workers=workers or None)
        first = time.perf_counter() - started
        started = time.perf_counter()
        screening.screen_index(index, config.on_bad_image, config.dataset.max_pixels, split, workers=workers or None)
        return first, time.perf_counter() - started


def epoch_seconds(config: dict, split: str) -> float:
    """One epoch's time, after a first epoch that warms the page cache and starts the workers."""
    with build_loader(config, split) as loader:
        for _ in loader:
            pass
        started = time.perf_counter()
        for _ in loader:
            pass
        return time.perf_counter() - started


def measure_split(split: str, backends: list[str], args: argparse.Namespace) -> dict:
    raw = {"dataset": {"root": str(args.data), "screen": False}, "output": {"device": "cpu"},
           "workers": {"num_workers": args.workers}, "dali": {"threads": args.workers},
           split: {"batch_size": args.batch_size}}
    config = load_config({**raw, "dataset": {"root": str(args.data)}})  # screening on: the check itself
    index = build_index(config, config.split(split))
    alone, cached = screen_seconds(config, split, index, workers=0)
    pooled, _ = screen_seconds(config, split, index, workers=args.workers)
    epochs = {backend: epoch_seconds({**raw, "backend": backend}, split) for backend in backends}
    return {"files": len(index), "in_process_s": alone, "pooled_s": pooled, "cached_s": cached,
            "epoch_s": epochs, "share_of_one_epoch": min(alone, pooled) / min(epochs.values())}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    backends = args.backends
    pooled = f"in {args.workers} process{'es' if args.workers > 1 else ''}"
    print(f"{'split':6} {'files':>5} {'check in-process':>17} {pooled:>15} {'cached':>9} "
          + " ".join(f"{'epoch ' + b:>12}" for b in backends) + f" {'share of 1 epoch':>17}")
    results = {}
    for split in harness.splits_of(args):
        r = results[split] = measure_split(split, backends, args)
        per_file = r["in_process_s"] / r["files"]
        print(f"{split:6} {r['files']:5d} {r['in_process_s'] * 1e3:9.1f} ms ({per_file * 1e6:3.0f} us/file) "
              f"{r['pooled_s'] * 1e3:12.1f} ms {r['cached_s'] * 1e3:6.1f} ms "
              + " ".join(f"{r['epoch_s'][b]:10.2f} s" for b in backends) + f" {r['share_of_one_epoch']:16.1%}",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps({"hardware": hardware(), "workers": args.workers,
                                         "splits": results}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
