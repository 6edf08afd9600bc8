"""uint8 pixels -> (x / 255 - mean) / std in the output dtype and memory format, on the device.

CUDA: the copy and conversion of batch i+1 run on a side stream while the trainer works on batch i;
the trainer's stream waits for it before the batch is handed over, and `record_stream` tells the
caching allocator that the trainer's stream uses the memory. One side stream serves a loader for
its life (prefetch_stream): the caching allocator keeps freed blocks per stream, so a new stream
each epoch would strand the last epoch's blocks on a stream nobody allocates from any more. The
copy is asynchronous from pinned memory (workers.pin_memory); the labels are pinned here if the
DataLoader did not (fastloader.transfer). The kernels, the finisher's included, are launched from
the loader's producer thread (ahead.py), not the training thread, and run on the side stream.
CPU: the same arithmetic runs per image in the workers' collate (see collate.py), while the pixels
are in cache: 0.08 ms per 224 px image here, against 0.27-0.55 ms per image for a whole batch in
the main process, which would also serialize it with the trainer.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Sequence

import torch

from fastloader.device_ops import BatchFinisher
from fastloader.transfer import to_device

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class Normalizer:
    """The one normalization both paths use: x * (1 / (255 std)) - mean / std."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], dtype: str, channels_last: bool,
                 device: torch.device):
        """normalize.mean and std (of 0..1 pixels), output.dtype and channels_last, on `device`."""
        self.device = device
        self.dtype = DTYPES[dtype]
        self.channels_last = channels_last
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        mean = torch.tensor(mean, dtype=torch.float32).view(3, 1, 1) * 255
        std = torch.tensor(std, dtype=torch.float32).view(3, 1, 1) * 255
        self.scale = (1.0 / std).to(device)
        self.bias = (-mean / std).to(device)

    def batch(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [B, 3, H, W] (any memory format, any device) -> normalized on self.device, one kernel.
        From pinned memory the copy is asynchronous; from pageable memory (workers.pin_memory:
        false) it is what CUDA makes of it, a copy the calling thread waits for."""
        images = images.to(self.device, non_blocking=images.is_pinned())
        out = torch.empty(images.shape, dtype=torch.float32, device=self.device, memory_format=self.memory_format)
        torch.addcmul(self.bias, images, self.scale, out=out)
        return out if self.dtype == torch.float32 else out.to(self.dtype, memory_format=self.memory_format)

    def into(self, slot: torch.Tensor, image: torch.Tensor) -> None:
        """Write one normalized uint8 [3, H, W] image into `slot`, a [3, H, W] view of the output batch."""
        if slot.dtype == torch.float32 and slot.is_contiguous():
            slot.copy_(image)  # HWC uint8 to CHW float in one pass; the arithmetic then runs vectorized
            slot.mul_(self.scale).add_(self.bias)
        else:
            slot.copy_(image.contiguous().float().mul_(self.scale).add_(self.bias))

    def stack_into(self, batch: torch.Tensor, images: torch.Tensor) -> None:
        """Write float32 [N, 3, H, W] images of uint8 values, normalized, into `batch` (the images are
        used up): the arithmetic of `into`, image for image, in one pass for the stack."""
        batch.copy_(images.mul_(self.scale).add_(self.bias))


def prefetch_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream a loader's prefetcher uses for its whole life."""
    return torch.cuda.Stream(device=device)


def convert_on_stream(batches: Iterable[tuple], normalizer: Normalizer, stream: torch.cuda.Stream,
                      finisher: BatchFinisher | None = None) -> Iterator[tuple]:
    """Copy, convert and finish (erasing, mixing, soft targets) each batch on the side `stream`
    (prefetch_stream, the loader's), launched from the thread that iterates this (the loader's
    producer, ahead.py): (images, labels, the event recorded after them on the stream). Items are
    (images, labels, seeds, ...). The trainer's thread hands each over (hand_over)."""
    with torch.cuda.device(normalizer.device):  # a new thread's current device is the first GPU
        for images, labels, seeds, *_ in batches:
            with torch.cuda.stream(stream):
                views = isinstance(images, list)  # one uint8 tensor per view group (fastloader.views)
                images = [normalizer.batch(group) for group in images] if views else normalizer.batch(images)
                labels = to_device(labels, normalizer.device)
                if finisher is not None:
                    images, labels = finisher(images, labels, seeds)
                done = torch.cuda.Event()
                done.record(stream)
            yield images, labels, done


def hand_over(item: tuple) -> tuple[torch.Tensor | list[torch.Tensor], torch.Tensor]:
    """On the trainer's thread: its current stream waits for the batch's event (no host wait), and
    the caching allocator is told that stream uses the batch's memory (record_stream), which was
    allocated on the side stream."""
    images, labels, done = item
    current = torch.cuda.current_stream(labels.device)
    current.wait_event(done)
    for tensor in (images if isinstance(images, list) else [images]):
        tensor.record_stream(current)
    labels.record_stream(current)
    return images, labels
