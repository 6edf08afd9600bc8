"""Your own source against folders: the same photos read from their folders, from a SQLite table of
their JPEG bytes (`source: fastloader.sources.sqlite_table:SQLiteSource`), and from a map-style
Dataset through `fastloader.sources.from_dataset`, its items the files' bytes (`dataset bytes`) or
decoded PIL images (`dataset PIL`, what a torchvision-style Dataset gives: no region decode, no
nvJPEG), both backends, in one run.

Per (backend, split, source), fresh loaders in interleaved rounds, each warmed by one untimed epoch
(its workers started, the page cache and the source's connections warm) and then timed over
--epochs epochs: images/s and the training thread's CPU time per sample inside next()
(time.thread_time(), as benchmarks/shards.py measures it), then each source's ratio to the
folder's. The issue's bar: a SQLite table at >= 0.9x the folder's images/s on the torch backend.

    python benchmarks/sources.py --data ../shared/data/realphotos [--rounds 3] [--epochs 3]
"""
from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness
import shards as shard_benchmark
from PIL import Image

import fastloader
from fastloader.parallel import available_cores
from fastloader.sources import from_dataset
from fastloader.sources.folder import scan_folder
from fastloader.sources.sqlite_table import write_table

SOURCES = ("folder", "sqlite", "dataset bytes", "dataset PIL")


class PhotoItems:
    """A map-style Dataset over a split's photos: (the file's bytes, label) or (a PIL image, label)."""

    def __init__(self, paths: list[str], labels: list[int], classes: list[str], decoded: bool):
        self.paths, self.targets, self.classes, self.decoded = paths, labels, classes, decoded

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, item: int):
        data = Path(self.paths[item]).read_bytes()
        if not self.decoded:
            return data, self.targets[item]
        with Image.open(io.BytesIO(data)) as image:
            return image.convert("RGB"), self.targets[item]


def split_files(data: Path, split: str) -> tuple[list[str], list[int], list[str]]:
    index = scan_folder(str(data / split), harness.IMAGE_EXTENSIONS)
    return [index.path(i) for i in range(len(index))], index.labels.tolist(), list(index.classes)


def warm_epochs(config: dict, split: str, source: object | None, epochs: int) -> dict:
    """A fresh loader: one epoch untimed, then `epochs` timed (images/s, thread us per sample)."""
    loader = fastloader.build_loader(config, split, source=source)
    for _ in loader:
        pass
    cpu, samples = 0.0, 0
    started = time.perf_counter()
    for _ in range(epochs):
        iterator = iter(loader)
        while True:
            before = time.thread_time()
            batch = next(iterator, None)
            cpu += time.thread_time() - before
            if batch is None:
                break
            samples += len(batch[1])
    elapsed = time.perf_counter() - started
    loader.close()
    return {"images_per_s": samples / elapsed, "thread_us_per_sample": cpu / samples * 1e6,
            "samples": samples // epochs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_data_argument(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs of each loader, after one untimed")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--size", type=int, help="output size (default: the config's)")
    parser.add_argument("--split", choices=("train", "val", "both"), default="both")
    parser.add_argument("--backends", nargs="+", default=list(harness.BACKENDS), choices=harness.BACKENDS)
    parser.add_argument("--json", type=Path, help="write the raw results here")
    args = parser.parse_args()
    data = harness.check_data(parser, args.data, harness.splits_of(args))
    backends = harness.usable_backends(parser, args.backends)
    results: dict = {}
    with tempfile.TemporaryDirectory() as work:
        print(f"data: {data}; {available_cores()} cores; batch {args.batch_size}; {args.rounds} rounds, fresh "
              f"loaders", flush=True)
        for split in harness.splits_of(args):
            paths, labels, classes = split_files(data, split)
            table = Path(work) / f"{split}.sqlite"
            write_table(str(table), [(Path(path).relative_to(data / split).as_posix(), Path(path).read_bytes(), label)
                                     for path, label in zip(paths, labels)], classes)
            for backend in backends:
                folder = shard_benchmark.config_for("folder", backend, data, {}, args.batch_size, args.size)
                sqlite = {**folder, split: {**folder[split], "source": "fastloader.sources.sqlite_table:SQLiteSource",
                                            "source_args": {"path": str(table)}}}
                runs = {"folder": (folder, None), "sqlite": (sqlite, None),
                        "dataset bytes": (folder, lambda: from_dataset(PhotoItems(paths, labels, classes, False))),
                        "dataset PIL": (folder, lambda: from_dataset(PhotoItems(paths, labels, classes, True)))}
                rows: dict[str, list[dict]] = {source: [] for source in SOURCES}
                for _ in range(args.rounds):
                    for source in SOURCES:  # interleaved: the machine's drift falls on all
                        config, make = runs[source]
                        rows[source].append(warm_epochs(config, split, make() if make else None, args.epochs))
                results[f"{backend} {split}"] = rows
                show(backend, split, rows)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def show(backend: str, split: str, rows: dict) -> None:
    rate = {source: statistics.median(r["images_per_s"] for r in rows[source]) for source in SOURCES}
    thread = {source: statistics.median(r["thread_us_per_sample"] for r in rows[source]) for source in SOURCES}
    print(f"\n{backend} {split} ({rows['folder'][0]['samples']} images)")
    print(f"  {'source':<14} {'images/s':>9} {'x folder':>9} {'thread us/sample':>17}")
    for source in SOURCES:
        print(f"  {source:<14} {rate[source]:>9.0f} {rate[source] / rate['folder']:>8.2f}x {thread[source]:>17.2f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
