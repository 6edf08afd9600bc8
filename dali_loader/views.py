"""Views on the DALI backend (fastloader.views): what the feed passes in for every view of a batch,
and the pipeline's outputs, one per view, joined into one tensor per view group.

The graph (pipeline.view_graph) decodes each sample once, whole, and slices, resizes, flips and
augments every view from that one image: one pipeline, one decode, a branch per view, and where a
group's ops allow it (view_ops), the group's views stacked through each op at once. Each view's
crop box, flips and ops are drawn on the host from the view's seed, as the torch backend draws
them, and fed in under the view's own names ("v3.crop_anchor"): view v's inputs are a train
batch's inputs (augment.feed_inputs) for its group's transform, or for its crop and flips alone
where the group's ops are stacked, whose inputs follow per group ("g2.s0.hsv").
"""
from __future__ import annotations

import weakref

import numpy as np
import torch
from nvidia.dali import types
from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

from fastloader.draws import Augmenter
from fastloader.hooks import SplitHooks
from fastloader.views import ViewPlan

from .augment import feed_arrays, feed_inputs
from .user_ops import hook_inputs
from .view_ops import STACKS_BY_DEFAULT, flips_only, group_arrays, group_layout, stackable


def view_name(view: int, name: str) -> str:
    return f"v{view}.{name}"


def stacked_groups(plan: ViewPlan) -> tuple[bool, ...]:
    """Per group, whether its ops run on its views stacked (<split>.view_ops, where the group's ops
    allow it: view_ops.stackable): decided once, where the loader builds its graph and its feed,
    which travels with the answer to a feed process."""
    on = plan.stacks_ops(STACKS_BY_DEFAULT)
    return tuple(on and stackable(group.augmenter) for group in plan.groups)


def view_specs(plan: ViewPlan, stacking: tuple[bool, ...]) -> list[Augmenter]:
    """What each view is fed on its own, view by view: its group's whole transform, or its crop and
    flips where the group's ops run on its stacked views (view_ops)."""
    return [flips_only(group.augmenter) if stacking[number] else group.augmenter
            for number, group in enumerate(plan.groups) for _ in range(group.count)]


def view_layout(plan: ViewPlan, hooks: SplitHooks) -> list[tuple[str, types.DALIDataType]]:
    """(name, DALI dtype) of every view's per-sample inputs, view by view, then each stacked group's
    ops' inputs (view_ops.group_layout)."""
    stacking = stacked_groups(plan)
    layout = [(view_name(v, name), dtype) for v, spec in enumerate(view_specs(plan, stacking))
              for name, dtype in feed_inputs(spec) + hook_inputs(hooks)]
    return layout + [entry for number, group in enumerate(plan.groups) if stacking[number]
                     for entry in group_layout(number, group.augmenter)]


def view_inputs(inputs: dict, view: int) -> dict:
    """View `view`'s inputs under the names a single crop's graph reads."""
    prefix = view_name(view, "")
    return {name[len(prefix):]: node for name, node in inputs.items() if name.startswith(prefix)}


def view_arrays(plan: ViewPlan, batch: np.ndarray, sizes: np.ndarray, hooked: bool,
                stacking: tuple[bool, ...]) -> tuple[np.ndarray, ...]:
    """A batch's arrays for view_layout, from its (sample, seed) rows and upright sizes [B, 2];
    `stacking`: stacked_groups' answer where the graph was built."""
    view_seeds, arrays = plan.seeds(batch[:, 1]), ()
    for view, spec in enumerate(view_specs(plan, stacking)):
        arrays += feed_arrays(spec, view_seeds[view], sizes)
        if hooked:  # user_ops.HOOK_INPUTS, with the view's seed
            arrays += (np.ascontiguousarray(np.stack([batch[:, 0], view_seeds[view]], axis=1), dtype=np.int64),)
    for number, group in enumerate(plan.groups):
        if stacking[number]:
            draws = [group.augmenter.draw_ops(seeds) for seeds in view_seeds[group.first:group.first + group.count]]
            arrays += group_arrays(group.augmenter, np.stack([d[2] for d in draws]), np.stack([d[3] for d in draws]))
    return arrays


class HostBuffers:
    """Reused host memory for the CPU flavour's view groups. Why: a fresh group tensor every batch
    (130 MB for DINOv2's ten views at batch 64) is paged in by the driver thread and unmapped by the
    thread that drops it, the training thread: about 120 us a sample there. A buffer is handed out
    as a tensor whose storage holds a numpy view of it; once the trainer has dropped the last tensor
    over it, the view is dead and the next batch takes the buffer again (as
    torch_loader.collate.BatchPool). At most `slots` buffers of a shape; a trainer that keeps more
    batches gets fresh tensors."""

    def __init__(self, slots: int):
        self.slots = slots
        self.free: dict[tuple, list[np.ndarray]] = {}
        self.made: dict[tuple, int] = {}
        self.lent: list[tuple[weakref.ref, tuple, np.ndarray]] = []
        """(a weak reference to the view the trainer's tensor holds, its key, its buffer), per buffer lent."""

    def sweep(self) -> None:
        """The buffers whose views are dead, free again. Checked as the next batch is made, never by a
        callback when the trainer drops a batch: code run from a deallocation loses a Ctrl-C that
        lands in it (torch_loader.collate.BatchPool.sweep)."""
        lent = []
        for view, key, memory in self.lent:
            if view() is None:
                self.free[key].append(memory)
            else:
                lent.append((view, key, memory))
        self.lent = lent

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        self.sweep()
        key = (tuple(shape), dtype)
        free = self.free.setdefault(key, [])
        if free:
            memory = free.pop()
        elif self.made.get(key, 0) < self.slots:
            memory = np.empty(int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
            self.made[key] = self.made.get(key, 0) + 1
        else:
            return torch.empty(shape, dtype=dtype)
        view = memory.view()
        self.lent.append((weakref.ref(view), key, memory))  # free again once the last tensor over it is gone
        return torch.from_numpy(view).view(dtype).view(shape)


def join_views(plan: ViewPlan, views: list, device: torch.device, stream=None,
               buffers: HostBuffers | None = None) -> list[torch.Tensor]:
    """The pipeline's outputs, one DALI tensor [B, ...] per view, as one torch tensor [count * B, ...]
    per group on `device`, crop-major (view k of sample i at row k * B + i): each view copied once,
    straight into its rows (on the driver's CUDA `stream` in the GPU flavour; into `buffers` on the
    host)."""
    groups = []
    for group in plan.groups:
        first = views[group.first]
        count, shape = first.shape()[0], first.shape()[1:]
        full, dtype = (group.count * count, *shape), to_torch_type[first.dtype]
        out = buffers.take(full, dtype) if buffers is not None else torch.empty(full, dtype=dtype, device=device)
        for k in range(group.count):
            feed_ndarray(views[group.first + k], out[k * count:(k + 1) * count], cuda_stream=stream)
        groups.append(out)
    return groups
