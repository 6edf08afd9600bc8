"""Your own transforms for examples/train.py (docs/transforms.md), named by path:

    python examples/train.py configs/sample.yaml --sample-hook my_transforms:RAND_AUGMENT
    python examples/train.py configs/sample.yaml --batch-hook my_transforms:brightness

Each draws from the samples' seeds, so a run replays exactly with any number of workers, on either
backend, and after a resume.
"""
from __future__ import annotations

import torch
from torchvision.transforms import v2

RAND_AUGMENT = v2.Compose([v2.RandAugment(num_ops=2, magnitude=9), v2.RandomGrayscale(p=0.2)])
"""A torchvision v2 pipeline as a sample hook: fastloader runs it with torch's global generator
seeded from each sample's (fastloader.with_global_rng)."""


def brightness(images: torch.Tensor, labels: torch.Tensor, seeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch hook: each normalized image shifted by up to +-0.2, drawn from its sample's seed."""
    shift = (seeds % 1001).to(images.device, torch.float32) / 1000 * 0.4 - 0.2
    return images + shift.to(images.dtype).view(-1, 1, 1, 1), labels


def upside_down_odd(images, seeds, every: int = 2):
    """A DALI graph function (dali.graph_hook: my_transforms:upside_down_odd): each sample whose seed
    is not a multiple of `every` flipped vertically, at DALI's speed, on the GPU where the graph is."""
    from nvidia.dali import fn, types
    return fn.flip(images, vertical=fn.cast(seeds % every != 0, dtype=types.INT32))
