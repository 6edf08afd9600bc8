"""The machine a measurement ran on, and the memory of a process and its workers.

`fastloader bench` and the scripts in benchmarks/ print their numbers with the hardware they come
from, so that results can be compared across machines. Memory is read through psutil, which knows
each platform's source (on Linux, /proc/PID/status and smaps_rollup).
"""
from __future__ import annotations

import os
import platform
from dataclasses import astuple, dataclass
from importlib import metadata

import psutil


def hardware() -> dict:
    """What throughput depends on: the CPU and the cores this process may use, the library
    versions, and the GPU where there is one."""
    import PIL
    import torch
    info = {"cpu": cpu_model(), "cpu_cores": usable_cores(), "cpu_count": os.cpu_count(),
            "machine": platform.machine(), "python": platform.python_version(), "torch": torch.__version__,
            "torchvision": installed_version("torchvision"), "pillow": PIL.__version__,
            "torch_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def installed_version(package: str) -> str:
    """A package's installed version, read from its metadata: importing torchvision to ask takes
    about 2 s (its models import torch._dynamo), a third of a short command's run."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def cpu_model() -> str:
    """The CPU's marketing name ("AMD EPYC 7B13"); Linux names it in /proc/cpuinfo only."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def usable_cores() -> int:
    """The cores this process may run on (a container or taskset can allow fewer than the machine has)."""
    try:
        return len(psutil.Process().cpu_affinity())
    except (AttributeError, psutil.Error):  # macOS has no CPU affinity
        return psutil.cpu_count() or 1


@dataclass(frozen=True)
class Memory:
    """Bytes of resident memory, summed over one or more processes.

    pss: proportional set size, each shared page divided among the processes sharing it, so that a
    sum over a parent and its forked workers counts shared pages once (RSS where the platform has no
    PSS: macOS, Windows). anonymous: heap and private copies. shared: pages backed by files or shared
    memory (mapped files such as the uint8 cache, libraries, torch's shared-memory batches), which
    the page cache holds once for every process that maps them."""

    rss: int = 0
    pss: int = 0
    anonymous: int = 0
    shared: int = 0

    def __add__(self, other: Memory) -> Memory:
        return Memory(*(a + b for a, b in zip(astuple(self), astuple(other))))


def process_memory(pid: int | None = None) -> Memory:
    """One process's memory (this one by default). Reading PSS takes ~10 ms for a large process."""
    full = psutil.Process(pid).memory_full_info()
    shared = getattr(full, "shared", 0)
    return Memory(rss=full.rss, pss=getattr(full, "pss", full.rss), anonymous=full.rss - shared, shared=shared)


def descendant_pids(pid: int | None = None) -> list[int]:
    """The processes a process started, and theirs (DataLoader workers, screening processes)."""
    return sorted(child.pid for child in psutil.Process(pid).children(recursive=True))


def tree_memory(pid: int | None = None, include_root: bool = True) -> Memory:
    """The memory of a process (this one by default) and all its descendants, summed; without the
    process itself where `include_root` is false (its workers only). A process that ends while it
    is read counts nothing."""
    root = psutil.Process(pid).pid
    total = Memory()
    for member in ([root] if include_root else []) + descendant_pids(root):
        try:
            total += process_memory(member)
        except psutil.Error:  # gone meanwhile, or not ours to read
            continue
    return total


def human_bytes(count: int) -> str:
    """1536 -> '1.5 KiB': a size as people read it."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return str(count)


def available_memory() -> int:
    """Bytes of memory this machine can give now without swapping (psutil's `available`)."""
    return psutil.virtual_memory().available


SHARED_MEMORY = "/dev/shm"


def resource_problem(error: BaseException, what: str) -> str | None:
    """What an OSError (or a worker's error carrying one) says about the machine's limits, for
    `what` ("the torch backend's workers"): /dev/shm full, with its size and what is free, or the
    descriptor limit; with the fixes. None for other errors."""
    import errno
    import resource

    text = str(error)
    code = getattr(error, "errno", None)
    if code == errno.ENOSPC or "No space left on device" in text:
        try:
            stat = os.statvfs(SHARED_MEMORY)
            free, size = stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize
            room = f"{human_bytes(free)} free of {human_bytes(size)}"
        except OSError:
            room = "its size unknown"
        return (f"{SHARED_MEMORY} is full ({room}): {what} share their batches and their queues' semaphores through "
                f"it. Give the container more (`docker run --shm-size=8g`; Kubernetes: an emptyDir of medium Memory "
                f"at {SHARED_MEMORY}), use fewer workers (workers.num_workers) or a smaller workers.prefetch_factor, "
                f"or backend: dali (its feed reads into memory of its own, not {SHARED_MEMORY})")
    if code in (errno.EMFILE, errno.ENFILE) or "Too many open files" in text:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return (f"this process may open {soft} files at once (`ulimit -n`; the hard limit is "
                f"{'unlimited' if hard == resource.RLIM_INFINITY else hard}), and {what} need more: raise it "
                f"(`ulimit -n 65536` in the shell that starts the job, or resource.setrlimit(RLIMIT_NOFILE) at the "
                f"top of the script), or use fewer workers (workers.num_workers)")
    return None
