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

import io
import json
import tempfile
from pathlib import Path

import harness
import shards as shard_benchmark
from PIL import Image

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


def main() -> None:
    parser = harness.epochs_parser(__doc__, epochs=3)
    parser.add_argument("--size", type=int, help="output size (default: the config's)")
    parser.add_argument("--split", choices=("train", "val", "both"), default="both")
    parser.add_argument("--backends", nargs="+", default=list(harness.BACKENDS), choices=harness.BACKENDS)
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
                        given = make() if make else None
                        rows[source].append(harness.warm_epochs(config, split, args.epochs, source=given))
                results[f"{backend} {split}"] = rows
                harness.ratio_table(f"{backend} {split}", rows, "folder", "source")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
