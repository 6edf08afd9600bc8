"""The photometric ops on a stack of images at once, each image with its own parameter: what a
view group's images (or one image, a stack of one) go through on the torch backend.

Why a stack: DINOv2's views are ten images a sample, eight of them 96 px, each jittered, greyed,
blurred or solarized on its own draw: op by op and image by image, about 300 small tensor calls a
sample and four or five passes over each image per op. Here a slot's colour op, whichever of
brightness, contrast, saturation, hue or grey each image drew, is one matrix product for the
stack (3 x 3 per image), and the blur a weighted sum of shifted stacks. Every function computes,
pixel for pixel, what it computes for that image in a stack of one (a reduction is taken image by
image; a product is per element or per image), so that a view is the same whether its batch or the
sample alone made it (tests/test_stacked_ops.py, tests/test_views.py).

Images: float32 [N, 3, H, W], contiguous, values in [0, 255] (the chain of ops keeps them in
float, rounded after each op, as torch_loader.augment does); parameters: float32 [N] tensors (the
colour ops: numpy arrays, with each image's kind). Results are new tensors or the input changed in
place; the caller takes the returned one.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as functional

LUMA = (0.299, 0.587, 0.114)
"""ITU-R 601 luma weights: Pillow's grey (L) conversion, DALI's contrast centre and YIQ's Y."""
_RGB_TO_YIQ = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.321], [0.211, -0.523, 0.311]])
_YIQ_TO_RGB = np.linalg.inv(_RGB_TO_YIQ)


def rounded(x: torch.Tensor) -> torch.Tensor:
    """An op's result as uint8 values, kept in float (the chain turns them into uint8 once)."""
    return x.round_().clamp_(0, 255)


def _per_image(values: torch.Tensor) -> torch.Tensor:
    """[N] -> [N, 1, 1, 1], to scale each image by its own value."""
    return values.view(-1, 1, 1, 1)


COLOURS = ("brightness", "contrast", "color", "grayscale", "hue")
"""The colour kinds: brightness and contrast scale each value (contrast about the image's mean
grey), saturation, grey and hue are a 3 x 3 matrix on an image's RGB: a slot's colour ops,
whichever each image drew, are at most two passes over the stack."""
_EYE = np.eye(3)
_TO_GREY = np.ones((3, 1)) * np.array([LUMA])
"""The matrix of a grey image in all three channels."""


def colour_matrices(kinds: np.ndarray, params: np.ndarray) -> torch.Tensor:
    """Each image's colour op as a float32 [N, 3, 3] matrix: kinds index COLOURS (-1: none, the
    identity), params their factors (hue: turns); contrast's offset is contrast_offsets'."""
    params = params.astype(np.float64)
    matrix = np.repeat(_EYE[None], len(kinds), axis=0)
    scaled = (kinds == 0) | (kinds == 1)  # brightness, contrast: factor x the image
    matrix[scaled] = params[scaled, None, None] * _EYE
    saturated = (kinds == 2) | (kinds == 3)  # color, grayscale (factor 0): blend with the image's grey
    factor = np.where(kinds == 3, 0.0, params)[saturated, None, None]
    matrix[saturated] = factor * _EYE + (1 - factor) * _TO_GREY
    turned = kinds == 4  # hue: rotate the chroma (I, Q) of YIQ
    if turned.any():
        angle = -2 * math.pi * params[turned]
        rotation = np.zeros((len(angle), 3, 3))
        rotation[:, 0, 0] = 1
        rotation[:, 1, 1], rotation[:, 1, 2] = np.cos(angle), -np.sin(angle)
        rotation[:, 2, 1], rotation[:, 2, 2] = np.sin(angle), np.cos(angle)
        matrix[turned] = _YIQ_TO_RGB @ rotation @ _RGB_TO_YIQ
    return torch.from_numpy(matrix.astype(np.float32))


EXACT_FLOAT32_SUM = 2 ** 24
"""Below this a float32 sum of whole values is exact, whatever the order of its partial sums."""


def mean_greys(x: torch.Tensor) -> np.ndarray:
    """float64 [N]: each image's mean grey (the luma of its channel means), DALI's contrast centre.
    The channel sums of whole values are exact (float32 up to 256 x 256 px, float64 above), so an
    image's centre is the same in any stack and on any thread count."""
    pixels = x[0, 0].numel()
    exact = None if pixels * 255 < EXACT_FLOAT32_SUM else torch.float64
    sums = x.reshape(len(x), 3, -1).sum(dim=2, dtype=exact).double().numpy()
    return sums @ np.array(LUMA) / pixels


def contrast_offsets(x: torch.Tensor, kinds: np.ndarray, params: np.ndarray) -> torch.Tensor | None:
    """float32 [N, 1, 1, 1]: (1 - factor) x the mean grey for each image that draws contrast, 0 for
    the others; None where none does."""
    contrasted = kinds == 1
    if not contrasted.any():
        return None
    offset = np.zeros(len(kinds), np.float32)
    offset[contrasted] = (1 - params[contrasted].astype(np.float64)) * mean_greys(x)[contrasted]
    return _per_image(torch.from_numpy(offset))


def colour(x: torch.Tensor, kinds: np.ndarray, params: np.ndarray) -> torch.Tensor:
    """Each image through its colour op (brightness, contrast, saturation, grey or hue), rounded:
    a multiply a value where only brightness and contrast are drawn, else one matrix product for
    the stack (colour_matrices); then contrast's offset. An image's values do not depend on its
    neighbours' kinds: a brightness or contrast matrix is diagonal, and a product with it adds
    exact zeros to factor x value, what the multiply gives."""
    offset = contrast_offsets(x, kinds, params)
    if (kinds >= 2).any():
        x = torch.bmm(colour_matrices(kinds, params), x.view(len(x), 3, -1)).view(x.shape)
    else:
        x = x.mul_(_per_image(torch.from_numpy(np.where(kinds >= 0, params, 1).astype(np.float32))))
    return rounded(x if offset is None else x.add_(offset))


def solarize(x: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    threshold = _per_image(threshold)
    return torch.where(x >= threshold, 255 - x, x)


def reflect_padded(x: torch.Tensor, pad: int) -> torch.Tensor:
    """x [..., H, W] padded by `pad` pixels on each side, the border reflected without repeating the
    edge (torch's `reflect`, DALI's `reflect_101`) as many times as the pad needs: torch's own pad
    refuses a pad as wide as the image (a 13-pixel blur window on a 6 px crop, sharpness on 1 px),
    which took good files for bad ones at small sizes (issue 68); a 1 px side repeats its pixel."""
    height, width = x.shape[-2:]
    if pad < min(height, width):
        return functional.pad(x, (pad, pad, pad, pad), mode="reflect")
    return x.index_select(-2, _reflected(height, pad)).index_select(-1, _reflected(width, pad))


def _reflected(length: int, pad: int) -> torch.Tensor:
    """The source index of each of the length + 2 pad positions, reflected back into [0, length)."""
    index = torch.arange(-pad, length + pad)
    if length == 1:
        return torch.zeros_like(index)
    index = index.remainder(2 * (length - 1))
    return torch.where(index >= length, 2 * (length - 1) - index, index)


def blur_window(sigma: float) -> int:
    """The Gaussian kernel's width for a sigma: 2 ceil(3 sigma) + 1, DALI's default window."""
    return 2 * math.ceil(3 * sigma) + 1


def gaussian_kernels(window: int, sigma: torch.Tensor) -> torch.Tensor:
    """float32 [N, window]: torchvision's 1-D Gaussian kernel (`_get_gaussian_kernel1d`'s
    arithmetic) for each sigma."""
    lim = (window - 1) / (2.0 * math.sqrt(2.0))
    taps = torch.linspace(-lim, lim, steps=window)
    return torch.softmax(taps.div(sigma.view(-1, 1)).pow(2).neg(), dim=1)


def gaussian_blur(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """torchvision.transforms.v2's gaussian_blur (a normalized Gaussian, the border reflected
    without repeating the edge), with DALI's default window for each sigma, run as the separable
    filter it is: a row pass, then a column pass, each a weighted sum of shifted views (a 2-D
    kernel of a 13-pixel window is 169 products a pixel for these 26). Images that share a window
    go through it together, each with its own weights."""
    windows = [blur_window(s) for s in sigma.tolist()]
    if len(set(windows)) > 1:
        out = torch.empty_like(x)
        for window in sorted(set(windows)):
            rows = torch.tensor([i for i, w in enumerate(windows) if w == window])
            out.index_copy_(0, rows, gaussian_blur(x.index_select(0, rows), sigma[rows]))
        return out
    window = windows[0]
    weights = gaussian_kernels(window, sigma).view(len(x), window, 1, 1, 1).unbind(1)
    half, (height, width) = window // 2, x.shape[2:]
    padded = reflect_padded(x, half)
    rows = padded[..., :width] * weights[0]
    for tap in range(1, window):
        rows.addcmul_(padded[..., tap:tap + width], weights[tap])
    out = rows[:, :, :height] * weights[0]
    for tap in range(1, window):
        out.addcmul_(rows[:, :, tap:tap + height], weights[tap])
    return rounded(out)


STACKED = {"solarize": solarize, "gaussian_blur": gaussian_blur}
"""Kind name -> its function on a stack (images [N, 3, H, W], parameters [N]), besides COLOURS':
with them, the kinds views draw (colour jitter, grey, blur, solarize); the other kinds go image by
image."""
