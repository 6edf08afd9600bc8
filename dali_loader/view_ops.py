"""A view group's photometric ops on the DALI backend: the group's views stacked as the frames of one
sequence a sample, each op slot one operator over all of them, with per-frame parameters.

Why: view by view, each op slot is an auto_aug `select` over the kinds it can draw (augment.py):
DINOv2's ten views made about 280 small operators a batch, each over one view of each sample. A
group's views stacked ([count, size, size, 3], layout FHWC) go through a slot's colour jitter as
one `fn.hsv` (brightness as its value, saturation and grey as its saturation, hue as its hue: each
frame the kind it drew, the identity elsewhere) and a contrast blend with each frame's mean grey
(the luma of its channel means, as auto_aug's contrast); the blur as one `fn.gaussian_blur` with a
sigma per frame (a frame that does not blur: a sigma whose kernel is [0, 1, 0]); solarize as an
arithmetic expression. The order of the jitter ops stays each view's own: a slot is whichever kind
the view drew there. The flips commute with these ops, so a view is flipped after them, by the
normalize's mirror where nothing else comes between (pipeline.finish).

The host draws every parameter as the torch backend does (fastloader.draws, each view from
its own seed) and the feed passes them per group and slot, one value per frame. Off by default
(STACKS_BY_DEFAULT says why) until a GPU run measures it against the per-view graph; <split>.view_ops:
stacked turns it on.
"""
from __future__ import annotations

import copy

import numpy as np
from nvidia.dali import fn, types
from nvidia.dali.data_node import DataNode

from fastloader.augment.ops import IDENTITY, KIND_IDS
from fastloader.draws import Augmenter, ExtraOps

from .augment import param_on

HSV_KINDS = frozenset(KIND_IDS[name] for name in ("brightness", "color", "grayscale", "hue"))
CONTRAST, BLUR, SOLARIZE = KIND_IDS["contrast"], KIND_IDS["gaussian_blur"], KIND_IDS["solarize"]
STACKABLE = HSV_KINDS | {CONTRAST, BLUR, SOLARIZE, IDENTITY}
"""The kinds a stacked slot can apply: the colour jitter, grey, blur and solarize (DINO's, SimCLR's
views). A group whose slots may draw another kind (a policy's rotate) runs view by view."""
NO_BLUR = 1e-3
"""The sigma of a frame that does not blur: a 3-tap kernel of weights 0, 1, 0 in float."""
_LUMA = (0.299, 0.587, 0.114)
STACKS_BY_DEFAULT = False
"""Whether groups stack where <split>.view_ops is auto. Off until a GPU run measures it: on DALI's
CPU operators a stacked slot costs more than the per-view branches (every frame goes through hsv and the contrast
arithmetic, where `select` runs each view's one drawn kind: DINOv2's views 26 samples/s against 39
here), while on a GPU it should cost far less (230 GPU operators a batch against 826, no
conditional's split and merge). benchmarks/views.py measures both; the tests run the stacked graph."""


def stackable(augmenter: Augmenter) -> bool:
    """Whether a group's views can go through its ops stacked (every slot's kinds stackable)."""
    return bool(augmenter.slots) and all(set(kinds) <= STACKABLE for kinds in augmenter.slot_kinds)


def flips_only(augmenter: Augmenter) -> Augmenter:
    """The group's transform without its ops: what each view gets on its own (crop, flips)."""
    spec = copy.copy(augmenter)
    spec.slots, spec.policy, spec.colour_jitter, spec.extras = 0, None, None, ExtraOps()
    spec.__dict__.pop("slot_kinds", None)  # the original's cached kinds: derived again (none) from the above
    return spec


def _slot_parts(kinds: tuple[int, ...]) -> tuple[str, ...]:
    """The inputs a slot of these kinds needs, in feed order."""
    parts = []
    if HSV_KINDS & set(kinds):
        parts += ["hsv"]
    for kind, part in ((CONTRAST, "contrast"), (BLUR, "sigma"), (SOLARIZE, "threshold")):
        if kind in kinds:
            parts.append(part)
    return tuple(parts)


def group_name(group: int, slot: int, part: str) -> str:
    return f"g{group}.s{slot}.{part}"


def group_layout(group: int, augmenter: Augmenter) -> list[tuple[str, types.DALIDataType]]:
    """(name, DALI dtype) of a stacked group's per-sample inputs: float32 [count] per part ([count, 3]
    for hsv: hue in degrees, saturation, value)."""
    return [(group_name(group, slot, part), types.FLOAT) for slot, kinds in enumerate(augmenter.slot_kinds)
            for part in _slot_parts(kinds)]


def group_arrays(augmenter: Augmenter, op: np.ndarray, param: np.ndarray) -> tuple[np.ndarray, ...]:
    """A batch's arrays for group_layout from the views' draws, op int [count, B, slots] and param
    float [count, B, slots] (each view's draw_ops): one value per frame, frames in view order."""
    op, param = np.moveaxis(op, 0, 1), np.moveaxis(param, 0, 1).astype(np.float32)  # [B, count, slots]
    arrays = []
    for slot, kinds in enumerate(augmenter.slot_kinds):
        kind, value = op[..., slot], param[..., slot]
        for part in _slot_parts(kinds):
            if part == "hsv":
                hue = np.where(kind == KIND_IDS["hue"], value * 360.0, 0.0)
                grey = np.where(kind == KIND_IDS["grayscale"], 0.0, 1.0)
                saturation = np.where(kind == KIND_IDS["color"], value, grey)
                brightness = np.where(kind == KIND_IDS["brightness"], value, 1.0)
                arrays.append(np.stack([hue, saturation, brightness], axis=-1))
            elif part == "contrast":
                arrays.append(np.where(kind == CONTRAST, value, 1.0))
            elif part == "sigma":
                arrays.append(np.where(kind == BLUR, value, NO_BLUR))
            else:
                arrays.append(np.where(kind == SOLARIZE, value, 256.0))
    return tuple(np.ascontiguousarray(array, dtype=np.float32) for array in arrays)


def apply_group_ops(frames: DataNode, inputs: dict[str, DataNode], group: int, augmenter: Augmenter) -> DataNode:
    """A group's views, stacked (FHWC uint8), through its slots in order, each frame with its own
    parameters (group_layout's inputs); uint8 out."""

    def per_frame_tensor(node: DataNode) -> DataNode:
        """float [count] -> [count, 1, 1, 1], where the frames are, for arithmetic with them."""
        return param_on(frames, fn.reshape(node, shape=[-1, 1, 1, 1]))

    for slot, kinds in enumerate(augmenter.slot_kinds):
        parts = {part: inputs[group_name(group, slot, part)] for part in _slot_parts(kinds)}
        if "hsv" in parts:
            hsv = parts["hsv"]
            frames = fn.hsv(frames, hue=fn.per_frame(hsv[:, 0]), saturation=fn.per_frame(hsv[:, 1]),
                            value=fn.per_frame(hsv[:, 2]))
        if "contrast" in parts:  # blend with each frame's mean grey (auto_aug's contrast): x k + (1 - k) centre
            means = fn.reductions.mean(frames, axes=[1, 2])  # [count, 3]: each frame's channel means
            centre = fn.reductions.sum(means * types.Constant(np.array(_LUMA, np.float32)), axes=[1])
            factor = parts["contrast"]
            offset = fn.reshape(centre * param_on(frames, 1.0 - factor), shape=[-1, 1, 1, 1])
            frames = fn.cast(frames * per_frame_tensor(factor) + offset, dtype=types.UINT8)
        if "sigma" in parts:
            frames = fn.gaussian_blur(frames, sigma=fn.per_frame(parts["sigma"]))
        if "threshold" in parts:  # 255 - x where x >= the frame's threshold (256: none)
            at_or_above = fn.cast(frames >= per_frame_tensor(parts["threshold"]), dtype=types.UINT8)
            frames = fn.cast(frames + at_or_above * (255 - 2 * fn.cast(frames, dtype=types.INT16)), dtype=types.UINT8)
    return frames
