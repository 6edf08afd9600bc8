"""LitData (Lightning's `litdata`) on remote.py's setting, run by a Python that has LitData installed
(its own torch): remote.py starts it as a subprocess, so this file imports nothing of fastloader.

`write`: the photos' JPEG bytes and class labels as LitData chunks (litdata.optimize), uploaded with
boto3 to AWS_ENDPOINT_URL; prints one JSON line: chunks, their bytes, the cache limit to read with.
`read`: StreamingDataset (shuffle=True: chunks in a random order per worker, samples shuffled within
a chunk) in LitData's StreamingDataLoader, decoding each photo with PIL and torchvision's reference
train transform (random-resized-crop, flip, normalized float32, as our loader's output and
streaming_peer.py's); prints a JSON line at the end of each epoch (remote.py reads the server's bytes
sent and CPU time at each), then one with the time to the first batch and the cache folder's largest
size seen (polled every 20 ms, benchmarks/cache_watch.py) against max_cache_size.

LitData's S3 client is boto3's, which reads AWS_ENDPOINT_URL and the keys remote.py sets; its chunk
downloads go through obstore, built from that client.
"""
from __future__ import annotations

import argparse
import io
import json
import os
from pathlib import Path

import litdata
import litdata.streaming.downloader
from cache_watch import read_epochs
from PIL import Image
from torchvision import transforms

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

if os.environ.get("AWS_ALLOW_HTTP", "").lower() == "true":
    # LitData 0.2.76 hands obstore's S3Store client options of its own, and obstore then ignores
    # AWS_ALLOW_HTTP: every chunk GET from an http:// endpoint (the local server) fails with reqwest's
    # BadScheme. Adding the one option to LitData's is the least change; an https:// store needs none.
    litdata.streaming.downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"


class Labelled:
    """A photo's path as the sample LitData writes: its JPEG bytes and class (picklable, for optimize's
    worker processes)."""

    def __init__(self, classes: list[str]):
        self.classes = classes

    def __call__(self, path: Path) -> dict:
        return {"jpeg": path.read_bytes(), "label": self.classes.index(path.parent.name)}


def write(args: argparse.Namespace) -> dict:
    import boto3

    photos = sorted(p for p in (args.photos / "train").rglob("*") if p.is_file())
    classes = sorted({p.parent.name for p in photos})
    litdata.optimize(fn=Labelled(classes), inputs=photos, output_dir=str(args.out), chunk_bytes=args.chunk_bytes,
                     num_workers=1, mode="overwrite")
    client = boto3.client("s3")
    bucket, _, prefix = args.remote.removeprefix("s3://").partition("/")
    for path in args.out.iterdir():
        client.upload_file(str(path), bucket, f"{prefix}/{path.name}")
    chunks = sorted(args.out.glob("*.bin"))
    data_bytes = sum(p.stat().st_size for p in chunks)
    return {"samples": len(photos), "shards": len(chunks), "data_bytes": data_bytes, "chunk_bytes": args.chunk_bytes,
            "cache_limit": int(args.cache_fraction * data_bytes)}


class Transform:
    """torchvision's reference train transform of a sample's JPEG bytes, decoded with PIL."""

    def __init__(self, size: int):
        self.pipeline = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                                            transforms.ToTensor(), transforms.Normalize(MEAN, STD)])

    def __call__(self, sample: dict):
        return self.pipeline(Image.open(io.BytesIO(sample["jpeg"])).convert("RGB")), sample["label"]


def read(args: argparse.Namespace) -> dict:
    def make_loader():
        dataset = litdata.StreamingDataset(
            args.remote or str(args.local), cache_dir=str(args.local) if args.remote else None,
            max_cache_size=args.cache_limit, shuffle=True, seed=args.seed, transform=Transform(args.size),
            **({"max_pre_download": args.pre_download} if args.pre_download else {}))
        return litdata.StreamingDataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers)
    return read_epochs(make_loader, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    writing = commands.add_parser("write", help="write and upload the chunks")
    writing.add_argument("--photos", type=Path, required=True, help="a folder with train/<class>/<photo>")
    writing.add_argument("--out", type=Path, required=True, help="where the chunks are written")
    writing.add_argument("--remote", required=True, help="s3://bucket/prefix to upload them to")
    writing.add_argument("--chunk-bytes", type=int, required=True, help="about this many bytes a chunk")
    writing.add_argument("--cache-fraction", type=float, required=True, help="the cache limit over the data")
    reading = commands.add_parser("read", help="read them for --epochs")
    reading.add_argument("--remote", help="s3://bucket/prefix, or none to read the chunks in --local as they are")
    reading.add_argument("--local", type=Path, required=True, help="the chunks, or LitData's cache_dir with --remote")
    reading.add_argument("--cache-limit", type=int, help="max_cache_size, bytes (with --remote)")
    reading.add_argument("--pre-download", type=int, help="max_pre_download, chunks (default: LitData's, 2)")
    for name, default in (("epochs", 3), ("batch-size", 32), ("size", 224), ("workers", 2), ("seed", 0)):
        reading.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    print(json.dumps(write(args) if args.command == "write" else read(args)), flush=True)


if __name__ == "__main__":
    main()
