"""Time to the first batch from a fresh process: fastloader's DALI backend against NVIDIA's example.

What a user waits for after typing the command: interpreter start, imports, CUDA start-up, the
pipeline build and the first batch on the device. Each try is a new Python process per peer, the
peers alternating, and the clock is the parent's (from process start to the child's line).

    python benchmarks/first_batch.py                  # the GPU flavour where CUDA is present
    python benchmarks/first_batch.py --device cpu --tries 3
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch

from harness import CONFIG, DEFAULT_DATA, REPO_ROOT

BENCHMARKS = Path(__file__).resolve().parent

CHILD = textwrap.dedent("""
    import sys, time
    sys.path[:0] = [{repo!r}, {benchmarks!r}]
    peer, root, device, batch, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    import torch
    if peer == "fastloader":
        import fastloader
        loader = fastloader.build_loader(str({config!r}), "train", {{
            "backend": "dali", "dataset.root": root, "train.batch_size": batch, "dali.threads": threads,
            "output.device": "cuda" if device == "gpu" else "cpu"}})
        images, labels = next(iter(loader))
    else:
        import argparse
        from compare_dali import iterator_factory, nvidia_example_pipeline
        from fastloader.config import IMAGE_EXTENSIONS
        from fastloader.samples import scan_folder
        index = scan_folder(root + "/train", IMAGE_EXTENSIONS)
        paths, labels = [index.path(i) for i in range(len(index))], [index.label(i) for i in range(len(index))]
        args = argparse.Namespace(batch_size=batch, workers=threads)
        batches, _ = iterator_factory(lambda: nvidia_example_pipeline(
            list(paths), list(labels), True, device == "gpu", 224, 256, args))()
        images, labels = next(iter(batches))
    if images.is_cuda:
        torch.cuda.synchronize()
    print("first batch", tuple(images.shape), flush=True)
""")


def time_one(peer: str, args: argparse.Namespace) -> float:
    script = CHILD.format(repo=str(REPO_ROOT), benchmarks=str(BENCHMARKS), config=str(CONFIG))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", script, peer, str(args.root), args.device, str(args.batch_size),
                           str(args.threads)], capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    if done.returncode != 0 or "first batch" not in done.stdout:
        sys.exit(f"{peer} failed:\n{done.stderr[-3000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=DEFAULT_DATA, help="an imagenette-shaped tree (train/<class>/)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="gpu" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tries", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    if not (args.root / "train").is_dir():
        parser.error(f"--root {args.root}: no train/ folder there")
    peers = ("fastloader", "nvidia")
    times: dict[str, list[float]] = {peer: [] for peer in peers}
    for attempt in range(args.tries):
        for peer in peers if attempt % 2 == 0 else reversed(peers):
            times[peer].append(time_one(peer, args))
            print(f"try {attempt + 1}: {peer} {times[peer][-1]:.2f} s", flush=True)
    ours, theirs = statistics.median(times["fastloader"]), statistics.median(times["nvidia"])
    print(f"first batch from a fresh process, DALI {args.device} flavour, batch {args.batch_size}, "
          f"{args.threads} threads: fastloader dali {ours:.2f} s, NVIDIA example {theirs:.2f} s "
          f"(medians of {args.tries}); fastloader / NVIDIA: {ours / theirs:.2f}x")


if __name__ == "__main__":
    main()
