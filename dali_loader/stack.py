"""The CUDA stack DALI runs on, read without a GPU: DALI's CUDA major, the nvJPEG its decoders load,
and what that nvJPEG can do on the GPU.

Why it matters: nvImageCodec (DALI's decoders) refuses a region decode of a chroma-subsampled JPEG
(4:2:0, 4:2:2, 4:4:0) with interpolated ("fancy") upsampling on nvJPEG older than 13.2, whose region
decode mishandled the region's edge; both nvJPEG decoders (hardware and CUDA) then leave the JPEG to
DALI's CPU decoder, silently (nvImageCodec's `enable_roi_fancy_upsampling`, default on from 13.2).
`nvidia-dali-cuda120` brings nvJPEG 12.x, `nvidia-dali-cuda130` nvJPEG 13.3: the train graph asks
for what the installed one decodes on the GPU (pipeline.decode_plan).

nvJPEG's version is asked of the library itself (nvjpegGetProperty needs no GPU), found where its
wheel puts it (`nvidia/<pkg>/lib`), else by its soname on the loader's path, as nvImageCodec finds it.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import os

ROI_FANCY_NVJPEG = (13, 2)
"""The first nvJPEG whose region decode upsamples chroma by interpolation (nvImageCodec's
NVJPEG_WITH_FIXED_UPSAMPLING_VERSION)."""
UNKNOWN = None


def dali_cuda_major() -> int | None:
    """The CUDA major DALI was built for (nvidia.dali.__cuda_version__: 12986 is 12.9, 13492 is 13.4)."""
    import nvidia.dali

    version = getattr(nvidia.dali, "__cuda_version__", None)
    return int(version) // 1000 if isinstance(version, int) and version > 0 else None


def torch_cuda_major() -> int | None:
    """The CUDA major of torch's build; None for a CPU-only build."""
    import torch

    return int(torch.version.cuda.split(".")[0]) if torch.version.cuda else None


@functools.lru_cache(maxsize=4)
def nvjpeg_version(major: int | None) -> tuple[int, int, int] | None:
    """(major, minor, patch) of the libnvjpeg.so.<major> DALI's decoders load; None where none is found."""
    if major is None:
        return UNKNOWN
    soname = f"libnvjpeg.so.{major}"
    for candidate in [*_wheel_libraries(soname), soname]:
        try:
            library = ctypes.CDLL(candidate)
        except OSError:
            continue
        parts = []
        for prop in range(3):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            value = ctypes.c_int()
            if library.nvjpegGetProperty(prop, ctypes.byref(value)) != 0:
                break
            parts.append(value.value)
        if len(parts) == 3:
            return tuple(parts)
    return UNKNOWN


def _wheel_libraries(soname: str) -> list[str]:
    """Where NVIDIA's wheels put a library: nvidia/<package>/lib/ (nvidia-nvjpeg-cu12: nvjpeg/lib,
    nvidia-nvjpeg for CUDA 13: cu13/lib)."""
    try:
        import nvidia
    except ImportError:
        return []
    return [path for base in getattr(nvidia, "__path__", []) for path in
            sorted(glob.glob(os.path.join(base, "*", "lib", soname)))]


def region_fancy_on_gpu(version: tuple[int, int, int] | None) -> bool:
    """Whether nvJPEG decodes a region of a subsampled JPEG with interpolated chroma on the GPU."""
    return version is not None and version[:2] >= ROI_FANCY_NVJPEG


def version_words(version: tuple[int, int, int] | None) -> str:
    return "an nvJPEG of unknown version" if version is None else "nvJPEG " + ".".join(map(str, version))


def stack_problem(dali_major: int | None, torch_major: int | None) -> str | None:
    """Why DALI's and torch's CUDA majors should match, and the fix; None where they do (or one is
    not a CUDA build). Two majors work side by side, but load two CUDA runtimes and, with DALI for
    CUDA 12, an nvJPEG that decodes no subsampled JPEG region with interpolated chroma."""
    if dali_major is None or torch_major is None or dali_major == torch_major:
        return None
    package = f"nvidia-dali-cuda{torch_major}0"
    return (f"NVIDIA DALI is built for CUDA {dali_major} and torch for CUDA {torch_major}: the process loads two CUDA "
            f"runtimes and DALI's nvJPEG is CUDA {dali_major}'s. Install the DALI of torch's CUDA: pip uninstall -y "
            f"nvidia-dali-cuda{dali_major}0 && pip install {package} (docs/performance.md#the-cuda-stack)")


CPU_JPEG_CODINGS = {0xC5: "hierarchical", 0xC6: "hierarchical", 0xC7: "hierarchical", 0xC9: "arithmetic-coded",
                    0xCA: "arithmetic-coded", 0xCB: "arithmetic-coded", 0xCD: "hierarchical arithmetic-coded",
                    0xCE: "hierarchical arithmetic-coded", 0xCF: "hierarchical arithmetic-coded"}
"""JPEG frames nvJPEG does not decode (nvImageCodec's CUDA and hardware decoders take baseline,
extended and progressive Huffman frames, its lossless decoder lossless ones): by frame marker."""
CPU_FORMATS = frozenset({"PNG", "BMP", "WEBP", "PPM"})
"""What DALI's decoders read on the CPU only, whatever the flavour (a GIF reaches DALI as a PNG copy,
a decoded image from a source as a PPM). TIFF goes to nvTIFF or the CPU by its compression, JPEG 2000
to nvJPEG2000: not counted."""


def cpu_decode_reason(fmt: str | None, coding: int) -> str | None:
    """What kind of image the GPU flavour's decoder decodes on the CPU ("PNG files", "arithmetic-coded
    JPEGs"), by its format and JPEG frame marker (Screened.coding); None where a GPU decoder takes it."""
    if fmt == "JPEG":
        kind = CPU_JPEG_CODINGS.get(coding)
        return None if kind is None else f"{kind} JPEGs"
    return f"{fmt} files" if fmt in CPU_FORMATS else None
