"""Memory of the SampleIndex at ImageNet scale, and of the DataLoader workers that read it.

Part A builds the index of 1,281,167 synthetic ImageNet-like paths from a file list and reports
its size and how much the process grew. Part B runs DataLoader workers over a full pass of that
index, where each sample only looks up its path (no file I/O), and samples each worker's PSS
shortly after start and at the end of the pass. Forked workers share the parent's pages until
they write to them: a numpy index is never written, so PSS stays flat, while a list of Python
strings is written by reference counting, so every page a worker reads is copied into it.

    python benchmarks/index_memory.py
    python benchmarks/index_memory.py --samples 100000 --workers 4 --no-list
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Sequence

import torch
import torch.utils.data

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fastloader.samples import SampleIndex, read_file_list  # noqa: E402

IMAGENET_TRAIN_SAMPLES = 1_281_167
CLASSES = 1000
INDEX_TARGET_MB = 150
MB = 1024 * 1024


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=IMAGENET_TRAIN_SAMPLES,
                        help=f"paths in the synthetic file list (default: {IMAGENET_TRAIN_SAMPLES}, ImageNet train)")
    parser.add_argument("--workers", type=int, default=8, help="DataLoader workers in part B (default: 8)")
    parser.add_argument("--batch-size", type=int, default=1024, help="part B batch size (default: 1024)")
    parser.add_argument("--shuffle", action=argparse.BooleanOptionalAction, default=True,
                        help="part B reads in random order, as a training epoch does (default: on)")
    parser.add_argument("--list", dest="with_list", action=argparse.BooleanOptionalAction, default=True,
                        help="part B also measures paths held as a plain Python list of str (default: on)")
    args = parser.parse_args(argv)
    if args.samples < CLASSES:
        parser.error(f"--samples must be >= {CLASSES} (one per class at least)")
    if args.workers < 1 or args.batch_size < 1:
        parser.error("--workers and --batch-size must be >= 1")
    return args


# -- reading memory from /proc ------------------------------------------------------------------


def proc_status_kb(field: str, pid: int | str = "self") -> int:
    """A `Vm...` line of /proc/<pid>/status, in kB."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(f"no {field} in /proc/{pid}/status")


def pss_kb(pid: int) -> int:
    """Proportional set size: private pages plus each shared page divided by its sharers."""
    with open(f"/proc/{pid}/smaps_rollup") as handle:
        for line in handle:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    raise KeyError(f"no Pss line in /proc/{pid}/smaps_rollup")


def reset_peak_rss() -> bool:
    """Restart VmHWM from the current RSS (Linux >= 4.0), so that the peak of one step can be read."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def child_pids() -> list[int]:
    """This process's children, from /proc (for when the DataLoader iterator does not expose them)."""
    pids = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return sorted(pids)


# -- part A ---------------------------------------------------------------------------------------


def write_synthetic_list(list_path: Path, samples: int) -> None:
    """`nXXXXXXXX/nXXXXXXXX_K.JPEG label` lines shaped like ImageNet's, written a class at a time."""
    per_class, extra = divmod(samples, CLASSES)
    with open(list_path, "w", encoding="utf-8") as handle:
        for label in range(CLASSES):
            wnid = f"n{1440764 + label * 4099:08d}"
            count = per_class + (label < extra)
            handle.write("".join(f"{wnid}/{wnid}_{10000 + k * 7}.JPEG {label}\n" for k in range(count)))


def measure_index(samples: int, workdir: Path) -> tuple[SampleIndex, dict]:
    list_path = workdir / "train_list.txt"
    write_synthetic_list(list_path, samples)
    gc.collect()
    rss_before = proc_status_kb("VmRSS")
    peak_known = reset_peak_rss()
    started = time.perf_counter()
    index = read_file_list(str(list_path), "/data/imagenet/train", classes=None)
    seconds = time.perf_counter() - started
    gc.collect()
    rss_after = proc_status_kb("VmRSS")
    peak = proc_status_kb("VmHWM") if peak_known else None
    return index, {"samples": len(index), "list_bytes": list_path.stat().st_size, "build_s": seconds,
                   "nbytes": index.nbytes, "rss_growth_kb": rss_after - rss_before,
                   "peak_growth_kb": peak - rss_before if peak is not None else None}


def report_index(result: dict) -> None:
    growth_mb = result["rss_growth_kb"] / 1024
    print(f"Part A: SampleIndex of {result['samples']:,} paths "
          f"(file list {result['list_bytes'] / MB:.1f} MB, {CLASSES} classes)")
    print(f"  build (read_file_list):  {result['build_s']:.2f} s")
    print(f"  index.nbytes:            {result['nbytes'] / MB:.1f} MB")
    print(f"  process RSS growth:      {growth_mb:.1f} MB   "
          f"target < {INDEX_TARGET_MB} MB: {'OK' if growth_mb < INDEX_TARGET_MB else 'ABOVE TARGET'}")
    if result["peak_growth_kb"] is not None:
        print(f"  peak RSS growth (build): {result['peak_growth_kb'] / 1024:.1f} MB (build buffers, freed after)")


# -- part B ---------------------------------------------------------------------------------------


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


def worker_pids(iterator) -> list[int]:
    workers = getattr(iterator, "_workers", None)
    return [w.pid for w in workers] if workers else child_pids()


def measure_workers(dataset: torch.utils.data.Dataset, args: argparse.Namespace) -> dict:
    """Each worker's PSS after the first batch and after the last one, over one full pass."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=args.shuffle,
                                         num_workers=args.workers)
    total = len(loader)
    started = time.perf_counter()
    iterator = iter(loader)
    start_kb = end_kb = {}
    for number, _ in enumerate(iterator, 1):
        if number == 1:
            pids = worker_pids(iterator)
            start_kb = {pid: pss_kb(pid) for pid in pids}
        if number == total:  # workers are still alive until the iterator is asked for one more batch
            end_kb = {pid: pss_kb(pid) for pid in pids}
    seconds = time.perf_counter() - started
    del iterator
    return {"batches": total, "seconds": seconds, "pids": pids,
            "start_kb": [start_kb[p] for p in pids], "end_kb": [end_kb[p] for p in pids]}


def report_workers(title: str, result: dict, reference_bytes: int, reference_name: str) -> None:
    print(f"\n  {title}: {result['batches']} batches in {result['seconds']:.1f} s")
    print(f"    {'worker':>6} {'pid':>8} {'PSS start MB':>13} {'PSS end MB':>11} {'growth MB':>10}")
    for number, (pid, start, end) in enumerate(zip(result["pids"], result["start_kb"], result["end_kb"])):
        print(f"    {number:>6} {pid:>8} {start / 1024:13.1f} {end / 1024:11.1f} {(end - start) / 1024:10.1f}")
    growth = [(end - start) * 1024 for start, end in zip(result["start_kb"], result["end_kb"])]
    largest = max(growth)
    print(f"    largest growth {largest / MB:.1f} MB per worker, {largest / reference_bytes:.0%} of the "
          f"{reference_name} ({reference_bytes / MB:.1f} MB); all workers: {sum(growth) / MB:.1f} MB")


def build_path_list(index: SampleIndex) -> tuple[list[str], int]:
    """The index's full paths as a list of str, and its size (RSS growth would hide reused allocator pages)."""
    paths = [index.path(i) for i in range(len(index))]
    return paths, sys.getsizeof(paths) + sum(map(sys.getsizeof, paths))


def run_workers(index: SampleIndex, args: argparse.Namespace) -> None:
    order = "shuffled" if args.shuffle else "sequential"
    print(f"\nPart B: PSS of {args.workers} DataLoader workers over a full {order} pass of {len(index):,} samples, "
          f"batch size {args.batch_size}, no file I/O (parent pid {os.getpid()})")
    result = measure_workers(IndexPaths(index), args)
    report_workers("SampleIndex (numpy arrays)", result, index.nbytes, "index")
    if not args.with_list:
        return
    paths, list_bytes = build_path_list(index)
    result = measure_workers(ListPaths(paths), args)
    report_workers("plain list of str (for contrast)", result, list_bytes, "list and its strings")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # more workers than cores: on purpose
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"{os.cpu_count()} CPUs, torch {torch.__version__}, Python {sys.version.split()[0]}\n")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="index_memory_") as workdir:
        index, result = measure_index(args.samples, Path(workdir))
    report_index(result)
    run_workers(index, args)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
