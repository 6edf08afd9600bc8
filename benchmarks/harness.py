"""What every benchmark here shares: the data folder and arguments, the hardware report, interleaved
rounds of fresh loaders, medians, the table and the JSON report, and the uint8 cache some peers read.
Each comparison script only says which peers it builds (peer_loaders.py defines those that several
scripts use).

Peers are measured in turns within each round, the order alternating from round to round, so that
machine noise (other jobs, thermal throttling, the page cache) hits them alike. Each measurement
builds a fresh loader, skips warm-up batches, then times a fixed number of batches.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import fastloader  # noqa: E402
from fastloader.cache_write import build_split_cache  # noqa: E402
from fastloader.config import IMAGE_EXTENSIONS  # noqa: E402
from fastloader.machine import hardware  # noqa: E402
from fastloader.samples import SampleIndex  # noqa: E402
from fastloader.sources.folder import scan_folder  # noqa: E402
from fastloader.sources.formats import build_index  # noqa: E402

CONFIG = REPO_ROOT / "configs" / "imagenette.yaml"
BACKENDS = ("torch", "dali")
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "realphotos"
"""The real photos the figures in docs/ were measured on, where a checkout has them next to it."""
DATA_HELP = ("a folder of ImageNet-style images, train/<class>/*.JPEG and val/<class>/*.JPEG "
             "(default: ../shared/data/realphotos next to the repository, where present)")

Batches = Iterable[tuple[torch.Tensor, torch.Tensor]]
Factory = Callable[[], tuple[Batches, Callable[[], None]]]
PeerBuilder = Callable[[str, Path, SampleIndex, Path, int, argparse.Namespace], dict[str, Factory]]
"""(split, split folder, index, file list path, repeat, args) -> {peer name: factory}, ours first."""
Ratios = list[tuple[str, str]]
"""(numerator, denominator) peer names; by default the first peer (ours) against each other one."""


def add_data_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=DATA_HELP)


def check_data(parser: argparse.ArgumentParser, data: Path, splits: Iterable[str]) -> Path:
    """`data` resolved; a usage error that says how to pass --data where a split's folder is missing."""
    data = data.resolve()
    missing = [f"{split}/" for split in splits if not (data / split).is_dir()]
    if missing:
        which = "the default data folder" if data == DEFAULT_DATA.resolve() else "--data"
        parser.error(f"{which} {data} has no {' or '.join(missing)} folder; pass --data DIR, a folder holding "
                     "train/<class>/*.JPEG and val/<class>/*.JPEG (ImageNet-style images)")
    return data


@contextlib.contextmanager
def reencoded_420(data: Path, reencode: bool):
    """`data` itself, or (`reencode`) a temporary copy of its train/ and val/ trees whose JPEGs are
    re-encoded 4:2:0 at quality 90, as ImageNet's original JPEGs are; other files copied as they are.
    Said with the share of the originals that were 4:4:4."""
    if not reencode:
        yield data
        return
    from PIL import Image

    with tempfile.TemporaryDirectory(prefix="reencoded_420_") as folder:
        copied, was_444 = 0, 0
        for path in sorted(data.glob("*/*/*")):
            if path.parts[-3] not in ("train", "val") or not path.is_file():
                continue
            target = Path(folder) / path.relative_to(data)
            target.parent.mkdir(parents=True, exist_ok=True)
            with Image.open(path) as image:
                if image.format != "JPEG":
                    target.write_bytes(path.read_bytes())
                    continue
                was_444 += image.layer[0][1:3] == (1, 1) if image.mode != "L" and image.layers > 1 else 0
                image.convert("RGB").save(target, "JPEG", quality=90, subsampling=2, exif=image.info.get("exif", b""))
            copied += 1
        print(f"note: {copied} JPEGs of {data} re-encoded 4:2:0 at quality 90 in {folder} ({was_444} were 4:4:4)")
        yield Path(folder)


def splits_of(args: argparse.Namespace) -> list[str]:
    return ["train", "val"] if args.split == "both" else [args.split]


def missing_dali() -> str | None:
    """None where NVIDIA DALI imports, else why its peers are skipped."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError as error:
        return f"NVIDIA DALI is not installed ({error})"
    return None


def missing_peer(python: str | None, option: str, module: str) -> str | None:
    """None where `python` (given with `option`: a Python of its own, as MosaicML Streaming 0.13 pins
    an older numpy than this project's and LitData its own torch) imports `module`, else why its peer
    is skipped."""
    if not python:
        return f"{option} not given"
    found = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True)
    return None if found.returncode == 0 else f"{python} cannot import {module}: {found.stderr.strip()[-200:]}"


def add_backends_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backends", type=lambda text: text.split(","), default=list(BACKENDS),
                        help=f"comma-separated, of {','.join(BACKENDS)} (default: both)")


def usable_backends(parser: argparse.ArgumentParser, backends: list[str]) -> list[str]:
    """`backends` less dali where DALI does not import (printing why); a usage error for an unknown one."""
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        parser.error(f"--backends: unknown backend {', '.join(unknown)}; choose from {', '.join(BACKENDS)}")
    no_dali = missing_dali()
    if no_dali and "dali" in backends:
        print(f"skipped the dali backend: {no_dali}")
        backends = [b for b in backends if b != "dali"]
    if not backends:
        parser.error("--backends: no backend left to measure")
    return backends


def base_parser(doc: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_argument(parser)
    parser.add_argument("--split", choices=("train", "val", "both"), default="both", help="default: both")
    parser.add_argument("--workers", type=int, default=2,
                        help="decoding worker processes or DALI CPU threads (default: 2)")
    parser.add_argument("--batch-size", type=int, default=64, help="default: 64")
    parser.add_argument("--size", type=int, default=224, help="output height and width (default: 224)")
    parser.add_argument("--repeat", type=int, default=20,
                        help="list the split's files K times, so that an epoch is long like ImageNet's "
                             "(default: 20; raised where warm-up + timed batches would not fit in one epoch)")
    parser.add_argument("--batches", type=int, default=30, help="timed batches per measurement (default: 30)")
    parser.add_argument("--warmup", type=int, default=3, help="batches skipped before timing (default: 3)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the median is reported (default: 5)")
    parser.add_argument("--json", type=Path, help="write every raw measurement to this file")
    return parser


def epochs_parser(doc: str, epochs: int = 2) -> argparse.ArgumentParser:
    """The options of the scripts that time whole epochs of fresh loaders (warm_epochs): the data,
    the rounds, the timed epochs, the batch size, the JSON report."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_argument(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=epochs, help="timed epochs of each loader, after one untimed")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--json", type=Path, help="write the raw results here")
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    for name in ("workers", "batch_size", "size", "repeat", "batches", "rounds"):
        minimum = 0 if name == "workers" else 1
        if getattr(args, name) < minimum:
            parser.error(f"--{name.replace('_', '-')} must be >= {minimum}")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    args.data = check_data(parser, args.data, splits_of(args))
    return args


def effective_repeat(num_files: int, args: argparse.Namespace) -> int:
    """The repeat count that fits warm-up + timed batches in one epoch: a new epoch would restart workers."""
    needed = (args.warmup + args.batches + 1) * args.batch_size
    return max(args.repeat, math.ceil(needed / num_files))


def listed_files(index: SampleIndex, repeat: int) -> tuple[list[str], list[int]]:
    """The split's paths and labels `repeat` times over: the long epoch every peer reads."""
    paths = [index.path(i) for i in range(len(index))]
    labels = [index.label(i) for i in range(len(index))]
    return paths * repeat, labels * repeat


def write_file_list(split: str, index: SampleIndex, repeat: int, list_path: Path) -> None:
    """The split's images (ImageFolder order and labels) as its file list, for an epoch of `repeat`
    passes over them, as the peers' repeated lists give. A file list names each file once, so a train
    split's list names each once and fastloader_overrides sets its epoch_size to `repeat` passes
    (consecutive permutations, as a repeated list shuffled); an eval split, which takes no epoch_size,
    names each again through each of `repeat - 1` links to the split folder, beside the list."""
    rows = [(index.relpath(i), index.label(i)) for i in range(len(index))]
    heads = [""]
    for number in range(1, 1 if is_train(split) else repeat):
        link = list_path.parent / f"{list_path.stem}-pass{number + 1}"
        if link.is_symlink():
            link.unlink()
        link.symlink_to(Path(index.root).resolve(), target_is_directory=True)
        heads.append(f"{link}/")
    list_path.write_text("".join(f"{head}{path} {label}\n" for head in heads for path, label in rows),
                         encoding="utf-8")


@functools.cache
def is_train(split: str) -> bool:
    """Whether configs/imagenette.yaml reads the split in train mode."""
    return fastloader.load_config(str(CONFIG)).split(split).mode == "train"


def write_shards(paths: list[str], labels: list[int], folder: Path, prefix: str, per_shard: int) -> list[str]:
    """The listed samples, in this order, as WebDataset shards of `per_shard` samples: `{n}.{ext}` (the
    file's bytes; n its position, so a file listed twice is two samples) and `{n}.cls`."""
    import io
    import tarfile
    folder.mkdir(parents=True, exist_ok=True)
    shards = []
    for number, first in enumerate(range(0, len(paths), per_shard)):
        shard = folder / f"{prefix}-{number:06d}.tar"
        with tarfile.open(shard, "w") as archive:
            for position in range(first, min(len(paths), first + per_shard)):
                archive.add(paths[position], arcname=f"{position:08d}{Path(paths[position]).suffix.lower()}")
                info = tarfile.TarInfo(f"{position:08d}.cls")
                data = str(labels[position]).encode()
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
        shards.append(str(shard))
    return shards


def decode_whole_file(path: str) -> torch.Tensor:
    """The decode_jpeg limit's work for one file: read it and decode all of it (RGB), no transform."""
    from torchvision.io import ImageReadMode, decode_jpeg, read_file
    return decode_jpeg(read_file(path), mode=ImageReadMode.RGB)


def fastloader_overrides(split: str, split_dir: Path, index: SampleIndex, list_path: Path,
                         args: argparse.Namespace, repeat: int = 1, **extra) -> dict:
    """configs/imagenette.yaml pointed at this split's file list (write_file_list), for an epoch of
    `repeat` passes over its images, at the benchmark's sizes."""
    passes = {f"{split}.epoch_size": len(index) * repeat} if repeat > 1 and is_train(split) else {}
    return {"dataset.root": str(split_dir), "dataset.classes": list(index.classes),
            f"{split}.file_list": str(list_path), f"{split}.batch_size": args.batch_size,
            f"{split}.transform.size": args.size, **passes, **extra}


def fastloader_factory(split: str, overrides: dict) -> Factory:
    def build():
        loader = fastloader.build_loader(str(CONFIG), split, overrides)
        return loader, loader.close
    return build


def synchronize() -> None:
    """Wait for the GPU's queued work: a lane's clock stops when its batches are made, not when their
    kernels are queued (a deeper ready queue would flatter it otherwise)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def prefetch_depth(loader) -> int | None:
    """Batches a lane may hold ready ahead of its consumer, as each kind of loader says it: fastloader's
    `prefetch_depth`, a DataLoader's workers x prefetch_factor, an iterator's own attribute."""
    depth = getattr(loader, "prefetch_depth", None)
    if depth is None and isinstance(loader, torch.utils.data.DataLoader):
        depth = loader.num_workers * (loader.prefetch_factor or 0)
    return depth


class JpegEngines:
    """The GPU's JPEG engines' mean utilization (%) while a lane is timed, from `nvidia-smi dmon`'s
    `jpg` column; None where there is no nvidia-smi or the GPU has no such column. The hardware
    decoder's share of a lane's decoding shows here (DALI's nvJPEG hardware path)."""

    def __init__(self):
        self.process = None
        if not torch.cuda.is_available():
            return
        try:
            self.process = subprocess.Popen(["nvidia-smi", "dmon", "-s", "u", "-d", "1", "-i", "0"],
                                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.process = None

    def stop(self) -> float | None:
        if self.process is None:
            return None
        self.process.terminate()
        try:
            out, _ = self.process.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, _ = self.process.communicate()
        return jpg_utilization(out)


def jpg_utilization(dmon: str) -> float | None:
    """The mean of `nvidia-smi dmon -s u`'s jpg column (its header names the columns), None without one."""
    columns, values = None, []
    for line in dmon.splitlines():
        if line.startswith("#"):
            columns = columns or line.lstrip("#").split()
            continue
        fields = line.split()
        if columns and "jpg" in columns and len(fields) == len(columns):
            value = fields[columns.index("jpg")]
            if value.replace(".", "", 1).isdigit():
                values.append(float(value))
    return statistics.mean(values) if values else None


def measure(build: Factory, warmup: int, batches: int) -> dict:
    """images/s over `batches` batches after `warmup` ones, on a loader built for this measurement only;
    the device synchronized at both ends of the clock. Also: the lane's prefetch depth, the GPU's JPEG
    engines' utilization meanwhile, and what fastloader's DALI GPU flavour decoded on the CPU."""
    started = time.perf_counter()
    loader, close = build()
    iterator = iter(loader)
    timed_from = started
    images = seen = 0
    engines = None
    try:
        for _, labels in iterator:
            seen += 1
            if seen == warmup:
                synchronize()
                timed_from = time.perf_counter()
                engines = JpegEngines()
            elif seen > warmup:
                images += len(labels)
            if seen == warmup + batches:
                break
        synchronize()
        elapsed = time.perf_counter() - timed_from
        jpg = engines.stop() if engines is not None else None
        depth = prefetch_depth(loader)
        stats = getattr(loader, "stats", None)
        on_cpu = dict(getattr(stats, "cpu_decoded", {}) or {})
    finally:
        del iterator
        close()
        del loader
    if seen < warmup + batches:
        raise RuntimeError(f"the epoch ended after {seen} batches, before {warmup + batches}; raise --repeat")
    startup = timed_from - started if warmup else None
    return {"images": images, "seconds": elapsed, "images_per_s": images / elapsed, "startup_s": startup,
            "prefetch_depth": depth, "jpg_engines_percent": jpg, "cpu_decoded": on_cpu}


def run_split(split: str, args: argparse.Namespace, workdir: Path, build_peers: PeerBuilder,
              ratios: Ratios | None = None) -> dict:
    """All rounds of one split: each round measures every peer, in alternating order."""
    split_dir = args.data / split
    index = scan_folder(str(split_dir), IMAGE_EXTENSIONS)
    files = len(index)
    repeat = effective_repeat(files, args)
    if repeat != args.repeat:
        print(f"note: {split}: --repeat raised to {repeat} so that {args.warmup + args.batches} batches fit in "
              f"one epoch of {files} files x repeat")
    list_path = workdir / f"{split}_x{repeat}.txt"
    write_file_list(split, index, repeat, list_path)
    peers = build_peers(split, split_dir, index, list_path, repeat, args)
    raw: dict[str, list[dict]] = {name: [] for name in peers}
    order_log = []
    width = max(len(name) for name in peers)
    for round_number in range(args.rounds):
        order = list(peers) if round_number % 2 == 0 else list(reversed(peers))
        order_log.append(order)
        for name in order:
            result = measure(peers[name], args.warmup, args.batches)
            raw[name].append(result)
            print(f"  {split} round {round_number + 1}/{args.rounds} {name:<{width}} "
                  f"{result['images_per_s']:8.1f} images/s", flush=True)
    return {"files": files, "repeat": repeat, "epoch_images": files * repeat, "order": order_log,
            "measurements": raw, "summary": summarize(raw, ratios)}


def summarize(raw: dict[str, list[dict]], ratios: Ratios | None = None) -> dict:
    """Median, min and max per peer (its prefetch depth, JPEG engines' median utilization and images
    decoded on the CPU beside them), and the ratios of medians: the given pairs whose peers were
    measured, else the first peer (ours) to each other one."""
    rates = {name: [m["images_per_s"] for m in results] for name, results in raw.items()}
    summary = {name: {"median": statistics.median(r), "min": min(r), "max": max(r)} for name, r in rates.items()}
    for name, results in raw.items():
        jpg = [m["jpg_engines_percent"] for m in results if m.get("jpg_engines_percent") is not None]
        summary[name].update(prefetch_depth=results[0].get("prefetch_depth"),
                             jpg_engines_percent=statistics.median(jpg) if jpg else None,
                             cpu_decoded=sum(sum(m.get("cpu_decoded", {}).values()) for m in results))
    if ratios is None:
        ours, *others = rates
        ratios = [(ours, other) for other in others]
    summary["ratios"] = {f"{a} / {b}": summary[a]["median"] / summary[b]["median"]
                         for a, b in ratios if a in rates and b in rates}
    return summary


def print_table(split: str, result: dict) -> None:
    summary = result["summary"]
    names = [name for name in summary if name != "ratios"]
    width = max(len(name) for name in names)
    print(f"\n{split}: {result['files']} files x {result['repeat']} = {result['epoch_images']} images per epoch")
    print(f"  {'loader':<{width}} {'median images/s':>16} {'min..max over rounds':>22} {'prefetch':>8} "
          f"{'JPG engines':>11} {'CPU decodes':>11}")
    for name in names:
        s = summary[name]
        depth = "?" if s.get("prefetch_depth") is None else str(s["prefetch_depth"])
        jpg = "-" if s.get("jpg_engines_percent") is None else f"{s['jpg_engines_percent']:.0f}%"
        print(f"  {name:<{width}} {s['median']:16.1f} {s['min']:>12.1f}..{s['max']:<9.1f} {depth:>8} {jpg:>11} "
              f"{s.get('cpu_decoded', 0):>11}")
    for pair, ratio in summary["ratios"].items():
        print(f"  ratio {pair}: {ratio:.2f}x")


def main(args: argparse.Namespace, build_peers: PeerBuilder, name: str, extra_info: str = "",
         ratios: Ratios | None = None, report: Callable[[dict, dict], dict] | None = None) -> int:
    """Run every split, print the settings, the per-round rates and the tables; write the JSON report.

    `report(results, hardware)`, when given, runs after the tables (extra measurements, plots) and
    returns what it adds to the JSON report."""
    splits = splits_of(args)
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    info = hardware()
    print(f"command: {command}")
    print(f"hardware: {info['cpu']}, {info['cpu_count']} CPUs ({info['cpu_cores']} usable), "
          f"torch {info['torch']} ({info['torch_threads']} threads), torchvision {info['torchvision']}, "
          f"Pillow {info['pillow']}, Python {info['python']}{extra_info}")
    print(f"settings: workers {args.workers}, batch size {args.batch_size}, size {args.size}, "
          f"{args.warmup} warm-up + {args.batches} timed batches, {args.rounds} rounds, data {args.data}")
    results = {}
    with tempfile.TemporaryDirectory(prefix=f"{name}_") as workdir:
        for split in splits:
            results[split] = run_split(split, args, Path(workdir), build_peers, ratios)
    for split in splits:
        print_table(split, results[split])
    extra = report(results, info) if report else {}
    if args.json:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        summary = {"command": command, "hardware": info, "settings": settings, "splits": results, **extra}
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


def build_cache(split: str, overrides: dict, cache_dir: Path, files: SampleIndex, args: argparse.Namespace) -> dict:
    """Build the uint8 cache the cached peers read (`args.short_side`, as `fastloader cache` does),
    from the file list they read (write_file_list: a train split's names each file once, an eval
    split's once a pass); print and return what it cost."""
    config = fastloader.load_config(str(CONFIG), overrides)
    report = build_split_cache(config, config.split(split), build_index(config, config.split(split)),
                               str(cache_dir), args.short_side, workers=max(1, args.workers))
    source_bytes = sum(Path(files.path(i)).stat().st_size for i in range(len(files)))
    print(f"  {split}: cache of {report['images']} images built in {report['seconds']:.1f} s with {args.workers} "
          f"processes ({report['images'] / report['seconds']:.0f} images/s): {report['bytes'] / 2**20:.1f} MiB, "
          f"{report['bytes'] / report['images'] / 1e3:.0f} kB per image ({report['bytes'] / source_bytes:.1f}x "
          f"the {source_bytes / 2**20:.1f} MiB of JPEGs)", flush=True)
    return {"images": report["images"], "seconds": report["seconds"], "bytes": report["bytes"],
            "source_bytes": source_bytes, "short_side": args.short_side}


def warm_epochs(config: dict, split: str, epochs: int, **build_args) -> dict:
    """A fresh loader (build_loader's keyword arguments: a source, hooks): one epoch untimed, then
    `epochs` timed: images/s and the training thread's CPU time per sample inside next()."""
    loader = fastloader.build_loader(config, split, **build_args)
    for _ in loader:
        pass
    result = timed_epochs(loader, epochs)
    loader.close()
    return result


def timed_epochs(loader, epochs: int) -> dict:
    """`epochs` epochs of any loader of (images, labels) batches, timed: images/s and the training
    thread's CPU time per sample inside next()."""
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
    return {"images_per_s": samples / elapsed, "thread_us_per_sample": cpu / samples * 1e6,
            "samples": samples // epochs}


def ratio_table(title: str, rows: dict[str, list[dict]], reference: str, column: str) -> None:
    """Print each case's median images/s (of warm_epochs' rounds), its ratio to the `reference`
    case's and the training thread's us/sample."""
    rate = {case: statistics.median(r["images_per_s"] for r in runs) for case, runs in rows.items()}
    thread = {case: statistics.median(r["thread_us_per_sample"] for r in runs) for case, runs in rows.items()}
    width = max(len(column), *map(len, rows))
    print(f"\n{title} ({rows[reference][0]['samples']} images)")
    print(f"  {column:<{width}} {'images/s':>9} {'x ' + reference:>12} {'thread us/sample':>17}")
    for case in rows:
        print(f"  {case:<{width}} {rate[case]:>9.0f} {rate[case] / rate[reference]:>11.2f}x {thread[case]:>17.2f}")
    sys.stdout.flush()
