"""Shards in an object store against the same shards on local disk (issue 35's point 8).

The real photos' train split, --copies times over, is packed with `fastloader pack` (shards of
--per-shard samples, an index beside each) and served by a real S3-compatible server started here
(moto's server mode, behind the tests' TCP proxy: tests/objectstore.py), on 127.0.0.1. Per backend,
the same config reads them three ways, `shuffle: block` with the same block size each time so that
all three read the same order:

- `local`: the shards on local disk;
- `remote`: from the server, through a node cache of a quarter of the data (--cache-fraction), so
  that every epoch fetches the data again;
- `remote +Nms`: the same with --latency-ms added by the proxy before each request, a stand-in for a
  store in another building.

Per way, the median over --rounds (the ways' order reversed each round): the time from build to the
first batch (a fresh node cache: the first shard fetched), images/s over the epochs after the first,
bytes fetched per epoch over the dataset's bytes (goal: <= 1.05 with a quarter cache), the seconds
readers waited for shards, and the server's CPU time over the epochs' time: the server runs on the
same cores as the loader here, where a real store would not. The ratios printed are remote / local
images/s in the same run (goal >= 0.9 at steady state).

    python benchmarks/remote.py
    python benchmarks/remote.py --backends torch --epochs 4 --latency-ms 30 --json remote.json

MosaicML Streaming and LitData are not measured beside it: neither installs into this project's
Python here without replacing its torch (see docs/performance.md).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import harness
import psutil

from fastloader import build_loader

sys.path.insert(0, str(harness.REPO_ROOT / "tests"))  # the tests' server and proxy, not a copy of them


def copied(data: Path, folder: Path, copies: int) -> Path:
    """The train split's photos `copies` times over (a copy of each file per round), as a folder:
    blocks then hold more samples than the loader reads ahead, as blocks of real shards of thousands
    of samples do."""
    for path in sorted((data / "train").rglob("*")):
        if path.is_file():
            target = folder / "train" / path.relative_to(data / "train")
            target.parent.mkdir(parents=True, exist_ok=True)
            for number in range(copies):
                shutil.copyfile(path, target.with_name(f"{target.stem}_{number}{target.suffix}"))
    return folder


def pack(data: Path, out: Path, per_shard: int) -> list[Path]:
    """The train split as shards of `per_shard` photos, with `fastloader pack` (its index beside each)."""
    command = shutil.which("fastloader", path=os.path.dirname(sys.executable)) or "fastloader"
    subprocess.run([command, "pack", str(harness.CONFIG), "--split", "train", "--out", str(out),
                    "--per-shard", str(per_shard), "--set", f"dataset.root={data}"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return sorted(out.glob("train-*.tar"))


def upload(store, folder: Path) -> str:
    """Every file of `folder` under s3://bench/shards/, straight to the server; that URL."""
    import obstore
    from objectstore import ACCESS_KEY, REGION, SECRET_KEY
    from obstore.store import S3Store

    store.make_bucket("bench")
    bucket = S3Store("bench", endpoint=store.server, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY,
                     region=REGION, client_options={"allow_http": True})
    files = sorted(p for p in folder.iterdir() if p.is_file())
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: obstore.put(bucket, f"shards/{p.name}", p.read_bytes()), files))
    return "s3://bench/shards"


def config_for(backend: str, shards: str, block_bytes: int, args: argparse.Namespace,
               remote: dict | None = None) -> dict:
    config = {"backend": backend, "seed": 0, "output": {"device": "cpu"},
              "dataset": {"format": "webdataset", **({"remote": remote} if remote else {})},
              "workers": {"num_workers": args.workers},
              "dali": {"threads": args.workers},
              "train": {"shards": shards, "batch_size": args.batch_size, "shuffle": "block",
                        "block_size": f"{block_bytes}B", "transform": {"size": args.size}}}
    return config


def cpu_seconds(process) -> float:
    """The CPU time of the server so far: it shares this machine's cores with the loader, where a
    real store would not."""
    times = process.cpu_times()
    return times.user + times.system


def measure(config: dict, epochs: int, data_bytes: int, server) -> dict:
    """Time to the first batch from build, then images/s, fetches and the server's CPU time of each epoch."""
    began = time.perf_counter()
    loader = build_loader(config, "train")
    built = time.perf_counter()
    rows, first = [], None
    try:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            started, images, server_began = time.perf_counter(), 0, cpu_seconds(server)
            for batch, (_, labels) in enumerate(loader):
                if first is None:
                    first = time.perf_counter() - began
                images += len(labels)
            seconds = time.perf_counter() - started
            rows.append({"epoch": epoch, "images": images, "images_per_s": images / seconds,
                         "fetched_over_data": loader.stats.fetched_bytes / data_bytes,
                         "network_wait_s": loader.stats.network_wait_s,
                         "server_cpu_s": cpu_seconds(server) - server_began, "seconds": seconds})
    finally:
        loader.close()
    steady = rows[1:] or rows
    return {"build_s": built - began, "first_batch_s": first, "epochs": rows,
            "images_per_s": sum(r["images"] for r in steady) / sum(r["images"] / r["images_per_s"] for r in steady),
            "fetched_over_data": max(r["fetched_over_data"] for r in steady),
            "server_cpu_share": sum(r["server_cpu_s"] for r in steady) / sum(r["seconds"] for r in steady)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_data_argument(parser)
    harness.add_backends_argument(parser)
    parser.add_argument("--epochs", type=int, default=3, help="epochs per way (default: 3; the first warms up)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds of the three ways, their order reversed each round; the median is shown")
    parser.add_argument("--copies", type=int, default=4, help="the photos this many times over (default: 4)")
    parser.add_argument("--per-shard", type=int, default=100, help="samples per shard (default: 100: 16 shards)")
    parser.add_argument("--cache-fraction", type=float, default=0.25,
                        help="the node cache's limit over the data's bytes (default: 0.25)")
    parser.add_argument("--latency-ms", type=float, default=30.0, help="added before each request (default: 30)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers or DALI threads (default: 2)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    data = harness.check_data(parser, args.data, ["train"])
    backends = harness.usable_backends(parser, args.backends)
    if shutil.which("moto_server", path=os.path.dirname(sys.executable)) is None:
        parser.error("moto's server is not installed here: pip install 'moto[server]' (in the test extra)")
    from objectstore import start_server, stop_server

    results: dict = {"backends": {}}
    with tempfile.TemporaryDirectory(prefix="remote_bench_") as work:
        work = Path(work)
        shards = pack(copied(data, work / "photos", args.copies), work / "shards", args.per_shard)
        data_bytes = sum(p.stat().st_size for p in shards)
        cache_limit = int(data_bytes * args.cache_fraction)
        block = cache_limit // 2  # what a remote split takes by default: two blocks fit the cache
        store = start_server()
        try:
            url = upload(store, work / "shards")
            os.environ.update(store.environment())
            results.update(shards=len(shards), data_bytes=data_bytes, cache_limit=cache_limit,
                           latency_ms=args.latency_ms, cores=os.cpu_count(), date=time.strftime("%Y-%m-%d"))
            print(f"{len(shards)} shards, {data_bytes / 1e6:.1f} MB; node cache {cache_limit / 1e6:.1f} MB "
                  f"({args.cache_fraction:g} of the data), blocks of {block / 1e6:.1f} MB; "
                  f"batch {args.batch_size} at {args.size} px; {args.workers} workers; {os.cpu_count()} cores")
            server = psutil.Process(store.process.pid)
            for backend in backends:
                ways = {"local": None, "remote": 0.0, f"remote +{args.latency_ms:g}ms": args.latency_ms / 1000}
                runs = {way: [] for way in ways}
                for number in range(args.rounds):
                    for way in (list(ways) if number % 2 == 0 else list(ways)[::-1]):
                        latency = ways[way]
                        if latency is None:
                            config = config_for(backend, str(work / "shards" / "train-*.tar"), block, args)
                        else:
                            store.proxy.latency = latency
                            node = work / f"node-{backend}-{number}-{way.replace(' ', '')}"  # fresh each time
                            config = config_for(backend, f"{url}/train-*.tar", block, args,
                                                {"cache_dir": str(node), "cache_limit": f"{cache_limit}B"})
                        runs[way].append(measure(config, args.epochs, data_bytes, server))
                results["backends"][backend] = summary = {way: median_run(rows) for way, rows in runs.items()}
                show(backend, summary)
        finally:
            stop_server(store)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def median_run(runs: list[dict]) -> dict:
    """Each figure's median over the rounds, and the rounds themselves."""
    keys = ("build_s", "first_batch_s", "images_per_s", "fetched_over_data", "server_cpu_share")
    return {**{key: statistics.median(run[key] for run in runs) for key in keys},
            "network_wait_s": statistics.median(sum(r["network_wait_s"] for r in run["epochs"][1:]) for run in runs),
            "rounds": runs}


def show(backend: str, ways: dict) -> None:
    local = ways["local"]["images_per_s"]
    for way, result in ways.items():
        fetched = f"{result['fetched_over_data']:.2f}x the data fetched an epoch" if way != "local" else "local disk"
        print(f"{backend:5} {way:14} first batch {result['first_batch_s']:5.2f} s, "
              f"{result['images_per_s']:6.1f} images/s ({result['images_per_s'] / local:.2f}x local), {fetched}, "
              f"waited {result['network_wait_s']:.2f} s on the network after epoch 0, "
              f"server busy {result['server_cpu_share']:.2f} of a core")


if __name__ == "__main__":
    sys.exit(main())
