"""Parquet and Arrow against folders and tar shards: the same photos read five ways, both backends, and
the way users read a Hub dataset today (`datasets` + a DataLoader) side by side; then what a row
costs by byte range against a row-group read, the choice docs/performance.md records.

1. Per (split, reader), fresh loaders in interleaved rounds, one epoch each: images/s, and the bytes
   the process and its workers read in the epoch (`rchar` of /proc/<pid>/io: every read and pread,
   from the page cache or the disk; memory-mapped reads are not counted: `datasets` maps its Arrow
   cache, so its row shows next to nothing, and reads what it maps). Readers: fastloader's two
   backends over the folder, tar shards (64 samples each), parquet (row groups of 100 rows, as
   Hugging Face writes image datasets, the image column uncompressed and PLAIN), the same parquet as
   pyarrow writes it by default (snappy, dictionary pages: rows read by row group, train in the
   block order) and Arrow (`datasets`' cache format); and `datasets.load_dataset("parquet")` + a
   torch DataLoader with torchvision's transforms (the same crop and size, the same worker count),
   its one-time conversion into its Arrow cache timed apart.
2. One row's image bytes, random rows, one core: (a) a pread of the row's byte range (what
   dataset.format: parquet does where the pages are uncompressed), (b) pyarrow reading the row's row
   group (random access by row group, uncompressed and snappy-compressed), (c) row groups read in
   order, each once (what the block order over row groups gives): ms per row and bytes read per row.
3. --index-rows N: N rows of a JPEG stub in parquet files of 100,000 rows (row groups of 100, as
   above), indexed cold (the page walk), then from its cache: seconds per 100k rows, bytes per sample.

    python benchmarks/parquet.py --data ../shared/data/realphotos [--rounds 3] [--index-rows 1280000]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import harness
import numpy as np
import psutil

import fastloader
from fastloader.config_dump import config_to_dict
from fastloader.parallel import available_cores
from fastloader.schema import IMAGE_EXTENSIONS, IMAGENET_MEAN, IMAGENET_STD
from fastloader.sources.folder import scan_folder
from fastloader.sources.row_groups import ROW_GROUP_CACHE, forget_row_groups

READERS = ("folder", "shards", "parquet", "parquet-snappy", "arrow")
"""parquet-snappy: the same rows as pyarrow writes them by default (snappy, dictionary pages), read by row
group; its train split in the block order (blocks of at most the row-group cache)."""


def write_sources(data: Path, work: Path, per_shard: int, row_group: int) -> dict[str, dict[str, list[str]]]:
    """Each split as tar shards, one parquet file and one Arrow stream, rows in the folder index's order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files: dict[str, dict[str, list[str]]] = {"shards": {}, "parquet": {}, "parquet-snappy": {}, "arrow": {}}
    for split in ("train", "val"):
        index = scan_folder(str(data / split), IMAGE_EXTENSIONS)
        paths, labels = harness.listed_files(index, 1)
        files["shards"][split] = harness.write_shards(paths, labels, work / "shards", split, per_shard)
        image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        features = {"image": {"_type": "Image"}, "label": {"names": list(index.classes), "_type": "ClassLabel"}}
        schema = pa.schema([("image", image_type), ("label", pa.int64())],
                           metadata={"huggingface": json.dumps({"info": {"features": features}})})
        table = pa.Table.from_arrays([pa.array([{"bytes": Path(p).read_bytes(), "path": None} for p in paths],
                                               image_type), pa.array(labels, pa.int64())], schema=schema)
        (work / "parquet").mkdir(exist_ok=True)
        (work / "arrow").mkdir(exist_ok=True)
        parquet = work / "parquet" / f"{split}-00000-of-00001.parquet"
        pq.write_table(table, parquet, row_group_size=row_group, compression={"image.bytes": "none",
                       "image.path": "none", "label": "snappy"}, use_dictionary=["label"],
                       column_encoding={"image.bytes": "PLAIN", "image.path": "PLAIN"}, write_page_index=True)
        snappy = work / "parquet" / f"{split}-snappy.parquet"
        pq.write_table(table, snappy, row_group_size=row_group)  # pyarrow's defaults
        files["parquet"][split], files["parquet-snappy"][split] = [str(parquet)], [str(snappy)]
        arrow = work / "arrow" / f"{split}.arrow"
        with pa.OSFile(str(arrow), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
            writer.write_table(table, max_chunksize=row_group)
        files["arrow"][split] = [str(arrow)]
    return files


def config_for(reader: str, backend: str, data: Path, files: dict, batch: int, size: int | None,
               workers: int) -> dict:
    raw = config_to_dict(fastloader.load_config(harness.CONFIG))
    raw["backend"] = backend
    raw["output"] = {**raw.get("output", {}), "device": "cpu"}
    raw["workers"] = {**raw.get("workers", {}), "num_workers": workers}
    if reader == "folder":
        raw["dataset"] = {**raw["dataset"], "root": str(data)}
    else:
        raw["dataset"] = {key: value for key, value in raw["dataset"].items() if key not in ("root", "cache")}
        raw["dataset"]["format"] = "webdataset" if reader == "shards" else reader.split("-")[0]
    for split in ("train", "val"):
        raw[split] = {**raw[split], "batch_size": batch}
        if size:
            raw[split]["transform"] = {**raw[split].get("transform", {}), "size": size}
        if reader != "folder":
            raw[split]["shards" if reader == "shards" else "files"] = files[reader][split]
        if reader == "parquet-snappy" and split == "train":
            raw[split].update(shuffle="block", block_size=f"{ROW_GROUP_CACHE >> 20}MB")
    return raw


def read_chars() -> int:
    """Bytes this process and its live children have read so far (rchar)."""
    total = 0
    me = psutil.Process()
    for process in [me, *me.children(recursive=True)]:
        try:
            total += process.io_counters().read_chars
        except (psutil.Error, AttributeError):
            pass
    return total


def timed_epoch(make, split: str) -> dict:
    """One epoch of a fresh loader: images/s from the first next() to the last, and the bytes read in it
    (not in the build, whose screening reads each new file once and is cached). Row groups that an
    earlier loader of this process decoded are dropped first, as a fresh process would have none."""
    forget_row_groups()
    loader, close = make()
    before = read_chars()
    samples, started = 0, time.perf_counter()
    for _, labels in loader:
        samples += len(labels)
    elapsed = time.perf_counter() - started
    read = read_chars() - before
    close()
    return {"images_per_s": samples / elapsed, "bytes_read": read, "samples": samples}


def fastloader_maker(config: dict, split: str):
    def make():
        loader = fastloader.build_loader(config, split)
        return loader, loader.close
    return make


def datasets_maker(dataset, split: str, batch: int, size: int, workers: int, seed: int):
    """The Hub user's path: a `datasets` Dataset (its Arrow cache), PIL decode in the Image feature,
    torchvision's RandomResizedCrop + flip (train) or Resize + CenterCrop (val), a DataLoader."""
    import torch
    from torchvision import transforms

    if split == "train":
        transform = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                                        transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    else:
        transform = transforms.Compose([transforms.Resize(int(size / 0.875)), transforms.CenterCrop(size),
                                        transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])

    def apply(batch_rows):
        batch_rows["pixels"] = [transform(image.convert("RGB")) for image in batch_rows["image"]]
        return batch_rows

    def make():
        view = dataset.with_transform(apply, columns=["image", "label"], output_all_columns=False)

        def collate(rows):
            return torch.stack([row["pixels"] for row in rows]), torch.tensor([row["label"] for row in rows])
        loader = torch.utils.data.DataLoader(view, batch_size=batch, shuffle=split == "train", num_workers=workers,
                                             collate_fn=collate, drop_last=split == "train",
                                             generator=torch.Generator().manual_seed(seed))
        return loader, lambda: None
    return make


def row_costs(parquet: str, snappy: str, rows: int, seed: int) -> dict:
    """ms and bytes per row: a byte range's pread against reading its row group with pyarrow."""
    import pyarrow.parquet as pq

    from fastloader.sources.formats import build_index
    from fastloader.sources.reading import read_bytes

    config = fastloader.load_config({"dataset": {"format": "parquet", "root": str(Path(parquet).parent)},
                                     "val": {"files": [parquet]}})
    index = build_index(config, config.split("val"))
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(index), size=min(rows, len(index)))
    locations = [index.location(int(i)) for i in picks]
    started = time.process_time()
    read = sum(len(read_bytes(location)) for location in locations)
    results = {"byte_range": {"ms_per_row": (time.process_time() - started) / len(picks) * 1e3,
                              "bytes_per_row": read / len(picks)}}
    for name, path in (("row_group", parquet), ("row_group_snappy", snappy)):
        file = pq.ParquetFile(path)
        meta = file.metadata
        bounds = np.cumsum([meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
        chunk = [meta.row_group(g).column(0).total_compressed_size for g in range(meta.num_row_groups)]
        started, read = time.process_time(), 0
        for row in picks.tolist():
            group = int(np.searchsorted(bounds, row, side="right"))
            first = int(bounds[group - 1]) if group else 0
            column = file.read_row_group(group, columns=["image"], use_threads=False).column(0)
            column.chunk(0).field("bytes")[row - first].as_buffer()
            read += chunk[group]
        results[name] = {"ms_per_row": (time.process_time() - started) / len(picks) * 1e3,
                         "bytes_per_row": read / len(picks)}
        started = time.process_time()
        for group in range(meta.num_row_groups):  # each row group once, all its rows: a block order's best
            values = file.read_row_group(group, columns=["image"], use_threads=False).column(0).chunk(0).field("bytes")
            for value in range(len(values)):
                values[value].as_buffer()
        results[f"{name}_in_order"] = {"ms_per_row": (time.process_time() - started) / meta.num_rows * 1e3,
                                       "bytes_per_row": sum(chunk) / meta.num_rows}
    results["rows_per_group"] = float(np.mean(np.diff(np.r_[0, bounds])))
    return results


def index_at_scale(rows: int, folder: Path, row_group: int) -> dict:
    """Synthesised parquet files of `rows` rows, indexed cold and then from the cache."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fastloader.sources.parquet import index_parquet
    image = b"\xff\xd8\xff\xe0" + b"\0" * 60 + b"\xff\xd9"  # never decoded: indexing reads no image
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    per_file, files = 100_000, []
    for number, first in enumerate(range(0, rows, per_file)):
        count = min(per_file, rows - first)
        table = pa.table({"image": pa.array([{"bytes": image, "path": None}] * count, image_type),
                          "label": pa.array(np.arange(first, first + count) % 1000, pa.int64())})
        path = folder / f"train-{number:05d}.parquet"
        pq.write_table(table, path, row_group_size=row_group, compression={"image.bytes": "none",
                       "image.path": "none", "label": "snappy"}, use_dictionary=["label"],
                       column_encoding={"image.bytes": "PLAIN", "image.path": "PLAIN"})
        files.append(str(path))
    config = fastloader.load_config({"dataset": {"format": "parquet", "root": str(folder)}, "val": {"files": files}})
    started = time.perf_counter()
    index = index_parquet(config, config.split("val"))
    cold = time.perf_counter() - started
    started = time.perf_counter()
    index_parquet(config, config.split("val"))
    cached = time.perf_counter() - started
    return {"rows": len(index), "files": len(files), "index_s": cold, "cached_index_s": cached,
            "s_per_100k_rows": cold / len(index) * 1e5, "bytes_per_sample": index.nbytes / len(index)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_data_argument(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--size", type=int, default=224, help="output size (default: 224)")
    parser.add_argument("--workers", type=int, default=2, help="workers or DALI threads of every reader (default: 2)")
    parser.add_argument("--per-shard", type=int, default=64, help="samples per tar shard")
    parser.add_argument("--row-group", type=int, default=100, help="rows per parquet row group (HF: 100)")
    parser.add_argument("--rows", type=int, default=200, help="random rows of the row-cost comparison")
    parser.add_argument("--index-rows", type=int, default=0, help="also index this many synthesised rows")
    parser.add_argument("--backends", nargs="+", default=list(harness.BACKENDS), choices=harness.BACKENDS)
    parser.add_argument("--json", type=Path, help="write the raw results here")
    args = parser.parse_args()
    data = harness.check_data(parser, args.data, ("train", "val"))
    backends = harness.usable_backends(parser, args.backends)
    results: dict = {}
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        files = write_sources(data, work, args.per_shard, args.row_group)
        print(f"data: {data}; {available_cores()} cores; batch {args.batch_size}, size {args.size}, "
              f"{args.workers} workers; {args.rounds} rounds, fresh loaders; parquet row groups of {args.row_group}",
              flush=True)
        try:
            import datasets
            started = time.perf_counter()
            converted = {split: datasets.load_dataset("parquet", data_files=files["parquet"][split], split="train",
                                                      cache_dir=str(work / "hf")) for split in ("train", "val")}
            results["datasets_conversion_s"] = time.perf_counter() - started
        except ImportError:
            converted = None
        for split in ("train", "val"):
            makers = {f"{backend} {reader}": fastloader_maker(
                config_for(reader, backend, data, files, args.batch_size, args.size, args.workers), split)
                for backend in backends for reader in READERS}
            if converted is not None:
                makers["datasets + DataLoader"] = datasets_maker(converted[split], split, args.batch_size, args.size,
                                                                 args.workers, 0)
            rows: dict[str, list[dict]] = {name: [] for name in makers}
            for _ in range(args.rounds):
                for name, make in makers.items():  # interleaved: the machine's drift falls on all
                    rows[name].append(timed_epoch(make, split))
            results[split] = rows
            show(split, rows)
        results["row_costs"] = costs = row_costs(files["parquet"]["val"][0], files["parquet-snappy"]["val"][0],
                                                 args.rows, 0)
        print(f"\none row's image bytes, {args.rows} random rows of val, one core "
              f"({costs['rows_per_group']:.0f} rows a row group):")
        for name, cost in costs.items():
            if isinstance(cost, dict):
                print(f"  {name:<24} {cost['ms_per_row']:>8.3f} ms/row {cost['bytes_per_row'] / 1e3:>10.1f} kB/row")
        if converted is not None:
            print(f"\ndatasets.load_dataset('parquet') into its Arrow cache, once: "
                  f"{results['datasets_conversion_s']:.2f} s")
        if args.index_rows:
            with tempfile.TemporaryDirectory(dir=work) as folder:
                scale = results["index"] = index_at_scale(args.index_rows, Path(folder), args.row_group)
            print(f"\nparquet index, {scale['rows']:,} rows in {scale['files']} files, cold, one process: "
                  f"{scale['index_s']:.1f} s, {scale['s_per_100k_rows']:.2f} s per 100k rows; from its cache "
                  f"{scale['cached_index_s']:.1f} s; {scale['bytes_per_sample']:.0f} bytes per sample in every process")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def show(split: str, rows: dict[str, list[dict]]) -> None:
    samples = next(iter(rows.values()))[0]["samples"]
    print(f"\n{split} ({samples} images a pass)")
    print(f"  {'reader':<24} {'images/s':>9} {'MB read/epoch':>14}")
    for name, runs in rows.items():
        rate = statistics.median(r["images_per_s"] for r in runs)
        read = statistics.median(r["bytes_read"] for r in runs) / 1e6
        print(f"  {name:<24} {rate:>9.0f} {read:>14.1f}")


if __name__ == "__main__":
    main()
