"""Same batches, bit for bit: one SHA-256 per (recipe, backend, split, epoch) over every batch's pixels
and labels, to hold a refactor to "nothing a user gets has changed".

Run it before a change with --json, after it with --check: any digest that moved is named, and the
command exits 1. The recipes cover the paths that draw randomness: the default config, DeiT's (RandAugment,
erasing, mixing, repeated augmentation) and DINOv2's views. Both backends run (DALI in the flavour this
machine has), train and val, 2 epochs, on the same files; digests differ between backends (two
implementations of one op, docs/semantics.md), never between runs of one backend on one machine.

    python benchmarks/same_batches.py --json bench-results/same_batches.json
    python benchmarks/same_batches.py --check bench-results/same_batches.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import harness
import torch
from harness import REPO_ROOT

import fastloader

RECIPES = {
    "imagenette": REPO_ROOT / "configs" / "imagenette.yaml",
    "deit": REPO_ROOT / "configs" / "recipes" / "deit.yaml",
    "dinov2": REPO_ROOT / "configs" / "recipes" / "dinov2.yaml",
}
SPLITS = {"imagenette": ("train", "val"), "deit": ("train", "val"), "dinov2": ("train",)}
"""DINOv2's val is the default eval transform, already covered by the other recipes."""


def digest_batch(hasher, images, labels) -> None:
    """Feed one batch's bytes to `hasher`: each view's pixels (views give a list), then the labels."""
    for view in images if isinstance(images, (list, tuple)) else [images]:
        hasher.update(str(tuple(view.shape)).encode() + str(view.dtype).encode())
        hasher.update(view.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    hasher.update(labels.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())


def digests(recipe: str, backend: str, split: str, data: Path, epochs: int, batch_size: int) -> list[dict]:
    overrides = {"backend": backend, "dataset.root": str(data), f"{split}.batch_size": batch_size,
                 "workers.num_workers": 2, "output.device": "cpu"}
    rows = []
    with fastloader.build_loader(RECIPES[recipe], split=split, overrides=overrides) as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            hasher, batches, samples = hashlib.sha256(), 0, 0
            for images, labels in loader:
                digest_batch(hasher, images, labels)
                batches += 1
                samples += len(labels)
            rows.append({"recipe": recipe, "backend": backend, "split": split, "epoch": epoch,
                         "batches": batches, "samples": samples, "sha256": hasher.hexdigest()})
    return rows


def key(row: dict) -> str:
    return f"{row['recipe']}/{row['backend']}/{row['split']}/epoch {row['epoch']}"


def changed(rows: list[dict], before: list[dict]) -> tuple[list[str], list[str]]:
    """(the digests measured now that differ from `before`'s, those of `before` not measured now)."""
    then = {key(row): row for row in before}
    now = {key(row) for row in rows}
    return ([key(row) for row in rows if key(row) in then and then[key(row)] != row],
            [name for name in then if name not in now])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_data_argument(parser)
    harness.add_backends_argument(parser)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--recipes", nargs="+", choices=sorted(RECIPES), default=list(RECIPES))
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--json", type=Path, help="write the digests to this JSON file")
    what.add_argument("--check", type=Path, help="compare with the digests a --json run wrote; exit 1 on any change")
    args = parser.parse_args()
    data = harness.check_data(parser, args.data, ("train", "val"))
    backends = harness.usable_backends(parser, args.backends)
    rows = []
    for recipe in args.recipes:
        for backend in backends:
            for split in SPLITS[recipe]:
                for row in digests(recipe, backend, split, data, args.epochs, args.batch_size):
                    print(f"{key(row):40s} {row['batches']:4d} batches {row['samples']:5d} samples  "
                          f"{row['sha256'][:16]}", flush=True)
                    rows.append(row)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
        print(f"saved {len(rows)} digests to {args.json}")
    if args.check:
        moved, missing = changed(rows, json.loads(args.check.read_text()))
        for name in moved:
            print(f"CHANGED: {name}")
        print(f"{len(rows) - len(moved)} of {len(rows)} digests the same as {args.check}"
              + (f"; not measured now: {', '.join(missing)}" if missing else ""))
        return 1 if moved else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
