"""The node cache's locks and files against the libraries that could replace them (issue 71): py-filelock
for `sources/file_locks.py`, fsspec's caching filesystems for `sources/node_cache.py`.

Measured, each on real files and real processes:
  1. lock cost: one exclusive flock taken and let go on a lock file (what a shard's fetch lock costs
     a reader that misses), ours (`file_locks.locked`) against filelock.FileLock (a new object per
     take, as a lock per shard would be; and one object kept per file);
  2. a killed holder: the lock is taken at once by both after SIGKILL (the kernel drops a flock);
  3. a stopped holder (SIGSTOP) and a bounded wait: what each raises, and whether it names the holder;
  4. fsspec's simplecache and filecache over HTTP (aiohttp, a local server that counts GETs): a
     downloader killed midway, then a reader; and 4 processes opening one uncached file at once.

    python benchmarks/cache_libraries.py            # ~30 s
"""
from __future__ import annotations

import argparse
import http.server
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import filelock  # noqa: E402
import fsspec  # noqa: E402

from fastloader.errors import LockTimeout  # noqa: E402
from fastloader.sources import file_locks  # noqa: E402

SIZE = 16 << 20
CHUNK = 1 << 20
CHUNK_PAUSE_S = 0.05


def lock_cost(folder: Path, files: int = 500, rounds: int = 10) -> None:
    paths = [folder / f"{i}.lock" for i in range(files)]
    for path in paths:
        path.touch()
    kept = [filelock.FileLock(str(path)) for path in paths]
    takes = files * rounds

    def ours():
        for _ in range(rounds):
            for path in paths:
                with file_locks.locked(path, False, 20.0, "a lock"):
                    pass

    def theirs_new():
        for _ in range(rounds):
            for path in paths:
                with filelock.FileLock(str(path), timeout=20.0):
                    pass

    def theirs_kept():
        for _ in range(rounds):
            for lock in kept:
                with lock:
                    pass

    for name, run in (("ours: file_locks.locked", ours), ("filelock.FileLock, a new one per take", theirs_new),
                      ("filelock.FileLock, one kept per file", theirs_kept)):
        run()  # warm
        best = min(_timed(run) for _ in range(3))
        print(f"  {name:40s} {best / takes * 1e6:6.1f} us per take and release ({takes} takes, best of 3)")


def _timed(run) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def _holder(path: Path) -> subprocess.Popen:
    script = ("import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
              "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(600)\n")
    process = subprocess.Popen([sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "locked"
    return process


def held_by_others(folder: Path) -> None:
    path = folder / "held.lock"
    process = _holder(path)
    process.kill()
    process.wait()
    started = time.perf_counter()
    with file_locks.locked(path, False, 5.0, "a lock"):
        ours = time.perf_counter() - started
    started = time.perf_counter()
    with filelock.FileLock(str(path), timeout=5.0):
        theirs = time.perf_counter() - started
    print(f"  killed holder: ours took it in {ours * 1e3:.2f} ms, filelock in {theirs * 1e3:.2f} ms (flock: the kernel "
          f"lets go)")
    process = _holder(path)
    os.kill(process.pid, signal.SIGSTOP)
    try:
        for name, take in (("ours", lambda: file_locks.locked(path, False, 1.0, "the fetch lock of s3://b/x.tar")),
                           ("filelock", lambda: filelock.FileLock(str(path), timeout=1.0))):
            started = time.perf_counter()
            try:
                with take():
                    pass
            except (LockTimeout, filelock.Timeout) as error:
                print(f"  stopped holder, {name}: after {time.perf_counter() - started:.1f} s, "
                      f"{type(error).__name__}: {error}")
    finally:
        os.kill(process.pid, signal.SIGKILL)
        os.kill(process.pid, signal.SIGCONT)
        process.wait()


class _Slow(http.server.BaseHTTPRequestHandler):
    """One object of SIZE bytes, sent a MiB at a time with a pause (a download one can kill midway)."""
    gets = 0
    body = bytes(range(256)) * (SIZE // 256)

    def do_HEAD(self):
        self._head()

    def do_GET(self):
        type(self).gets += 1
        self._head()
        try:
            for start in range(0, SIZE, CHUNK):
                self.wfile.write(self.body[start:start + CHUNK])
                time.sleep(CHUNK_PAUSE_S)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _head(self):
        self.send_response(200)
        self.send_header("Content-Length", str(SIZE))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()

    def log_message(self, *args):
        pass


_READ = ("import fsspec, sys\n"
         "with fsspec.open(f'{sys.argv[1]}::' + sys.argv[2], **{sys.argv[1]: {'cache_storage': sys.argv[3]}}) as f:\n"
         "    print(len(f.read()), flush=True)\n")


def _reader(kind: str, url: str, storage: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _READ, kind, url, str(storage)], stdout=subprocess.PIPE, text=True)


def _bytes_in(storage: Path) -> int:
    return sum(p.stat().st_size for p in storage.glob("*") if p.is_file() and not p.name.startswith("cache"))


def fsspec_caches(folder: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/shard.tar"
    for kind in ("simplecache", "filecache"):
        storage = folder / f"{kind}-killed"
        killed = _reader(kind, url, storage)
        deadline = time.monotonic() + 60
        while not _bytes_in(storage) and time.monotonic() < deadline:  # killed once some bytes are written
            time.sleep(0.01)
        killed.kill()
        killed.wait()
        after = _reader(kind, url, storage)
        got = int(after.stdout.readline() or -1)
        after.wait()
        print(f"  {kind}, downloader killed after its first write, then a reader: read {got} of {SIZE} bytes"
              f"{', no error' if got != SIZE else ''}")
        storage = folder / f"{kind}-four"
        _Slow.gets = 0
        readers = []
        for _ in range(4):
            readers.append(_reader(kind, url, storage))
            time.sleep(0.2)  # each starts while the first downloads
        sizes = [int(reader.stdout.readline() or -1) for reader in readers]
        for reader in readers:
            reader.wait()
        print(f"  {kind}, 4 processes opening one uncached file 0.2 s apart: {_Slow.gets} GET requests; "
              f"bytes each read: {sizes}")
    server.shutdown()


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    print(f"filelock {filelock.__version__}, fsspec {fsspec.__version__}, {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        print("1. lock cost")
        lock_cost(folder)
        print("2-3. killed and stopped holders")
        held_by_others(folder)
        print("4. fsspec's caches")
        fsspec_caches(folder)


if __name__ == "__main__":
    main()
