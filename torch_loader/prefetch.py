"""uint8 batches -> normalized float batches on the output device.

On CUDA the copy and the conversion of batch i+1 run on a side stream while the trainer works on
batch i; the trainer's stream waits for it before the batch is handed over, and `record_stream`
tells the caching allocator that the trainer's stream uses the memory. On the CPU the same
conversion runs inline. Either way: one kernel converts, normalizes and lays out the batch.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import torch

from fastloader.config import NormalizeConfig, OutputConfig

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class BatchConverter:
    """uint8 [B, 3, H, W] (any memory format, any device) -> (x - mean) / std on `device`."""

    def __init__(self, normalize: NormalizeConfig, output: OutputConfig, device: torch.device):
        self.device = device
        self.dtype = DTYPES[output.dtype]
        self.memory_format = torch.channels_last if output.channels_last else torch.contiguous_format
        mean = torch.tensor(normalize.mean, dtype=torch.float32).view(1, 3, 1, 1) * 255
        std = torch.tensor(normalize.std, dtype=torch.float32).view(1, 3, 1, 1) * 255
        self.scale = (1.0 / std).to(device)
        self.bias = (-mean / std).to(device)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        images = images.to(self.device, non_blocking=True)
        out = torch.empty(images.shape, dtype=torch.float32, device=self.device, memory_format=self.memory_format)
        torch.addcmul(self.bias, images, self.scale, out=out)  # uint8 read, float32 written: one pass
        if self.dtype != torch.float32:
            out = out.to(self.dtype, memory_format=self.memory_format)
        return out


def convert_on_cpu(batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                   convert: BatchConverter) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for images, labels in batches:
        yield convert(images), labels


def prefetch_to_cuda(batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                     convert: BatchConverter) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Copy and convert one batch ahead on a side stream; hand it over once the stream is done."""
    stream = torch.cuda.Stream(device=convert.device)
    ready = None
    for images, labels in batches:
        with torch.cuda.stream(stream):
            next_images = convert(images)
            next_labels = labels.to(convert.device, non_blocking=True)
        if ready is not None:
            yield ready
        current = torch.cuda.current_stream(convert.device)
        current.wait_stream(stream)
        next_images.record_stream(current)
        next_labels.record_stream(current)
        ready = (next_images, next_labels)
    if ready is not None:
        yield ready
