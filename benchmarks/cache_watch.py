"""The largest size a peer's cache folder reaches, polled: Streaming's and LitData's peers run in Pythons
of their own (benchmarks/streaming_peer.py, benchmarks/litdata_peer.py), so this imports only the
standard library."""
from __future__ import annotations

import os
import threading
from pathlib import Path


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
