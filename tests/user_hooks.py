"""Hooks the tests name by path (`user_hooks:stamp`), as a user's config would: a module on the
path, imported where the loader is built and in every worker."""
from __future__ import annotations

import os
import random
import signal
import sys
import time

import numpy as np
import torch
from torchvision.transforms import v2

from fastloader import with_global_rng


def stamp(image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The first row becomes one grey value drawn from the sample's generator."""
    out = image.clone()
    out[:, 0, :] = int(torch.randint(0, 256, (1,), generator=generator))
    return out


def identity(image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return image


def batch_identity(images, labels, seeds):
    return images, labels


def fails(image, generator):
    return {"no such key": 1}["the key"]


def shrinks(image, generator):
    return image[:, :8, :8]


def floats(image, generator):
    return image.float()


def hangs(image, generator):
    time.sleep(3600)


SEEN: list[tuple] = []


def batch_stamp(images, labels, seeds):
    """Pixel (0, 0) of each image becomes its seed's last digits (normalized: before the mixing);
    what it was given is noted."""
    SEEN.append((images.dtype, tuple(images.shape), labels.dtype, tuple(labels.shape)))
    images[:, :, 0, 0] = (seeds % 251).to(images.device, images.dtype).view(-1, 1) / 251
    return images, labels


def batch_new_tensors(images, labels, seeds):
    """New tensors, not the ones given: each image's colours reversed."""
    return images.flip(1).contiguous(), labels.clone()


def batch_wrong_labels(images, labels, seeds):
    return images, labels.float()


def batch_fails(images, labels, seeds):
    raise ValueError("batch hook bug")


def graph_flip(images, seeds, every=2):
    """A DALI op: the samples whose seed is even (every=2) flipped upside down."""
    from nvidia.dali import fn, types
    return fn.flip(images, vertical=fn.cast(seeds % every == 0, dtype=types.INT32))


def graph_not_a_node(images, seeds):
    return images is not None


def graph_resizes(images, seeds):
    from nvidia.dali import fn
    return fn.resize(images, resize_x=8, resize_y=8)


RAND_AUGMENT = v2.Compose([v2.RandAugment(num_ops=2, magnitude=9), v2.RandomGrayscale(p=0.3)])
"""A torchvision v2 pipeline, named in a config as `user_hooks:RAND_AUGMENT`."""


def global_stamp(image: torch.Tensor) -> torch.Tensor:
    """The first row becomes one grey value drawn from torch's global generator (what `stamp` draws
    from the sample's), then draws from Python's, numpy's and torch's global generators for some
    milliseconds, letting go of the GIL between them as a torchvision op on a large image does."""
    out = image.clone()
    out[:, 0, :] = int(torch.randint(0, 256, (1,)))
    for _ in range(10):
        random.random(), np.random.rand(), torch.rand(1)
        time.sleep(0.001)
    return out


GLOBAL_STAMP = with_global_rng(global_stamp)


def global_fails(image: torch.Tensor) -> torch.Tensor:
    return {"no such key": 1}["the global key"]


def global_dies(image: torch.Tensor) -> torch.Tensor:
    os.kill(os.getpid(), signal.SIGKILL)


GLOBAL_FAILS, GLOBAL_DIES = with_global_rng(global_fails), with_global_rng(global_dies)


class versioned:  # noqa: N801 - a hook function with a version
    version = "2"

    def __call__(self, image, generator):
        return image


VERSIONED = versioned()


def in_place(image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Works on the image it is given, as torch lets a function do."""
    image[:, 0, :] = int(torch.randint(0, 256, (1,), generator=generator))
    return image


def graph_identity(images, seeds):
    """A graph function that leaves the seeds it is given unused."""
    return images


KEPT: list = []
"""What batch_keeps kept, in this process: (its input, a copy made when it was given)."""


def batch_keeps(images, labels, seeds):
    """A memory bank's way: keeps every input; each call first checks that the inputs it kept still
    hold what they held when given (a loader that reuses their memory for a later batch fails here)."""
    for kept, copy in KEPT:
        if not torch.equal(kept, copy):
            raise AssertionError("a batch this hook kept was overwritten by a later batch")
    KEPT.append((images, images.clone()))
    return images, labels


def batch_channels_last(images, labels, seeds):
    """Gives its batch in channels_last memory: the trainer's batch is laid out as configured."""
    return images.contiguous(memory_format=torch.channels_last), labels


def batch_expanded(images, labels, seeds):
    """Gives an expanded view (one image's memory for the whole batch): dense in the trainer's batch."""
    return images[:1].expand_as(images), labels


def exits(image, generator):
    sys.exit(3)


def interrupts(image, generator):
    raise KeyboardInterrupt


def batch_exits(images, labels, seeds):
    sys.exit("stop")


def graph_gives_seeds(images, seeds):
    """Returns the seeds' DataNode, not the images'."""
    return seeds


def graph_gives_grey(images, seeds):
    """Returns one channel where three are wanted."""
    return images[:, :, 0:1]
