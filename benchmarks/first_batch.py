"""Time to the first batch from a fresh process: fastloader's DALI backend against NVIDIA's example.

What a user waits for after typing the command: interpreter start, imports, CUDA start-up, the
pipeline build and the first batch on the device. Each try is a new Python process per peer, the
peers alternating, and the clock is the parent's (from process start to the child's line).

    python benchmarks/first_batch.py --data DIR       # the GPU flavour where CUDA is present
    python benchmarks/first_batch.py --device cpu --tries 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import harness
import torch
from harness import CONFIG, REPO_ROOT

from fastloader.machine import hardware

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
        from harness import listed_files
        from peer_loaders import nvidia_example_factory
        from fastloader.config import IMAGE_EXTENSIONS
        from fastloader.sources.folder import scan_folder
        paths, labels = listed_files(scan_folder(root + "/train", IMAGE_EXTENSIONS), 1)
        batches, _ = nvidia_example_factory(paths, labels, True, device == "gpu", 224, batch, threads)()
        images, labels = next(iter(batches))
    if images.is_cuda:
        torch.cuda.synchronize()
    print("first batch", tuple(images.shape), flush=True)
""")


def time_one(peer: str, args: argparse.Namespace) -> float:
    script = CHILD.format(repo=str(REPO_ROOT), benchmarks=str(BENCHMARKS), config=str(CONFIG))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", script, peer, str(args.data), args.device, str(args.batch_size),
                           str(args.threads)], capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    if done.returncode != 0 or "first batch" not in done.stdout:
        sys.exit(f"{peer} failed:\n{done.stderr[-3000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_data_argument(parser)
    parser.add_argument("--root", dest="data", type=Path, help=argparse.SUPPRESS)  # the name before --data
    parser.add_argument("--device", choices=("cpu", "gpu"), default="gpu" if torch.cuda.is_available() else "cpu",
                        help="DALI flavour (default: gpu where CUDA is available, else cpu)")
    parser.add_argument("--tries", type=int, default=2, help="fresh processes per peer; the median counts (default: 2)")
    parser.add_argument("--batch-size", type=int, default=64, help="default: 64")
    parser.add_argument("--threads", type=int, default=4, help="DALI CPU threads (default: 4)")
    parser.add_argument("--json", type=Path, help="write every try's time to this file")
    args = parser.parse_args()
    args.data = harness.check_data(parser, args.data, ["train"])
    if args.tries < 1 or args.batch_size < 1 or args.threads < 1:
        parser.error("--tries, --batch-size and --threads must be >= 1")
    if args.device == "gpu" and not torch.cuda.is_available():
        parser.error("--device gpu: no CUDA device here; pass --device cpu")
    no_dali = harness.missing_dali()
    if no_dali:
        parser.error(f"both peers run on DALI: {no_dali}")
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
    if args.json:
        args.json.write_text(json.dumps({"hardware": hardware(), "device": args.device, "seconds": times,
                                         "ratio": ours / theirs}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
