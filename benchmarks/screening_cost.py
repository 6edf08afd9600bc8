"""What the bad-input screening costs (see fastloader/screening.py), against an epoch's time.

On the real photos, per split: the header check of every file when a loader is built with nothing
cached (in this process, as for small splits, and in 2 worker processes, as for splits of more than
`IN_PROCESS_UP_TO` files), reading the cached result, and one epoch of each backend with 2 workers
/ threads. The check is paid once per dataset and machine, so "share of 1 epoch" is the worst case
(a run of a single epoch); over a 90-epoch run it is 1/90 of that.

    python benchmarks/screening_cost.py --data ../shared/data/realphotos
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import harness  # noqa: F401  (puts the repository on sys.path)

from fastloader import build_loader, screening
from fastloader.config import load_config
from fastloader.samples import build_index


def screen_seconds(config, index, in_process: bool) -> tuple[float, float]:
    """(first screening, cached screening) in seconds, with a fresh cache folder."""
    with tempfile.TemporaryDirectory() as cache:
        os.environ["FASTLOADER_CACHE_DIR"] = cache
        screening.IN_PROCESS_UP_TO = len(index) if in_process else 0
        started = time.perf_counter()
        screening.screen_index(config, index, workers=2)
        first = time.perf_counter() - started
        started = time.perf_counter()
        screening.screen_index(config, index, workers=2)
        return first, time.perf_counter() - started


def epoch_seconds(config: dict, split: str) -> float:
    with build_loader(config, split) as loader:
        for _ in loader:  # warm the page cache and the workers
            pass
        started = time.perf_counter()
        for _ in loader:
            pass
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=harness.DEFAULT_DATA)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    print(f"{'split':6} {'files':>5} {'check in-process':>17} {'in 2 processes':>15} {'cached':>9} "
          f"{'epoch torch':>12} {'epoch dali':>11} {'share of 1 epoch':>17}")
    for split in ("train", "val"):
        raw = {"dataset": {"root": str(args.data), "screen": False}, "output": {"device": "cpu"},
               "workers": {"num_workers": args.workers}, split: {"batch_size": 64}}
        config = load_config({**raw, "dataset": {"root": str(args.data)}})
        index = build_index(config, config.split(split))
        alone, cached = screen_seconds(config, index, in_process=True)
        pooled, _ = screen_seconds(config, index, in_process=False)
        epochs = {backend: epoch_seconds({**raw, "backend": backend}, split) for backend in ("torch", "dali")}
        fastest_check = min(alone, pooled)
        print(f"{split:6} {len(index):5d} {alone * 1e3:9.1f} ms ({alone / len(index) * 1e6:3.0f} us/file) "
              f"{pooled * 1e3:12.1f} ms {cached * 1e3:6.1f} ms {epochs['torch']:10.2f} s {epochs['dali']:9.2f} s "
              f"{fastest_check / min(epochs.values()):16.1%}")


if __name__ == "__main__":
    main()
