"""Reading the uint8 cache (dataset.cache) against decoding the JPEGs, for both backends.

Peers, measured in interleaved rounds on the same files, workers and transforms (see harness.py):
torch and dali backends, each reading the JPEGs and reading a cache of them built at the start
(`--short-side`, default 256, as `fastloader cache` does). Prints the cached / JPEG ratio of each
backend, the build time and size, and the memory of the torch backend's workers over a whole
cached epoch: their shared RSS (mapped files, shared memory) grows as they touch the cache's pages
(which the page cache holds, once for all of them), while their anonymous memory (heap, copies)
stays flat.

    python benchmarks/cache.py --data DIR                 # 2 workers
    python benchmarks/cache.py --workers 1 --split train
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import harness
from harness import Factory

import fastloader
from fastloader.cache_format import DEFAULT_SHORT_SIDE
from fastloader.machine import tree_memory
from fastloader.samples import SampleIndex

BUILDS: dict[str, dict] = {}
"""Per split: what building its cache cost, and the workers' memory over a cached epoch."""


def peer(backend: str, cached: bool) -> str:
    return f"{backend} {'cached' if cached else 'JPEG'}"


def build_peers(split: str, split_dir: Path, index: SampleIndex, list_path: Path, repeat: int,
                args: argparse.Namespace) -> dict[str, Factory]:
    cache_dir = list_path.parent / "cache"
    common = {"output.device": "cpu", "workers.num_workers": args.workers}
    overrides = harness.fastloader_overrides(split, split_dir, index, list_path, args, repeat, **common)
    BUILDS[split] = harness.build_cache(split, overrides, cache_dir, index, args)
    peers = {}
    for backend in args.backends:
        for cached in (True, False):
            extra = {"backend": backend, **({"dataset.cache": str(cache_dir)} if cached else {})}
            peers[peer(backend, cached)] = harness.fastloader_factory(split, {**overrides, **extra})
    BUILDS[split]["torch_worker_memory"] = epoch_memory(split, {**overrides, "backend": "torch",
                                                                "dataset.cache": str(cache_dir)})
    return peers


def workers_memory() -> dict[str, int]:
    """The memory of this process's workers (its descendants), all together, in bytes."""
    return asdict(tree_memory(include_root=False))


def epoch_memory(split: str, overrides: dict) -> dict:
    """The torch backend's workers' memory after 5 batches and at the end of one cached epoch."""
    with fastloader.build_loader(str(harness.CONFIG), split, overrides) as loader:
        samples, started = {}, time.perf_counter()
        for number, _ in enumerate(loader, 1):
            if number == min(5, len(loader)):
                samples["after_5_batches"] = workers_memory()
        samples["end_of_epoch"] = workers_memory()
        samples["batches"], samples["seconds"] = len(loader), time.perf_counter() - started
    early, late = samples["after_5_batches"], samples["end_of_epoch"]
    change = ", ".join(f"{label} {early[key] / 2**20:.0f} -> {late[key] / 2**20:.0f} MiB" for key, label in
                       (("rss", "RSS"), ("pss", "PSS"), ("anonymous", "anonymous"),
                        ("shared", "shared (files, shared memory)")))
    print(f"  {split}: torch workers (all together) from batch 5 to the end of a cached epoch of "
          f"{samples['batches']} batches: {change}", flush=True)
    return samples


def main() -> int:
    parser = harness.base_parser(__doc__)
    parser.add_argument("--short-side", type=int, default=DEFAULT_SHORT_SIDE,
                        help=f"the cache's --short-side (default: {DEFAULT_SHORT_SIDE})")
    harness.add_backends_argument(parser)
    args = harness.check_args(parser, parser.parse_args())
    args.backends = harness.usable_backends(parser, args.backends)
    ratios = [(peer(backend, True), peer(backend, False)) for backend in args.backends]
    status = harness.main(args, build_peers, "cache", ratios=ratios)
    if status == 0 and args.json:
        report = json.loads(args.json.read_text())
        report["cache"] = BUILDS
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
