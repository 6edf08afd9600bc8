"""A lock held by another process is told from one this process holds by the file's device and
inode, not its inode alone: the same inode number on another file system (a lock file on tmpfs, a
file of /etc or /sys this process has locked) made the node cache's waiter take the lock for its
own and wait for ever (issue 68.16). Real files on two real file systems, real flocks, a real
holder process; no GPU."""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from fastloader.sources import file_locks
from fastloader.sources.file_locks import LockTimeout, holders, locked

SHM = Path("/dev/shm")


def _inodes_elsewhere(device: int) -> dict[int, str]:
    """Inode -> path of files and folders in /etc and /sys (small, dense inode numbers, the same as a
    fresh tmpfs file's), on devices other than `device`."""
    found: dict[int, str] = {}
    stack = ["/etc", "/sys"]
    while stack and len(found) < 100_000:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif not entry.is_file(follow_symlinks=False):
                    continue
                found.setdefault(entry.inode(), entry.path)
            except OSError:
                pass
    return found


def _same_inode_pair(folder: Path) -> tuple[Path, int] | None:
    """A lock file made in `folder` (tmpfs) and a descriptor of a file on another device with the
    same inode number, flocked (shared) by this process; None where none was found."""
    candidates = _inodes_elsewhere(os.stat(folder).st_dev)
    for number in range(5000):
        path = folder / f"{number}.lock"
        path.touch()
        info = os.stat(path)
        other = candidates.get(info.st_ino)
        if other is None:
            continue
        try:
            fd = os.open(other, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            continue
        there = os.fstat(fd)
        if there.st_ino == info.st_ino and there.st_dev != info.st_dev:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return path, fd
            except OSError:
                pass
        os.close(fd)
    return None


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs /proc/locks (Linux)")
@pytest.mark.timeout(60)
def test_a_lock_this_process_holds_on_another_file_system_is_not_taken_for_the_lock_waited_for(small_disk):
    with tempfile.TemporaryDirectory(dir=SHM if SHM.is_dir() else None) as folder:
        # /dev/shm's inode numbers are small while few files were made there; else a new tmpfs's
        pair = _same_inode_pair(Path(folder)) or _same_inode_pair(small_disk("1m"))
        assert pair is not None, "no file of /etc or /sys has the inode number of a new tmpfs file"
        path, mine = pair
        script = "import fcntl, os, sys; fcntl.flock(os.open(sys.argv[1], os.O_RDWR), fcntl.LOCK_EX); " \
                 "print('locked', flush=True); input()"
        holder = subprocess.Popen([sys.executable, "-c", script, str(path)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "locked"
            assert holders(path) == [holder.pid]  # not this process, whose lock is on the other file
            raised: list[BaseException] = []

            def wait() -> None:
                try:
                    with locked(path, shared=False, patience=file_locks.PROGRESS_EVERY_S, what="a shard's lock"):
                        pass
                except BaseException as error:  # noqa: BLE001 - the test's verdict
                    raised.append(error)

            waiter = threading.Thread(target=wait, daemon=True)
            waiter.start()
            waiter.join(15)
            assert not waiter.is_alive(), "the waiter took the other file's lock for its own and waits for ever"
            assert len(raised) == 1 and isinstance(raised[0], LockTimeout)
            assert f"by process {holder.pid} (" in str(raised[0]) and str(path) in str(raised[0])
        finally:
            holder.stdin.write("\n")
            holder.stdin.flush()
            holder.wait(10)
            os.close(mine)
