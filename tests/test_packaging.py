"""`import fastloader` must work, and build a loader, where DALI is not installed."""
from __future__ import annotations

import subprocess
import sys
import textwrap

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
    assert "JPEG crops are decoded whole with decode_jpeg: nvImageCodec is not installed" in result.stderr
    assert "torch loader decoders: JPEG crops: torchvision.io.decode_jpeg (whole file); no region decode" \
        in result.stderr


def test_importing_fastloader_loads_no_backend():
    script = "import sys, fastloader; print(sorted(m for m in sys.modules if m.split('.')[0] in " \
             "('nvidia', 'torch_loader', 'dali_loader', 'torchvision')))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr
