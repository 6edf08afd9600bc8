"""The CUDA stack as a process finds it (fastloader/cuda_install.py, cuda_libraries.py), checked on
the CPU: the driver rule for a given driver version, a CUDA 12 install's leftovers from real package metadata, and what
`fastloader check` says of the nvJPEG DALI's decoders bind. Which copy a process binds, by import
order: test_nvjpeg_binding.py (fresh processes)."""
from __future__ import annotations

import importlib.metadata

import pytest

from fastloader.cuda_install import (
    cuda12_leftovers,
    driver_cuda_version,
    driver_gpu_count,
    driver_problem,
    installed,
)


def test_a_driver_older_than_torchs_or_dalis_cuda_is_named_with_the_fix():
    """Device: none (the rule, for given driver versions). CUDA 13 builds need a CUDA 13 driver; a CUDA
    12.8 driver runs neither, and the words say what happens, the fix and the page."""
    words = driver_problem((12, 8), {"torch": 13, "DALI": 13})
    assert words.startswith("the NVIDIA driver installed runs CUDA up to 12.8, older than torch for CUDA 13 and "
                            "DALI for CUDA 13: torch sees no GPU")
    assert "580 or newer" in words and "docs/install.md" in words and "for CUDA 12" in words
    assert driver_problem((12, 8), {"torch": 12, "DALI": 13}).count("for CUDA 13") == 1  # only DALI's
    assert driver_problem((13, 0), {"torch": 13, "DALI": 13}) is None  # minor version compatibility
    assert driver_problem((13, 2), {"torch": 13, "DALI": None}) is None  # no DALI installed
    assert driver_problem(None, {"torch": 13}) is None  # no driver: a CPU machine, not a broken one


def test_this_machines_driver_is_read_or_absent():
    """Device: whichever this machine has. Without libcuda (a CPU machine) there is no version and no GPU;
    with one, a CUDA version of 12 or later and the GPUs torch sees where its CUDA runs on it."""
    version = driver_cuda_version()
    if version is None:
        assert driver_gpu_count() == 0
        return
    import torch
    assert version[0] >= 12
    if torch.cuda.is_available():
        assert driver_gpu_count() == torch.cuda.device_count()


def test_a_cuda12_nvimgcodec_beside_the_cu13_one_is_named_with_the_shared_files_and_the_fix(tmp_path, monkeypatch):
    """A CUDA 12 install's leftover, as pip leaves it: nvidia-nvimgcodec-cu12's metadata (a real
    dist-info on the path) claiming files of the cu13 one installed here. Uninstalling it alone would
    delete them: the fix reinstalls the cu13 one."""
    cu13 = installed("nvidia-nvimgcodec-cu13")
    if cu13 is None:
        pytest.skip("nvidia-nvimgcodec-cu13 is not installed here")
    assert cuda12_leftovers() == []  # as installed here
    theirs = [str(f) for f in importlib.metadata.distribution("nvidia-nvimgcodec-cu13").files]
    shared = [path for path in theirs if path.startswith("nvidia/nvimgcodec/") and "__pycache__" not in path][:5]
    info = tmp_path / "nvidia_nvimgcodec_cu12-0.7.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-nvimgcodec-cu12\nVersion: 0.7.0\n")
    (info / "RECORD").write_text("".join(f"{path},,\n" for path in shared + ["nvidia/nvimgcodec/only_cu12.so"]))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    found = cuda12_leftovers()
    assert len(found) == 1, found
    assert found[0].startswith(f"nvidia-nvimgcodec-cu12 0.7.0 is installed beside nvidia-nvimgcodec-cu13 {cu13}, "
                               f"a CUDA 12 install's leftover; they share {len(shared)} file paths")
    assert (f"Fix: pip uninstall -y nvidia-nvimgcodec-cu12 && pip install --force-reinstall --no-deps "
            f"nvidia-nvimgcodec-cu13=={cu13}") in found[0] and "breaks DALI" in found[0]


def test_check_names_the_nvjpeg_dalis_decoders_bind_and_torchvisions_copy(capsys):
    """`fastloader check`'s lines in this process, which imported fastloader (so the wheel's nvJPEG,
    where nothing bound one before: the test process may have imported torchvision first)."""
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")
    from fastloader.commands.check import nvjpeg_lines
    from fastloader.cuda_install import dali_cuda_major_installed
    from fastloader.cuda_libraries import bound_nvjpeg, torchvision_nvjpeg

    major = dali_cuda_major_installed()
    bound = bound_nvjpeg(major)
    lines = nvjpeg_lines()
    assert lines[0].startswith(f"nvJPEG, dali backend: DALI's decoders bind nvJPEG {'.'.join(map(str, bound.version))} "
                               f"({bound.path})"), lines
    bundled = torchvision_nvjpeg(major)
    if bundled and bundled != bound.path:
        assert lines[1].startswith("  torchvision bundles nvJPEG ") and bundled in lines[1], lines
        assert "import fastloader first" in lines[1]


def test_the_wheels_nvjpeg_is_found_in_every_nvidia_folder_on_the_path(tmp_path, monkeypatch):
    """Device: none. nvidia/ is one package over several folders (its __init__ extends its path over
    sys.path, as the GPU machine's staged DALI site beside the system's packages needs): a library in
    a later folder is found, without importing the package."""
    import shutil
    import sys

    from fastloader.cuda_libraries import wheel_nvjpegs
    here = wheel_nvjpegs()
    if not here:
        pytest.skip("no NVIDIA nvJPEG wheel installed here")
    later = tmp_path / "nvidia" / "cu99" / "lib"
    later.mkdir(parents=True)
    shutil.copy(next(iter(here.values())), later / "libnvjpeg.so.99")  # a real library, under another major
    monkeypatch.setattr(sys, "path", [*sys.path, str(tmp_path)])  # after the system's folders
    found = wheel_nvjpegs()
    assert found == {**here, 99: str(later / "libnvjpeg.so.99")}
