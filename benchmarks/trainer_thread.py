"""What a loader costs the training thread: its CPU time inside `next(loader)`, per sample.

On a GPU the thread that runs `for images, labels in loader` also launches the model, so every
microsecond a loader spends on it is a microsecond the GPU does not train. This measures that cost
on any machine: `time.thread_time()` around each `next()`, with the loader kept ahead of the
consumer by a simulated model step (a sleep, which costs the thread no CPU time) between batches.
Blocking on a queue costs no CPU time either, so what is left is the loader's own work on that
thread: its Python, the hand-over of each batch, and whatever it reads or computes there.

Peers, each built fresh per round and run for two epochs (the first and a later one are separate
rows, since a loader may do work in its first epoch that it keeps for the next):
- NVIDIA's ResNet-50 example pipeline (fn.readers.file, DALIClassificationIterator), the reference;
- fastloader's DALI backend (CPU flavour here, GPU flavour with --device gpu: the same feed);
- fastloader's torch backend;
- with --shards, both backends again on the same listed samples packed as WebDataset tar shards
  (the DALI feed then reads the members' bytes itself, on its driver thread).

    python benchmarks/trainer_thread.py --data ../shared/data/realphotos
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness
import peer_loaders
import torch
from harness import CONFIG

import fastloader
from fastloader.config import IMAGE_EXTENSIONS
from fastloader.sources.folder import scan_folder

NVIDIA, DALI, TORCH = "NVIDIA RN50 example", "fastloader dali", "fastloader torch"
MIXED = " + mixing"
SHARDS = " shards"
DEIT_MIXING = {"train.mixup.mixup_alpha": 0.8, "train.mixup.cutmix_alpha": 1.0, "train.mixup.switch_prob": 0.5,
               "train.mixup.mode": "batch", "train.label_smoothing": 0.1, "train.transform.erase_prob": 0.25,
               "train.transform.erase_mode": "pixel"}
"""--mixing: DeiT's batch augmentations (main.py's defaults), measured beside each backend without them."""
EPOCHS = ("first", "later")


def consume(batches, epochs: int, step_s: float) -> list[dict]:
    """Per epoch: the training thread's CPU seconds inside next(), the samples and batches, iterating
    `batches()` (a fresh iterator per epoch) and sleeping `step_s` after each batch as a model step."""
    results = []
    for _ in range(epochs):
        iterator = iter(batches())
        cpu = 0.0
        samples = count = 0
        while True:
            before = time.thread_time()
            try:
                _, labels = next(iterator)
            except StopIteration:
                cpu += time.thread_time() - before
                break
            cpu += time.thread_time() - before
            samples += len(labels)
            count += 1
            time.sleep(step_s)
        results.append({"cpu_s": cpu, "samples": samples, "batches": count,
                        "us_per_sample": 1e6 * cpu / max(1, samples)})
    return results


def fastloader_run(split: str, overrides: dict, epochs: int, step_s: float) -> list[dict]:
    with fastloader.build_loader(str(CONFIG), split, overrides) as loader:
        return consume(lambda: loader, epochs, step_s)


def nvidia_run(paths: list[str], labels: list[int], split: str, gpu: bool, args, epochs: int,
               step_s: float) -> list[dict]:
    """NVIDIA's example read as its main.py reads it: DALIClassificationIterator, reset between epochs."""
    from nvidia.dali.plugin.pytorch import DALIClassificationIterator, LastBatchPolicy
    size = int(args.size / 0.875)
    pipe = peer_loaders.nvidia_example_pipeline(paths, labels, split == "train", gpu, args.size, size,
                                                args.batch_size, args.workers)
    iterator = DALIClassificationIterator(pipe, reader_name="Reader", last_batch_policy=LastBatchPolicy.PARTIAL,
                                          auto_reset=True)

    def batches():  # what the example's training loop does with each batch
        return ((batch[0]["data"], batch[0]["label"].squeeze(-1).long()) for batch in iterator)
    return consume(batches, epochs, step_s)


def run_split(split: str, args, workdir: Path) -> dict:
    split_dir = args.data / split
    index = scan_folder(str(split_dir), IMAGE_EXTENSIONS)
    repeat = args.repeat_train if split == "train" else args.repeat_val
    list_path = workdir / f"{split}_x{repeat}.txt"
    harness.write_file_list(split, index, repeat, list_path)
    paths, labels = harness.listed_files(index, repeat)
    gpu = args.device == "gpu"
    base = harness.fastloader_overrides(split, split_dir, index, list_path, args, repeat,
                                        **{"output.device": "cuda" if gpu else "cpu", "stats.log_level": "none"},
                                        **dict(args.set))
    step = args.step_ms / 1e3
    runs = {}
    if "nvidia" in args.peers:
        runs[NVIDIA] = lambda: nvidia_run(paths, labels, split, gpu, args, args.epochs, step)
    ours = {DALI: {**base, "backend": "dali", "dali.threads": args.workers},
            TORCH: {**base, "backend": "torch", "workers.num_workers": args.workers}}
    for name, overrides in ours.items():
        if name.split()[-1] in args.peers:
            runs[name] = lambda overrides=overrides: fastloader_run(split, overrides, args.epochs, step)
    if args.shards:  # each backend again, on the listed samples as tar shards
        shards = harness.write_shards(paths, labels, workdir / f"{split}-shards", split, 256)
        sharded = {"dataset.format": "webdataset", f"{split}.file_list": None, f"{split}.shards": shards,
                   f"{split}.epoch_size": None}  # the shards hold every pass
        for name, overrides in ours.items():
            if name.split()[-1] in args.peers:
                runs[name + SHARDS] = lambda o={**overrides, **sharded}: fastloader_run(split, o, args.epochs, step)
    if args.mixing and split == "train":  # each backend again, with DeiT's mixing and erasing
        for name, overrides in ours.items():
            if name in runs:
                mixed = {**overrides, **DEIT_MIXING}
                runs[name + MIXED] = lambda mixed=mixed: fastloader_run(split, mixed, args.epochs, step)
    raw = {name: [] for name in runs}
    for round_number in range(args.rounds):
        order = list(runs) if round_number % 2 == 0 else list(reversed(runs))
        for name in order:
            epochs = runs[name]()
            raw[name].append(epochs)
            shown = ", ".join(f"{EPOCHS[min(i, 1)]} {e['us_per_sample']:.2f} us ({e['batches']} batches)"
                              for i, e in enumerate(epochs))
            print(f"  {split} round {round_number + 1}/{args.rounds} {name:<20} {shown}", flush=True)
    return {"files": len(index), "repeat": repeat, "measurements": raw}


def summarize(raw: dict) -> dict:
    """Per epoch row (the first; the last, when a run had more than one) and peer: the median and
    range of us per sample over rounds."""
    rows = {}
    for name, rounds in raw.items():
        picks = {"first": [epochs[0] for epochs in rounds],
                 "later": [epochs[-1] for epochs in rounds if len(epochs) > 1]}
        for row, epochs in picks.items():
            values = [epoch["us_per_sample"] for epoch in epochs]
            if values:
                rows.setdefault(row, {})[name] = {"median": statistics.median(values), "min": min(values),
                                                  "max": max(values)}
    return rows


def print_table(split: str, result: dict, summary: dict) -> None:
    print(f"\n{split}: {result['files']} files x {result['repeat']}; training thread's CPU time per sample "
          f"inside next(loader), median over rounds (min..max)")
    names = list(result["measurements"])
    print("  epoch   " + "".join(f"{name:>28}" for name in names))
    for row, peers in summary.items():
        cells = "".join(f"{peers[n]['median']:>11.2f} us ({peers[n]['min']:.2f}..{peers[n]['max']:.2f})"
                        .rjust(28) if n in peers else f"{'-':>28}" for n in names)
        print(f"  {row:<7} {cells}")
    for row, peers in summary.items():
        if NVIDIA in peers:
            for name in names:
                if name != NVIDIA and name in peers:
                    print(f"  ratio {row} epoch: {name} / {NVIDIA} = "
                          f"{peers[name]['median'] / peers[NVIDIA]['median']:.2f}x (goal <= 1.0x)")
        for name in names:
            if name.endswith(MIXED) and name in peers and name[:-len(MIXED)] in peers:
                print(f"  ratio {row} epoch: {name} / {name[:-len(MIXED)]} = "
                      f"{peers[name]['median'] / peers[name[:-len(MIXED)]]['median']:.2f}x (goal <= 1.05x)")


def key_value(text: str) -> tuple[str, object]:
    """--set KEY=VALUE, the value parsed as YAML (as fastloader's own --set)."""
    import yaml
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, yaml.safe_load(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_data_argument(parser)
    parser.add_argument("--split", choices=("train", "val", "both"), default="both", help="default: both")
    parser.add_argument("--peers", type=lambda text: text.split(","), default=["nvidia", "dali", "torch"],
                        help="comma-separated, of nvidia,dali,torch (default: all three)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes or DALI threads (default: 2)")
    parser.add_argument("--batch-size", type=int, default=256, help="default: 256")
    parser.add_argument("--size", type=int, default=224, help="output height and width (default: 224)")
    parser.add_argument("--repeat-train", type=int, default=12, help="train files listed K times (default: 12)")
    parser.add_argument("--repeat-val", type=int, default=48, help="val files listed K times (default: 48)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per run: the first, then later ones "
                        "(the last is reported as 'later'; default: 2)")
    parser.add_argument("--step-ms", type=float, default=400,
                        help="simulated model step after each batch, long enough for the loader to stay ahead "
                             "(default: 400)")
    parser.add_argument("--rounds", type=int, default=3, help="default: 3")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="gpu" if torch.cuda.is_available() else "cpu",
                        help="output device and DALI flavour (default: gpu where CUDA is available)")
    parser.add_argument("--mixing", action="store_true",
                        help="train split: also each backend with DeiT's mixup, cutmix, label smoothing and random "
                             "erasing, and the ratio to it without them")
    parser.add_argument("--shards", action="store_true",
                        help="also each backend reading the same listed samples packed as WebDataset tar shards")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", type=key_value,
                        help="a config override for fastloader's loaders, e.g. dataset.screen=false (repeatable)")
    parser.add_argument("--json", type=Path, help="write every measurement to this file")
    args = parser.parse_args()
    args.data = harness.check_data(parser, args.data, harness.splits_of(args))
    unknown = set(args.peers) - {"nvidia", "dali", "torch"}
    if unknown:
        parser.error(f"--peers: unknown {', '.join(sorted(unknown))}; choose from nvidia, dali, torch")
    if harness.missing_dali() and {"nvidia", "dali"} & set(args.peers):
        print(f"skipped nvidia and dali: {harness.missing_dali()}")
        args.peers = [p for p in args.peers if p == "torch"]
    if args.workers < 1 or args.epochs < 1 or args.rounds < 1:
        parser.error("--workers, --epochs and --rounds must be >= 1")
    if args.device == "gpu" and not torch.cuda.is_available():
        parser.error("--device gpu: no CUDA device here; pass --device cpu")
    info = harness.hardware()
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    print(f"command: {command}")
    print(f"hardware: {info['cpu']}, {info['cpu_cores']} usable cores, torch {info['torch']}, device {args.device}")
    print(f"settings: batch {args.batch_size}, {args.workers} workers/threads, {args.size} px, model step "
          f"{args.step_ms:g} ms, {args.epochs} epochs per run, {args.rounds} rounds, data {args.data}"
          + "".join(f", {key}={value}" for key, value in args.set))
    results = {}
    with tempfile.TemporaryDirectory(prefix="trainer_thread_") as workdir:
        for split in harness.splits_of(args):
            results[split] = run_split(split, args, Path(workdir))
            results[split]["summary"] = summarize(results[split]["measurements"])
    for split, result in results.items():
        print_table(split, result, result["summary"])
    if args.json:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"command": command, "hardware": info, "settings": settings,
                                         "splits": results}, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
