"""The augmentation ops on the DALI backend: one function per kind of fastloader.augment.ops, built
from nvidia.dali.auto_aug's operations (and DALI's transforms for the warps), applied to the
size x size HWC uint8 images after the crop and resize, on whichever device they are (the same
graph for both flavours).

DALI does not draw anything here: the host draws every parameter from the samples' seeds
(fastloader.draws, the torch backend's draws) and the feed passes them in as argument
inputs, so both backends apply the same crop, flips, ops and magnitudes to a sample, and a resumed
run replays them. Each slot picks its op per sample with auto_aug's `select`, a tree of `if`s on
a branch number: the pipeline must be built with `enable_conditionals=True` (@pipeline_def). A
slot has a branch only for the kinds its policy can draw (Augmenter.slot_kinds), one per function
(shear_x and shear_y share one): colour jitter's 4 slots hold 5 branches each, not all 17 kinds, so
DALI builds, schedules and holds buffers for a third of the operators.

auto_aug's ops take a magnitude bin; we call the operation under each (`.op`) with the exact
parameter instead, which the host encodes per kind in the unit the DALI operator wants
(`dali_params`). DALI's warp fills with one value for all channels, so the geometric ops frame the
image with the fill colour and warp it with the edge clamped (_warped), as the torch ops do.
"""
from __future__ import annotations

import functools
from typing import Callable

import numpy as np
from nvidia.dali import fn, types
from nvidia.dali.auto_aug import augmentations as aa
from nvidia.dali.auto_aug.core._select import select
from nvidia.dali.data_node import DataNode

from fastloader.augment.ops import KIND_IDS, KINDS
from fastloader.draws import Augmenter, Draws

CROP_INPUTS = [("crop_anchor", types.FLOAT), ("crop_shape", types.FLOAT)]
"""Per-sample inputs of every train batch: the crop box's (x, y) corner and (width, height) in
upright source pixels (fn.decoders.image_slice / fn.slice with axis_names="WH")."""
FLIP_INPUTS = [("hflip", types.INT32), ("vflip", types.INT32)]
"""Per-sample inputs of the flips a split can draw (a probability above 0): 1 where the sample flips."""
OP_INPUTS = [("aug_op", types.INT32), ("aug_param", types.FLOAT)]
"""Per-sample inputs when the split has ops: int32 [slots] branch numbers (slot_branches), float32
[slots, 2] parameters."""
SIZE_INPUTS = [("out_size", types.FLOAT)]
"""Per-sample input under a size schedule (fastloader.resolution): float32 [2], the batch's output
(height, width), which the resize and the warps take as argument inputs: one graph for every size,
nothing rebuilt when it changes."""


def feed_inputs(augmenter: Augmenter, sized: bool = False) -> list[tuple[str, types.DALIDataType]]:
    """(name, DALI dtype) of the inputs the feed passes with each train batch, in feed_arrays' order;
    `sized`: the batches carry their output size (a size schedule)."""
    return (CROP_INPUTS + [flip for flip in FLIP_INPUTS if getattr(augmenter, flip[0]) > 0] +
            (OP_INPUTS if augmenter.slots else []) + (SIZE_INPUTS if sized else []))


def feed_arrays(augmenter: Augmenter, seeds: np.ndarray, sizes: np.ndarray,
                side: int | None = None) -> tuple[np.ndarray, ...]:
    """A batch's dense arrays for feed_inputs, from its sample seeds (int64 [B]) and upright sizes
    (int64 [B, 2], height and width): one vectorized draw, no loop over samples. `side`: the
    batch's output size under a size schedule (then fed too), else None (transform.size)."""
    arrays = dali_arrays(augmenter.draw(seeds, sizes, side), augmenter, side)
    if side is None:
        return arrays
    return (*arrays, np.full((len(seeds), 2), side, dtype=np.float32))


def dali_arrays(draws: Draws, augmenter: Augmenter, side: int | None = None) -> tuple[np.ndarray, ...]:
    """Draws -> the arrays of feed_inputs: crop_anchor, crop_shape float32 [B, 2], hflip and vflip
    int32 [B] where the split draws them, and with ops aug_op int32 [B, slots], aug_param float32
    [B, slots, 2] (for images of `side` pixels, default transform.size)."""
    left, top, right, bottom = draws.crop.T
    flips = tuple(flip.astype(np.int32) for flip, p in ((draws.hflip, augmenter.hflip), (draws.vflip, augmenter.vflip))
                  if p > 0)
    arrays = (np.stack([left, top], axis=1).astype(np.float32), np.stack([right - left, bottom - top], axis=1)
              .astype(np.float32), *flips)
    if not augmenter.slots:
        return arrays
    _, branch_of = slot_branches(augmenter.slot_kinds)
    branches = branch_of[np.arange(augmenter.slots), draws.op]
    if (branches < 0).any():  # a draw the graph has no branch for: never route it to another op
        row, slot = np.argwhere(branches < 0)[0]
        raise ValueError(f"slot {slot} drew {KINDS[draws.op[row, slot]].name}, which its policy cannot draw "
                         f"(Augmenter.slot_kinds)")
    return (*arrays, branches, dali_params(draws.op, draws.param, side or augmenter.size))


@functools.lru_cache(maxsize=32)
def slot_branches(slot_kinds: tuple[tuple[int, ...], ...]) -> tuple[tuple[tuple[Callable, ...], ...], np.ndarray]:
    """Per slot, the DALI functions of the kinds it can draw, each function once (shear_x and
    shear_y are one); and int32 [slots, len(KINDS)]: each kind's branch in its slot, -1 where the
    slot cannot draw it."""
    functions, branch_of = [], np.full((len(slot_kinds), len(KINDS)), -1, np.int32)
    for slot, kinds in enumerate(slot_kinds):
        unique: list[Callable] = []
        for kind in kinds:
            function = DALI_OPS[KINDS[kind].name]
            if function not in unique:
                unique.append(function)
            branch_of[slot, kind] = unique.index(function)
        functions.append(tuple(unique))
    return tuple(functions), branch_of


def dali_params(op: np.ndarray, param: np.ndarray, size: int) -> np.ndarray:
    """float32 [B, slots, 2]: each slot's parameter in the unit its DALI operator takes. Shears and
    translations are forward maps ([x, y] pairs, pixels for translations), where the shared unit is
    the inverse map; posterize's is the bit mask, hue's degrees."""
    param = param.astype(np.float64)
    out = np.zeros((*op.shape, 2), np.float64)
    out[..., 0] = param
    for kind, axis, scale in (("shear_x", 0, -1.0), ("shear_y", 1, -1.0), ("translate_x", 0, -float(size)),
                              ("translate_y", 1, -float(size))):
        chosen = op == KIND_IDS[kind]
        out[chosen] = 0.0
        out[chosen, axis] = param[chosen] * scale
    posterize = op == KIND_IDS["posterize"]
    bits = np.clip(param[posterize], 1, 8).astype(np.int64)
    out[posterize, 0] = 0xFF ^ ((1 << (8 - bits)) - 1)
    hue = op == KIND_IDS["hue"]
    out[hue, 0] = param[hue] * 360.0
    return out.astype(np.float32)


# -- the ops, one function per kind: (images, parameter pair [2], settings) -> images --------------

class Settings:
    """What the ops need besides the parameter: the fill colour, the warp's interpolation, the side
    (a constant, or under a size schedule the feed's per-sample `out_size`: (height, width))."""

    def __init__(self, fill: tuple[int, int, int], nearest: bool, size: int, out_size: DataNode | None = None):
        self.fill = [float(value) for value in fill]
        self.interp = types.INTERP_NN if nearest else types.INTERP_LINEAR
        self.size, self.out_size = size, out_size

    @property
    def shape(self):
        """The images' (height, width): a constant pair, or the per-sample argument input."""
        return self.out_size if self.out_size is not None else [float(self.size), float(self.size)]

    @property
    def framed(self):
        """The shape of an image framed by one pixel on each side."""
        if self.out_size is None:
            return [self.size + 2, self.size + 2]
        return fn.cast(self.out_size + 2.0, dtype=types.INT32)  # fn.slice takes an integer shape with start

    @property
    def centre(self):
        """The images' centre, (x, y)."""
        return self.out_size * 0.5 if self.out_size is not None else [self.size / 2, self.size / 2]


def param_on(images: DataNode, value: DataNode) -> DataNode:
    """A per-sample parameter where the images are, for arithmetic with them."""
    return value.gpu() if images.device == "gpu" else value


def _warped(images: DataNode, settings: Settings, transform) -> DataNode:
    """A geometric op with a per-channel fill, the torch backend's way: the image framed by one
    pixel of the fill colour (fn.warp_affine fills with one value for all channels), warped with
    the edge clamped, so that samples beyond the image read the fill and edge pixels blend with it.
    `transform(start)` appends the op's forward map (fn.transforms.*) to `start`, which moves the
    framed image's coordinates onto the image's. On the CPU this costs half of a filled warp."""
    framed = fn.slice(images, start=[-1, -1], shape=settings.framed, axis_names="HW",
                      out_of_bounds_policy="pad", fill_values=settings.fill)
    matrix = transform(fn.transforms.translation(offset=[-1.0, -1.0]))
    return fn.warp_affine(framed, matrix=matrix, size=settings.shape, interp_type=settings.interp, inverse_map=False)


def identity(images, p, settings):
    return images


def auto_contrast(images, p, settings):
    return aa.auto_contrast.op(images, None)


def equalize(images, p, settings):
    return fn.equalize(images)  # what aa.equalize applies, without its deprecated experimental alias


def invert(images, p, settings):
    return aa.invert.op(images, None)


def rotate(images, p, settings):
    centre = settings.centre  # square images: (x, y) is (height, width) halved
    return _warped(images, settings, lambda start: fn.transforms.rotation(start, angle=-p[0], center=centre))


def shear_x(images, p, settings):
    return _warped(images, settings, lambda start: fn.transforms.shear(start, shear=p))


shear_y = shear_x  # the parameter pair says which axis (dali_params)


def translate_x(images, p, settings):
    return _warped(images, settings, lambda start: fn.transforms.translation(start, offset=p))


translate_y = translate_x


def posterize(images, p, settings):
    return aa.posterize.op(images, param_on(images, fn.cast(p[0], dtype=types.UINT8)))


def solarize(images, p, settings):
    return aa.solarize.op(images, param_on(images, p[0]))


def solarize_add(images, p, settings):
    return aa.solarize_add.op(images, param_on(images, fn.cast(p[0], dtype=types.UINT8)))


def color(images, p, settings):
    return aa.color.op(images, p[0])


def contrast(images, p, settings):
    return aa.contrast.op(images, p[0])


def brightness(images, p, settings):
    return aa.brightness.op(images, p[0])


_BLUR = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], dtype=np.float32) / 13
_IDENT = np.array([[0, 0, 0], [0, 1, 0], [0, 0, 0]], dtype=np.float32)


def sharpness(images, p, settings):
    kernel = types.Constant(_BLUR) * (1 - p[0]) + types.Constant(_IDENT) * p[0]
    return fn.filter(images, param_on(images, kernel))  # aa.sharpness's filter, under its current name


def hue(images, p, settings):
    return fn.hue(images, hue=p[0])


def grayscale(images, p, settings):
    return aa.color.op(images, p[0] * 0.0)  # the torch backend's grey: color at factor 0


def gaussian_blur(images, p, settings):
    return fn.gaussian_blur(images, sigma=p[0])  # window 2 ceil(3 sigma) + 1, border reflect 101


DALI_OPS = {
    "identity": identity, "auto_contrast": auto_contrast, "equalize": equalize, "invert": invert,
    "rotate": rotate, "shear_x": shear_x, "shear_y": shear_y, "translate_x": translate_x,
    "translate_y": translate_y, "posterize": posterize, "solarize": solarize, "solarize_add": solarize_add,
    "color": color, "contrast": contrast, "brightness": brightness, "sharpness": sharpness, "hue": hue,
    "grayscale": grayscale, "gaussian_blur": gaussian_blur,
}
"""Kind name -> its function; every kind of fastloader.augment.ops.KINDS has one (tests hold it)."""


def augment_images(images: DataNode, inputs: dict[str, DataNode], augmenter: Augmenter,
                   nearest: bool = False, flips: bool = True) -> DataNode:
    """The flips (where `flips` and the split flips at all), then each slot's op on its samples,
    from the feed's `inputs` (feed_inputs' names). Call it inside a pipeline built with
    enable_conditionals=True where there are ops; the images are HWC uint8."""
    if flips and (augmenter.hflip > 0 or augmenter.vflip > 0):
        images = fn.flip(images, horizontal=inputs.get("hflip", 0), vertical=inputs.get("vflip", 0))
    if not augmenter.slots:
        return images
    settings = Settings(augmenter.fill, nearest, augmenter.size, inputs.get("out_size"))
    functions, _ = slot_branches(augmenter.slot_kinds)
    for slot, branches in enumerate(functions):
        images = select(list(branches), inputs["aug_op"][slot], images, inputs["aug_param"][slot], settings)
    return images
