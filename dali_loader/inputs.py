"""What the pipeline is fed with a batch besides its images: pure functions of the batch.

Every random choice of a sample is drawn on the host from its seed and its upright size (as the torch
backend draws it), and handed to the graph as dense arrays (pipeline.feed_layout says which, in
order): train's crop boxes, flips and ops (augment.feed_arrays), each view's (views.view_arrays),
eval's centre boxes, a size schedule's output side, and the (sample, seed) rows a user's hook is
called with (user_ops.HOOK_INPUTS).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fastloader.draws import Augmenter
from fastloader.order import output_size
from fastloader.views import ViewPlan

from .augment import feed_arrays
from .pipeline import Sizing, centre_boxes
from .views import stacked_groups, view_arrays


class InputPlan(NamedTuple):
    """What decides a batch's inputs, fixed when the graph is built."""
    train: bool
    sizing: Sizing
    """The split's transform's (its size: where a size schedule is off; eval's centre box)."""
    augmenter: Augmenter | None
    views: ViewPlan | None
    stacking: tuple[bool, ...]
    """Per view group, whether the graph runs its ops stacked (views.stacked_groups)."""
    hooked: bool
    """The graph runs the user's sample hook or graph function: each batch's (sample, seed) rows are fed."""
    sized: bool
    """The planned batches carry their output size (a size schedule): fed with the draws."""


def input_plan(train: bool, sizing: Sizing, augmenter: Augmenter | None, views: ViewPlan | None, hooked: bool,
               sized: bool) -> InputPlan:
    return InputPlan(train, sizing, augmenter, views, stacked_groups(views) if views is not None else (), hooked,
                     sized)


def batch_inputs(plan: InputPlan, planned: np.ndarray, batch: np.ndarray, sizes: np.ndarray) -> tuple:
    """The arrays fed after the images for the (sample, seed) rows `batch` taken from the `planned`
    batch, of upright (height, width) `sizes`."""
    if plan.views is not None:  # every view's draws, from the view's seed (hooked: its (sample, seed) too)
        return view_arrays(plan.views, batch, sizes, plan.hooked, plan.stacking)
    if plan.train:  # every random choice of each sample, drawn from its seed
        side = output_size(planned, plan.sizing.size) if plan.sized else None
        inputs = feed_arrays(plan.augmenter, batch[:, 1], sizes, side)
    else:
        inputs = (centre_boxes(sizes, plan.sizing),)
    if plan.hooked:  # user_ops.HOOK_INPUTS
        inputs += (np.ascontiguousarray(batch[:, :2], dtype=np.int64),)
    return inputs
