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


def _dali_or_skip():
    pytest.importorskip("nvidia.dali", reason="the DALI GPU flavour needs NVIDIA DALI")


@pytest.mark.parametrize("dtype, channels_last", [("float32", False), ("bfloat16", True)])
def test_dali_gpu_flavour_matches_its_cpu_flavour(textured_root, dtype, channels_last):
    _dali_or_skip()
    output = {"dtype": dtype, "channels_last": channels_last}
    cpu = build_loader(base_config(textured_root, backend="dali", output={**output, "device": "cpu"}), "val")
    gpu = build_loader(base_config(textured_root, backend="dali", output={**output, "device": "cuda"}), "val")
    assert (cpu.flavour, gpu.flavour) == ("cpu", "gpu") and gpu.device == torch.device("cuda", 0)
    pairs = list(zip(cpu, gpu))
    assert len(pairs) == len(cpu) == len(gpu) == 8
    for (x_cpu, y_cpu), (x_gpu, y_gpu) in pairs:
        assert x_gpu.is_cuda and y_gpu.is_cuda and y_gpu.dtype == torch.int64 and x_gpu.dtype == getattr(torch, dtype)
        assert x_gpu.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        assert torch.equal(y_cpu, y_gpu.cpu())
        # nvJPEG and libjpeg-turbo may round differently; PNG here decodes identically
        assert (x_cpu.float() - x_gpu.float().cpu()).abs().mean() < 0.02


def test_dali_gpu_flavour_train_contract_and_auto_choice(textured_root, caplog):
    _dali_or_skip()
    import logging
    with caplog.at_level(logging.INFO, logger="fastloader"):
        loader = build_loader(base_config(textured_root, backend="auto",
                                          train={"batch_size": 5, "transform": {"erase_prob": 0.5}}), "train")
    assert loader.backend == "dali" and loader.flavour == "gpu"
    assert "backend: auto, a CUDA GPU is present and NVIDIA DALI imports" in caplog.text
    torch_loader = build_loader(base_config(textured_root, backend="torch", output={"device": "cpu"},
                                            train={"batch_size": 5}), "train")
    for _ in range(2):
        batches = list(loader)
        assert [tuple(x.shape) for x, _ in batches] == [(5, 3, 32, 32)] * 4
        assert torch.equal(torch.cat([y for _, y in batches]).cpu(), torch.cat([y for _, y in torch_loader]))
    for step, _ in enumerate(loader):  # break, then a whole new epoch
        if step == 0:
            break
    assert len(list(loader)) == 4
