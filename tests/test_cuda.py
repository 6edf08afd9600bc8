"""GPU-only: the side-stream prefetcher gives exactly what the CPU path gives. Skipped without CUDA."""
from __future__ import annotations

import pytest
import torch

from fastloader import build_loader
from conftest import base_config

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("dtype, channels_last", [("float32", False), ("bfloat16", True)])
def test_cuda_prefetcher_matches_cpu_conversion(textured_root, dtype, channels_last):
    output = {"dtype": dtype, "channels_last": channels_last}
    cpu = build_loader(base_config(textured_root, output={**output, "device": "cpu"}), split="val")
    gpu = build_loader(base_config(textured_root, output={**output, "device": "cuda"},
                                   workers={"num_workers": 2, "pin_memory": True}), split="val")
    assert gpu.device == torch.device("cuda", 0)
    pairs = list(zip(cpu, gpu))
    assert len(pairs) == len(cpu) == len(gpu)
    for (x_cpu, y_cpu), (x_gpu, y_gpu) in pairs:
        assert x_gpu.is_cuda and y_gpu.is_cuda and x_gpu.dtype == getattr(torch, dtype)
        assert x_gpu.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        assert torch.equal(y_cpu, y_gpu.cpu())
        assert torch.allclose(x_cpu.float(), x_gpu.float().cpu(), atol=1e-2)
