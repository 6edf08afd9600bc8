"""How much memory the sample index and the loader's workers take, and whether it grows.

index: builds the SampleIndex of 1,281,167 synthetic ImageNet-like paths from a file list and reports
its size and how much the process grew (part A). Then DataLoader workers read every path of that
index once, each sample only looking up its path (no file I/O), and each worker's PSS is sampled
after the first batch and at the end of the pass (part B). Forked workers share the parent's pages
until they write to them: a numpy index is never written, so PSS stays flat, while a list of Python
strings is written by reference counting, so every page a worker reads is copied into it.

workers: RSS and PSS of each torch-backend worker across epochs of real JPEGs: flat, or growing? A
worker holds its decoder, its copy-on-read share of the index and (CPU output) its reused batch
buffers (torch_loader.collate.BatchPool), so its memory should rise over the first batches and then
stay flat. Sampled every --every batches while a consumer drops each batch at once.

    python benchmarks/memory.py index
    python benchmarks/memory.py index --samples 100000 --workers 4 --no-list
    python benchmarks/memory.py workers --data DIR --epochs 2
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Sequence

import harness
import torch
import torch.utils.data

from fastloader.config import IMAGE_EXTENSIONS
from fastloader.machine import descendant_pids, hardware, process_memory
from fastloader.samples import SampleIndex
from fastloader.sources.file_list import read_file_list
from fastloader.sources.folder import scan_folder

IMAGENET_TRAIN_SAMPLES = 1_281_167
CLASSES = 1000
INDEX_TARGET_MB = 150
MB = 1024 * 1024


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="part", required=True, metavar="{index,workers}")
    index = commands.add_parser("index", help="the index at ImageNet scale, and workers reading it (no files)")
    index.add_argument("--samples", type=int, default=IMAGENET_TRAIN_SAMPLES,
                       help=f"paths in the synthetic file list (default: {IMAGENET_TRAIN_SAMPLES}, ImageNet train)")
    index.add_argument("--workers", type=int, default=8, help="DataLoader workers in part B (default: 8)")
    index.add_argument("--batch-size", type=int, default=1024, help="part B batch size (default: 1024)")
    index.add_argument("--shuffle", action=argparse.BooleanOptionalAction, default=True,
                       help="part B reads in random order, as a training epoch does (default: on)")
    index.add_argument("--list", dest="with_list", action=argparse.BooleanOptionalAction, default=True,
                       help="part B also measures paths held as a plain Python list of str (default: on)")
    workers = commands.add_parser("workers", help="each torch-backend worker over epochs of real images")
    harness.add_data_argument(workers)
    workers.add_argument("--split", choices=("train", "val"), default="train", help="default: train")
    workers.add_argument("--workers", type=int, default=2, help="default: 2")
    workers.add_argument("--batch-size", type=int, default=64, help="default: 64")
    workers.add_argument("--size", type=int, default=224, help="output height and width (default: 224)")
    workers.add_argument("--repeat", type=int, default=20, help="list the split's files K times (default: 20)")
    workers.add_argument("--epochs", type=int, default=2, help="default: 2")
    workers.add_argument("--every", type=int, default=25, help="batches between samples (default: 25)")
    for command in (index, workers):
        command.add_argument("--json", type=Path, help="write the measurements to this file")
    args = parser.parse_args(argv)
    chosen = index if args.part == "index" else workers
    if args.part == "index" and args.samples < CLASSES:
        chosen.error(f"--samples must be >= {CLASSES} (one per class at least)")
    if args.workers < 1 or args.batch_size < 1:
        chosen.error("--workers and --batch-size must be >= 1")
    if args.part == "workers":
        args.data = harness.check_data(chosen, args.data, [args.split])
    return args


def peak_rss() -> int:
    """The largest RSS this process has had, in bytes (getrusage: kB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


# -- index, part A ----------------------------------------------------------------------------------


def write_synthetic_list(list_path: Path, samples: int) -> None:
    """`nXXXXXXXX/nXXXXXXXX_K.JPEG label` lines shaped like ImageNet's, written a class at a time."""
    per_class, extra = divmod(samples, CLASSES)
    with open(list_path, "w", encoding="utf-8") as handle:
        for label in range(CLASSES):
            wnid = f"n{1440764 + label * 4099:08d}"
            count = per_class + (label < extra)
            handle.write("".join(f"{wnid}/{wnid}_{10000 + k * 7}.JPEG {label}\n" for k in range(count)))


def measure_index(samples: int, workdir: Path) -> tuple[SampleIndex, dict]:
    """The index's size, the RSS it added, and the build's peak where the build set a new one."""
    list_path = workdir / "train_list.txt"
    write_synthetic_list(list_path, samples)
    gc.collect()
    rss_before, peak_before = process_memory().rss, peak_rss()
    started = time.perf_counter()
    index = read_file_list(str(list_path), "/data/imagenet/train", classes=None)
    seconds = time.perf_counter() - started
    gc.collect()
    rss_after, peak_after = process_memory().rss, peak_rss()
    return index, {"samples": len(index), "list_bytes": list_path.stat().st_size, "build_s": seconds,
                   "nbytes": index.nbytes, "rss_growth_bytes": rss_after - rss_before,
                   "peak_growth_bytes": peak_after - rss_before if peak_after > peak_before else None}


def report_index(result: dict) -> None:
    growth_mb = result["rss_growth_bytes"] / MB
    print(f"Part A: SampleIndex of {result['samples']:,} paths "
          f"(file list {result['list_bytes'] / MB:.1f} MB, {CLASSES} classes)")
    print(f"  build (read_file_list):  {result['build_s']:.2f} s")
    print(f"  index.nbytes:            {result['nbytes'] / MB:.1f} MB")
    print(f"  process RSS growth:      {growth_mb:.1f} MB   "
          f"target < {INDEX_TARGET_MB} MB: {'OK' if growth_mb < INDEX_TARGET_MB else 'ABOVE TARGET'}")
    if result["peak_growth_bytes"] is not None:
        print(f"  peak RSS growth (build): {result['peak_growth_bytes'] / MB:.1f} MB (build buffers, freed after)")
    else:
        print("  peak RSS growth (build): below the process's earlier peak, so not measured")


# -- index, part B ----------------------------------------------------------------------------------


class IndexPaths(torch.utils.data.Dataset):
    """What a real dataset does per sample, minus the decoding: look the path up in the index."""

    def __init__(self, index: SampleIndex):
        self.index = index

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> int:
        return len(self.index.path(i))


class ListPaths(torch.utils.data.Dataset):
    """The same lookups on a plain list of str, the layout the SampleIndex replaces."""

    def __init__(self, paths: Sequence[str]):
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> int:
        return len(self.paths[i])


def measure_workers(dataset: torch.utils.data.Dataset, args: argparse.Namespace) -> dict:
    """Each worker's PSS after the first batch and after the last one, over one full pass."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=args.shuffle,
                                         num_workers=args.workers)
    total = len(loader)
    started = time.perf_counter()
    iterator = iter(loader)
    pids, start, end = [], {}, {}
    for number, _ in enumerate(iterator, 1):
        if number == 1:
            pids = descendant_pids()
            start = {pid: process_memory(pid).pss for pid in pids}
        if number == total:  # workers are still alive until the iterator is asked for one more batch
            end = {pid: process_memory(pid).pss for pid in pids}
    seconds = time.perf_counter() - started
    del iterator
    return {"batches": total, "seconds": seconds, "pids": pids,
            "start_pss_bytes": [start[p] for p in pids], "end_pss_bytes": [end[p] for p in pids]}


def report_workers(title: str, result: dict, reference_bytes: int, reference_name: str) -> None:
    print(f"\n  {title}: {result['batches']} batches in {result['seconds']:.1f} s")
    print(f"    {'worker':>6} {'pid':>8} {'PSS start MB':>13} {'PSS end MB':>11} {'growth MB':>10}")
    starts, ends = result["start_pss_bytes"], result["end_pss_bytes"]
    for number, (pid, start, end) in enumerate(zip(result["pids"], starts, ends)):
        print(f"    {number:>6} {pid:>8} {start / MB:13.1f} {end / MB:11.1f} {(end - start) / MB:10.1f}")
    growth = [end - start for start, end in zip(starts, ends)]
    largest = max(growth)
    print(f"    largest growth {largest / MB:.1f} MB per worker, {largest / reference_bytes:.0%} of the "
          f"{reference_name} ({reference_bytes / MB:.1f} MB); all workers: {sum(growth) / MB:.1f} MB")


def build_path_list(index: SampleIndex) -> tuple[list[str], int]:
    """The index's full paths as a list of str, and its size (RSS growth would hide reused allocator pages)."""
    paths = [index.path(i) for i in range(len(index))]
    return paths, sys.getsizeof(paths) + sum(map(sys.getsizeof, paths))


def run_index(args: argparse.Namespace) -> dict:
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # more workers than cores: on purpose
    with tempfile.TemporaryDirectory(prefix="memory_index_") as workdir:
        index, built = measure_index(args.samples, Path(workdir))
    report_index(built)
    order = "shuffled" if args.shuffle else "sequential"
    print(f"\nPart B: PSS of {args.workers} DataLoader workers over a full {order} pass of {len(index):,} samples, "
          f"batch size {args.batch_size}, no file I/O (parent pid {os.getpid()})")
    results = {"index": built, "workers": {"index": measure_workers(IndexPaths(index), args)}}
    report_workers("SampleIndex (numpy arrays)", results["workers"]["index"], index.nbytes, "index")
    if args.with_list:
        paths, list_bytes = build_path_list(index)
        results["workers"]["list"] = measure_workers(ListPaths(paths), args)
        report_workers("plain list of str (for contrast)", results["workers"]["list"], list_bytes,
                       "list and its strings")
    return results


# -- workers ----------------------------------------------------------------------------------------


def run_workers(args: argparse.Namespace) -> dict:
    """Each worker's RSS and PSS at the first batch, every --every batches and the last, per epoch."""
    index = scan_folder(str(args.data / args.split), IMAGE_EXTENSIONS)
    samples = []
    with tempfile.TemporaryDirectory(prefix="memory_workers_") as workdir:
        list_path = Path(workdir) / "list.txt"
        harness.write_file_list(args.split, index, args.repeat, list_path)
        overrides = harness.fastloader_overrides(args.split, args.data / args.split, index, list_path, args,
                                                 args.repeat, backend="torch", **{"output.device": "cpu",
                                                                     "workers.num_workers": args.workers})
        loader, close = harness.fastloader_factory(args.split, overrides)()
        print(f"{args.split}: {len(index)} files x {args.repeat}, {len(loader)} batches of {args.batch_size} per "
              f"epoch, {args.workers} workers; MB per worker (RSS / PSS)")
        try:
            for epoch in range(args.epochs):
                for number, _ in enumerate(loader, 1):
                    if number == 1 or number % args.every == 0 or number == len(loader):
                        workers = [process_memory(pid) for pid in descendant_pids()]
                        samples.append({"epoch": epoch, "batch": number, "rss_bytes": [w.rss for w in workers],
                                        "pss_bytes": [w.pss for w in workers]})
                        row = "  ".join(f"{w.rss / MB:7.1f} / {w.pss / MB:6.1f}" for w in workers)
                        print(f"  epoch {epoch} batch {number:4d}: {row}", flush=True)
        finally:
            close()
    return {"split": args.split, "files": len(index), "repeat": args.repeat, "workers": args.workers,
            "samples": samples}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    info = hardware()
    print(f"hardware: {info['cpu']}, {info['cpu_cores']} usable cores, torch {info['torch']}, "
          f"Python {info['python']}\n")
    started = time.perf_counter()
    results = run_index(args) if args.part == "index" else run_workers(args)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"part": args.part, "hardware": info, **results}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
