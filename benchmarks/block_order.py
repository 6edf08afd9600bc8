"""What `shuffle: block` gives up in randomness, and what it saves a bounded shard cache: the epoch
orders of a synthetic ImageNet-sized split in tar shards, measured without reading any data.

The split: --samples samples of --classes classes, sample sizes log-normal around --mean-kb, packed
into --shards shards either in a seeded shuffled order (`mixed`: what `fastloader pack` writes by
default) or in class order (`sorted`: shards of one or two classes, the worst case for a block order).
The orders: `shuffle: true` (a uniform permutation), `shuffle: block` at each of --budgets, and, where
--streaming-python names a Python with MosaicML Streaming installed, Streaming's `py1e` with a shuffle
block of as many samples as each budget holds (one canonical node: one global order, as ours).
Per order, over the global batches of --batch-size:

- distinct shards per batch, and distinct classes per batch (means);
- the correlation of neighbouring batches' classes: Pearson's r between the class counts of batch t
  and batch t + 1, averaged (a uniform permutation gives about 0);
- shard fetches per epoch over the shard count, through an LRU cache holding --cache-fraction of the
  split's bytes (every rank's reads in the global order, as one node cache sees them);
- the time to draw the epoch's order (ms).

    python benchmarks/block_order.py
    python benchmarks/block_order.py --budgets 1GB,4GB,16GB --streaming-python /tmp/venv/bin/python --json b.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

import harness
import numpy as np

from fastloader.order import BlockShuffle, Containers, uniform_permutation
from fastloader.units import parse_size

PY1E = r"""
import sys, time, numpy as np
from streaming.base.shuffle import get_shuffle
counts, out = np.load(sys.argv[1]), sys.argv[5]
block, seed, epoch = (int(a) for a in sys.argv[2:5])
best = float("inf")
for _ in range(3):
    began = time.perf_counter()
    order = get_shuffle("py1e", counts, 1, seed, epoch, block)
    best = min(best, time.perf_counter() - began)
np.save(out, order)
print(best * 1000)
"""
"""Streaming's py1e order of the shards' sample counts (one canonical node), and its fastest of 3 draws in ms."""


class Split:
    """The synthetic split: each sample's class, shard and byte range."""

    def __init__(self, samples: int, shards: int, classes: int, mean_kb: float, layout: str, seed: int):
        rng = np.random.default_rng(seed)
        labels = np.arange(samples) % classes
        order = rng.permutation(samples) if layout == "mixed" else np.argsort(labels, kind="stable")
        self.labels = labels[order]
        sigma = 0.5
        self.length = rng.lognormal(np.log(mean_kb * 1024) - sigma ** 2 / 2, sigma, samples).astype(np.int64)
        self.shard = (np.arange(samples) * shards // samples).astype(np.int32)
        ends = np.cumsum(self.length)
        shard_begin = np.r_[0, ends][np.searchsorted(self.shard, np.arange(shards))]
        self.start = np.r_[0, ends[:-1]] - shard_begin[self.shard]
        self.containers = Containers(self.shard, self.start, self.length)
        self.bytes = int(self.length.sum())
        self.classes = classes


def measure(split: Split, order: np.ndarray, batch: int, cache_bytes: int) -> dict:
    """The statistics of one epoch's global order (see the module's docstring)."""
    whole = len(order) // batch * batch
    shards = split.shard[order[:whole]].reshape(-1, batch)
    classes = split.labels[order[:whole]].reshape(-1, batch)
    distinct = lambda rows: float(np.mean(1 + (np.diff(np.sort(rows, axis=1), axis=1) != 0).sum(axis=1)))  # noqa: E731
    counts = np.zeros((len(classes), split.classes))
    np.add.at(counts, (np.repeat(np.arange(len(classes)), batch), classes.ravel()), 1)
    centred = counts - counts.mean(axis=1, keepdims=True)
    norms = np.sqrt((centred ** 2).sum(axis=1))
    r = (centred[:-1] * centred[1:]).sum(axis=1) / np.maximum(norms[:-1] * norms[1:], 1e-12)
    return {"shards_per_batch": distinct(shards), "classes_per_batch": distinct(classes),
            "neighbour_class_r": float(r.mean()),
            "fetches_per_shard": lru_fetches(split, split.shard[order], cache_bytes) / len(split.containers.number)}


def lru_fetches(split: Split, reads: np.ndarray, cache_bytes: int) -> int:
    """Shard fetches of an LRU cache of `cache_bytes` over the shard reads in this order (a read of a
    shard just read again is a hit, so runs are collapsed first)."""
    runs = reads[np.r_[True, reads[1:] != reads[:-1]]].tolist()
    size = dict(zip(split.containers.number.tolist(), split.containers.sizes.tolist()))
    held, used, fetched = OrderedDict(), 0, 0
    for shard in runs:
        if shard in held:
            held.move_to_end(shard)
            continue
        fetched += 1
        held[shard] = True
        used += size[shard]
        while used > cache_bytes and len(held) > 1:
            gone, _ = held.popitem(last=False)
            used -= size[gone]
    return fetched


def timed(draw) -> tuple[np.ndarray, float]:
    """(the order, the fastest of 3 draws in ms)."""
    best, order = float("inf"), None
    for _ in range(3):
        began = time.perf_counter()
        order = draw()
        best = min(best, time.perf_counter() - began)
    return order, best * 1000


def py1e_order(python: str, split: Split, block_samples: int, seed: int, epoch: int) -> tuple[np.ndarray, float]:
    with tempfile.TemporaryDirectory(prefix="py1e_") as work:
        counts, out = Path(work) / "counts.npy", Path(work) / "order.npy"
        np.save(counts, split.containers.counts)
        done = subprocess.run([python, "-c", PY1E, str(counts), str(block_samples), str(seed), str(epoch), str(out)],
                              check=True, capture_output=True, text=True)
        return np.load(out), float(done.stdout.split()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=1_281_167, help="default: 1,281,167 (ImageNet's train)")
    parser.add_argument("--shards", type=int, default=1024, help="default: 1024")
    parser.add_argument("--classes", type=int, default=1000, help="default: 1000")
    parser.add_argument("--mean-kb", type=float, default=110, help="mean sample size in KiB (default: 110)")
    parser.add_argument("--batch-size", type=int, default=256, help="global batch: all ranks together (default: 256)")
    parser.add_argument("--budgets", default="1GB,4GB,16GB", help="block budgets (default: 1GB,4GB,16GB)")
    parser.add_argument("--cache-fraction", type=float, default=0.25,
                        help="the LRU cache's size as a fraction of the split's bytes (default: 0.25)")
    parser.add_argument("--layouts", default="mixed,sorted", help="mixed, sorted or both (default: both)")
    parser.add_argument("--seed", type=int, default=0, help="default: 0")
    parser.add_argument("--epoch", type=int, default=1, help="the epoch measured (default: 1)")
    parser.add_argument("--streaming-python", help="a Python with mosaicml-streaming installed, for py1e")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    if args.samples < args.shards or args.shards < 1 or args.batch_size < 1:
        parser.error("--samples must be at least --shards, and both and --batch-size at least 1")
    budgets = [(text, parse_size(text, "--budgets")) for text in args.budgets.split(",")]
    skipped = harness.missing_peer(args.streaming_python, "--streaming-python", "streaming")
    results = {"settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "layouts": {}}
    if skipped:
        print(f"skipped py1e: {skipped}")
    for layout in args.layouts.split(","):
        split = Split(args.samples, args.shards, args.classes, args.mean_kb, layout, args.seed)
        cache = int(split.bytes * args.cache_fraction)
        print(f"\n{layout} shards: {args.samples:,} samples, {args.shards} shards, {split.bytes / 2**30:.1f} GiB; "
              f"LRU cache {cache / 2**30:.1f} GiB; global batch {args.batch_size}")
        print(f"  {'order':<22} {'shards/batch':>12} {'classes/batch':>13} {'neighbour r':>11} "
              f"{'fetches/shard':>13} {'draw ms':>8}")
        rows = {}
        orders = [("shuffle: true", lambda: uniform_permutation(args.seed, args.epoch, args.samples))]
        for text, budget in budgets:
            blocks = BlockShuffle(split.containers, budget)
            orders.append((f"block {text}", lambda blocks=blocks: blocks(args.seed, args.epoch, args.samples)))
        for name, draw in orders:
            order, ms = timed(draw)
            rows[name] = {**measure(split, order, args.batch_size, cache), "draw_ms": ms}
        if not skipped:
            for text, budget in budgets:
                block = max(1, round(budget / (split.bytes / args.samples)))
                order, ms = py1e_order(args.streaming_python, split, block, args.seed, args.epoch)
                rows[f"py1e {block:,} samples"] = {**measure(split, order, args.batch_size, cache), "draw_ms": ms}
        for name, row in rows.items():
            print(f"  {name:<22} {row['shards_per_batch']:>12.1f} {row['classes_per_batch']:>13.1f} "
                  f"{row['neighbour_class_r']:>11.3f} {row['fetches_per_shard']:>13.2f} {row['draw_ms']:>8.0f}")
        results["layouts"][layout] = rows
    results["py1e"] = skipped or "measured"
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
