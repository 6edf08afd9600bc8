"""Views on the torch backend: every view of a sample cropped from one decode, and the batch of
views (one tensor per view group, crop-major: view k of sample i at row k * B + i).

The decoder decodes the union of the sample's view boxes (region decode where the decoder can, the
whole image where Pillow decodes) at full resolution, never drafted: Pillow's draft scales the
whole JPEG for the smallest view's need, and the DALI backend decodes every view from the whole,
unscaled image. Each view is then cropped, resized, flipped and augmented as a sample of its group
would be (transforms.SampleTransform), from its own seed (fastloader.views).

Where no sample hook needs each view finished in the sample's call (`stacked_ops`), the ops wait
for the collate: a view group's images of the whole batch go through each op together
(augment.apply_ops_stacked), the same pixels as view by view at a fraction of the calls.
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import numpy as np
import torch

from fastloader.decoding.decode import load_region
from fastloader.device_ops import BatchFinisher
from fastloader.imaging.geometry import Crop
from fastloader.locations import Location
from fastloader.schema import BOMB_PIXELS
from fastloader.views import ViewPlan

from .augment import apply_ops_stacked
from .collate import Batch, BatchPool, empty_batch, labels_of, partition
from .prefetch import Normalizer
from .transforms import SampleOps, SampleTransform

STACKS_BY_DEFAULT = True
"""<split>.view_ops: auto here: a loader without a sample hook leaves the views' ops to the collate
(stacked); per_view: each view's ops in its sample's call (benchmarks/views.py's `per view` case)."""

STACK_BYTES = 2 << 20
"""How much of a group's stack goes through the ops at a time: passes over a batch's whole stack
(56 MB of float for DINOv2's local views at batch 64) run from memory, a chunk's from the cache."""

ViewOps = tuple[SampleOps, ...]
"""One sample's draws, one SampleOps per view."""


class ViewsTransform:
    """(path, sample seed) -> a tuple of uint8 [3, size, size] images, one per view, from one decode;
    picklable, so it travels to the workers."""

    train = True

    def __init__(self, plan: ViewPlan, groups: Sequence[SampleTransform], exif_orientation: bool = True,
                 max_pixels: int = BOMB_PIXELS, stacked_ops: bool = False):
        """`groups`: each view group's SampleTransform, in the plan's order (torch_loader.loader builds
        them from the groups' transforms, use_draft off: every view is cut from one whole decode)."""
        self.plan = plan
        self.stacked_ops = stacked_ops
        """The ops are left to the collate (ViewsCollate with this transform): views come cropped,
        resized and flipped only."""
        self.of_view = [groups[plan.groups.index(g)] for g in plan.group_of_view]
        self.groups = [(transform, range(g.first, g.first + g.count)) for transform, g in zip(groups, plan.groups)]
        self.size = max(g.size for g in plan.groups)
        self.exif_orientation, self.max_pixels = exif_orientation, max_pixels

    def view_seeds(self, seed: int) -> list[int]:
        return self.plan.seeds(np.array([seed]))[:, 0].tolist()

    def sample_ops(self, seeds: np.ndarray, size: int | None = None) -> list[ViewOps]:
        """Every view's draws of a batch's samples, one vectorized draw per view."""
        view_seeds = self.plan.seeds(seeds)
        per_view = [t.sample_ops(view_seeds[v]) for v, t in enumerate(self.of_view)]
        return list(zip(*per_view))

    def __call__(self, where: str | Location, seed: int, ops: ViewOps | None = None,
                 size: int | None = None) -> tuple[torch.Tensor, ...]:
        ops = ops or self.sample_ops([seed])[0]
        boxes: list[Crop] = []

        def union(width: int, height: int) -> Crop:
            boxes[:] = self.boxes(width, height, ops)
            return Crop(min(b.left for b in boxes), min(b.top for b in boxes), max(b.right for b in boxes),
                        max(b.bottom for b in boxes))

        pixels, decoded, _ = load_region(where, union, self.size, exif_orientation=self.exif_orientation,
                                         use_draft=False, max_pixels=self.max_pixels)
        dx, dy = decoded.left - min(b.left for b in boxes), decoded.top - min(b.top for b in boxes)
        return tuple(self._finish(t, t.resize(pixels, Crop(b.left + dx, b.top + dy, b.right + dx, b.bottom + dy,
                                                         b.flip)), op) for t, op, b in zip(self.of_view, ops, boxes))

    def _finish(self, transform: SampleTransform, view: torch.Tensor, ops: SampleOps) -> torch.Tensor:
        """The view's vertical flip and ops; the flip alone where the collate runs the ops."""
        return transform.augment(view, ops._replace(op=(), param=()) if self.stacked_ops else ops)

    def stacked(self, images: list[torch.Tensor], group: int, seeds: np.ndarray,
                write: Callable[[slice, torch.Tensor], None]) -> None:
        """View group `group`'s images of a batch, crop-major (view k of sample i at k * B + i), through
        the group's ops, drawn from the samples' `seeds` as each view's own call would draw them: each
        chunk of rows handed to `write(rows, float32 [n, 3, size, size] of uint8 values)` as it is done."""
        transform, views = self.groups[group]
        augmenter = transform.augmenter
        ops = params = None
        if augmenter.slots:
            view_seeds = self.plan.seeds(seeds)
            draws = [augmenter.draw_ops(view_seeds[view]) for view in views]
            ops, params = np.concatenate([d[2] for d in draws]), np.concatenate([d[3] for d in draws])
        step = max(1, STACK_BYTES // (4 * images[0].numel()))
        for start in range(0, len(images), step):  # a few MB at a time: each op's pass runs in the cache
            rows = slice(start, min(start + step, len(images)))
            chunk = torch.stack(images[rows]).to(torch.float32, memory_format=torch.contiguous_format)
            write(rows, chunk if ops is None else apply_ops_stacked(chunk, ops[rows], params[rows], transform.context))

    def boxes(self, width: int, height: int, ops: ViewOps) -> list[Crop]:
        """Every view's crop box in an image of this upright size: one vectorized draw per group."""
        boxes = []
        for transform, views in self.groups:
            uniforms = np.stack([ops[view].crop for view in views])
            sizes = np.broadcast_to(np.array([[height, width]]), (len(views), 2))
            boxes += [Crop(*box, flip=ops[view].hflip)
                      for view, box in zip(views, transform.augmenter.boxes(uniforms, sizes).tolist())]
        return boxes

    def from_pixels(self, pixels: np.ndarray, seed: int, ops: ViewOps | None = None,
                    size: int | None = None) -> tuple[torch.Tensor, ...]:
        """Every view of already decoded upright HWC uint8 pixels (the uint8 cache's)."""
        ops = ops or self.sample_ops([seed])[0]
        image, (height, width) = torch.from_numpy(pixels), pixels.shape[:2]
        return tuple(self._finish(t, t.resize(image, box), op)
                     for t, op, box in zip(self.of_view, ops, self.boxes(width, height, ops)))


class ViewsCollate:
    """A Batch whose images are a list of one tensor per view group, crop-major: uint8 in
    channels_last memory for the device to normalize (`normalizer` None), fresh in shared memory;
    or normalized here in the output dtype and memory format and finished per view (the CPU's),
    each group's tensor in a slot of its group's BatchPool (`pools`; collate.py says why), the
    Batch's slot then a tuple of one slot per group (-1 where a group's tensor is sent). With a
    `transform` whose views wait for their ops (ViewsTransform.stacked_ops), each group's views go
    through the ops here, stacked."""

    def __init__(self, plan: ViewPlan, normalizer: Normalizer | None = None, finisher: BatchFinisher | None = None,
                 pools: list[BatchPool] | None = None, transform: ViewsTransform | None = None):
        self.plan, self.normalizer, self.finisher, self.pools = plan, normalizer, finisher, pools
        self.transform = transform if transform is not None and transform.stacked_ops else None

    def _write(self, batch: torch.Tensor, rows: slice, chunk: torch.Tensor) -> None:
        """Stacked views' rows into the batch: as uint8, or normalized."""
        if self.normalizer is None:
            batch[rows].copy_(chunk)
        else:
            self.normalizer.stack_into(batch[rows], chunk)

    def __call__(self, samples: list) -> Batch:
        decoded, skipped = partition(samples)
        if not decoded:
            return None, labels_of(decoded), skipped, -1, None
        count, groups, slots = len(decoded), [], []
        seeds = np.array([seed for *_, seed in decoded], dtype=np.int64)
        for number, group in enumerate(self.plan.groups):
            shape = (group.count * count, 3, group.size, group.size)
            slot = -1
            if self.normalizer is None:
                batch = empty_batch(shape, torch.uint8, channels_last=True)
            elif self.pools:
                batch, _, slot = self.pools[number].take(shape[0])
            else:
                batch = empty_batch(shape, self.normalizer.dtype, self.normalizer.channels_last)
            slots.append(slot)
            images = [views[group.first + k] for k in range(group.count) for views, *_ in decoded]
            for row, image in enumerate(images):
                if tuple(image.shape) != shape[1:]:
                    raise ValueError(f"view {group.first + row // count} of sample {row % count} of the batch has "
                                     f"shape {tuple(image.shape)}, expected {shape[1:]}")
            if self.transform is not None:  # the group's ops on all its views at once, a chunk at a time
                self.transform.stacked(images, number, seeds, functools.partial(self._write, batch))
            else:
                for row, image in enumerate(images):
                    if self.normalizer is None:
                        batch[row].copy_(image)
                    else:
                        self.normalizer.into(batch[row], image)
            groups.append(batch)
        labels = labels_of(decoded)
        if self.finisher is not None and self.normalizer is not None:
            groups, finished = self.finisher(groups, torch.from_numpy(labels), seeds)
            labels = finished.numpy()
        if not self.pools:
            return groups, labels, skipped, -1, None
        return [None if slot >= 0 else batch for batch, slot in zip(groups, slots)], labels, skipped, tuple(slots), None
