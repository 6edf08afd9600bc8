"""Reading the uint8 cache (dataset.cache) against decoding the JPEGs, for both backends.

Peers, measured in interleaved rounds on the same files, workers and transforms (see harness.py):
torch and dali backends, each reading the JPEGs and reading a cache of them built at the start
(`--short-side`, default 256, as `fastloader cache` does). Prints the cached / JPEG ratio of each
backend, the build time and size, and the memory of the torch backend's workers over a whole
cached epoch: their file-backed RSS grows as they touch the cache's pages (which the page cache
holds, once for all of them), while their anonymous memory (heap, copies) stays flat.

    python benchmarks/compare_cache.py                 # 2 workers
    python benchmarks/compare_cache.py --workers 1 --split train
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import harness
from harness import Factory

import fastloader
from fastloader.cache_write import DEFAULT_SHORT_SIDE, build_split_cache
from fastloader.samples import SampleIndex, build_index

BACKENDS = ("torch", "dali")
BUILDS: dict[str, dict] = {}
"""Per split: what building its cache cost, and the workers' memory over a cached epoch."""


def peer(backend: str, cached: bool) -> str:
    return f"{backend} {'cached' if cached else 'JPEG'}"


def build_peers(split: str, split_dir: Path, index: SampleIndex, list_path: Path, repeat: int,
                args: argparse.Namespace) -> dict[str, Factory]:
    cache_dir = list_path.parent / "cache"
    common = {"output.device": "cpu", "workers.num_workers": args.workers}
    overrides = harness.fastloader_overrides(split, split_dir, index, list_path, args, **common)
    BUILDS[split] = build_cache(split, overrides, cache_dir, index, args)
    peers = {}
    for backend in BACKENDS:
        for cached in (True, False):
            extra = {"backend": backend, **({"dataset.cache": str(cache_dir)} if cached else {})}
            peers[peer(backend, cached)] = harness.fastloader_factory(split, {**overrides, **extra})
    BUILDS[split]["torch_worker_memory"] = epoch_memory(split, {**overrides, "backend": "torch",
                                                                "dataset.cache": str(cache_dir)})
    return peers


def build_cache(split: str, overrides: dict, cache_dir: Path, files: SampleIndex, args: argparse.Namespace) -> dict:
    """Build the cache the cached peers read, from the repeated file list they read (each file once)."""
    config = fastloader.load_config(str(harness.CONFIG), overrides)
    report = build_split_cache(config, config.split(split), build_index(config, config.split(split)),
                               str(cache_dir), args.short_side, workers=max(1, args.workers))
    source_bytes = sum(Path(files.path(i)).stat().st_size for i in range(len(files)))
    print(f"  {split}: cache of {report['images']} images built in {report['seconds']:.1f} s with {args.workers} "
          f"processes ({report['images'] / report['seconds']:.0f} images/s): {report['bytes'] / 2**20:.1f} MiB, "
          f"{report['bytes'] / report['images'] / 1e3:.0f} kB per image ({report['bytes'] / source_bytes:.1f}x "
          f"the {source_bytes / 2**20:.1f} MiB of JPEGs)", flush=True)
    return {"images": report["images"], "seconds": report["seconds"], "bytes": report["bytes"],
            "source_bytes": source_bytes, "short_side": args.short_side}


def worker_memory() -> dict[str, int]:
    """Summed over this process's children (the DataLoader workers), in bytes: RSS and its anonymous
    part (heap, copies) and file part (mapped files: the cache's pages, libraries) from
    /proc/PID/status, and PSS from smaps_rollup."""
    import os
    keys = {"VmRSS:": "rss", "RssAnon:": "anonymous", "RssFile:": "file", "Pss:": "pss"}
    total = dict.fromkeys(keys.values(), 0)
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as handle:
            for pid in handle.read().split():
                for name in ("status", "smaps_rollup"):
                    try:
                        with open(f"/proc/{pid}/{name}") as lines:
                            for line in lines:
                                key = line.split()[0] if line.strip() else ""
                                if key in keys:
                                    total[keys[key]] += int(line.split()[1]) * 1024
                    except OSError:
                        continue
    return total


def epoch_memory(split: str, overrides: dict) -> dict:
    """The torch backend's workers' memory after 5 batches and at the end of one cached epoch."""
    with fastloader.build_loader(str(harness.CONFIG), split, overrides) as loader:
        samples, started = {}, time.perf_counter()
        for number, _ in enumerate(loader, 1):
            if number == 5:
                samples["after_5_batches"] = worker_memory()
        samples["end_of_epoch"] = worker_memory()
        samples["batches"], samples["seconds"] = len(loader), time.perf_counter() - started
    early, late = samples["after_5_batches"], samples["end_of_epoch"]
    change = ", ".join(f"{label} {early[key] / 2**20:.0f} -> {late[key] / 2**20:.0f} MiB" for key, label in
                       (("rss", "RSS"), ("pss", "PSS"), ("anonymous", "anonymous"), ("file", "file-backed")))
    print(f"  {split}: torch workers (all together) from batch 5 to the end of a cached epoch of "
          f"{samples['batches']} batches: {change}", flush=True)
    return samples


def main() -> int:
    parser = harness.base_parser(__doc__)
    parser.add_argument("--short-side", type=int, default=DEFAULT_SHORT_SIDE,
                        help=f"the cache's --short-side (default: {DEFAULT_SHORT_SIDE})")
    args = harness.check_args(parser, parser.parse_args())
    ratios = [(peer(backend, True), peer(backend, False)) for backend in BACKENDS]
    status = harness.main(args, build_peers, "compare_cache", ratios=ratios)
    if status == 0 and args.json:
        report = json.loads(args.json.read_text())
        report["cache"] = BUILDS
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
