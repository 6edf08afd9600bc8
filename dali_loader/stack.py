"""The CUDA stack DALI runs on, read without a GPU: DALI's CUDA major, the nvJPEG its decoders bind,
what that nvJPEG can do on the GPU, and what the GPU flavour's decoders leave to the CPU.

Why it matters: nvImageCodec (DALI's decoders) refuses a region decode of a chroma-subsampled JPEG
(4:2:0, 4:2:2, 4:4:0) with interpolated ("fancy") upsampling on nvJPEG older than 13.2, whose region
decode mishandled the region's edge; both nvJPEG decoders (hardware and CUDA) then leave the JPEG to
DALI's CPU decoder, silently (nvImageCodec's `enable_roi_fancy_upsampling`, default on from 13.2).
`nvidia-dali-cuda120` brings nvJPEG 12.x, `nvidia-dali-cuda130` nvJPEG 13.3: the train graph asks
for what the installed one decodes on the GPU (pipeline.decode_plan).

nvJPEG's version is asked of the library DALI's decoders bind: nvImageCodec opens it by its soname,
which gets whichever copy the process loaded first under it (torchvision's, where `import
torchvision` came first), so the version is the bound library's (fastloader.cuda_libraries), never
a file's.
"""
from __future__ import annotations

import logging
from typing import NamedTuple

from fastloader.cuda_libraries import ROI_FANCY_NVJPEG, Library, bind_nvjpeg, file_version, soname, wheel_nvjpegs

log = logging.getLogger("fastloader")

UNKNOWN = None


def dali_cuda_major() -> int | None:
    """The CUDA major DALI was built for (nvidia.dali.__cuda_version__: 12986 is 12.9, 13492 is 13.4)."""
    import nvidia.dali

    version = getattr(nvidia.dali, "__cuda_version__", None)
    return int(version) // 1000 if isinstance(version, int) and version > 0 else None


def nvjpeg_version(major: int | None) -> tuple[int, int, int] | None:
    """(major, minor, patch) of the libnvjpeg.so.<major> DALI's decoders bind in this process: the
    library a by-soname open gets (bound now where none is: the wheel's), not a file's; None where
    there is none."""
    bound = decoders_nvjpeg(major)
    return None if bound is None else bound.version


def decoders_nvjpeg(major: int | None) -> Library | None:
    """The nvJPEG DALI's decoders bind in this process (cuda_libraries.bind_nvjpeg); once bound, the
    same for the process's life."""
    if major is None:
        return UNKNOWN
    if major not in _BOUND:
        bound = bind_nvjpeg(major)
        if bound is None:
            return UNKNOWN
        _BOUND[major] = bound
    return _BOUND[major]


_BOUND: dict[int, Library] = {}


def binding_problem(bound: Library | None, wheel: Library | None, major: int | None) -> str | None:
    """Why the decoders bind an nvJPEG other than the wheel's, what the plan does about it and the
    fix; None where they bind the wheel's (or there is no wheel's to prefer). Said once a process."""
    if bound is None or wheel is None or major is None or bound.path == wheel.path:
        return None
    loses = not region_fancy_on_gpu(bound.version) and region_fancy_on_gpu(wheel.version)
    cost = (" Below 13.2 nvJPEG decodes no region of a subsampled JPEG with interpolated chroma on the GPU, so "
            "train's crops repeat chroma in their regions (dali.fancy_upsampling: auto; true decodes whole images "
            "instead) rather than go to DALI's CPU decoder." if loses else "")
    return (f"DALI's decoders bind {version_words(bound.version)} ({bound.path}), loaded under {soname(major)} "
            f"before fastloader could bind nvidia-nvjpeg's {version_words(wheel.version)} ({wheel.path}): "
            f"a by-soname open gets the copy loaded first (torchvision's wheel bundles one, loaded by `import "
            f"torchvision`).{cost} The decode plan is made for the bound one. Fix: import "
            f"fastloader before torchvision (or anything else that loads nvJPEG), or start Python with "
            f"LD_PRELOAD={wheel.path} (docs/performance.md#the-cuda-stack)")


def plan_nvjpeg() -> tuple[int, int, int] | None:
    """The version the GPU flavour's decode plan is made for: the nvJPEG DALI's decoders bind in this
    process, with why where it is not the wheel's, logged once."""
    major = dali_cuda_major()
    bound = decoders_nvjpeg(major)
    path = wheel_nvjpegs().get(major) if major is not None else None
    problem = binding_problem(bound, Library(file_version(path), path) if path else None, major)
    if problem and problem not in _SAID:
        _SAID.add(problem)  # a WARNING where the bound one costs the plan its interpolated regions
        log.log(logging.INFO if region_fancy_on_gpu(bound.version) else logging.WARNING, problem)
    return None if bound is None else bound.version


_SAID: set[str] = set()


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


class GpuDecoding(NamedTuple):
    """What the GPU flavour's decoders are asked for a split's JPEGs (its DecodePlan) and which nvJPEG
    they bind: what nvImageCodec's rule for leaving a JPEG to the CPU decoder turns on."""
    region: bool
    """Each crop's region decoded (train), or the whole image."""
    fancy: bool
    """Chroma interpolated (jpeg_fancy_upsampling)."""
    nvjpeg: tuple[int, int, int] | None


ROI_FANCY_SAMPLINGS = frozenset({"", "4:4:4", "grey"})
"""The chroma samplings whose regions every nvJPEG decodes with interpolated chroma on the GPU (no
chroma to interpolate); "" (not read at screening) is not counted, not being known. nvImageCodec 0.9
refuses every other one (4:2:0, 4:2:2, 4:4:0, 4:1:1, 4:1:0, unsupported layouts) in both nvJPEG
decoders below 13.2 (its enable_roi_fancy_upsampling: "ROI decode with fancy upsampling may produce
wrong results on image edge ... with nvJPEG < 13.2"), and DALI's CPU decoder takes it."""


def cpu_decode_reason(fmt: str | None, coding: int, sampling: str = "", decoding: GpuDecoding | None = None
                      ) -> str | None:
    """What kind of image the GPU flavour's decoders leave to DALI's CPU decoder ("PNG files",
    "arithmetic-coded JPEGs", "regions of 4:2:0 JPEGs with interpolated chroma"), by its format,
    JPEG frame marker and chroma subsampling (Screened.coding, .sampling) and, where given, what the
    decoders are asked of which nvJPEG (`decoding`); None where a GPU decoder takes it. nvImageCodec's
    rule: its hardware decoder takes baseline JPEGs, its CUDA decoder baseline, extended and
    progressive ones; a region with interpolated chroma of a subsampled JPEG neither takes below
    nvJPEG 13.2; anything neither takes goes to the CPU."""
    if fmt == "JPEG":
        kind = CPU_JPEG_CODINGS.get(coding)
        if kind is not None:
            return f"{kind} JPEGs"
        if decoding is not None and region_refused(sampling, decoding):
            return f"regions of {sampling} JPEGs with interpolated chroma"
        return None
    return f"{fmt} files" if fmt in CPU_FORMATS else None


def region_refused(sampling: str, decoding: GpuDecoding) -> bool:
    """Whether nvJPEG's decoders refuse a JPEG of this chroma sampling under `decoding` (above)."""
    return (decoding.region and decoding.fancy and not region_fancy_on_gpu(decoding.nvjpeg)
            and sampling not in ROI_FANCY_SAMPLINGS)


def cpu_decode_fix(reason: str) -> str:
    """What keeps such images on the GPU, for the loader's warning."""
    if reason.startswith("regions of"):
        return ("nvJPEG 13.2 or later decodes them on the GPU (bind nvidia-nvjpeg's: import fastloader before "
                "torchvision, docs/performance.md#the-cuda-stack), and so does dali.fancy_upsampling: auto or false")
    return "re-encoded as baseline JPEGs they would decode on the GPU"
