"""The augmentation ops on the torch backend: one function per kind of fastloader.augment.ops,
applied in the workers to each uint8 [3, size, size] image after the crop, resize and flips.

The arithmetic follows what DALI's operators do (dali_loader/augment.py), so that both backends
give the same pixels within the tolerances docs/semantics.md states: float math, rounded once at
the end. Written with plain tensor ops rather than torchvision's functional ones, which cost 2 to 15
times more here (its sharpness: 4.3 ms per 224 px image, a float conv2d; its affine ops: 1.4 ms),
and the worker runs on the trainer's CPU budget.

The photometric kinds (colour jitter, grey, blur, solarize) are stacked_ops' functions on a stack
of one: apply_ops_stacked runs a view group's images through them at once, each image getting what
it gets alone.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple

import numpy as np
import torch
import torch.nn.functional as functional

from fastloader.augment.ops import IDENTITY, KINDS

from .stacked_ops import COLOURS, STACKED, colour, reflect_padded, rounded

Image = torch.Tensor
"""uint8 [3, H, W]: any memory layout (the resize leaves HWC memory)."""


class Context(NamedTuple):
    """What an op needs besides its parameter: the fill of uncovered pixels, the sampling mode."""
    fill: tuple[int, int, int]
    nearest: bool


def _float(image: Image) -> torch.Tensor:
    """float32 [3, H, W] in plain CHW memory, whatever the image's: the crops come in HWC memory,
    where each channel's pixels lie 3 apart, and the per-channel arithmetic below runs about twice
    as fast over contiguous planes (the same values: only the layout changes)."""
    return image.to(torch.float32, memory_format=torch.contiguous_format)


def _round(x: torch.Tensor) -> torch.Tensor:
    """The op's result as uint8 values, kept in float: apply_ops chains the ops in float and turns
    the image into uint8 once at the end (the same values as a uint8 image after each op, without
    two conversions per op); TORCH_OPS' functions give uint8."""
    return rounded(x)


# -- point and colour ops ---------------------------------------------------------------------------

def identity(image: Image, param: float, ctx: Context) -> Image:
    return image


def invert(image: Image, param: float, ctx: Context) -> Image:
    return 255 - image


def posterize(image: Image, param: float, ctx: Context) -> Image:
    bits = int(param)
    image = image.to(torch.uint8)  # a bitwise op: uint8 (a no-op for a uint8 image)
    return image if bits >= 8 else image & (0xFF ^ ((1 << (8 - bits)) - 1))


def solarize(image: Image, param: float, ctx: Context) -> Image:
    return image if param > 255 else torch.where(image >= param, 255 - image, image)  # uint8 or float alike


def solarize_add(image: Image, param: float, ctx: Context) -> Image:
    # a pixel below 128 plus at most 128 never passes 255, so the uint8 sum cannot wrap where it is kept
    return torch.where(image < 128, image + int(param), image)


def _stacked(name: str) -> Callable[[Image, float, Context], torch.Tensor]:
    """The per-image form of a stacked op (stacked_ops): the image as a stack of one, so that an
    image alone and in a view group's stack get the same pixels."""
    if name in COLOURS:
        code = np.array([COLOURS.index(name)])

        def one(image: Image, param: float, ctx: Context) -> torch.Tensor:
            return colour(_float(image)[None], code, np.array([param], np.float32))[0]
    else:
        stacked = STACKED[name]

        def one(image: Image, param: float, ctx: Context) -> torch.Tensor:
            return stacked(_float(image)[None], torch.tensor([param], dtype=torch.float32))[0]
    one.__name__ = one.__qualname__ = name
    return one


brightness, contrast, color, hue = (_stacked(name) for name in ("brightness", "contrast", "color", "hue"))
grayscale, gaussian_blur = _stacked("grayscale"), _stacked("gaussian_blur")


def sharpness(image: Image, param: float, ctx: Context) -> Image:
    """Blend with Pillow's smoothing filter (3x3, centre 5, the rest 1, over 13); the border
    reflects (DALI's filter default) where Pillow leaves the outer pixels as they were."""
    x = image.float()
    padded = reflect_padded(x, 1)
    height, width = x.shape[1:]
    total = x * 4
    for dy in range(3):
        for dx in range(3):
            total += padded[:, dy:dy + height, dx:dx + width]
    blurred = total.div_(13)
    return _round(x.sub_(blurred).mul_(param).add_(blurred))


def auto_contrast(image: Image, param: float, ctx: Context) -> Image:
    """Stretch each channel's [min, max] to [0, 255]; a flat channel is left as it is."""
    flat = image.reshape(3, -1)
    low, high = flat.amin(dim=1).float(), flat.amax(dim=1).float()
    spread = high - low
    scale = torch.where(spread > 0, 255 / spread.clamp(min=1), torch.ones_like(spread))
    low = torch.where(spread > 0, low, torch.zeros_like(low))
    return _round((image.float() - low.view(3, 1, 1)) * scale.view(3, 1, 1))


def equalize(image: Image, param: float, ctx: Context) -> Image:
    """OpenCV's histogram equalization per channel (what DALI's equalize follows): the darkest
    level present maps to 0, each other level to round(255 x pixels below or at it, those of the
    darkest excluded, / the pixels not of the darkest level); a flat channel is left as it is."""
    channels, height, width = image.shape
    total = height * width
    levels = image.reshape(3, -1).long()
    hist = torch.bincount((levels + torch.arange(3).view(3, 1) * 256).reshape(-1), minlength=768).view(3, 256)
    darkest = (hist > 0).int().argmax(dim=1)
    count_darkest = hist.gather(1, darkest.view(3, 1))
    cumulative = hist.cumsum(dim=1) - count_darkest
    scale = 255.0 / (total - count_darkest).clamp(min=1)
    lut = (cumulative.double() * scale).round().clamp(0, 255).to(torch.uint8)
    flat_channel = (count_darkest == total).view(3)
    lut[flat_channel] = torch.arange(256, dtype=torch.uint8)
    return lut.gather(1, levels).view(channels, height, width)


# -- geometric ops ----------------------------------------------------------------------------------

_TIE = 1e-4
"""Pixels added to nearest sampling's source coordinates: grid_sample rounds ties to even."""


@functools.lru_cache(maxsize=4)
def _pixel_centres(length: int) -> torch.Tensor:
    """float32 [length]: the continuous coordinate of each pixel's centre, i + 0.5."""
    return torch.arange(length, dtype=torch.float32) + 0.5


def _affine(image: Image, matrix: tuple[float, ...], ctx: Context) -> Image:
    """Resample through (a, b, c, d, e, f): each output pixel centre (x, y) reads the source at
    (a x + b y + c, d x + e y + f), bilinear (or nearest) with the fill colour beyond the edges
    (a one-pixel border of it, so that edge pixels blend with it as DALI's constant border does)."""
    _, height, width = image.shape
    a, b, c, d, e, f = matrix
    if ctx.nearest:  # a source point on a pixel boundary takes the pixel after it, as DALI's warp does
        c, f = c + _TIE, f + _TIE
    # the source's continuous coordinates, + 1 for the padded border, normalized for grid_sample
    sx, sy = 2 / (width + 2), 2 / (height + 2)
    xs, ys = _pixel_centres(width), _pixel_centres(height).view(-1, 1)
    grid = torch.empty(1, height, width, 2)
    grid[0, ..., 0] = (xs * (a * sx) + ((c + 1) * sx - 1)) + ys * (b * sx)  # separable: a row plus a column
    grid[0, ..., 1] = (xs * (d * sy) + ((f + 1) * sy - 1)) + ys * (e * sy)
    padded = torch.empty(1, 3, height + 2, width + 2)
    padded[0, :, 1:-1, 1:-1] = image
    fill = torch.tensor(ctx.fill, dtype=torch.float32).view(3, 1)
    padded[0, :, 0], padded[0, :, -1], padded[0, :, :, 0], padded[0, :, :, -1] = fill, fill, fill, fill
    out = functional.grid_sample(padded, grid, mode="nearest" if ctx.nearest else "bilinear",
                                 padding_mode="border", align_corners=False)
    return _round(out[0])


def rotate(image: Image, param: float, ctx: Context) -> Image:
    _, height, width = image.shape
    cos, sin = math.cos(math.radians(param)), math.sin(math.radians(param))
    cx, cy = width / 2, height / 2
    return _affine(image, (cos, -sin, cx - cos * cx + sin * cy, sin, cos, cy - sin * cx - cos * cy), ctx)


def shear_x(image: Image, param: float, ctx: Context) -> Image:
    return _affine(image, (1, param, 0, 0, 1, 0), ctx)


def shear_y(image: Image, param: float, ctx: Context) -> Image:
    return _affine(image, (1, 0, 0, param, 1, 0), ctx)


def translate_x(image: Image, param: float, ctx: Context) -> Image:
    return _affine(image, (1, 0, param * image.shape[2], 0, 1, 0), ctx)


def translate_y(image: Image, param: float, ctx: Context) -> Image:
    return _affine(image, (1, 0, 0, 0, 1, param * image.shape[1]), ctx)


_OPS: dict[str, Callable[[Image, float, Context], torch.Tensor]] = {
    "identity": identity, "auto_contrast": auto_contrast, "equalize": equalize, "invert": invert,
    "rotate": rotate, "shear_x": shear_x, "shear_y": shear_y, "translate_x": translate_x,
    "translate_y": translate_y, "posterize": posterize, "solarize": solarize, "solarize_add": solarize_add,
    "color": color, "contrast": contrast, "brightness": brightness, "sharpness": sharpness, "hue": hue,
    "grayscale": grayscale, "gaussian_blur": gaussian_blur,
}
"""Kind name -> its function, whose result may be uint8 values kept in float (_round)."""
_BY_ID = [_OPS[kind.name] for kind in KINDS]


def _uint8(op: Callable[[Image, float, Context], torch.Tensor]) -> Callable[[Image, float, Context], Image]:
    @functools.wraps(op)
    def as_uint8(image: Image, param: float, ctx: Context) -> Image:
        return op(image, param, ctx).to(torch.uint8)
    return as_uint8


TORCH_OPS: dict[str, Callable[[Image, float, Context], Image]] = {name: _uint8(op) for name, op in _OPS.items()}
"""Kind name -> its function on a uint8 image, giving uint8; every kind of fastloader.augment.ops.KINDS
has one (tests hold it)."""


def apply_ops(image: Image, ops: list[int], params: list[float], ctx: Context) -> Image:
    """A sample's slots, in order (kind ids and parameters from fastloader.draws), chained
    in float (_round), uint8 at the end: apply_ops_stacked for a stack of one."""
    if all(kind == IDENTITY for kind in ops):
        return image.to(torch.uint8)
    ops, params = np.asarray([ops]), np.asarray([params], np.float32)
    return apply_ops_stacked(_float(image)[None], ops, params, ctx)[0].to(torch.uint8)


_COLOUR_OF = np.array([COLOURS.index(kind.name) if kind.name in COLOURS else -1 for kind in KINDS])
"""Kind id -> its index in stacked_ops.COLOURS, -1 for the other kinds."""
_STACKED_BY_ID = [STACKED.get(kind.name) for kind in KINDS]


def apply_ops_stacked(images: torch.Tensor, ops: np.ndarray, params: np.ndarray, ctx: Context) -> torch.Tensor:
    """Each image's slots, in order (ops int [N, slots], params float32 [N, slots]), on float32
    [N, 3, H, W] images (changed in place or replaced: use the result), rounded after each op: in
    a slot, the colour ops of all its images as one product (stacked_ops.colour), each other kind
    on the images that draw it together where stacked_ops has it, image by image where not. An
    image's pixels are what it gets in a stack of one (apply_ops)."""
    for slot in range(ops.shape[1]):
        kinds, values = ops[:, slot], params[:, slot]
        colours = _COLOUR_OF[kinds]
        coloured = colours >= 0
        if coloured.all() or coloured.sum() * 2 >= len(images):  # the rest as the identity, not gathered
            images = colour(images, colours, values)
        elif coloured.any():
            images = _on_rows(images, np.flatnonzero(coloured), lambda x, rows: colour(x, colours[rows], values[rows]))
        for kind in np.unique(kinds[~coloured]).tolist():
            if kind == IDENTITY:
                continue
            rows = np.flatnonzero(kinds == kind)
            stacked = _STACKED_BY_ID[kind]
            if stacked is None:
                for row in rows.tolist():
                    images[row] = _BY_ID[kind](images[row], float(values[row]), ctx)
            else:
                images = _on_rows(images, rows, lambda x, rows: stacked(x, torch.from_numpy(values[rows])))
    return images


def _on_rows(images: torch.Tensor, rows: np.ndarray, op: Callable) -> torch.Tensor:
    """`op(stack, rows)` on those rows of the images (all of them: no copy)."""
    if len(rows) == len(images):
        return op(images, rows)
    index = torch.from_numpy(rows)  # index_select / index_copy_: row copies, where [index] scatters
    return images.index_copy_(0, index, op(images.index_select(0, index), rows))
