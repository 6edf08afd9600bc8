"""`import fastloader` must work, and build a loader, where DALI is not installed; the wheel must
hold every module."""
from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch
from conftest import REPO

HIDE_DALI = textwrap.dedent("""
    import sys, importlib.abc
    class HideNvidia(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "nvidia" or name.startswith("nvidia."):
                raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)")
    sys.meta_path.insert(0, HideNvidia())
""")


def test_import_and_build_without_dali(tmp_path):
    script = HIDE_DALI + textwrap.dedent(f"""
        import logging
        logging.basicConfig(level=logging.INFO)
        import fastloader
        loader = fastloader.build_loader({str(REPO / 'configs' / 'sample.yaml')!r}, "val",
                                         {{"workers.num_workers": 0}})
        images, labels = next(iter(loader))
        print(loader.backend, tuple(images.shape), any(m.startswith("nvidia") for m in sys.modules))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180,
                            env={"FASTLOADER_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["torch", "(32,", "3,", "128,", "128)", "False"]
    # auto falls back to torch: for want of DALI where a GPU is present, for want of a GPU elsewhere
    reasons = ["NVIDIA DALI does not import", "No module named 'nvidia"] if torch.cuda.is_available() \
        else ["backend: auto and no CUDA GPU is available"]
    assert all(reason in result.stderr for reason in reasons), result.stderr
    # without nvImageCodec (it ships with DALI), the torch backend decodes JPEG crops whole, and says why
    assert "JPEG crops are decoded whole (torchcodec or torchvision): nvImageCodec is not installed" in result.stderr
    assert "torch loader decoders: JPEG crops: torchvision.io.decode_jpeg (whole file); no region decode" \
        in result.stderr


def test_importing_fastloader_loads_no_backend():
    script = "import sys, fastloader; print(sorted(m for m in sys.modules if m.split('.')[0] in " \
             "('nvidia', 'torch_loader', 'dali_loader', 'torchvision')))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr


def test_the_wheel_holds_every_module_of_the_three_packages(tmp_path):
    """A fixed package list once left fastloader.commands out of the wheel: a user's install would
    have failed at `fastloader bench` while the suite, run from the checkout, passed."""
    pytest.importorskip("setuptools", reason="building the wheel without isolation needs setuptools")
    source = tmp_path / "source"  # a copy: a build/ folder left in the checkout would hide the fault
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__"))
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                             "-w", str(tmp_path), str(source)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    [wheel] = tmp_path.glob("fastloader-*.whl")
    packed = set(zipfile.ZipFile(wheel).namelist())
    modules = {path.relative_to(REPO).as_posix() for package in ("fastloader", "dali_loader", "torch_loader")
               for path in (REPO / package).rglob("*.py")}
    assert len(modules) > 40 and not modules - packed, sorted(modules - packed)
    assert "fastloader/py.typed" in packed  # type checkers ignore an installed package without it


def test_the_dali_floor_is_the_version_whose_api_the_backend_uses_and_older_ones_are_told_so():
    """pyproject.toml's floor is DALI_MIN_VERSION (2.0: fn.filter and fn.equalize out of
    fn.experimental); an older DALI gets a message with the version and the upgrade, not an
    AttributeError from deep in the graph when a policy first needs fn.filter."""
    import re

    from fastloader.factory import DALI_MIN_VERSION, dali_version_problem
    floor = re.search(r'"nvidia-dali-cuda130>=([\d.]+);', (REPO / "pyproject.toml").read_text()).group(1)
    assert tuple(int(part) for part in floor.split(".")) == DALI_MIN_VERSION == (2, 0)
    for version in ("2.0.0", "2.4.0", "2.10.1", "3.0.0.dev20270101"):
        assert dali_version_problem(version) is None, version
    for version in ("1.40.0", "1.53.0", "1.9.0"):
        assert dali_version_problem(version) == (
            f"NVIDIA DALI {version} is older than 2.0, the first with the operators the DALI backend uses (fn.filter "
            f"and fn.equalize out of fn.experimental). Upgrade it: pip install -U 'nvidia-dali-cuda130>=2.0'")
