"""Fetching ahead into the node cache: the shards an epoch will read, in the order it reads them,
downloaded by `dataset.remote.concurrency` threads while the cache's limit holds them besides those
still to be read. It runs in the process that opened the cache (node_cache.py), for its forked
readers too, which then find each shard complete on the disk.
"""
from __future__ import annotations

import logging
import threading
from typing import Sequence

import numpy as np

from ..locations import Identity, Location
from ..machine import human_bytes
from ..words import plural
from . import remote
from .node_cache import NodeCache, cache_of, info_of

log = logging.getLogger("fastloader")


class Plan:
    """The shards one epoch of one loader will read, fetched ahead in the order of their first read
    by `concurrency` threads: a shard starts downloading once it fits the limit besides the shards
    fetched before it that are still to be read (a shard is read until its last sample's position);
    those stay protected from this process's evictions. The trainer's position (`reached`) frees them.
    The first shard goes first: the first batch waits for its own shard, not for the others."""

    def __init__(self, cache: NodeCache, infos: list[remote.ObjectInfo], last: np.ndarray, label: str):
        self.cache: NodeCache | None = cache
        self.infos, self.last = infos, last.tolist()
        self.position = 0
        self.next = 0
        self.held: dict[int, int] = {}  # container (in first-read order) -> its size, while it is still to be read
        self.cancelled = False
        self.condition = threading.Condition()
        self.failures: list[str] = []
        self.names = [cache.entry(info).name for info in infos]
        """Each shard's entry name, made once: a plan cancelled while the interpreter exits (a loop left
        mid-epoch) may no longer have hashlib to name them with."""
        present = sum((cache.folder / name).exists() for name in self.names)
        total = sum(info.size for info in infos)
        log.log(logging.INFO if present < len(infos) else logging.DEBUG,  # quiet once all are here
                "%s: %s (%s) to read from %s, %d already in the node cache %s (limit %s); fetching ahead, %d at "
                "a time", label, plural(len(infos), "shard"), human_bytes(total),
                remote.common_root([i.url for i in infos]), present, cache.folder, human_bytes(cache.limit),
                cache.concurrency)
        self.threads = [threading.Thread(target=self._work, name=f"fastloader-fetch-{i}", daemon=True)
                        for i in range(min(cache.concurrency, len(infos)))]
        for thread in self.threads:
            thread.start()

    def reached(self, position: int) -> None:
        """The trainer has consumed this many of the epoch's samples on this rank."""
        with self.condition:
            self.position = position
            done = [c for c in self.held if self.last[c] < position]
            if done:
                for c in done:
                    self._release(c)
                self.condition.notify_all()

    def _release(self, container: int) -> None:
        self.held.pop(container, None)
        self.cache.space.protected.release(self.names[container])

    def _take(self) -> int | None:
        with self.condition:
            while True:
                if self.cancelled or self.next >= len(self.infos):
                    return None
                container = self.next
                size = self.infos[container].size
                if self.last[container] < self.position:  # read already (on demand)
                    self.next += 1
                    continue
                if not self.held or sum(self.held.values()) + size <= self.cache.limit:
                    self.next += 1
                    self.held[container] = size
                    self.cache.space.protected.hold(self.names[container])
                    return container
                self.condition.wait(1.0)

    def _work(self) -> None:
        cache = self.cache  # this thread's, while it fetches: a cancelled plan lets go of its own
        while cache is not None:
            container = self._take()
            if container is None:
                return
            try:  # not once cancelled, though taken before (a thread may run late): a closed loader fetches nothing
                cache.ensure(self.infos[container], reader=False, wanted=lambda: not self.cancelled)
            except Exception as error:  # noqa: BLE001 - the reader that needs it meets it, named
                self.failures.append(str(error))
                log.debug("fetching %s ahead failed: %s", self.infos[container].url, error)

    def cancel(self) -> None:
        with self.condition:
            self.cancelled = True
            for container in list(self.held):
                self._release(container)
            self.cache = None  # a closed loader keeps its last plan: not the cache, which goes at its last release
            self.condition.notify_all()


def plan(files: Sequence[str], identities: Sequence[Identity] | None, sequence: np.ndarray,
         label: str, token: str) -> Plan | None:
    """A Plan for reading files[sequence[0]], files[sequence[1]] ... (one entry per sample, in the
    order this rank reads them); None when nothing is to be read."""
    if not len(sequence):
        return None
    order, first = np.unique(sequence, return_index=True)
    last = len(sequence) - 1 - np.unique(sequence[::-1], return_index=True)[1]
    by_first = np.argsort(first, kind="stable")
    infos = []
    cache = cache_of(token)
    for container in order[by_first].tolist():
        identity = identities[container] if identities is not None else None
        infos.append(info_of(Location(files[container], files[container], 0, 0, 0, identity), cache.client))
    return Plan(cache, infos, last[by_first], label)
