"""The descriptors of local containers (shards, parquet and Arrow files) that readers share in one
process: kept open up to a cap, and never closed under a thread that reads through one.

Device: CPU (the byte seam is the same for both backends: a DALI loader's driver thread and a torch
loader's main process read through it, two loaders of one process at once).
"""
from __future__ import annotations

import random
import threading

from fastloader.locations import Location
from fastloader.sources import reading

FILES, SIZE, CHUNK = 6, 1 << 16, 4096


def test_threads_reading_more_containers_than_the_cap_each_get_their_own_files_bytes(tmp_path, monkeypatch):
    """With more containers than the cap, one thread's read evicts (closes) the descriptor another
    thread is about to pread: its number then goes to the next file opened, and that reader took the
    other file's bytes as its shard's (or failed with EBADF). Each file here holds one byte value, so a
    read of the wrong file shows."""
    paths = []
    for value in range(FILES):
        path = tmp_path / f"shard{value}.tar"
        path.write_bytes(bytes([value]) * SIZE)
        paths.append(str(path))
    monkeypatch.setattr(reading._open_containers, "limit", 1)
    wrong, failed = [], []

    def read(seed: int) -> None:
        draws = random.Random(seed)
        for _ in range(1500):
            value = draws.randrange(FILES)
            start = draws.randrange(0, SIZE - CHUNK)
            location = Location(f"{paths[value]}:member", paths[value], start, CHUNK)
            try:
                got = reading.read_bytes(location)
            except OSError as error:
                failed.append(f"{location.name}: {error}")
                continue
            if bytes(got) != bytes([value]) * CHUNK:
                wrong.append(f"{location.name} at {start}: bytes of shard{got[0]}.tar")

    threads = [threading.Thread(target=read, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert (wrong[:3], failed[:3], len(wrong) + len(failed)) == ([], [], 0)
    assert len(reading._open_containers.open) == 1  # the cap holds
    assert reading._open_containers.readers == {} and reading._open_containers.retired == set()  # all closed
