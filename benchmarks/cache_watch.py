"""The largest size a peer's cache folder reaches, polled, and the timed epochs both peers read with it:
Streaming's and LitData's peers run in Pythons of their own (benchmarks/streaming_peer.py,
benchmarks/litdata_peer.py), so this imports only the standard library."""
from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterable


class Watcher(threading.Thread):
    """The largest total size of the files under `folder` seen, polled every 20 ms: a lower bound of
    the true peak."""

    def __init__(self, folder: Path):
        super().__init__(daemon=True)
        self.folder, self.peak, self.done = folder, 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.02):
            sizes = []
            for root, _, files in os.walk(self.folder):
                for name in files:
                    try:
                        sizes.append(os.path.getsize(os.path.join(root, name)))
                    except FileNotFoundError:  # evicted or renamed under us
                        pass
            self.peak = max(self.peak, sum(sizes))

    def stop(self) -> int:
        """The peak seen, once polling has ended."""
        self.done.set()
        self.join()
        return self.peak


def read_epochs(make_loader: Callable[[], Iterable], args: argparse.Namespace) -> dict:
    """`args.epochs` epochs of the loader `make_loader` builds, a JSON line each (images, seconds); the
    first batch timed from before the loader is made, and with `args.remote` the peak of the cache
    folder `args.local` against `args.cache_limit`."""
    watcher = Watcher(args.local)
    if args.remote:
        watcher.start()
    began = time.perf_counter()
    loader = make_loader()
    first = None
    for epoch in range(args.epochs):
        started, images = time.perf_counter(), 0
        for _, labels in loader:
            first = first or time.perf_counter() - began
            images += len(labels)
        print(json.dumps({"epoch": epoch, "images": images, "seconds": time.perf_counter() - started}), flush=True)
    if not args.remote:
        return {"first_batch_s": first}
    peak = watcher.stop()
    return {"first_batch_s": first, "cache_peak_bytes": peak, "cache_limit_respected": peak <= args.cache_limit}
