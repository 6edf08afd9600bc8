"""flock with a patience: the node cache's locks, waited for only while their holder gets on.

Why: a process of the node that holds a lock and stops (a rank under SIGSTOP, a debugger, a stuck
mount) would freeze every other loader of the node in `flock` for ever, and the only message would
be a watchdog's, blaming a decoder. Here a lock is taken without blocking, again every few
milliseconds, for as long as the holder shows progress (`progress()` changes: a download growing);
past `patience` seconds without it (and held by another process: a thread of this one ends its own
wait within its retry budget), LockTimeout names the lock file, the process that holds it (from
/proc/locks) and what it is doing; a lock that /proc/locks shows no holder of is tried once more
first (a holder that ended, its own budget spent, just as the patience ran out). Lock files are
opened non-blocking and must be regular files: a FIFO planted under a lock's name would block its
open for ever.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import Callable, Iterator

from ..errors import LockTimeout
from ..locations import NotRegularFile, not_regular

POLL_S = 0.02
"""How often a waiter tries the lock again."""
PROGRESS_EVERY_S = 0.5
"""How often a waiter looks for the holder's progress."""


def open_lock_file(path: Path) -> int:
    """A descriptor of a lock file, made where missing: opened non-blocking, a regular file or NotRegularFile."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), 0o644)
    reason = not_regular(os.fstat(fd).st_mode)
    if reason:
        os.close(fd)
        raise NotRegularFile(0, f"{reason}, where the node cache keeps a lock; remove it", str(path))
    return fd


def wait_for(fd: int, shared: bool, patience: float, what: str, path: Path,
             progress: Callable[[], object] | None = None) -> None:
    """flock(fd), waiting while the holder progresses; LockTimeout after `patience` seconds without."""
    operation = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
    seen = progress() if progress else None
    since = looked = time.monotonic()
    while True:
        if _try(fd, operation):
            return
        now = time.monotonic()
        if progress is not None and now - looked >= PROGRESS_EVERY_S:  # a listing of the cache: not every poll
            looked, current = now, progress()
            if current != seen:
                seen, since = current, now
        if now - since > patience:
            pids = holders(path)
            if os.getpid() in pids:  # a thread of this process: its own budget ends its wait
                since = now
                continue
            if not pids and _try(fd, operation):  # let go since the last try (its holder ended): ours
                return
            raise LockTimeout(f"{what} ({path}) has been held for {now - since:.0f} s by {holder(path)}, with no "
                                 f"progress: a stopped or stuck process holds it. Resume or end that process "
                                 f"(kill -CONT PID, or kill PID); if it is a slow download, raise "
                                 f"dataset.remote.retry_timeout")
        time.sleep(POLL_S)


def _try(fd: int, operation: int) -> bool:
    try:
        fcntl.flock(fd, operation)
        return True
    except BlockingIOError:
        return False


@contextlib.contextmanager
def locked(path: Path, shared: bool, patience: float, what: str,
           progress: Callable[[], object] | None = None) -> Iterator[None]:
    fd = open_lock_file(path)
    try:
        wait_for(fd, shared, patience, what, path, progress)
        yield
    finally:
        os.close(fd)


def holders(path: Path) -> list[int]:
    """The processes that hold a lock on this file, as /proc/locks says (empty where it cannot be read).
    A lock is this file's where its device and inode both match (/proc/locks writes them as
    MAJOR:MINOR:INODE, the device numbers in hex): an inode number alone recurs on every file
    system, and a lock this process holds on another one would pass for this file's."""
    try:
        info = os.stat(path)
        with open("/proc/locks") as table:
            pids = [int(fields[4]) for fields in (line.split() for line in table)
                    if len(fields) > 5 and fields[1] in ("FLOCK", "POSIX", "OFDLCK") and _same_file(fields[5], info)
                    and fields[4].lstrip("-").isdigit() and int(fields[4]) > 0]
    except OSError:
        return []
    return list(dict.fromkeys(pids))


def _same_file(where: str, info: os.stat_result) -> bool:
    """Whether /proc/locks' 'MAJOR:MINOR:INODE' (hex device numbers) is the file stat'ed as `info`."""
    major, _, rest = where.partition(":")
    minor, _, inode = rest.partition(":")
    try:
        return (int(inode), int(major, 16), int(minor, 16)) == (info.st_ino, os.major(info.st_dev),
                                                                os.minor(info.st_dev))
    except ValueError:
        return False


def holder(path: Path) -> str:
    """'process 123 (python3 train.py, stopped)': who holds a lock on this file."""
    pids = holders(path)
    if not pids:
        return "another process (its id could not be read from /proc/locks)"
    return ", ".join(f"process {pid} ({_describe(pid)})" for pid in pids)


_STATES = {"T": "stopped", "t": "stopped by a debugger", "D": "waiting on a disk", "Z": "a zombie",
           "S": "sleeping", "R": "running"}


def _describe(pid: int) -> str:
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").replace("\0", " ").split()
        command = " ".join(words)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone, or not visible from here"
    return f"{command[:80] or '?'}, {_STATES.get(state, state)}"
