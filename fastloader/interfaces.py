"""What a loop gets and what a user's hooks are, as types: the one place to read the shapes of a
batch and the three hook signatures (docs/transforms.md, docs/views.md). Annotations only: nothing
here is called, so it imports torch only for a type checker.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Tuple, Union

if TYPE_CHECKING:
    import torch

Images = Union["torch.Tensor", "list[torch.Tensor]"]
"""A batch's images: float (or `dtype`) [B, 3, H, W], normalized, on the loader's device; with
`train.views`, a list with one tensor per view group, each [count * B, 3, size, size], crop-major
(view k of sample i is row k * B + i)."""

Labels = "torch.Tensor"
"""A batch's labels: int64 [B]; float32 [B, num_classes] soft targets where the split mixes
(mixup, cutmix) or smooths labels."""

Batch = Tuple[Images, "torch.Tensor"]
"""What `for images, labels in loader` gives: (Images, Labels). A batch whose every file failed
is empty (B = 0), never left out: every rank gets len(loader) batches."""


class SampleHook(Protocol):
    """`<split>.transform.sample_hook`: one sample's uint8 [3, H, W] image on the CPU after its crop,
    and a torch.Generator seeded from the sample's seed (draw from it, not from torch's global one);
    returns a uint8 tensor of the same shape."""

    def __call__(self, image: "torch.Tensor", generator: "torch.Generator") -> "torch.Tensor": ...


class BatchHook(Protocol):
    """`<split>.transform.batch_hook`: a normalized batch on the loader's device, its labels and its
    samples' seeds (int64 [B]); returns (images, labels) of the same shapes, dtypes and device."""

    def __call__(self, images: "torch.Tensor", labels: "torch.Tensor",
                 seeds: "torch.Tensor") -> "tuple[torch.Tensor, torch.Tensor]": ...


class GraphHook(Protocol):
    """`dali.graph_hook`: called once while the DALI graph is built, with the images' DataNode (uint8
    HWC after the crop), the seeds' DataNode and `dali.graph_hook_args` as keywords; returns the
    images' DataNode (the same layout and size) with the user's operators added."""

    def __call__(self, images: Any, seeds: Any, **graph_hook_args: Any) -> Any: ...
