"""The CUDA libraries as this process finds them, read without a GPU: which nvJPEG it binds under its
soname (the NVIDIA wheel's bound first where it can be), the driver's CUDA version, and a CUDA 12
install's leftovers.

Why: nvImageCodec (DALI's decoders, and the torch backend's where installed) opens nvJPEG by its
soname, `libnvjpeg.so.<major>`. The dynamic loader hands a by-soname open the library already
loaded under that soname, whatever its file: torchvision's wheel bundles its own nvJPEG (13.0.1 in
torchvision.libs/libnvjpeg.<hash>.so.13, soname libnvjpeg.so.13), so a process that imports
torchvision first gives every later decoder torchvision's copy, not the `nvidia-nvjpeg` wheel's
(13.3: regions of subsampled JPEGs with interpolated chroma on the GPU). Loading the wheel's library
first (`bind_wheel_nvjpegs`, at `import fastloader`) makes it the one bound; torchvision still
loads and uses its own file beside it (RTLD_LOCAL: its symbols stay its own). Where another copy
was bound first, `bound_nvjpeg` says which, so that the decode plan is made for it.

Everything here reads the libraries themselves (nvjpegGetProperty needs no GPU, dladdr names the
file a function lies in, cuDriverGetVersion needs no GPU either); nothing is read from a file name.
A driver older than torch's CUDA makes torch see no GPU: `output.device: auto` would then quietly
decode on the CPU, so the factory refuses it with `driver_problem`'s words.
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
from typing import NamedTuple

ROI_FANCY_NVJPEG = (13, 2)
"""The first nvJPEG whose region decode upsamples chroma by interpolation (nvImageCodec's
NVJPEG_WITH_FIXED_UPSAMPLING_VERSION): below it, nvImageCodec leaves such a region to the CPU."""


class Library(NamedTuple):
    """An nvJPEG: its (major, minor, patch), as nvjpegGetProperty says, and its file."""
    version: tuple[int, int, int] | None
    path: str | None


_HELD: dict[str, ctypes.CDLL] = {}
"""The libraries loaded here, by soname: held for the process's life (never closed)."""
SYSTEM_CUDA = "/usr/local/cuda/lib64"
"""Where nvImageCodec's extension looks last (its RUNPATH), after the wheel's folder."""


def soname(major: int) -> str:
    return f"libnvjpeg.so.{major}"


def wheel_nvjpegs() -> dict[int, str]:
    """major -> the NVIDIA wheel's libnvjpeg.so.<major> (nvidia-nvjpeg for CUDA 13 puts it in
    nvidia/cu13/lib, nvidia-nvjpeg-cu12 in nvidia/nvjpeg/lib); empty without NVIDIA's wheels."""
    import importlib.util
    try:  # found, not imported: `import fastloader` imports nothing of NVIDIA's (tests/test_packaging.py)
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return {}
    if spec is None:
        return {}
    # nvidia/__init__.py extends its path over every sys.path entry (pkgutil.extend_path) once imported:
    # the same folders, in the same order, without importing it
    bases = [*(spec.submodule_search_locations or []),
             *(os.path.join(entry or ".", "nvidia") for entry in sys.path if isinstance(entry, str))]
    found: dict[int, str] = {}
    for base in dict.fromkeys(base for base in bases if os.path.isdir(base)):
        for path in sorted(glob.glob(os.path.join(base, "*", "lib", "libnvjpeg.so.[0-9]*"))):
            major = path.rsplit(".", 1)[-1]
            if major.isdigit():  # the real path, as dladdr names a loaded library's file
                found.setdefault(int(major), os.path.realpath(path))
    return found


def torchvision_nvjpeg(major: int) -> str | None:
    """The nvJPEG torchvision's wheel bundles for CUDA `major` (torchvision.libs/libnvjpeg.<hash>.so.<major>,
    soname libnvjpeg.so.<major>), found without importing torchvision; None where it bundles none."""
    import importlib.util
    try:
        spec = importlib.util.find_spec("torchvision")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for package in spec.submodule_search_locations:
        found = sorted(glob.glob(os.path.join(os.path.dirname(package), "torchvision.libs", f"libnvjpeg*.so.{major}")))
        if found:
            return os.path.realpath(found[0])
    return None


def bound_nvjpeg(major: int) -> Library | None:
    """The nvJPEG a by-soname open of libnvjpeg.so.<major> gets in this process now; None where
    none is loaded under that soname yet (the next open searches the loader's paths)."""
    try:
        library = ctypes.CDLL(soname(major), mode=os.RTLD_NOLOAD)
    except OSError:
        return None
    return Library(library_version(library), library_file(library))


def bind_wheel_nvjpegs() -> None:
    """Load each NVIDIA wheel's nvJPEG under its soname where nothing holds that soname yet, so that
    every later by-soname open (nvImageCodec's) gets it; cheap (some 10 ms, no GPU touched)."""
    for major, path in wheel_nvjpegs().items():
        if soname(major) not in _HELD and bound_nvjpeg(major) is None:
            _load(major, path)


def bind_nvjpeg(major: int) -> Library | None:
    """The nvJPEG nvImageCodec's decoders get for CUDA `major` in this process: the one already bound
    under the soname, else the wheel's (bound now), else the first found where nvImageCodec looks
    (the loader's paths, then /usr/local/cuda), bound now; None where there is none."""
    bound = bound_nvjpeg(major)
    if bound is not None:
        return bound
    wheel = wheel_nvjpegs().get(major)
    for candidate in ([wheel] if wheel else []) + [soname(major), os.path.join(SYSTEM_CUDA, soname(major))]:
        library = _load(major, candidate)
        if library is not None:
            return Library(library_version(library), library_file(library))
    return None


def file_version(path: str) -> tuple[int, int, int] | None:
    """The version of the nvJPEG in a file (for `fastloader check`'s comparison with the bound one).
    Loading it by path where another copy holds the soname loads a second copy beside it, which is
    harmless: no by-soname open gets it."""
    try:
        return library_version(ctypes.CDLL(path))
    except OSError:
        return None


def _load(major: int, candidate: str) -> ctypes.CDLL | None:
    try:
        library = ctypes.CDLL(candidate)
    except OSError:
        return None
    _HELD[soname(major)] = library
    return library


def library_version(library: ctypes.CDLL) -> tuple[int, int, int] | None:
    """(major, minor, patch) by the library's nvjpegGetProperty (MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL)."""
    parts = []
    for prop in range(3):
        value = ctypes.c_int()
        try:
            if library.nvjpegGetProperty(prop, ctypes.byref(value)) != 0:
                return None
        except AttributeError:  # not an nvJPEG
            return None
        parts.append(value.value)
    return tuple(parts)


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def library_file(library: ctypes.CDLL) -> str | None:
    """The file a loaded library was mapped from (dladdr of its nvjpegGetProperty)."""
    for where in (None, "libdl.so.2"):  # glibc 2.34 moved dladdr into libc
        try:
            dladdr = ctypes.CDLL(where).dladdr
            info = _DlInfo()
            if dladdr(ctypes.cast(library.nvjpegGetProperty, ctypes.c_void_p), ctypes.byref(info)) and info.dli_fname:
                return os.path.realpath(os.fsdecode(info.dli_fname))
        except (AttributeError, OSError):
            continue
    return None


# -- the driver, and a CUDA 12 install's leftovers ---------------------------------------------------

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
