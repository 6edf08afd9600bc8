"""Shards against folders: the same photos read as files and as WebDataset tar shards, both backends,
in one run, and what the shard index costs at ImageNet scale.

1. Per (backend, source, split), fresh loaders in interleaved rounds: images/s over an epoch, and
   the training thread's CPU time per sample inside next() (time.thread_time(), the measure of
   benchmarks/trainer_thread.py), then the ratio shards / folder.
2. The torch backend's worker path (read + decode + crop + resize) per image on one core, in this
   process, in interleaved rounds: what differs between the sources without the loaders' noise.
3. The files a fresh loader opens in one epoch (a shard: once to check its cached index, once to
   read), counted with `strace -f -e trace=open,openat` in a child process (image files or shards
   under the data folders; skipped where strace is absent).
4. --members N: N synthesised tar members (N / 2 samples of a tiny image + a .cls), indexed cold with
   every core, then again from its cache; seconds per 100k members per core, and the index's bytes
   per sample (what every DataLoader worker holds).

    python benchmarks/shards.py --data ../shared/data/realphotos [--rounds 3] [--members 1280000]
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import harness

import fastloader
from fastloader.config_dump import config_to_dict
from fastloader.parallel import available_cores
from fastloader.schema import IMAGE_EXTENSIONS
from fastloader.sources.folder import scan_folder

SOURCES = ("folder", "shards")
MARKER = "/fastloader-count-opens-marker/"
"""A path that never exists: the counting process tries to open MARKER + case before each case, so
that the trace's lines between two markers are that case's opens."""
COUNT_OPENS = r"""
import json, os, sys, fastloader
try:
    import dali_loader.loader  # noqa: F401  imported once here, not again in each forked case
except ImportError:
    pass
for case, config, split in json.loads(sys.argv[1]):
    try:
        os.open(sys.argv[2] + case, os.O_RDONLY)
    except OSError:
        pass
    child = os.fork()
    if child == 0:  # a fresh loader in a fresh process: nothing opened before it
        with fastloader.build_loader(config, split) as loader:
            sum(len(labels) for _, labels in loader)
        os._exit(0)
    os.waitpid(child, 0)
"""


def pack_in_index_order(split_dir: Path, out: Path, per_shard: int) -> list[str]:
    """The split's images in the folder index's order as shards of `per_shard` samples, so that both
    sources hold the same samples in the same order (the same batches)."""
    index = scan_folder(str(split_dir), IMAGE_EXTENSIONS)
    paths, labels = harness.listed_files(index, 1)
    return harness.write_shards(paths, labels, out, split_dir.name, per_shard)


def config_for(source: str, backend: str, data: Path, shards: dict[str, list[str]], batch: int,
               size: int | None) -> dict:
    config = fastloader.load_config(harness.CONFIG)
    raw = config_to_dict(config)
    raw["backend"] = backend
    raw["output"] = {**raw.get("output", {}), "device": "cpu"}
    if source == "folder":
        raw["dataset"] = {**raw["dataset"], "root": str(data)}
    else:
        raw["dataset"] = {key: value for key, value in raw["dataset"].items() if key not in ("root", "cache")}
        raw["dataset"]["format"] = "webdataset"
    for split in ("train", "val"):
        raw[split] = {**raw[split], "batch_size": batch}
        if size:
            raw[split]["transform"] = {**raw[split].get("transform", {}), "size": size}
        if source == "shards":
            raw[split]["shards"] = shards[split]
    return raw


def one_epoch(config: dict, split: str, source: object | None = None) -> dict:
    """One epoch of a fresh loader (of `source`, where given): images/s and the training thread's CPU
    time per sample inside next()."""
    with fastloader.build_loader(config, split, source=source) as loader:  # closed: its workers stop now
        iterator = iter(loader)
        cpu = 0.0
        samples = 0
        started = time.perf_counter()
        while True:
            before = time.thread_time()
            try:
                _, labels = next(iterator)
            except StopIteration:
                break
            cpu += time.thread_time() - before
            samples += len(labels)
        elapsed = time.perf_counter() - started
    return {"images_per_s": samples / elapsed, "thread_us_per_sample": cpu / samples * 1e6, "samples": samples}


def worker_path(data: Path, split: str, shards: list[str], rounds: int, size: int | None) -> dict:
    """ms of CPU per image of the torch workers' per-sample work, for each source, median of rounds."""
    import numpy as np
    import torch

    from fastloader.sources.formats import build_index
    from torch_loader.loader import sample_transform
    torch.set_num_threads(1)
    indexes = {}
    for source in SOURCES:
        transform = {"transform": {"size": size}} if size else {}
        raw = {"dataset": {"root": str(data)}, split: transform}
        if source == "shards":
            raw = {"dataset": {"format": "webdataset", "root": str(data)}, split: {"shards": shards, **transform}}
        config = fastloader.load_config(raw)
        indexes[source] = build_index(config, config.split(split))
    transform = sample_transform(config.split(split))
    seeds = np.arange(len(indexes["folder"]))
    ops = transform.sample_ops(seeds)
    times: dict[str, list[float]] = {source: [] for source in SOURCES}
    for _ in range(rounds):
        for source, index in indexes.items():
            started = time.process_time()
            for i in range(len(index)):
                transform(index.location(i), int(seeds[i]), ops[i])
            times[source].append((time.process_time() - started) / len(index) * 1e3)
    return {source: statistics.median(values) for source, values in times.items()}


def count_opens(cases: dict[str, tuple[dict, str]], roots: list[str]) -> dict[str, int | None]:
    """Case -> the files under `roots` that a fresh loader of (config, split) opens in one epoch, each
    case in a process of its own forked from one traced process (which imports torch and DALI once);
    None where strace is absent."""
    if not shutil.which("strace"):
        return dict.fromkeys(cases)
    with tempfile.TemporaryDirectory() as folder:
        log = os.path.join(folder, "trace")
        listed = json.dumps([[case, config, split] for case, (config, split) in cases.items()])
        subprocess.run(["strace", "-f", "-qq", "--seccomp-bpf", "-e", "trace=open,openat", "-o", log, sys.executable,
                        "-c", COUNT_OPENS, listed, MARKER], check=True, capture_output=True, timeout=600)
        counts: dict[str, int | None] = {}
        case = None
        for line in open(log):
            if f'"{MARKER}' in line:
                case = line.split(f'"{MARKER}', 1)[1].split('"', 1)[0]
                counts[case] = 0
            elif case is not None and any(f'"{root}' in line for root in roots) and "= -1" not in line \
                    and "O_DIRECTORY" not in line:
                counts[case] += 1
    return counts


def index_at_scale(members: int, folder: Path) -> dict:
    """Synthesised shards of `members` members (1000 samples a shard), indexed cold."""
    from fastloader.sources.webdataset import index_split
    samples = members // 2
    image = b"\xff\xd8\xff\xe0" + b"\0" * 60 + b"\xff\xd9"  # never decoded: indexing reads headers only
    shards = []
    per_shard = 1000
    started = time.perf_counter()
    for number, first in enumerate(range(0, samples, per_shard)):
        path = folder / f"synthetic-{number:06d}.tar"
        shards.append(str(path))
        with tarfile.open(path, "w") as archive:
            for i in range(first, min(samples, first + per_shard)):
                key = f"n{i % 1000:08d}_{i}"
                for name, data in ((f"{key}.jpg", image), (f"{key}.cls", b"%d" % (i % 1000))):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    archive.addfile(info, io.BytesIO(data))
    written = time.perf_counter() - started
    config = fastloader.load_config({"dataset": {"format": "webdataset", "root": str(folder)},
                                     "val": {"shards": shards}})
    cores = available_cores()
    started, cpu_before = time.perf_counter(), os.times()
    index = index_split(config, config.split("val"))
    elapsed = time.perf_counter() - started
    after = os.times()
    cpu = (after.user - cpu_before.user) + (after.system - cpu_before.system) + \
          (after.children_user - cpu_before.children_user) + (after.children_system - cpu_before.children_system)
    started = time.perf_counter()
    index_split(config, config.split("val"))  # every shard unchanged: the cached index
    warm = time.perf_counter() - started
    return {"members": members, "samples": len(index), "shards": len(shards), "write_s": written,
            "index_s": elapsed, "cached_index_s": warm, "cores": cores, "index_cpu_s": cpu,
            "s_per_100k_members_per_core": elapsed * cores / members * 1e5,
            "bytes_per_sample": index.nbytes / len(index)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_data_argument(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--size", type=int, help="output size (default: the config's)")
    parser.add_argument("--per-shard", type=int, default=64, help="samples per shard of the photos")
    parser.add_argument("--backends", nargs="+", default=list(harness.BACKENDS), choices=harness.BACKENDS)
    parser.add_argument("--members", type=int, default=0, help="also index this many synthesised members")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    args = parser.parse_args()
    data = harness.check_data(parser, args.data, ("train", "val"))
    backends = harness.usable_backends(parser, args.backends)
    results: dict = {}
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        shards = {split: pack_in_index_order(data / split, work / "shards", args.per_shard)
                  for split in ("train", "val")}
        print(f"data: {data}; shards: {sum(map(len, shards.values()))} of {args.per_shard} samples; "
              f"{available_cores()} cores; batch {args.batch_size}; {args.rounds} rounds, fresh loaders", flush=True)
        configs = {(backend, source): config_for(source, backend, data, shards, args.batch_size, args.size)
                   for backend in backends for source in SOURCES}
        counted = count_opens({f"{backend}-{split}-{source}": (configs[backend, source], split)
                               for split in ("train", "val") for backend in backends for source in SOURCES},
                              [str(data), str(work / "shards")])
        for split in ("train", "val"):
            for backend in backends:
                rows = {source: [] for source in SOURCES}
                for _ in range(args.rounds):
                    for source in SOURCES:  # interleaved: the machine's drift falls on both
                        rows[source].append(one_epoch(configs[backend, source], split))
                opens = {source: counted.get(f"{backend}-{split}-{source}") for source in SOURCES}
                results[f"{backend} {split}"] = {"rounds": rows, "opens": opens,
                                                 "shards": len(shards[split]), "samples": rows["folder"][0]["samples"]}
                show(backend, split, rows, opens, len(shards[split]))
            if "torch" in backends:
                path = worker_path(data, split, shards[split], args.rounds, args.size)
                results[f"worker path {split}"] = path
                print(f"\ntorch worker path, {split}, per image on one core: folder {path['folder']:.3f} ms, shards "
                      f"{path['shards']:.3f} ms: shards take {path['shards'] / path['folder']:.2f}x the folder's time")
        if args.members:
            with tempfile.TemporaryDirectory(dir=work) as folder:
                scale = index_at_scale(args.members, Path(folder))
            results["index"] = scale
            print(f"\nshard index, {scale['members']:,} members ({scale['samples']:,} samples, "
                  f"{scale['shards']} shards), cold, {scale['cores']} cores: {scale['index_s']:.1f} s "
                  f"({scale['index_cpu_s']:.1f} CPU s), "
                  f"{scale['s_per_100k_members_per_core']:.2f} s per 100k members per core; "
                  f"{scale['bytes_per_sample']:.0f} bytes per sample in every process; from its cache "
                  f"{scale['cached_index_s']:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def show(backend: str, split: str, rows: dict, opens: dict, shard_count: int) -> None:
    rate = {source: statistics.median(r["images_per_s"] for r in rows[source]) for source in SOURCES}
    thread = {source: statistics.median(r["thread_us_per_sample"] for r in rows[source]) for source in SOURCES}
    samples = rows["folder"][0]["samples"]
    print(f"\n{backend} {split} ({samples} images, {shard_count} shards)")
    print(f"  {'source':<8} {'images/s':>9} {'thread us/sample':>17} {'files opened':>13}")
    for source in SOURCES:
        opened = "n/a" if opens[source] is None else str(opens[source])
        print(f"  {source:<8} {rate[source]:>9.0f} {thread[source]:>17.2f} {opened:>13}")
    print(f"  shards / folder: {rate['shards'] / rate['folder']:.2f}x images/s, "
          f"{thread['shards'] / thread['folder']:.2f}x thread time")


if __name__ == "__main__":
    main()
