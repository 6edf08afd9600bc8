"""What every loader comparison here shares: arguments, hardware report, interleaved rounds of
fresh loaders, medians, the table and the JSON report. Each benchmark script only says which peers
it builds.

Peers are measured in turns within each round, the order alternating from round to round, so that
machine noise (other jobs, thermal throttling, the page cache) hits them alike. Each measurement
builds a fresh loader, skips warm-up batches, then times a fixed number of batches.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

import PIL
import torch
import torchvision

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import fastloader  # noqa: E402
from fastloader.config import IMAGE_EXTENSIONS  # noqa: E402
from fastloader.samples import SampleIndex, scan_folder  # noqa: E402

CONFIG = REPO_ROOT / "configs" / "imagenette.yaml"
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "realphotos"

Batches = Iterable[tuple[torch.Tensor, torch.Tensor]]
Factory = Callable[[], tuple[Batches, Callable[[], None]]]
PeerBuilder = Callable[[str, Path, SampleIndex, Path, int, argparse.Namespace], dict[str, Factory]]
"""(split, split folder, index, file list path, repeat, args) -> {peer name: factory}, ours first."""
Ratios = list[tuple[str, str]]
"""(numerator, denominator) peer names; by default the first peer (ours) against each other one."""


def base_parser(doc: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help="folder holding train/<class>/*.JPEG and val/<class>/*.JPEG "
                             "(default: ../shared/data/realphotos next to the repository)")
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


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    for name in ("workers", "batch_size", "size", "repeat", "batches", "rounds"):
        minimum = 0 if name == "workers" else 1
        if getattr(args, name) < minimum:
            parser.error(f"--{name.replace('_', '-')} must be >= {minimum}")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    return args


def hardware() -> dict:
    """What the numbers depend on, printed with them so that results can be compared across machines."""
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), model)
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": model, "cpu_count": os.cpu_count(), "usable_cpus": usable, "python": platform.python_version(),
            "torch": torch.__version__, "torchvision": torchvision.__version__, "pillow": PIL.__version__,
            "torch_threads": torch.get_num_threads()}


def effective_repeat(num_files: int, args: argparse.Namespace) -> int:
    """The repeat count that fits warm-up + timed batches in one epoch: a new epoch would restart workers."""
    needed = (args.warmup + args.batches + 1) * args.batch_size
    return max(args.repeat, math.ceil(needed / num_files))


def write_file_list(index: SampleIndex, repeat: int, list_path: Path) -> None:
    """The split's images (ImageFolder order and labels) listed `repeat` times, relative to the split folder."""
    lines = [f"{index.relpath(i)} {index.label(i)}\n" for i in range(len(index))]
    list_path.write_text("".join(lines * repeat), encoding="utf-8")


def fastloader_overrides(split: str, split_dir: Path, index: SampleIndex, list_path: Path,
                         args: argparse.Namespace, **extra) -> dict:
    """configs/imagenette.yaml pointed at this split's repeated file list, at the benchmark's sizes."""
    return {"dataset.root": str(split_dir), "dataset.classes": list(index.classes),
            f"{split}.file_list": str(list_path), f"{split}.batch_size": args.batch_size,
            f"{split}.transform.size": args.size, **extra}


def fastloader_factory(split: str, overrides: dict) -> Factory:
    def build():
        loader = fastloader.build_loader(str(CONFIG), split, overrides)
        return loader, loader.close
    return build


def measure(build: Factory, warmup: int, batches: int) -> dict:
    """images/s over `batches` batches after `warmup` ones, on a loader built for this measurement only."""
    started = time.perf_counter()
    loader, close = build()
    iterator = iter(loader)
    timed_from = started
    images = seen = 0
    try:
        for _, labels in iterator:
            seen += 1
            if seen == warmup:
                timed_from = time.perf_counter()
            elif seen > warmup:
                images += len(labels)
            if seen == warmup + batches:
                break
        elapsed = time.perf_counter() - timed_from
    finally:
        del iterator
        close()
        del loader
    if seen < warmup + batches:
        raise RuntimeError(f"the epoch ended after {seen} batches, before {warmup + batches}; raise --repeat")
    startup = timed_from - started if warmup else None
    return {"images": images, "seconds": elapsed, "images_per_s": images / elapsed, "startup_s": startup}


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
    write_file_list(index, repeat, list_path)
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
    """Median, min and max per peer, and the ratios of medians: the given pairs whose peers were
    measured, else the first peer (ours) to each other one."""
    rates = {name: [m["images_per_s"] for m in results] for name, results in raw.items()}
    summary = {name: {"median": statistics.median(r), "min": min(r), "max": max(r)} for name, r in rates.items()}
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
    print(f"  {'loader':<{width}} {'median images/s':>16} {'min..max over rounds':>22}")
    for name in names:
        s = summary[name]
        print(f"  {name:<{width}} {s['median']:16.1f} {s['min']:>12.1f}..{s['max']:<9.1f}")
    for pair, ratio in summary["ratios"].items():
        print(f"  ratio {pair}: {ratio:.2f}x")


def main(args: argparse.Namespace, build_peers: PeerBuilder, name: str, extra_info: str = "",
         ratios: Ratios | None = None, report: Callable[[dict, dict], dict] | None = None) -> int:
    """Run every split, print the settings, the per-round rates and the tables; write the JSON report.

    `report(results, hardware)`, when given, runs after the tables (extra measurements, plots) and
    returns what it adds to the JSON report."""
    args.data = args.data.resolve()
    splits = ["train", "val"] if args.split == "both" else [args.split]
    missing = [s for s in splits if not (args.data / s).is_dir()]
    if missing:
        print(f"{name}: error: no {'/'.join(missing)} folder under {args.data}; pass --data DIR, a folder "
              f"holding train/<class>/*.JPEG and val/<class>/*.JPEG", file=sys.stderr)
        return 2
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    info = hardware()
    print(f"command: {command}")
    print(f"hardware: {info['cpu']}, {info['cpu_count']} CPUs ({info['usable_cpus']} usable), "
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
