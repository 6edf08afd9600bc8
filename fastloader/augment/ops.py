"""The op table: what each augmentation op does to a sample, what its parameter means, its valid
range, and how a policy's magnitude level becomes that parameter.

Two tables, so that a new op is one row here plus one function per backend:

- KINDS: the operations the backends apply, one function each (torch_loader/augment.py,
  dali_loader/augment.py). A kind's id is its index; 0 is the identity, which is also what a slot
  whose op was not applied (the op's probability) carries. Every kind takes one float parameter,
  in the unit its row states, clamped to its valid range after the level mapping, so any
  magnitude the grammar allows gives a parameter both backends can apply.
- POLICY_OPS: the ops a policy names (timm's names and torchvision's TrivialAugmentWide's), each
  a kind plus the mapping from a magnitude level (timm's 0..10 scale, _LEVEL_DENOM 10) and a
  random sign to the parameter, vectorized over a batch.

Geometric parameters follow Pillow's affine convention, which timm applies: the map goes from an
output pixel to the source pixel it reads, in continuous coordinates (pixel centres at i + 0.5),
the origin at the top-left corner for shears, the image centre for rotations.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

LEVEL_DENOM = 10.0
"""timm's magnitude scale: level 10 is each op's 'maximum' strength (mmax raises the clip)."""


@dataclass(frozen=True)
class Kind:
    """An operation both backends implement: its parameter's meaning and valid range."""
    name: str
    param: str
    low: float = -np.inf
    high: float = np.inf
    geometric: bool = False


KINDS: tuple[Kind, ...] = (
    Kind("identity", "none"),
    Kind("auto_contrast", "none: each channel stretched to 0..255"),
    Kind("equalize", "none: each channel's histogram equalized (OpenCV's formula, as DALI)"),
    Kind("invert", "none: 255 - pixel"),
    Kind("rotate", "degrees, counter-clockwise, about the centre", geometric=True),
    Kind("shear_x", "factor f: the source x is x + f * y", geometric=True),
    Kind("shear_y", "factor f: the source y is y + f * x", geometric=True),
    Kind("translate_x", "fraction t of the width: the source x is x + t * width", geometric=True),
    Kind("translate_y", "fraction t of the height: the source y is y + t * height", geometric=True),
    Kind("posterize", "bits kept per channel", 1, 8),
    Kind("solarize", "threshold: pixels >= it are inverted", 0, 256),
    Kind("solarize_add", "added to pixels below 128, saturating at 255", 0, 128),
    Kind("color", "saturation factor: blend with the grey image (0 grey, 1 unchanged)", 0),
    Kind("contrast", "factor: blend with the mean grey level (0 flat, 1 unchanged)", 0),
    Kind("brightness", "factor: blend with black (0 black, 1 unchanged)", 0),
    Kind("sharpness", "factor: blend with the 3x3 smoothed image (0 smooth, 1 unchanged)", 0),
    Kind("hue", "fraction of a turn, rotating chroma in YIQ space (as DALI's hue)", -0.5, 0.5),
    Kind("grayscale", "none: the grey (ITU-R 601 luma) image in all three channels, as color(0)"),
    Kind("gaussian_blur", "sigma in pixels: a Gaussian kernel 2 ceil(3 sigma) + 1 wide, the border reflected "
                          "(DALI's default window, torchvision's reflect padding)", 0.1, 16.0),
)
KIND_IDS = {kind.name: i for i, kind in enumerate(KINDS)}
IDENTITY = KIND_IDS["identity"]

Mapping = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""(level float [...], sign +-1 [...]) -> the kind's parameter, before the clamp to its range; for an
op that draws its parameter (`draws_uniform`), a uniform in [0, 1) in place of the sign."""


@dataclass(frozen=True)
class PolicyOp:
    """An op a policy names: the kind it applies and how a level becomes the kind's parameter."""
    name: str
    kind: str
    to_param: Mapping | None = None  # None: the kind takes no parameter
    draws_uniform: bool = False  # the mapping takes a uniform in [0, 1) where others take the sign

    @property
    def kind_id(self) -> int:
        return KIND_IDS[self.kind]

    def params(self, level: np.ndarray, sign: np.ndarray) -> np.ndarray:
        """The parameter for each level and sign, clamped to the kind's valid range."""
        if self.to_param is None:
            return np.zeros_like(level, dtype=np.float64)
        kind = KINDS[self.kind_id]
        return np.clip(self.to_param(level, sign), kind.low, kind.high)


def _frac(level):
    return level / LEVEL_DENOM


def _signed(scale: float) -> Mapping:
    return lambda level, sign: _frac(level) * scale * sign


def _enhance(level, sign):
    return _frac(level) * 1.8 + 0.1


def _enhance_increasing(level, sign):
    return np.maximum(0.1, 1.0 + sign * _frac(level) * 0.9)


def _posterize_bits(level):
    return np.trunc(_frac(level) * 4)  # timm's int(); a level is never negative


def _solarize_threshold(level):
    return np.minimum(256, np.trunc(_frac(level) * 256))


def _minmax(level, low: float, high: float):
    """timm's _minmax_level_to_arg: low + (high - low) x level / 10, clamped to [low, high]."""
    return np.clip(low + (high - low) * _frac(level), low, high)


def _desaturate(level, sign):
    """timm's Desaturate: ImageEnhance.Color with factor 1 - minmax(level, 0.5, 1), i.e. 0 (grey) at level 10."""
    return np.clip(1.0 - _minmax(level, 0.5, 1.0), 0.0, 1.0)


def _blur_random(level, uniform):
    """timm's GaussianBlurRand: a radius (sigma) uniform in [0.1, 2 x minmax(level, 0, 1)]."""
    return 0.1 + (2.0 * _minmax(level, 0.0, 1.0) - 0.1) * uniform


_TIMM_OPS = (
    PolicyOp("AutoContrast", "auto_contrast"),
    PolicyOp("Equalize", "equalize"),
    PolicyOp("Invert", "invert"),
    PolicyOp("Rotate", "rotate", _signed(30.0)),
    PolicyOp("Posterize", "posterize", lambda level, sign: _posterize_bits(level)),
    PolicyOp("PosterizeIncreasing", "posterize", lambda level, sign: 4 - _posterize_bits(level)),
    PolicyOp("PosterizeOriginal", "posterize", lambda level, sign: _posterize_bits(level) + 4),
    PolicyOp("Solarize", "solarize", lambda level, sign: _solarize_threshold(level)),
    PolicyOp("SolarizeIncreasing", "solarize", lambda level, sign: 256 - _solarize_threshold(level)),
    PolicyOp("SolarizeAdd", "solarize_add", lambda level, sign: np.minimum(128, np.trunc(_frac(level) * 110))),
    PolicyOp("Color", "color", _enhance),
    PolicyOp("ColorIncreasing", "color", _enhance_increasing),
    PolicyOp("Contrast", "contrast", _enhance),
    PolicyOp("ContrastIncreasing", "contrast", _enhance_increasing),
    PolicyOp("Brightness", "brightness", _enhance),
    PolicyOp("BrightnessIncreasing", "brightness", _enhance_increasing),
    PolicyOp("Sharpness", "sharpness", _enhance),
    PolicyOp("SharpnessIncreasing", "sharpness", _enhance_increasing),
    PolicyOp("ShearX", "shear_x", _signed(0.3)),
    PolicyOp("ShearY", "shear_y", _signed(0.3)),
    PolicyOp("TranslateXRel", "translate_x", _signed(0.45)),
    PolicyOp("TranslateYRel", "translate_y", _signed(0.45)),
    PolicyOp("Desaturate", "color", _desaturate),
    PolicyOp("GaussianBlur", "gaussian_blur", lambda level, sign: _minmax(level, 0.1, 2.0)),
    PolicyOp("GaussianBlurRand", "gaussian_blur", _blur_random, draws_uniform=True),
)
"""timm's RandAugment / AutoAugment ops (timm/data/auto_augment.py, LEVEL_TO_ARG), by timm's name."""

TIMM_OPS = {op.name: op for op in _TIMM_OPS}

RAND_OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd", "Color",
            "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
"""timm's _RAND_TRANSFORMS: RandAugment's ops with inc0."""
RAND_INCREASING_OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing", "SolarizeIncreasing",
                       "SolarizeAdd", "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing",
                       "SharpnessIncreasing", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
"""timm's _RAND_INCREASING_TRANSFORMS: RandAugment's ops with inc1."""

TRIVIAL_BINS = 31
"""torchvision's TrivialAugmentWide num_magnitude_bins."""


@dataclass(frozen=True)
class TrivialOp:
    """A TrivialAugmentWide op: its kind, its magnitudes per bin (torchvision's _AUGMENTATION_SPACE)
    and whether a coin negates the magnitude; `to_param` turns a signed magnitude into the kind's
    parameter (size: the output side, for torchvision's translations in whole pixels)."""
    name: str
    kind: str
    magnitudes: np.ndarray | None
    signed: bool
    to_param: Callable[[np.ndarray, int], np.ndarray] = lambda magnitude, size: magnitude

    @property
    def kind_id(self) -> int:
        return KIND_IDS[self.kind]


def _bins(low: float, high: float) -> np.ndarray:
    return np.linspace(low, high, TRIVIAL_BINS, dtype=np.float32).astype(np.float64)  # torch.linspace's float32


def _whole_pixels(magnitude: np.ndarray, size: int) -> np.ndarray:
    """torchvision moves the content by int(magnitude) pixels (F.affine's translate): the source
    is that many pixels the other way, as a fraction of the side."""
    return -np.trunc(magnitude) / size


TRIVIAL_OPS = (
    TrivialOp("Identity", "identity", None, False),
    TrivialOp("ShearX", "shear_x", _bins(0.0, 0.99), True),
    TrivialOp("ShearY", "shear_y", _bins(0.0, 0.99), True),
    TrivialOp("TranslateX", "translate_x", _bins(0.0, 32.0), True, _whole_pixels),
    TrivialOp("TranslateY", "translate_y", _bins(0.0, 32.0), True, _whole_pixels),
    TrivialOp("Rotate", "rotate", _bins(0.0, 135.0), True),
    TrivialOp("Brightness", "brightness", _bins(0.0, 0.99), True, lambda m, size: 1.0 + m),
    TrivialOp("Color", "color", _bins(0.0, 0.99), True, lambda m, size: 1.0 + m),
    TrivialOp("Contrast", "contrast", _bins(0.0, 0.99), True, lambda m, size: 1.0 + m),
    TrivialOp("Sharpness", "sharpness", _bins(0.0, 0.99), True, lambda m, size: 1.0 + m),
    TrivialOp("Posterize", "posterize", np.round(8 - np.arange(TRIVIAL_BINS) / ((TRIVIAL_BINS - 1) / 6)), False),
    TrivialOp("Solarize", "solarize", _bins(1.0, 0.0), False, lambda m, size: 255.0 * m),
    TrivialOp("AutoContrast", "auto_contrast", None, False),
    TrivialOp("Equalize", "equalize", None, False),
)
"""torchvision.transforms.v2.TrivialAugmentWide's op space, in its order."""

JITTER_KINDS = ("brightness", "contrast", "color", "hue")
"""torchvision's ColorJitter, in its fn_idx order: brightness, contrast, saturation, hue."""
