"""The CUDA stack as installed, read without a GPU: the CUDA the NVIDIA driver runs, the CUDA majors
torch and DALI are built for, and a CUDA 12 install's leftovers beside the CUDA 13 packages.

Why: a driver older than torch's CUDA makes torch see no GPU, and `output.device: auto` would then
quietly decode on the CPU: the factory refuses it with `driver_problem`'s words, and `fastloader
check` lists it. nvidia-nvimgcodec-cu12 and -cu13 write the same files, so uninstalling a CUDA 12
leftover alone breaks DALI: `fastloader check` names it with the fix.
"""
from __future__ import annotations

import ctypes


def driver_cuda_version() -> tuple[int, int] | None:
    """The newest CUDA (major, minor) the installed NVIDIA driver runs (libcuda's cuDriverGetVersion,
    which needs no GPU and no cuInit); None without a driver (no libcuda)."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int()
    if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return None
    return version.value // 1000, version.value % 1000 // 10


def driver_gpu_count() -> int:
    """The GPUs the driver sees (CUDA_VISIBLE_DEVICES applied): 0 without a driver or where it fails."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int()
        if libcuda.cuInit(0) != 0 or libcuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
        return count.value
    except OSError:
        return 0


def driver_problem(driver: tuple[int, int] | None, builds: dict[str, int]) -> str | None:
    """Why an installed driver runs none of `builds` ({"torch": 13, "DALI": 13}: each package's CUDA
    major): a CUDA runtime needs a driver of its major or newer (within a major, CUDA's minor version
    compatibility covers the rest). None where it runs them, or where there is no driver at all."""
    if driver is None:
        return None
    old = {name: major for name, major in builds.items() if major is not None and major > driver[0]}
    if not old:
        return None
    names = " and ".join(f"{name} for CUDA {major}" for name, major in old.items())
    return (f"the NVIDIA driver installed runs CUDA up to {driver[0]}.{driver[1]}, older than {names}: torch sees "
            f"no GPU and every image would be decoded on the CPU. Update the driver (CUDA 13 needs 580 or newer), or "
            f"install torch and DALI for CUDA {driver[0]} (docs/install.md#the-nvidia-driver)")


def torch_cuda_major() -> int | None:
    """The CUDA major of torch's build; None for a CPU-only build."""
    import torch

    return int(torch.version.cuda.split(".")[0]) if torch.version.cuda else None


def installed(distribution: str) -> str | None:
    """The version of an installed Python distribution; None where it is not installed."""
    import importlib.metadata
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def dali_cuda_major_installed() -> int | None:
    """The CUDA major of the DALI wheel installed (nvidia-dali-cuda130: 13), read from the package's
    name without importing DALI; the newest where several are."""
    found = [major for major in (13, 12) if installed(f"nvidia-dali-cuda{major}0")]
    return found[0] if found else None


CUDA12_LEFTOVERS = (("nvidia-nvimgcodec-cu12", "nvidia-nvimgcodec-cu13"),
                    ("nvidia-dali-cuda120", "nvidia-dali-cuda130"))
"""(a CUDA 12 package, its CUDA 13 counterpart): both installed is a CUDA 12 install's leftover."""


def shared_files(first: str, second: str) -> int:
    """How many file paths two installed distributions both claim (their RECORDs)."""
    import importlib.metadata
    try:
        paths = [{str(f) for f in importlib.metadata.distribution(name).files or []} for name in (first, second)]
    except importlib.metadata.PackageNotFoundError:
        return 0
    return len(paths[0] & paths[1])


def cuda12_leftovers() -> list[str]:
    """Each CUDA 12 package installed beside its CUDA 13 counterpart, with why it matters and the fix.
    nvimgcodec-cu12 and -cu13 write the same files (nvidia/nvimgcodec/...): uninstalling the cu12 one
    deletes files the cu13 DALI loads, so the fix reinstalls the cu13 ones after it."""
    found = []
    for old, new in CUDA12_LEFTOVERS:
        if installed(old) and installed(new):
            shared = shared_files(old, new)
            found.append(f"{old} {installed(old)} is installed beside {new} {installed(new)}, a CUDA 12 install's "
                         f"leftover{f'; they share {shared} file paths' if shared else ''}: `pip uninstall {old}` "
                         f"alone deletes files {new} needs and breaks DALI. Fix: pip uninstall -y {old} && pip install "
                         f"--force-reinstall --no-deps {new}=={installed(new)} (docs/install.md#cuda-12-leftovers)")
    return found
