"""Which nvJPEG this process binds under its soname, read without a GPU, and the NVIDIA wheel's
bound first where it can be.

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
file a function lies in); nothing is read from a file name. What is installed around it (the
driver, the packages' CUDA majors): cuda_install.py.
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
