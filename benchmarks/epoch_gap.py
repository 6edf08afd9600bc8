"""Time to first batch and the gap at each epoch boundary, as a trainer sees them (loader.stats).

The split's files once per epoch (short epochs, so boundaries come often), a simulated model step
that sleeps (a GPU step leaves the CPU to the loader) long enough for the loader to keep up, so a
wait shows only where the loader has nothing ready: at start-up and at epoch boundaries.
Printed per backend: the first loop's time to first batch, the first-batch wait of every later
epoch (the boundary gap), and the median wait of the other batches.

    python benchmarks/epoch_gap.py --data DIR
    python benchmarks/epoch_gap.py --split train --backends torch --epochs 3 --json epoch_gap.json
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness

from fastloader.config import IMAGE_EXTENSIONS
from fastloader.machine import hardware
from fastloader.sources.folder import scan_folder


def run(backend: str, split: str, list_path: Path, index, args) -> dict:
    extra = {"output.device": "cpu", "workers.num_workers": args.workers, "dali.threads": args.workers}
    overrides = harness.fastloader_overrides(split, args.data / split, index, list_path, args, backend=backend,
                                             **extra)
    loader, close = harness.fastloader_factory(split, overrides)()
    first, boundaries, steady = None, [], []
    try:
        for epoch in range(args.epochs):
            for _ in loader:
                time.sleep(args.step_ms / 1000)
            waits = list(loader.stats.batch_wait_s)
            if epoch == 0:
                first = waits[0]
            else:
                boundaries.append(waits[0])
            steady += waits[1:]
    finally:
        close()
    return {"time_to_first_batch_s": first, "boundary_waits_s": boundaries,
            "steady_wait_median_s": statistics.median(steady)}


def main() -> int:
    parser = harness.base_parser(__doc__)
    parser.add_argument("--epochs", type=int, default=4, help="default: 4")
    parser.add_argument("--step-ms", type=float, default=150, help="simulated model step per batch (default: 150)")
    harness.add_backends_argument(parser)
    args = harness.check_args(parser, parser.parse_args())
    if args.epochs < 2:
        parser.error("--epochs must be >= 2: the first epoch has no boundary before it")
    args.backends = harness.usable_backends(parser, args.backends)
    results = {}
    with tempfile.TemporaryDirectory(prefix="epoch_gap_") as workdir:
        for split in harness.splits_of(args):
            index = scan_folder(str(args.data / split), IMAGE_EXTENSIONS)
            list_path = Path(workdir) / f"{split}.txt"
            harness.write_file_list(split, index, 1, list_path)
            for backend in args.backends:
                r = results[f"{split} {backend}"] = run(backend, split, list_path, index, args)
                gaps = ", ".join(f"{1000 * w:.0f}" for w in r["boundary_waits_s"])
                print(f"{split} {backend:<6} {args.workers} workers: "
                      f"first batch {1000 * r['time_to_first_batch_s']:.0f} ms; epoch-boundary waits {gaps} ms; "
                      f"other batches median {1000 * r['steady_wait_median_s']:.1f} ms",
                      flush=True)
    if args.json:
        args.json.write_text(json.dumps({"hardware": hardware(), "workers": args.workers, "step_ms": args.step_ms,
                                         "runs": results}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
