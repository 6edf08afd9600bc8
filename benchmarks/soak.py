"""Memory and resources over many epochs: does a long run grow?

Epochs of the real photos' train split (--copies times over), per backend and per way: `local`, the
photos as a folder on disk; `s3`, the same photos packed into shards (`fastloader pack`) and served
by a real S3-compatible server on 127.0.0.1 (moto, behind the tests' proxy: tests/objectstore.py),
read through a node cache of --cache-fraction of the data, so that every epoch fetches again. One
loader a way, its epochs back to back (a consumer that drops each batch), and after each epoch:

- rss_mb: this process's resident memory; workers_mb: its children's (torch's workers, DALI's feed
  processes), summed; the object store's server, started here, is not counted;
- fds, threads, memfds (shared memory: /memfd: descriptors), children (processes);
- rss_after_trim_mb, at the end: RSS once glibc's malloc_trim returned its arenas' free pages (what
  is left is in use; the rest was freed memory the allocator kept);
- py_mb, with --tracemalloc: what Python allocated since the warm-up's end and still holds, and at
  the end the lines whose allocations grew most since then.

The slope is a least-squares fit over the epochs after --warmup, in MB per 100 epochs, for the whole
run and for its first and second half (a slope that falls is memory settling, one that holds is a
leak). The machine's other work moves RSS by a few MB; read slopes over tens of epochs.

    python benchmarks/soak.py --epochs 40
    python benchmarks/soak.py --backends dali --ways s3 --epochs 200 --tracemalloc --json soak.json
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import harness
import psutil
from remote import config_for, copied, pack

from fastloader import build_loader
from fastloader.machine import descendant_pids, hardware

sys.path.insert(0, str(harness.REPO_ROOT / "tests"))  # the tests' server and proxy, not a copy of them

WAYS = ("local", "s3")
MB = 1024 * 1024
COLUMNS = ("rss_mb", "workers_mb", "fds", "threads", "memfds", "children", "py_mb")


def sample(server_pid: int | None) -> dict:
    """This process's resources now; its children's memory, the object store's server left out."""
    me = psutil.Process()
    server = set() if server_pid is None else {server_pid, *descendant_pids(server_pid)}
    children = [child for child in me.children(recursive=True) if child.pid not in server]
    workers = 0
    for child in children:
        try:
            workers += child.memory_info().rss
        except psutil.Error:  # ended meanwhile
            continue
    memfds = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            memfds += os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:")
        except OSError:  # the listing's own descriptor, closed by now
            continue
    return {"rss_mb": me.memory_info().rss / MB, "workers_mb": workers / MB, "fds": me.num_fds(),
            "threads": me.num_threads(), "memfds": memfds, "children": len(children),
            "py_mb": tracemalloc.get_traced_memory()[0] / MB if tracemalloc.is_tracing() else None}


def trimmed_rss_mb() -> float | None:
    """This process's RSS once glibc's malloc has handed its free pages back (malloc_trim): what
    RSS holds beyond it is freed memory kept by the allocator's arenas, not memory in use. None
    where the C library has no malloc_trim (not glibc)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):
        return None
    return psutil.Process().memory_info().rss / MB


def slope(rows: list[dict], key: str) -> float | None:
    """Least-squares growth of `key` in units per 100 epochs; None for fewer than 3 epochs."""
    points = [(row["epoch"], row[key]) for row in rows if row[key] is not None]
    if len(points) < 3:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    return 100 * sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


def soak(config: dict, epochs: int, warmup: int, server_pid: int | None, top: int, trace: bool) -> dict:
    """One loader's epochs back to back, sampled after each; slopes after the warm-up. With `trace`,
    Python's allocations are traced from the warm-up's end (the build and the imports untraced)."""
    gc.collect()
    before = sample(server_pid)
    began = time.perf_counter()
    loader = build_loader(config, "train")
    rows, snapshot, grown = [], None, []
    try:
        for epoch in range(epochs):
            started, images = time.perf_counter(), 0
            for _, labels in loader:
                images += len(labels)
            rows.append({"epoch": epoch, "images": images, "seconds": time.perf_counter() - started,
                         **sample(server_pid)})
            if epoch + 1 == warmup and trace:
                tracemalloc.start()
                snapshot = tracemalloc.take_snapshot()
        trimmed = trimmed_rss_mb()
        if snapshot is not None:
            grown = [{"where": str(stat.traceback[0]), "grew_kb": stat.size_diff / 1024, "count_diff": stat.count_diff}
                     for stat in tracemalloc.take_snapshot().compare_to(snapshot, "lineno")[:top]]
    finally:
        tracemalloc.stop()
        loader.close()
    gc.collect()
    after = sample(server_pid)
    steady = rows[warmup:]
    half = len(steady) // 2
    slopes = {key: {"all": slope(steady, key), "first_half": slope(steady[:half], key),
                    "second_half": slope(steady[half:], key)} for key in COLUMNS}
    return {"seconds": time.perf_counter() - began, "before": before, "epochs": rows, "rss_after_trim_mb": trimmed,
            "after_close": after,
            "slopes_per_100_epochs": slopes, "grew_most": grown}


def show(backend: str, way: str, result: dict, warmup: int) -> None:
    rows = result["epochs"]
    first, last = rows[min(warmup, len(rows) - 1)], rows[-1]
    slopes = result["slopes_per_100_epochs"]

    def fit(key: str) -> str:
        found = slopes[key]
        return "n/a" if found["all"] is None else \
            f"{found['all']:+.1f} ({found['first_half'] or 0:+.1f}, {found['second_half'] or 0:+.1f})"

    print(f"{backend:5} {way:5}  {len(rows)} epochs, {sum(r['seconds'] for r in rows):.0f} s; after epoch {warmup} -> "
          f"{len(rows)}: rss {first['rss_mb']:.0f} -> {last['rss_mb']:.0f} MB, slope {fit('rss_mb')} MB/100 epochs; "
          f"workers {first['workers_mb']:.0f} -> {last['workers_mb']:.0f} MB, slope {fit('workers_mb')}; "
          f"fds {first['fds']} -> {last['fds']}, threads {first['threads']} -> {last['threads']}, memfds "
          f"{first['memfds']} -> {last['memfds']}, children {first['children']} -> {last['children']}"
          + (f"; python heap {first['py_mb']:.1f} -> {last['py_mb']:.1f} MB" if last["py_mb"] is not None else ""))
    if result["rss_after_trim_mb"] is not None:
        print(f"{'':13}at the end: rss {last['rss_mb']:.0f} MB, {result['rss_after_trim_mb']:.0f} MB once malloc_trim "
              f"returned the allocator's free pages")
    after, before = result["after_close"], result["before"]
    print(f"{'':13}after close: rss {after['rss_mb']:.0f} MB (before build {before['rss_mb']:.0f}), fds {after['fds']} "
          f"({before['fds']}), threads {after['threads']} ({before['threads']}), memfds {after['memfds']} "
          f"({before['memfds']}), children {after['children']} ({before['children']})")
    for grown in result["grew_most"]:
        print(f"{'':13}{grown['grew_kb']:+9.1f} kB {grown['count_diff']:+6d} blocks  {grown['where']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_data_argument(parser)
    harness.add_backends_argument(parser)
    parser.add_argument("--ways", type=lambda text: text.split(","), default=list(WAYS),
                        help=f"comma-separated, of {','.join(WAYS)} (default: both)")
    parser.add_argument("--epochs", type=int, default=40, help="epochs per backend and way (default: 40)")
    parser.add_argument("--warmup", type=int, help="epochs left out of the slopes (default: a quarter, at least 1)")
    parser.add_argument("--copies", type=int, default=1, help="the photos this many times over (default: 1)")
    parser.add_argument("--per-shard", type=int, default=25, help="samples per shard (default: 25)")
    parser.add_argument("--cache-fraction", type=float, default=0.5,
                        help="s3: the node cache's limit over the data's bytes (default: 0.5)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers or DALI threads (default: 2)")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="trace Python's allocations (slower): its heap per epoch, and the lines that grew most")
    parser.add_argument("--top", type=int, default=8, help="with --tracemalloc, lines shown (default: 8)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    data = harness.check_data(parser, args.data, ["train"])
    backends = harness.usable_backends(parser, args.backends)
    unknown = [way for way in args.ways if way not in WAYS]
    if unknown:
        parser.error(f"--ways: unknown way {', '.join(unknown)}; choose from {', '.join(WAYS)}")
    if args.epochs < 2:
        parser.error("--epochs: at least 2")
    warmup = min(args.epochs - 1, args.warmup if args.warmup is not None else max(1, args.epochs // 4))
    if "s3" in args.ways and shutil.which("moto_server", path=os.path.dirname(sys.executable)) is None:
        parser.error("moto's server is not installed here: pip install 'moto[server]' (in the test extra)")
    results: dict = {"date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count(), "epochs": args.epochs,
                     "warmup": warmup, "machine": hardware(),
                     "runs": {}}
    with tempfile.TemporaryDirectory(prefix="soak_bench_") as work:
        work = Path(work)
        photos = copied(data, work / "photos", args.copies)
        store = server_pid = url = None
        if "s3" in args.ways:
            from objectstore import start_server
            from remotefiles import uploaded

            shards = pack(photos, work / "shards", args.per_shard)
            data_bytes = sum(p.stat().st_size for p in shards)
            store = start_server()
            server_pid = store.process.pid
            url = uploaded(store, "soak", work / "shards", prefix="shards")
            os.environ.update(store.environment())
        try:
            print(f"{sum(1 for p in (photos / 'train').rglob('*') if p.is_file())} photos; batch {args.batch_size} at "
                  f"{args.size} px; {args.workers} workers; {args.epochs} epochs a way, slopes after epoch {warmup}; "
                  f"{os.cpu_count()} cores", flush=True)
            for backend in backends:
                for way in args.ways:
                    if way == "local":
                        config = {"backend": backend, "seed": 0, "output": {"device": "cpu"},
                                  "dataset": {"root": str(photos)}, "workers": {"num_workers": args.workers},
                                  "dali": {"threads": args.workers},
                                  "train": {"batch_size": args.batch_size, "transform": {"size": args.size}}}
                    else:
                        cache_limit = int(data_bytes * args.cache_fraction)
                        remote = {"cache_dir": str(work / f"node-{backend}"), "cache_limit": f"{cache_limit}B"}
                        config = config_for(backend, f"{url}/train-*.tar", cache_limit // 2, args, remote)
                    result = soak(config, args.epochs, warmup, server_pid, args.top, args.tracemalloc)
                    results["runs"][f"{backend} {way}"] = result
                    show(backend, way, result, warmup)
        finally:
            if store is not None:
                from objectstore import stop_server
                stop_server(store)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
