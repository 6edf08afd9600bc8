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

With --streaming-python (a Python of its own with MosaicML Streaming installed: Streaming 0.13
pins numpy < 2.2, older than this project's), Streaming reads the same photos the same three ways, in the same rounds:
benchmarks/streaming_peer.py, run by that Python, writes them as MDS shards of about our shards'
size, uploads them to the same server, and reads them with StreamingDataset (py1e shuffle, a block
of as many samples as ours holds; the same cache fraction) in a DataLoader of --workers, with
torchvision's reference train transform. Its bytes per epoch are what the server sent (counted by
the proxy, for ours too); its cache folder's peak size (polled) is checked against its limit.

With --litdata-python (a Python with LitData installed, its own torch), LitData does the same:
benchmarks/litdata_peer.py writes the photos with litdata.optimize as chunks of half our shards'
size (--litdata-chunk-bytes), uploads them, and reads them with StreamingDataset (shuffle=True; max_cache_size: the same
cache fraction) in its StreamingDataLoader of --workers, with the same transform.

    python benchmarks/remote.py --streaming-python /tmp/streaming-venv/bin/python
    python benchmarks/remote.py --litdata-python /tmp/litdata-venv/bin/python
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness
import psutil

from fastloader import build_loader

sys.path.insert(0, str(harness.REPO_ROOT / "tests"))  # the tests' server and proxy, not a copy of them


@dataclasses.dataclass(frozen=True)
class Peer:
    """A loader of another project, run by a Python of its own (--<key>-python) as `script`, its data at `url`."""
    title: str
    module: str
    script: Path
    url: str


PEERS = {"streaming": Peer("Streaming", "streaming", Path(__file__).with_name("streaming_peer.py"), "s3://bench/mds"),
         "litdata": Peer("LitData", "litdata", Path(__file__).with_name("litdata_peer.py"), "s3://bench/litdata")}


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


def measure(config: dict, epochs: int, data_bytes: int, store, server) -> dict:
    """Time to the first batch from build, then images/s, fetches and the server's CPU time of each epoch."""
    began = time.perf_counter()
    loader = build_loader(config, "train")
    built = time.perf_counter()
    rows, first = [], None
    try:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            started, images, server_began, sent = time.perf_counter(), 0, cpu_seconds(server), store.proxy.sent
            for batch, (_, labels) in enumerate(loader):
                if first is None:
                    first = time.perf_counter() - began
                images += len(labels)
            rows.append({"epoch": epoch, "images": images, "seconds": time.perf_counter() - started,
                         "fetched_over_data": loader.stats.fetched_bytes / data_bytes,
                         "sent_over_data": (store.proxy.sent - sent) / data_bytes,
                         "network_wait_s": loader.stats.network_wait_s,
                         "server_cpu_s": cpu_seconds(server) - server_began})
    finally:
        loader.close()
    return {"build_s": built - began, "first_batch_s": first, "epochs": rows, **steady(rows)}


def steady(rows: list[dict]) -> dict:
    """images/s over the epochs after the first, the most fetched in one, the server's share of a core."""
    rows = rows[1:] or rows
    seconds = sum(r["seconds"] for r in rows)
    moved = {key: max(r[key] for r in rows) for key in ("fetched_over_data", "sent_over_data") if key in rows[0]}
    return {"images_per_s": sum(r["images"] for r in rows) / seconds, **moved,
            "server_cpu_share": sum(r["server_cpu_s"] for r in rows) / seconds}


def peer_lines(python: str, script: Path, arguments: list[str], store):
    """The JSON lines a peer's script prints, as it prints them; its error output where it fails. Its
    environment has the server's (AWS_ENDPOINT_URL, which LitData's boto3 reads) and S3_ENDPOINT_URL
    (Streaming's name for it)."""
    with tempfile.TemporaryFile("w+") as errors, subprocess.Popen(
            [python, str(script), *arguments], stdout=subprocess.PIPE, stderr=errors, text=True,
            env={**os.environ, "S3_ENDPOINT_URL": store.endpoint}) as process:
        for line in process.stdout:
            if line.startswith("{"):
                yield json.loads(line)
        if process.wait():
            errors.seek(0)
            raise RuntimeError(f"{script.name} {arguments[0]} exited {process.returncode}: {errors.read()[-3000:]}")


def measure_peer(python: str, script: Path, arguments: list[str], epochs: int, data_bytes: int, store,
                 server) -> dict:
    """A peer's run: it times its epochs; the server's bytes sent and CPU time are read here as each
    epoch's line arrives (its DataLoader's workers have ended by then)."""
    rows, last, sent, cpu = [], {}, store.proxy.sent, cpu_seconds(server)
    for line in peer_lines(python, script, ["read", *arguments, "--epochs", str(epochs)], store):
        if "epoch" not in line:
            last = line
            continue
        rows.append({**line, "sent_over_data": (store.proxy.sent - sent) / data_bytes,
                     "server_cpu_s": cpu_seconds(server) - cpu})
        sent, cpu = store.proxy.sent, cpu_seconds(server)
    return {**last, "epochs": rows, **steady(rows)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_data_argument(parser)
    harness.add_backends_argument(parser)
    parser.add_argument("--epochs", type=int, default=3, help="epochs per way (default: 3; the first warms up)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds of every way, their order reversed each round; the median is shown")
    parser.add_argument("--copies", type=int, default=4, help="the photos this many times over (default: 4)")
    parser.add_argument("--per-shard", type=int, default=100, help="samples per shard (default: 100: 16 shards)")
    parser.add_argument("--cache-fraction", type=float, default=0.25,
                        help="the node cache's limit over the data's bytes (default: 0.25)")
    parser.add_argument("--latency-ms", type=float, default=30.0, help="added before each request (default: 30)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers or DALI threads (default: 2)")
    parser.add_argument("--streaming-python", help="a Python with mosaicml-streaming installed, to measure it beside")
    parser.add_argument("--streaming-predownload", type=int,
                        help="samples each Streaming worker downloads ahead (default: Streaming's, 8 batches)")
    parser.add_argument("--litdata-python", help="a Python with litdata installed, to measure it beside")
    parser.add_argument("--litdata-pre-download", type=int,
                        help="LitData's max_pre_download, chunks (default: LitData's, 2)")
    parser.add_argument("--litdata-chunk-bytes", type=int,
                        help="LitData's chunk_bytes (default: half our shards' size; at their size, 4 chunks in "
                             "the cache, LitData 0.2.76's 2 workers wait on each other until its 120 s timeout)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    data = harness.check_data(parser, args.data, ["train"])
    backends = harness.usable_backends(parser, args.backends)
    if shutil.which("moto_server", path=os.path.dirname(sys.executable)) is None:
        parser.error("moto's server is not installed here: pip install 'moto[server]' (in the test extra)")
    skipped = {key: harness.missing_peer(getattr(args, f"{key}_python"), f"--{key}-python", peer.module)
               for key, peer in PEERS.items()}
    for key, why in skipped.items():
        if why:
            print(f"skipped {PEERS[key].title}: {why}")
    from objectstore import start_server, stop_server
    from remotefiles import uploaded

    results: dict = {"backends": {}, **{key: {"skipped": why} for key, why in skipped.items()}}
    with tempfile.TemporaryDirectory(prefix="remote_bench_") as work:
        work = Path(work)
        shards = pack(copied(data, work / "photos", args.copies), work / "shards", args.per_shard)
        data_bytes = sum(p.stat().st_size for p in shards)
        cache_limit = int(data_bytes * args.cache_fraction)
        block = cache_limit // 2  # what a remote split takes by default: two blocks fit the cache
        store = start_server()
        try:
            url = uploaded(store, "bench", work / "shards", prefix="shards")  # as the tests upload
            os.environ.update(store.environment())
            results.update(shards=len(shards), data_bytes=data_bytes, cache_limit=cache_limit,
                           latency_ms=args.latency_ms, cores=os.cpu_count(), date=time.strftime("%Y-%m-%d"))
            print(f"{len(shards)} shards, {data_bytes / 1e6:.1f} MB; node cache {cache_limit / 1e6:.1f} MB "
                  f"({args.cache_fraction:g} of the data), blocks of {block / 1e6:.1f} MB; "
                  f"batch {args.batch_size} at {args.size} px; {args.workers} workers; {os.cpu_count()} cores")
            ways = {"local": None, "remote": 0.0, f"remote +{args.latency_ms:g}ms": args.latency_ms / 1000}
            settings = {}
            if not skipped["streaming"]:
                settings["streaming"] = write_streaming(args, work, store, data_bytes / len(shards), block / data_bytes)
            if not skipped["litdata"]:
                settings["litdata"] = write_litdata(args, work, store, data_bytes / len(shards) / 2)
            loaders = [*backends, *settings]
            server = psutil.Process(store.process.pid)
            runs = {(loader, way): [] for loader in loaders for way in ways}
            for number in range(args.rounds):
                for loader, way in (list(runs) if number % 2 == 0 else list(runs)[::-1]):
                    latency = ways[way]
                    store.proxy.latency = latency or 0.0
                    node = work / f"node-{loader}-{number}-{way.replace(' ', '')}"  # a fresh node cache each time
                    if loader in settings:
                        setting, peer = settings[loader], PEERS[loader]
                        where = (["--local", setting["local"]] if latency is None else
                                 ["--remote", peer.url, "--local", str(node),
                                  "--cache-limit", str(setting["cache_limit"])])
                        result = measure_peer(getattr(args, f"{loader}_python"), peer.script,
                                              [*where, *setting["arguments"]], args.epochs, setting["data_bytes"],
                                              store, server)
                    else:
                        at, remote = (str(work / "shards"), None) if latency is None else (
                            url, {"cache_dir": str(node), "cache_limit": f"{cache_limit}B"})
                        config = config_for(loader, f"{at}/train-*.tar", block, args, remote)
                        result = measure(config, args.epochs, data_bytes, store, server)
                    runs[loader, way].append(result)
                    print(f"round {number + 1} of {args.rounds}: {loader} {way}: {result['images_per_s']:.1f} images/s",
                          flush=True)
            summaries = {loader: {way: median_run(runs[loader, way]) for way in ways} for loader in loaders}
        finally:
            stop_server(store)
    for backend in backends:
        results["backends"][backend] = summaries[backend]
        show(backend, summaries[backend])
    for key, setting in settings.items():
        results[key] = {**setting, "skipped": None, "ways": summaries[key]}
        show_peer(PEERS[key].title, setting, summaries[key], results["backends"])
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def write_streaming(args: argparse.Namespace, work: Path, store, shard_bytes: float, block_share: float) -> dict:
    """The photos as MDS shards of about our shards' size, uploaded; the arguments every read of them takes
    (py1e's block: as many samples as our block holds)."""
    peer = PEERS["streaming"]
    (setting,) = peer_lines(args.streaming_python, peer.script, [
        "write", "--photos", str(work / "photos"), "--out", str(work / "mds"), "--remote", peer.url,
        "--shard-bytes", str(int(shard_bytes)), "--cache-fraction", str(args.cache_fraction)], store)
    setting["local"] = str(work / "mds")
    setting["block_samples"] = max(1, round(block_share * setting["samples"]))
    setting["arguments"] = ["--block-samples", str(setting["block_samples"]), "--batch-size", str(args.batch_size),
                            "--size", str(args.size), "--workers", str(args.workers)]
    if args.streaming_predownload:
        setting["arguments"] += ["--predownload", str(args.streaming_predownload)]
    print(f"Streaming: {setting['shards']} MDS shards, {setting['data_bytes'] / 1e6:.1f} MB; cache limit "
          f"{setting['cache_limit'] / 1e6:.1f} MB; py1e blocks of {setting['block_samples']} samples; "
          f"predownload {args.streaming_predownload or 'Streaming default'}")
    return setting


def write_litdata(args: argparse.Namespace, work: Path, store, chunk_bytes: float) -> dict:
    """The photos as LitData chunks (litdata.optimize) of --litdata-chunk-bytes, else `chunk_bytes`,
    uploaded; the arguments every read of them takes."""
    peer = PEERS["litdata"]
    (setting,) = peer_lines(args.litdata_python, peer.script, [
        "write", "--photos", str(work / "photos"), "--out", str(work / "litdata"), "--remote", peer.url,
        "--chunk-bytes", str(args.litdata_chunk_bytes or int(chunk_bytes)),
        "--cache-fraction", str(args.cache_fraction)], store)
    setting["local"] = str(work / "litdata")
    setting["arguments"] = ["--batch-size", str(args.batch_size), "--size", str(args.size),
                            "--workers", str(args.workers)]
    if args.litdata_pre_download:
        setting["arguments"] += ["--pre-download", str(args.litdata_pre_download)]
    print(f"LitData: {setting['shards']} chunks, {setting['data_bytes'] / 1e6:.1f} MB; max_cache_size "
          f"{setting['cache_limit'] / 1e6:.1f} MB; max_pre_download {args.litdata_pre_download or 'LitData default'}")
    return setting


def median_run(runs: list[dict]) -> dict:
    """Each figure's median over the rounds, and the rounds themselves."""
    figures = [key for key, value in runs[0].items() if type(value) in (int, float) and key != "cache_peak_bytes"]
    summary = {key: statistics.median(run[key] for run in runs) for key in figures}
    if "network_wait_s" in runs[0]["epochs"][0]:
        summary["network_wait_s"] = statistics.median(sum(r["network_wait_s"] for r in run["epochs"][1:])
                                                      for run in runs)
    if "cache_peak_bytes" in runs[0]:  # a peer's, over the rounds: the largest, and whether all kept the limit
        summary["cache_peak_bytes"] = max(run["cache_peak_bytes"] for run in runs)
        summary["cache_limit_respected"] = all(run["cache_limit_respected"] for run in runs)
    return {**summary, "rounds": runs}


def show(backend: str, ways: dict) -> None:
    local = ways["local"]["images_per_s"]
    for way, result in ways.items():
        moved = "local disk" if way == "local" else (f"{result['fetched_over_data']:.2f}x the data fetched an epoch "
                                                     f"({result['sent_over_data']:.2f}x sent)")
        print(f"{backend:5} {way:14} first batch {result['first_batch_s']:5.2f} s, "
              f"{result['images_per_s']:6.1f} images/s ({result['images_per_s'] / local:.2f}x local), {moved}, "
              f"waited {result['network_wait_s']:.2f} s on the network after epoch 0, "
              f"server busy {result['server_cpu_share']:.2f} of a core")


def show_peer(title: str, setting: dict, ways: dict, ours: dict) -> None:
    """A peer's rows, its images/s over its own local way's and over ours (local, and the same way)."""
    for way, result in ways.items():
        speed = result["images_per_s"]
        ratios = [f"{speed / ways['local']['images_per_s']:.2f}x local"] + [
            f"{speed / ours[backend][against]['images_per_s']:.2f}x {backend} {against}"
            for backend in ours for against in dict.fromkeys(("local", way))]
        moved = "local disk" if way == "local" else (
            f"{result['sent_over_data']:.2f}x the data sent an epoch, cache folder's peak "
            f"{result['cache_peak_bytes'] / 1e6:.1f} MB of its limit {setting['cache_limit'] / 1e6:.1f} MB")
        print(f"{title} {way:14} first batch {result['first_batch_s']:5.2f} s, {speed:6.1f} images/s "
              f"({', '.join(ratios)}), {moved}, server busy {result['server_cpu_share']:.2f} of a core")


if __name__ == "__main__":
    sys.exit(main())
