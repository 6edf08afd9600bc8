"""MosaicML Streaming on remote.py's setting, run by a Python that has Streaming installed (its own
torch): remote.py starts it as a subprocess, so this file imports nothing of fastloader.

`write`: the photos' JPEG bytes and class labels as MDS shards (streaming.MDSWriter), uploaded with
boto3 to AWS_ENDPOINT_URL; prints one JSON line: shards, their bytes, the cache limit to read with.
`read`: StreamingDataset (py1e shuffle) in a torch DataLoader, decoding each photo with PIL and
torchvision's reference train transform (random-resized-crop, flip, normalized float32, as our
loader's output); prints a JSON line at the end of each epoch (remote.py reads the server's bytes
sent and CPU time at each), then one with the time to the first batch and the cache folder's
largest size seen (polled every 20 ms, benchmarks/cache_watch.py) against the limit.

Streaming's S3 downloads read their endpoint from S3_ENDPOINT_URL, which remote.py sets.
"""
from __future__ import annotations

import argparse
import io
import json
import os
from pathlib import Path

import torch
from cache_watch import read_epochs
from PIL import Image
from streaming import MDSWriter, StreamingDataset
from streaming.base.util import clean_stale_shared_memory
from torchvision import transforms

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def write(args: argparse.Namespace) -> dict:
    """Shards of about --shard-bytes, but at most a quarter of the cache limit: Streaming refuses a
    cache that holds fewer than four of its largest shard."""
    import boto3

    photos = sorted(p for p in (args.photos / "train").rglob("*") if p.is_file())
    classes = sorted({p.parent.name for p in photos})
    cache_at_least = int(args.cache_fraction * sum(p.stat().st_size for p in photos))
    size_limit = min(args.shard_bytes, cache_at_least // 4)
    with MDSWriter(out=str(args.out), columns={"jpeg": "bytes", "label": "int"}, size_limit=size_limit) as writer:
        for path in photos:
            writer.write({"jpeg": path.read_bytes(), "label": classes.index(path.parent.name)})
    client = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"])
    bucket, _, prefix = args.remote.removeprefix("s3://").partition("/")
    for path in args.out.iterdir():
        client.upload_file(str(path), bucket, f"{prefix}/{path.name}")
    shards = sorted(args.out.glob("*.mds"))
    data_bytes = sum(p.stat().st_size for p in shards)
    return {"samples": len(photos), "shards": len(shards), "data_bytes": data_bytes, "size_limit": size_limit,
            "cache_limit": int(args.cache_fraction * data_bytes)}


class Photos(StreamingDataset):
    """Streaming's documented way to transform samples: a subclass's __getitem__."""

    def __init__(self, size: int, **kwargs):
        super().__init__(**kwargs)
        self.transform = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                                             transforms.ToTensor(), transforms.Normalize(MEAN, STD)])

    def __getitem__(self, index: int):
        sample = super().__getitem__(index)
        return self.transform(Image.open(io.BytesIO(sample["jpeg"])).convert("RGB")), sample["label"]


def read(args: argparse.Namespace) -> dict:
    clean_stale_shared_memory()
    def make_loader():
        dataset = Photos(args.size, remote=args.remote, local=str(args.local), cache_limit=args.cache_limit,
                         shuffle=True, shuffle_algo="py1e", shuffle_seed=args.seed,
                         shuffle_block_size=args.block_samples, batch_size=args.batch_size,
                         predownload=args.predownload)
        return torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers)
    return read_epochs(make_loader, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    writing = commands.add_parser("write", help="write and upload the MDS shards")
    writing.add_argument("--photos", type=Path, required=True, help="a folder with train/<class>/<photo>")
    writing.add_argument("--out", type=Path, required=True, help="where the shards are written")
    writing.add_argument("--remote", required=True, help="s3://bucket/prefix to upload them to")
    writing.add_argument("--shard-bytes", type=int, required=True, help="about this many bytes a shard")
    writing.add_argument("--cache-fraction", type=float, required=True, help="the cache limit over the data")
    reading = commands.add_parser("read", help="read them for --epochs")
    reading.add_argument("--remote", help="s3://bucket/prefix, or none to read --local as it is")
    reading.add_argument("--local", type=Path, required=True, help="Streaming's local folder (its cache)")
    reading.add_argument("--cache-limit", type=int, help="bytes (with --remote)")
    reading.add_argument("--block-samples", type=int, required=True, help="py1e's shuffle_block_size")
    reading.add_argument("--predownload", type=int, help="samples a worker downloads ahead (default: Streaming's)")
    for name, default in (("epochs", 3), ("batch-size", 32), ("size", 224), ("workers", 2), ("seed", 0)):
        reading.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    print(json.dumps(write(args) if args.command == "write" else read(args)), flush=True)


if __name__ == "__main__":
    main()
