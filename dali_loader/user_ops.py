"""The user's own transforms in the DALI graph (fastloader.hooks), where the torch backend runs
them: after the crop, resize, flips and ops, before normalizing.

- The sample hook runs through DALI's Python-function operator (fn.python_function), one call per
  sample on DALI's CPU thread, holding the GIL; in the GPU flavour the images go to the host for
  it and back (the dynamic executor allows the GPU->CPU step). A hook that draws from the global
  generators (with_global_rng) is called once a batch there, and hooks the batch in processes of
  its own (hook_processes.py): on DALI's threads it would reseed the trainer's generators. The
  images are HWC uint8 there, as the torch workers' crops are in memory: the hook sees the same
  [3, H, W] view, of a copy (DALI's operator must not modify its input; a hook may).
- The graph function (dali.graph_hook) is called once while the graph is built, with the images'
  DataNode and the samples' seeds' DataNode, and adds its operators where the graph runs.

Both need each sample's (sample, seed), which the feed passes in as one more per-sample input
(HOOK_INPUTS). A sample hook's error is kept (`failure`), so that the loader stops with it rather
than probing the batch's files for a bad one.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np
import torch
from nvidia.dali import fn, types
from nvidia.dali.data_node import DataNode

from fastloader.errors import HookError
from fastloader.hooks import Hook, SplitHooks
from fastloader.order import output_size
from fastloader.views import ViewPlan

from .hook_processes import HookProcesses

HOOK_INPUTS = [("sample_seed", types.INT64)]
"""Per-sample input of a graph with a hook: int64 [2], the sample's number in the index and its seed."""


def hook_inputs(hooks: SplitHooks) -> list[tuple[str, types.DALIDataType]]:
    """The feed's extra inputs for the split's hooks (none without a sample hook or graph function)."""
    return HOOK_INPUTS if hooks.sample is not None or hooks.graph is not None else []


class UserOps(NamedTuple):
    """What the graph needs of the split's hooks: the hooks, and the sample hook's caller (or None)."""
    hooks: SplitHooks
    sample_hook: "PythonSampleHook | None"


NO_USER_OPS = UserOps(SplitHooks(), None)


class PythonSampleHook:
    """The function fn.python_function calls per sample: (HWC uint8 image, [sample, seed]) -> the
    hook's image, HWC uint8. `name_of` names a sample by its number (the index's path); `in_progress`
    (the feed's, in_progress.InProgress) notes the sample being hooked, for a stalled pipeline. `apart`: the
    processes that run a hook drawing from the global generators (hook_processes.py), called a
    batch at a time (`batch`); None for any other hook."""

    def __init__(self, hook: Hook, name_of: Callable[[int], str], in_progress: Any, apart: HookProcesses | None = None):
        self.hook, self.name_of, self.in_progress, self.apart = hook, name_of, in_progress, apart
        self.failure: HookError | None = None
        """The hook's error, kept for the loader: DALI's own carries only its text."""

    def batch(self, images: list[np.ndarray], sample_seeds: list[np.ndarray]) -> list[np.ndarray]:
        """The batch's images (HWC uint8) hooked in the processes (`apart`), in order."""
        samples, seeds = ([int(row[column]) for row in sample_seeds] for column in (0, 1))
        self.in_progress.begin(f"running {self.hook.label} (in its processes) on a batch of {len(images)} from sample",
                          self.name_of(samples[0]))
        try:
            return self.apart.batch(images, samples, seeds)
        except HookError as error:
            self.failure = error
            raise
        finally:
            self.in_progress.end()

    def __call__(self, image: np.ndarray, sample_seed: np.ndarray) -> np.ndarray:
        sample, seed = (int(value) for value in sample_seed)
        name = self.name_of(sample)
        self.in_progress.begin(f"running {self.hook.label} on sample", name)
        try:
            # a copy: DALI's operator must not modify its input, and a hook may work in place (torch lets it)
            out = self.hook.on_sample(torch.from_numpy(image.copy()).permute(2, 0, 1), seed, name)
        except HookError as error:
            self.failure = error
            raise
        finally:
            self.in_progress.end()
        return np.ascontiguousarray(out.permute(1, 2, 0).numpy())


def apply_user_ops(images: DataNode, inputs: dict[str, DataNode], user: UserOps, gpu: bool) -> DataNode:
    """The sample hook, then the graph function, on HWC uint8 images (on the GPU in the gpu flavour)."""
    hooks, sample_hook = user
    if sample_hook is not None:
        host = images.cpu() if gpu else images
        apart = sample_hook.apart is not None
        images = fn.python_function(host, inputs["sample_seed"], function=sample_hook.batch if apart else sample_hook,
                                    batch_processing=apart, num_outputs=1, output_layouts="HWC")
        images = images.gpu() if gpu else images
    if hooks.graph is not None:
        images = _graph_function(images, inputs["sample_seed"][1], hooks)
    return images


def _graph_function(images: DataNode, seeds: DataNode, hooks: SplitHooks) -> DataNode:
    hook = hooks.graph
    try:
        out = hook.function(images, seeds, **hooks.graph_args)
    except (Exception, SystemExit, KeyboardInterrupt) as error:  # at build: never the process's end
        raise HookError(hook.failure_words(error, "the graph, while DALI built it") +
                        f"\n(called with the images, the seeds and dali.graph_hook_args {dict(hooks.graph_args)!r})"
                        ) from error
    if not isinstance(out, DataNode):
        raise HookError(f"{hook.label} returned a {type(out).__name__}; a graph function returns the images' DataNode "
                        f"(DALI operators' output), HWC uint8 of the size it is given")
    return out


def graph_size_check(hook: Hook | None, size: int, split_name: str, sized: bool, views: ViewPlan | None = None
                     ) -> Callable | None:
    """A check that a graph function kept each batch's output size (`size`, the split's transform's;
    a size schedule's, where `sized`; each view's: its group's size); None without one."""
    if hook is None:
        return None
    groups = views.group_of_view if views is not None else None

    def check(sizes: list[tuple[int, int]], plan: np.ndarray) -> None:
        """`sizes`: each output's (height, width), one per view with views."""
        for view, (height, width) in enumerate(sizes):
            side = output_size(plan, size) if sized else size
            side, what = (groups[view].size, f"view group {groups[view].name}'s size") if groups else (
                side, f"{split_name}.transform's size")
            if (height, width) != (side, side):
                raise HookError(f"{hook.label} gave images of {height}x{width} pixels (height x width); a graph "
                                f"function returns images of the size it is given, {side}x{side} ({what})")
    return check
