"""RSS and PSS of each torch-backend worker across epochs of real JPEGs: flat, or growing?

A worker holds its decoder, its copy-on-read share of the index and (CPU output) its reused batch
buffers (torch_loader.collate.BatchPool), so its memory should rise over the first batches and then
stay flat. Sampled from /proc every --every batches while a consumer drops each batch at once.

    python benchmarks/worker_memory.py --data ../shared/data/realphotos
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import harness
from index_memory import child_pids, proc_status_kb, pss_kb

from fastloader.config import IMAGE_EXTENSIONS
from fastloader.samples import scan_folder


def main() -> int:
    parser = harness.base_parser(__doc__)
    parser.add_argument("--epochs", type=int, default=2, help="default: 2")
    parser.add_argument("--every", type=int, default=25, help="batches between samples (default: 25)")
    args = parser.parse_args()
    args.data = args.data.resolve()
    split = "train" if args.split == "both" else args.split
    index = scan_folder(str(args.data / split), IMAGE_EXTENSIONS)
    with tempfile.TemporaryDirectory(prefix="worker_memory_") as workdir:
        list_path = Path(workdir) / "list.txt"
        harness.write_file_list(index, args.repeat, list_path)
        overrides = harness.fastloader_overrides(split, args.data / split, index, list_path, args, backend="torch",
                                                 **{"output.device": "cpu", "workers.num_workers": args.workers})
        loader, close = harness.fastloader_factory(split, overrides)()
        print(f"{split}: {len(index)} files x {args.repeat}, {len(loader)} batches of {args.batch_size} per epoch, "
              f"{args.workers} workers; MB per worker (RSS / PSS)")
        try:
            for epoch in range(args.epochs):
                for number, _ in enumerate(loader, 1):
                    if number == 1 or number % args.every == 0 or number == len(loader):
                        row = "  ".join(f"{proc_status_kb('VmRSS', pid) / 1024:7.1f} / {pss_kb(pid) / 1024:6.1f}"
                                        for pid in child_pids())
                        print(f"  epoch {epoch} batch {number:4d}: {row}", flush=True)
        finally:
            close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
