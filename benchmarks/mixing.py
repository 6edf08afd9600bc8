"""What mixup, cutmix and soft targets cost the training thread per batch: its CPU time (thread_time).

1. The mixing call alone (`fastloader.mixing.BatchMixer`, as the batch finisher calls it after
   random erasing: fastloader/device_ops.py) on a normalized float32 batch on --device, per
   setting: the host's draws per batch, the draws made ahead at the epoch's start (per batch, over
   an epoch of 1000 batches), and the whole call (draws, pixels blended or pasted, targets). Where it
   runs is the backend's: the DALI driver thread, the torch workers (CPU output) or the torch
   backend's CUDA prefetcher on the training thread (GPU output), which only draws and launches.
2. A whole `next(loader)` on the torch backend with its workers ahead (a simulated model step
   sleeps between batches), then a first read of the batch (`images.sum()`, as the model's first
   layer would read it), with mixing off and with DeiT's setting (mixup 0.8, cutmix 1.0, switch
   0.5, mode batch, label smoothing 0.1), and what mixing adds. On the CPU the read is where a
   trainer first touches the batch's shared memory (page faults), mixing or not: without it, mixing
   would be charged for touches the trainer pays anyway.

Medians of interleaved rounds. thread_time counts the calling thread only; process_time (this
process, all its threads) is reported too. torch runs one intra-op thread here, as mixing does on
the CPU: on a busy machine, OpenMP's spinning threads would otherwise count.

    python benchmarks/mixing.py --data DIR
    python benchmarks/mixing.py --batch-size 256 --size 224 --rounds 5 --json mixing.json
    python benchmarks/mixing.py --data DIR --device cuda --workers 8      # on a GPU
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness
import numpy as np
import torch

from fastloader.config import IMAGE_EXTENSIONS, load_config
from fastloader.machine import hardware
from fastloader.mixing import BatchMixer
from fastloader.sources.folder import scan_folder

DEIT = {"mixup": {"mixup_alpha": 0.8, "cutmix_alpha": 1.0}, "label_smoothing": 0.1}
SETTINGS = {  # name: the train split's keys
    "label smoothing 0.1": {"label_smoothing": 0.1},
    "mixup 0.8, batch": {"mixup": {"mixup_alpha": 0.8}},
    "cutmix 1.0, batch": {"mixup": {"cutmix_alpha": 1.0}},
    "DeiT: mixup 0.8 + cutmix 1.0, batch, smoothing 0.1": DEIT,
    "the same, mode pair": {**DEIT, "mixup": {**DEIT["mixup"], "mode": "pair"}},
    "the same, mode elem": {**DEIT, "mixup": {**DEIT["mixup"], "mode": "elem"}},
}
CLASSES = 1000
EPOCH_BATCHES = 1000
"""Batches in the epoch whose draws are made ahead (ImageNet at 256 per step on 5 ranks)."""


def cpu_times(call, repeats: int) -> tuple[float, float]:
    """(thread, process) CPU seconds per call."""
    thread, process = time.thread_time(), time.process_time()
    for _ in range(repeats):
        call()
    return (time.thread_time() - thread) / repeats, (time.process_time() - process) / repeats


def mixing_alone(name: str, keys: dict, args, rng: np.random.Generator) -> dict:
    """One round of the mixing call on the CPU for one setting, per batch."""
    split = load_config({"dataset": {"root": "unused"}, "train": {"transform": {"size": args.size}, **keys}}).split(
        "train")
    mixer = BatchMixer(split, CLASSES)
    batches = [np.stack([np.arange(args.batch_size), rng.integers(0, 2**62, args.batch_size)], axis=1)
               for _ in range(EPOCH_BATCHES)]
    images = torch.randn(args.batch_size, 3, args.size, args.size, device=args.device)
    labels = torch.from_numpy(rng.integers(0, CLASSES, args.batch_size)).to(args.device)
    ahead, _ = cpu_times(lambda: mixer.start_epoch(batches), 1)
    turn = iter(range(10**9))

    def draws():
        seeds = batches[next(turn) % len(batches)][:, 1]
        if mixer.mix is not None:
            mixer.plan(seeds, args.size, args.size)

    def whole():
        mixer(images, labels, batches[next(turn) % len(batches)][:, 1])

    draw_thread, _ = cpu_times(draws, args.batches)
    thread, process = cpu_times(whole, args.batches)
    if args.device == "cuda":
        torch.cuda.synchronize()  # after the timing: the launches are what the training thread pays
    return {"draws_ms": 1000 * draw_thread, "ahead_ms": 1000 * ahead / EPOCH_BATCHES,
            "call_thread_ms": 1000 * thread, "call_process_ms": 1000 * process}


def next_batches(keys: dict, list_path: Path, index, repeat: int, args) -> dict:
    """CPU time of the training thread inside next(loader), per batch, with the workers ahead."""
    overrides = harness.fastloader_overrides("train", args.data / "train", index, list_path, args, repeat,
                                             backend="torch",
                                             **{"output.device": args.device, "workers.num_workers": args.workers})
    overrides.update({f"train.{key}": value for key, value in keys.items()})
    loader, close = harness.fastloader_factory("train", overrides)()
    thread, process, read = [], [], []
    try:
        iterator = iter(loader)
        for number in range(args.warmup + args.batches):
            time.sleep(args.step_ms / 1000)  # the model's step: the workers get ahead meanwhile
            t, p = time.thread_time(), time.process_time()
            images, _ = next(iterator)
            took, took_process = time.thread_time() - t, time.process_time() - p
            t = time.thread_time()
            float(images.sum())
            if number >= args.warmup:
                thread.append(took)
                process.append(took_process)
                read.append(time.thread_time() - t)
            del images
        del iterator
    finally:
        close()
    return {"thread_ms": 1000 * statistics.median(thread), "process_ms": 1000 * statistics.median(process),
            "read_ms": 1000 * statistics.median(read)}


def main() -> int:
    parser = harness.base_parser(__doc__)
    parser.set_defaults(split="train", batch_size=256, batches=8, warmup=2, rounds=3)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="default: cpu")
    parser.add_argument("--step-ms", type=float, default=600,
                        help="simulated model step between batches, long enough for the workers to get "
                             "ahead (default: 600)")
    args = harness.check_args(parser, parser.parse_args())
    if args.split != "train":
        parser.error("--split: mixing runs on train splits only")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU is available here")
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    alone = {name: [] for name in SETTINGS}
    loops = {"off": [], "DeiT mixing": []}
    index = scan_folder(str(args.data / "train"), IMAGE_EXTENSIONS)
    repeat = harness.effective_repeat(len(index), args)
    with tempfile.TemporaryDirectory(prefix="mixing_") as workdir:
        list_path = Path(workdir) / "train.txt"
        harness.write_file_list("train", index, repeat, list_path)
        for round_number in range(args.rounds):
            names = list(SETTINGS) if round_number % 2 == 0 else list(reversed(SETTINGS))
            for name in names:
                alone[name].append(mixing_alone(name, SETTINGS[name], args, rng))
            for name in (loops if round_number % 2 == 0 else reversed(loops)):
                loops[name].append(next_batches({} if name == "off" else DEIT, list_path, index, repeat, args))
    median = {name: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for name, runs in alone.items()}
    loop = {name: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for name, runs in loops.items()}
    shape = f"{args.batch_size} x 3 x {args.size} x {args.size} float32"
    print(f"mixing call alone, batch {shape} on {args.device}, ms of CPU time per batch "
          f"(median of {args.rounds} rounds):")
    print(f"  {'setting':<52} {'draws':>7} {'ahead':>7} {'call (thread)':>14} {'call (process)':>15}")
    for name, m in median.items():
        print(f"  {name:<52} {m['draws_ms']:7.3f} {m['ahead_ms']:7.3f} {m['call_thread_ms']:14.2f} "
              f"{m['call_process_ms']:15.2f}")
    off, deit = loop["off"], loop["DeiT mixing"]
    total = {name: m["thread_ms"] + m["read_ms"] for name, m in loop.items()}
    added = total["DeiT mixing"] - total["off"]
    print(f"next(loader), torch backend, {args.workers} workers ahead, output on {args.device}, ms of CPU time "
          f"per batch (median of {args.batches} batches, then of {args.rounds} rounds):")
    for name, m in loop.items():
        print(f"  {name:<14} training thread {m['thread_ms']:8.2f}   process {m['process_ms']:8.2f}   "
              f"then the first read of the batch {m['read_ms']:8.2f}")
    print(f"  mixing adds {added:.2f} ms to the training thread's next + first read "
          f"({100 * added / total['off']:+.0f}%), {deit['thread_ms'] - off['thread_ms']:.2f} ms to next alone")
    if args.json:
        args.json.write_text(json.dumps({"hardware": hardware(), "device": args.device,
                                         "batch_size": args.batch_size, "size": args.size,
                                         "workers": args.workers, "rounds": args.rounds, "alone": median,
                                         "next": loop, "added_ms": added,
                                         "raw": {"alone": alone, "next": loops}}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
