"""Several views of each sample (multi-crop, DINO's and SimCLR's): a train split's view groups, the
seed of each view, and the batch stages run per view.

Each view is drawn as a sample of its own would be, from its own seed: the view's group's transform
(the split's with the group's keys over it) and a seed derived from (the sample's seed, the view's
index among all the sample's views). So a view's crop, flips and ops are a pure function of the
sample's seed, the same on both backends, in any batch and after a resume; a view group is one
split-like transform to every stage that knows one (the draws, the DALI graph, the torch crop).
Both backends decode a sample once and crop every view from the one image.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from .device_ops import BatchFinisher, erasing_enabled
from .draws import Augmenter
from .hooks import Hook
from .order import derived_seeds
from .schema import SplitConfig

_VIEW_SALT = 0x71E35EED


@dataclass(frozen=True)
class ViewGroup:
    """`count` views of each sample drawn through `split` (the train split with the group's
    transform): views first .. first + count - 1 of the sample."""
    name: str
    count: int
    first: int
    split: SplitConfig
    augmenter: Augmenter

    @property
    def size(self) -> int:
        return self.split.transform.size


class ViewPlan:
    """A train split's view groups, in order, and each view's seed."""

    def __init__(self, split: SplitConfig, mean: tuple[float, float, float]):
        groups, first = [], 0
        for k, view in enumerate(split.views):
            group_split = dataclasses.replace(split, transform=view.transform, views=None)
            groups.append(ViewGroup(view.name or f"view{k}", view.count, first, group_split,
                                    Augmenter(view.transform, mean)))
            first += view.count
        self.groups: tuple[ViewGroup, ...] = tuple(groups)
        self.total = first
        """Views of each sample, all groups together."""
        self.group_of_view: tuple[ViewGroup, ...] = tuple(g for g in groups for _ in range(g.count))
        self.ops = split.view_ops
        """<split>.view_ops: how the groups' ops run (auto: as the backend does by default)."""

    def stacks_ops(self, backend_default: bool) -> bool:
        """Whether the groups' ops run on their views stacked: <split>.view_ops, or where it is auto,
        the backend's default."""
        return backend_default if self.ops == "auto" else self.ops == "stacked"

    def seeds(self, seeds: np.ndarray) -> np.ndarray:
        """int64 [views, B]: each view's seed, from its sample's seed and the view's index."""
        return derived_seeds(np.asarray(seeds, dtype=np.int64), _VIEW_SALT, self.total)

    @property
    def has_ops(self) -> bool:
        return any(group.augmenter.slots for group in self.groups)

    def describe(self) -> str:
        """'2 x 224 px (global), 8 x 96 px (local)' for the log line and repr."""
        return ", ".join(f"{g.count} x {g.size} px ({g.name})" for g in self.groups)

    def empty(self, dtype: torch.dtype, device: torch.device, channels_last: bool) -> list[torch.Tensor]:
        """A batch of no images: one [0, 3, size, size] tensor per group."""
        memory_format = torch.channels_last if channels_last else torch.contiguous_format
        return [torch.empty((0, 3, g.size, g.size), dtype=dtype, device=device, memory_format=memory_format)
                for g in self.groups]


class ViewFinisher:
    """A split's batch stages run per view, on the rows of its group's tensor: the user's batch hook
    (called once per view, with that view's seeds), then the group's random erasing. No mixing or
    soft targets: refused with views (config_rules.check_views). The labels the hook gives for one
    view are what the next view's call gets; the last view's are the batch's."""

    mixer = None

    def __init__(self, plan: ViewPlan, hook: Hook | None):
        self.plan, self.hook = plan, hook
        self.stages = [BatchFinisher(g.split.transform, erasing_enabled(g.split.transform, "train"), None, hook)
                       for g in plan.groups]

    @classmethod
    def for_views(cls, plan: ViewPlan, hook: Hook | None) -> "ViewFinisher | None":
        """None where no view has a stage (no hook, no erasing)."""
        on = hook is not None or any(erasing_enabled(g.split.transform, "train") for g in plan.groups)
        return cls(plan, hook) if on else None

    def start_epoch(self, planned: list[np.ndarray]) -> None:
        """Nothing is drawn ahead: no mixing."""

    def __call__(self, images: list[torch.Tensor], labels: torch.Tensor, seeds: np.ndarray,
                 borrowed: bool = False) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Each group's tensor finished in place, view by view (`seeds`: the samples'). The hook is
        given each view's rows as a tensor of its own: it may keep them (BatchFinisher)."""
        view_seeds, count = self.plan.seeds(seeds), len(seeds)
        for group, tensor, stage in zip(self.plan.groups, images, self.stages):
            for k in range(group.count):
                rows = tensor[k * count:(k + 1) * count]
                finished, labels = stage(rows, labels, view_seeds[group.first + k], borrowed=True)
                if finished is not rows:  # the hook's own tensor, of the same shape and dtype
                    rows.copy_(finished)
        return images, labels
