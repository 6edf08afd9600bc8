"""The DALI feed alone against bare reads of the same files, and the GIL it takes from the trainer.

Every batch the DALI backend decodes is first read and checked in Python by its feed
(`dali_loader/feed.py`, `Feed`): the bytes of each sample, the magic bytes, the header's size
against `dataset.max_pixels`, the end marker, the draws. This measures that feed with no DALI
pipeline behind it (the graph's speed is peers.py's question), in one process, page cache warm:

- the feed: `feed()` called batch after batch over whole epochs of the split's planned order, as
  DALI's driver thread calls it;
- the same feed reading each sample into a fresh zero-filled buffer, as it did before its arena
  (`fresh buffers`), in the same rounds;
- into DALI: the feed handed to DALI's external source as the loader's pipeline takes it, in place
  (`no_copy`), and with DALI's copy (`copied`), in a pipeline that decodes nothing;
- with `--processes N`: the same feed with its reads and checks in N worker processes
  (`dali.feed_processes: N`), the bytes handed back in shared memory: its rate, the calling
  thread's CPU time a sample, the GIL it takes from a spinning trainer and its rate beside it,
  and its rate into DALI (in place);
- bare reads: `open()` + `read()` of the same files in the same order (shards: one `pread` of each
  member's range, a descriptor per shard), nothing checked; the ratio feed / bare is the figure.
  Each such read lands in memory the allocator hands out again at once, hot in the CPU's cache;
  `bare kept` reads each batch's bytes side by side into batch-sized buffers taken in turn (as
  many as the feed's slabs), as a loader must that hands whole batches to a decoder: the copy
  into memory not in the cache is most of a shard member's read (feed / kept, beside the figure);
- the GIL: a thread spinning in pure Python (a training thread's launches stand in for it) counts
  its loops while the feed runs, against its count alone: the share of the interpreter the feed
  takes from the training thread; and the feed's rate beside that thread (the GIL's hand-over
  every 5 ms makes a feed that needs it often wait).

For folders and shards (the same samples, packed in the index's order), train with rand-m9 and a
size per batch (`sizes: [160, 192, 224]`) and val:

    python benchmarks/feed.py --data ../shared/data/realphotos --rounds 3
"""
from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import harness
import shards as shard_benchmark

import fastloader

TRAIN_TRANSFORM = {"auto_augment": "rand-m9-mstd0.5-inc1", "sizes": [160, 192, 224], "size": 224}
SECONDS = 2.0
"""Each measurement runs whole epochs until at least this long (--seconds)."""


def config_for(source: str, data: Path, shards: dict[str, list[str]], batch: int, threads: int) -> dict:
    """shards.py's config of the split (folder or shards), on the DALI backend, train with TRAIN_TRANSFORM."""
    raw = shard_benchmark.config_for(source, "dali", data, shards, batch, None)
    raw["dali"] = {"threads": threads, "feed_processes": 0}  # the driver thread's feed (a GPU's auto: processes)
    raw["train"]["transform"] = {**raw["train"].get("transform", {}), **TRAIN_TRANSFORM}
    return raw


def feed_epochs(loader, seconds: float) -> tuple[int, float]:
    """(samples, seconds): whole epochs of the loader's feed, called as its driver calls it."""
    feed, samples, epoch = loader._feed, 0, 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        feed.start(loader.order.batches(epoch), functools.partial(loader.order.batches, epoch + 1))  # as the loader
        while True:
            try:
                data = feed()
            except StopIteration:
                break
            samples += len(data[0])
        feed.fed.clear()
        epoch += 1
    return samples, time.perf_counter() - started


def handover_epochs(loader, seconds: float, no_copy: bool) -> tuple[int, float]:
    """(samples, seconds): whole epochs of the feed handed to DALI's external source, as the
    loader's pipeline takes it (`no_copy`: in place) or with DALI's copy, in a pipeline that only
    returns the bytes' shapes (no decode): the feed and DALI's side of taking its arrays."""
    from nvidia.dali import fn, pipeline_def

    from dali_loader.pipeline import feed_layout
    feed = loader._feed
    layout = feed_layout(feed.inputs.train, feed.kind, loader.augmentation, feed.inputs.sized)

    def graph():
        arrays = fn.external_source(source=feed, num_outputs=len(layout), batch=True, no_copy=no_copy,
                                    dtype=[dtype for _, dtype in layout])
        return tuple(array.shape() for array in arrays)  # every output used: DALI takes each

    pipe = pipeline_def(graph)(batch_size=loader.split.batch_size, num_threads=2, device_id=None,
                               prefetch_queue_depth=loader.config.workers.prefetch_factor, exec_dynamic=True)
    pipe.build()
    samples, epoch = 0, 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        feed.start(loader.order.batches(epoch), functools.partial(loader.order.batches, epoch + 1))  # as the loader
        try:
            while True:
                samples += len(pipe.run()[0])
        except StopIteration:
            pipe.reset()
        feed.fed.clear()
        epoch += 1
    took = time.perf_counter() - started
    del pipe
    return samples, took


def process_epochs(loader, seconds: float) -> tuple[int, float, float]:
    """(samples, seconds, the calling thread's CPU seconds): feed_epochs of a loader whose feed is
    read by worker processes (dali.feed_processes)."""
    cpu = time.thread_time()
    samples, took = feed_epochs(loader, seconds)
    return samples, took, time.thread_time() - cpu


def bare_epochs(loader, seconds: float, kept: int = 0) -> tuple[int, float]:
    """(samples, seconds): the same samples' bytes in the same order, read and nothing else. Each
    read lands in a fresh `bytes`, whose memory the allocator hands out again at once (hot in the
    CPU's cache). `kept`: each batch's bytes land side by side in one of `kept` batch-sized buffers
    taken in turn, as any loader's must that hands a batch to a decoder (the feed's slabs)."""
    batches = [[loader.index.location(int(sample)) for sample in batch[:, 0]] for batch in loader.order.batches(0)]
    buffers = [memoryview(bytearray(max(sum(_size(location) for location in batch) for batch in batches)))
               for _ in range(kept)]
    descriptors: dict[str, int] = {}
    samples = 0
    started = time.perf_counter()
    try:
        while time.perf_counter() - started < seconds:
            for number, locations in enumerate(batches):
                into, offset = buffers[number % kept] if kept else None, 0
                for location in locations:
                    if location.whole_file:
                        with open(location.file, "rb") as handle:
                            if into is None:
                                handle.read()
                            else:
                                offset += handle.readinto(into[offset:offset + _size(location)])
                        continue
                    fd = descriptors.get(location.file)
                    if fd is None:
                        fd = descriptors[location.file] = os.open(location.file, os.O_RDONLY)
                    if into is None:
                        os.pread(fd, location.length, location.start)
                    else:
                        offset += os.preadv(fd, [into[offset:offset + location.length]], location.start)
                samples += len(locations)
    finally:
        for fd in descriptors.values():
            os.close(fd)
    return samples, time.perf_counter() - started


@functools.lru_cache(maxsize=None)
def _size(location) -> int:
    return location.length if not location.whole_file else os.stat(location.file).st_size


def spin(stop: threading.Event, counted: list[int]) -> None:
    loops = 0
    while not stop.is_set():
        loops += 1
    counted.append(loops)


def spin_rate(seconds: float, work=None) -> tuple[float, object]:
    """(loops per second of a pure-Python spinning thread, what `work()` returned): alone, or while
    `work()` runs here."""
    stop, counted = threading.Event(), []
    thread = threading.Thread(target=spin, args=(stop, counted))
    started = time.perf_counter()
    thread.start()
    result = None
    if work is None:
        time.sleep(seconds)
    else:
        result = work()
    stop.set()
    thread.join()
    return counted[0] / (time.perf_counter() - started), result


class FreshBuffers:
    """What the feed read into before its arena: a new zero-filled buffer per sample (--fresh)."""

    def reset(self) -> None:
        pass

    def view(self, size: int) -> memoryview:
        return memoryview(bytearray(size))


def measure(config: dict, split: str, rounds: int, seconds: float = SECONDS, processes: int = 0) -> dict:
    loader = fastloader.build_loader(config, split)
    arenas = loader._feed.arenas
    pooled_loader = None
    if processes:
        pooled_loader = fastloader.build_loader({**config, "dali": {**config["dali"], "feed_processes": processes}},
                                                split)
        feed_epochs(pooled_loader, 0.3)  # the workers started
    try:
        feed_epochs(loader, 0.3)  # warm: the page cache, the size table
        feed_rates, bare_rates, kept_rates, gil, contended, fresh_rates = [], [], [], [], [], []
        from dali_loader.batches_ahead import READS_AHEAD

        slabs = loader.config.workers.prefetch_factor + 1 + READS_AHEAD  # as many as the feed's (loader.py)
        handed, copied, pooled, pool_cpu, pool_gil, pool_contended, pool_handed = [], [], [], [], [], [], []
        for _ in range(rounds):
            if processes:
                samples, took, cpu = process_epochs(pooled_loader, seconds)
                pooled.append(samples / took)
                pool_cpu.append(cpu / samples * 1e6)
                alone, _ = spin_rate(seconds / 2)
                beside, (samples, took) = spin_rate(0, lambda: feed_epochs(pooled_loader, seconds / 2))
                pool_gil.append(1 - beside / alone)
                pool_contended.append(samples / took)
                samples, took = handover_epochs(pooled_loader, seconds, no_copy=True)
                pool_handed.append(samples / took)
            samples, took = handover_epochs(loader, seconds, no_copy=True)
            handed.append(samples / took)
            samples, took = handover_epochs(loader, seconds, no_copy=False)
            copied.append(samples / took)
            loader._feed.arenas = collections.deque([FreshBuffers()])
            samples, took = feed_epochs(loader, seconds)
            fresh_rates.append(samples / took)
            loader._feed.arenas = arenas
            samples, took = feed_epochs(loader, seconds)
            feed_rates.append(samples / took)
            samples, took = bare_epochs(loader, seconds)
            bare_rates.append(samples / took)
            samples, took = bare_epochs(loader, seconds, kept=slabs)
            kept_rates.append(samples / took)
            alone, _ = spin_rate(seconds / 2)
            beside, (samples, took) = spin_rate(0, lambda: feed_epochs(loader, seconds / 2))
            gil.append(1 - beside / alone)
            contended.append(samples / took)
    finally:
        loader.close()
        if pooled_loader is not None:
            pooled_loader.close()
    feed, bare = statistics.median(feed_rates), statistics.median(bare_rates)
    kept = statistics.median(kept_rates)
    return {"feed": feed, "bare": bare, "ratio": feed / bare, "bare_kept": kept, "ratio_kept": feed / kept,
            "gil_taken": statistics.median(gil),
            "us_per_sample": 1e6 / feed, "feed_beside_trainer": statistics.median(contended),
            "fresh": statistics.median(fresh_rates), "into_dali": statistics.median(handed),
            "into_dali_copied": statistics.median(copied),
            **({"processes": statistics.median(pooled), "processes_ratio": statistics.median(pooled) / bare,
                "processes_ratio_kept": statistics.median(pooled) / kept,
                "processes_thread_us": statistics.median(pool_cpu), "processes_gil_taken": statistics.median(pool_gil),
                "processes_beside_trainer": statistics.median(pool_contended),
                "processes_into_dali": statistics.median(pool_handed)}
               if processes else {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_data_argument(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2, help="dali.threads")
    parser.add_argument("--processes", type=int, default=0,
                        help="also measure the feed read by this many worker processes (dali.feed_processes)")
    parser.add_argument("--sources", nargs="+", choices=("folder", "shards"), default=["folder", "shards"])
    parser.add_argument("--seconds", type=float, default=SECONDS, help="each measurement's least time (default: 2)")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    args = parser.parse_args()
    data = harness.check_data(parser, args.data, ("train", "val"))
    missing = harness.missing_dali()
    if missing:
        sys.exit(f"feed.py measures the DALI backend's feed: {missing}")
    print(f"data {data}, batch {args.batch}, dali.threads {args.threads}, {args.rounds} rounds, medians; "
          f"train: {TRAIN_TRANSFORM}")
    with tempfile.TemporaryDirectory() as folder:
        shards = {}
        if "shards" in args.sources:
            for split in ("train", "val"):
                shards[split] = shard_benchmark.pack_in_index_order(data / split, Path(folder), 64)
        print(f"{'source':8} {'split':6} {'feed /s':>10} {'bare /s':>10} {'feed/bare':>10} {'bare kept /s':>13} "
              f"{'feed/kept':>10} {'us/sample':>10} "
              f"{'GIL taken':>10} {'beside a spinning trainer /s':>29} {'fresh buffers /s':>17} "
              f"{'into DALI /s':>13} {'copied /s':>10}"
              + (f" {f'{args.processes} processes /s':>14} {'/bare':>6} {'/kept':>6} {'thread us/sample':>17} "
                 f"{'GIL taken':>10} "
                 f"{'beside a trainer /s':>20} {'into DALI /s':>13}"
                 if args.processes else ""))
        report = {}
        for source in args.sources:
            for split in ("train", "val"):
                result = measure(config_for(source, data, shards, args.batch, args.threads), split, args.rounds,
                                 args.seconds, args.processes)
                report[f"{source} {split}"] = result
                print(f"{source:8} {split:6} {result['feed']:10.0f} {result['bare']:10.0f} {result['ratio']:9.2f}x "
                      f"{result['bare_kept']:13.0f} {result['ratio_kept']:9.2f}x "
                      f"{result['us_per_sample']:10.1f} {result['gil_taken']:9.0%} "
                      f"{result['feed_beside_trainer']:29.0f} {result['fresh']:17.0f} "
                      f"{result['into_dali']:13.0f} {result['into_dali_copied']:10.0f}"
                      + (f" {result['processes']:14.0f} {result['processes_ratio']:5.2f}x "
                         f"{result['processes_ratio_kept']:5.2f}x "
                         f"{result['processes_thread_us']:17.1f} {result['processes_gil_taken']:9.0%} "
                         f"{result['processes_beside_trainer']:20.0f} {result['processes_into_dali']:13.0f}"
                         if args.processes else ""))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
