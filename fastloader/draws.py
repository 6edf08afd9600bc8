"""The draws: a batch's sample seeds (and upright sizes) -> every random parameter of each sample,
as dense numpy arrays, without a Python loop over samples (the DALI backend draws on the training
thread).

Each row is a pure function of its sample's seed (and size, for the crop): a sample gets the same
crop, flips, ops and magnitudes whatever batch, worker, backend or resume position it is drawn in.
Each part has its own stream (seeded_uniform's salt), so that turning one on leaves the others'
draws as they were.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .augment.ops import IDENTITY, JITTER_KINDS, KIND_IDS, KINDS, TIMM_OPS, TRIVIAL_BINS, TRIVIAL_OPS
from .augment.policy import Policy, parse_policy
from .imaging.geometry import CROP_UNIFORMS, random_resized_boxes
from .order import seeded_uniform
from .schema import TransformConfig

_CROP_SALT, _FLIP_SALT, _OPS_SALT, _JITTER_SALT = 0xC209, 0xF11B, 0x0B5, 0x717E
_WEIGHTED_SALT, _GREY_SALT, _BLUR_SALT = 0x3E16, 0x6EE7, 0xB1E2
_JITTER_ON_SALT, _SOLARIZE_SALT = 0x7A99, 0x5017
GREY, BLUR, SOLARIZE = KIND_IDS["grayscale"], KIND_IDS["gaussian_blur"], KIND_IDS["solarize"]
SOLARIZE_THRESHOLD = 128
"""solarize_prob's threshold: torchvision's RandomSolarize(128) in DINO's recipes."""
BLUR_SIGMA = (0.1, 2.0)
"""gaussian_blur_prob's sigma range: torchvision's GaussianBlur default, which timm's train script uses."""
_PER_SLOT = 6  # uniforms per RandAugment / AutoAugment slot: choice, coin, 2 noise, sign, spare


@dataclass(frozen=True)
class Draws:
    """Every random parameter of a batch's samples (row i: sample i), in the order they apply:
    crop + resize, flips, then each slot's op (identity where no op applies)."""
    crop: np.ndarray
    """int64 [B, 4]: left, top, right, bottom, whole pixels of the upright image (Crop.pixel_box's)."""
    hflip: np.ndarray
    """bool [B]."""
    vflip: np.ndarray
    """bool [B]."""
    op: np.ndarray
    """int32 [B, slots]: the kind applied by each slot, in order (ops.KINDS index; 0 identity)."""
    param: np.ndarray
    """float32 [B, slots]: each slot's parameter, in its kind's unit, within its valid range."""

    def __len__(self) -> int:
        return len(self.hflip)

    def ops_text(self, row: int) -> str:
        return ops_text(self.hflip[row], self.vflip[row], self.op[row], self.param[row])


def ops_text(hflip: bool, vflip: bool, op: np.ndarray, param: np.ndarray) -> str:
    """The flips and ops of one sample, in order, for captions: 'hflip rotate(-27.3) posterize(2)'
    (parameters in their kind's unit, fastloader.augment.ops.KINDS), or 'none'."""
    parts = [name for name, on in (("hflip", hflip), ("vflip", vflip)) if on]
    for kind, value in zip(np.asarray(op).tolist(), np.asarray(param).tolist()):
        if kind != IDENTITY:
            unit = KINDS[kind]
            parts.append(unit.name if unit.param.startswith("none") else f"{unit.name}({value:.3g})")
    return " ".join(parts) or "none"


def jitter_ranges(color_jitter) -> tuple[tuple[float, float], ...]:
    """torchvision's ColorJitter ranges from the config value: (low, high) of the brightness,
    contrast and saturation factors ([max(0, 1 - v), 1 + v]) and of the hue ([-h, h])."""
    values = (float(color_jitter),) * 3 if isinstance(color_jitter, (int, float)) else tuple(color_jitter)
    values = (*values, 0.0) if len(values) == 3 else values
    return tuple((max(0.0, 1 - v), 1 + v) for v in values[:3]) + ((-values[3], values[3]),)


class ColourJitter:
    """torchvision's ColorJitter, applied with probability `prob`: four slots, each factor uniform in
    its range, the four in a random order."""

    def __init__(self, ranges: tuple[tuple[float, float], ...], prob: float):
        self.ranges = ranges
        """(low, high) of brightness, contrast and saturation factors and of the hue (jitter_ranges)."""
        self.prob = prob

    @classmethod
    def of(cls, color_jitter, prob: float) -> "ColourJitter | None":
        """The config's colour jitter, or None where it does nothing: ColorJitter(0, 0, 0, 0), or
        one applied with p 0."""
        ranges = jitter_ranges(color_jitter)
        if all(low == high for low, high in ranges) or prob == 0:
            return None
        return cls(ranges, prob)

    def describe(self) -> str:
        b, c, s, h = self.ranges
        return (f"colour jitter: brightness x[{b[0]:g}, {b[1]:g}], contrast x[{c[0]:g}, {c[1]:g}], "
                f"saturation x[{s[0]:g}, {s[1]:g}], hue {h[1]:g} turn, in random order"
                + (f", with p {self.prob:g}" if self.prob < 1 else ""))

    def kinds(self) -> list[set[int]]:
        """Per slot (four), the kind ids its draws can hold (Augmenter.slot_kinds)."""
        on = [KIND_IDS[name] for name, (low, high) in zip(JITTER_KINDS, self.ranges) if low != high]
        return [set(on) | ({IDENTITY} if len(on) < len(JITTER_KINDS) or self.prob < 1 else set())] * 4

    def draw(self, seeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The four slots' (op, param): a component that is off is identity, and all four where the
        prob's coin says no (its own stream: p 1 draws as before); the order is a uniform
        permutation (the argsort of four uniforms)."""
        u = seeded_uniform(seeds, _JITTER_SALT, 8)
        low = np.array([r[0] for r in self.ranges])
        high = np.array([r[1] for r in self.ranges])
        factors = low + (high - low) * u[:, :4]
        order = np.argsort(u[:, 4:], axis=1)
        kinds = np.array([KIND_IDS[name] for name in JITTER_KINDS])
        on = low != high
        if self.prob < 1:
            on = on[None, :] & (seeded_uniform(seeds, _JITTER_ON_SALT, 1) < self.prob)
            on = np.take_along_axis(np.broadcast_to(on, order.shape), order, axis=1)
        else:
            on = on[order]
        op = np.where(on, kinds[order], IDENTITY)
        param = np.where(on, np.take_along_axis(factors, order, axis=1), 0.0)
        return op, param


class ExtraOps:
    """The secondary transforms after the policy and the colour jitter, in timm's and DINO's order:
    RandomGrayscale (grayscale_prob), GaussianBlur with sigma uniform in BLUR_SIGMA
    (gaussian_blur_prob), then RandomSolarize (solarize_prob): one slot each that is on."""

    def __init__(self, grayscale: float = 0.0, gaussian_blur: float = 0.0, solarize: float = 0.0):
        self.probs = {name: prob for name, prob in (("grayscale", grayscale), ("gaussian_blur", gaussian_blur),
                                                    ("solarize", solarize)) if prob > 0}
        """The probability of each transform that is on, by name, in the order they apply."""

    @property
    def slots(self) -> tuple[str, ...]:
        return tuple(self.probs)

    def describe(self) -> list[str]:
        words = {"grayscale": lambda p: f"grey with p {p:g}",
                 "gaussian_blur": lambda p: f"Gaussian blur with p {p:g}, sigma uniform in [{BLUR_SIGMA[0]:g}, "
                                            f"{BLUR_SIGMA[1]:g}]",
                 "solarize": lambda p: f"solarize (>= {SOLARIZE_THRESHOLD}) with p {p:g}"}
        return [words[name](prob) for name, prob in self.probs.items()]

    def kinds(self) -> list[set[int]]:
        """Per slot, the kind ids its draws can hold (Augmenter.slot_kinds)."""
        return [{KIND_IDS[name]} | ({IDENTITY} if prob < 1 else set()) for name, prob in self.probs.items()]

    def draw(self, seeds: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
        """One slot's (op, param): identity where the coin says no."""
        prob = self.probs[name]
        if name == "grayscale":
            u = seeded_uniform(seeds, _GREY_SALT, 1)
            return np.where(u[:, :1] < prob, GREY, IDENTITY), np.zeros((len(seeds), 1))
        if name == "solarize":
            on = seeded_uniform(seeds, _SOLARIZE_SALT, 1) < prob
            return np.where(on, SOLARIZE, IDENTITY), np.where(on, float(SOLARIZE_THRESHOLD), 0.0)
        u = seeded_uniform(seeds, _BLUR_SALT, 2)
        on = u[:, :1] < prob
        sigma = BLUR_SIGMA[0] + (BLUR_SIGMA[1] - BLUR_SIGMA[0]) * u[:, 1:]
        return np.where(on, BLUR, IDENTITY), np.where(on, sigma, 0.0)


class Augmenter:
    """A train split's augmentation spec, from its transform keys; `draw` gives a batch's Draws:
    the crop, the flips, then the policy's slots (drawn here), the colour jitter's (ColourJitter)
    and the extra transforms' (ExtraOps)."""

    def __init__(self, transform: TransformConfig, mean: tuple[float, float, float]):
        t = transform
        self.size, self.scale, self.ratio = t.size, t.scale, t.ratio
        self.hflip, self.vflip = t.hflip, t.vflip
        self.policy: Policy | None = parse_policy(t.auto_augment) if t.auto_augment else None
        jitter_on = t.color_jitter is not None and (not self.policy or self.policy.keeps_color_jitter)
        self.colour_jitter = ColourJitter.of(t.color_jitter, t.color_jitter_prob) if jitter_on else None
        self.extras = ExtraOps(t.grayscale_prob, t.gaussian_blur_prob, t.solarize_prob)
        self.slots = ((self.policy.layers if self.policy else 0) + (4 if self.colour_jitter else 0)
                      + len(self.extras.slots))
        fill_mean = self.policy is None or self.policy.fill_mean
        self.fill = tuple(min(255, round(255 * m)) for m in mean) if fill_mean else (0, 0, 0)
        """What geometric ops uncover: timm's img_mean, or black for TrivialAugmentWide."""

    @property
    def jitter(self) -> tuple[tuple[float, float], ...] | None:
        """The colour jitter's ranges (jitter_ranges), or None where it is off."""
        return self.colour_jitter.ranges if self.colour_jitter else None

    @property
    def extra_slots(self) -> tuple[str, ...]:
        """The extra transforms that are on, one slot each (ExtraOps)."""
        return self.extras.slots

    def describe(self) -> str:
        """The ops part of the log line: the policy, the colour jitter, grey and blur, or 'none'."""
        words = [self.policy.describe()] if self.policy else []
        if self.colour_jitter:
            words.append(self.colour_jitter.describe())
        return "; then ".join(words + self.extras.describe()) or "none"

    @cached_property
    def slot_kinds(self) -> tuple[tuple[int, ...], ...]:
        """Per slot, the kind ids (ops.KINDS) its draws can hold, sorted, the identity among them
        where an op's coin can say no (or a jitter component is off): what a backend's graph needs
        a branch for, and no more."""
        kinds = []
        if self.policy is None:
            pass
        elif self.policy.family == "rand":
            kinds = [{TIMM_OPS[name].kind_id for name in self.policy.ops}
                     | ({IDENTITY} if self.policy.prob < 1 else set())] * self.policy.layers
        elif self.policy.family == "auto":
            subs = self.policy.sub_policies
            kinds = [{TIMM_OPS[sub[slot][0]].kind_id for sub in subs}
                     | ({IDENTITY} if any(sub[slot][1] < 1 for sub in subs) else set())
                     for slot in range(self.policy.layers)]
        else:
            kinds = [{op.kind_id for op in TRIVIAL_OPS}]
        if self.colour_jitter:
            kinds += self.colour_jitter.kinds()
        kinds += self.extras.kinds()
        return tuple(tuple(sorted(slot)) for slot in kinds)

    # -- the draws ---------------------------------------------------------------------------------

    def draw(self, seeds: np.ndarray, sizes: np.ndarray, size: int | None = None) -> Draws:
        """Every parameter of a batch: seeds int64 [B], upright sizes int64 [B, 2] (height, width);
        `size`: the batch's output side (default transform.size; a size schedule's: the batch's)."""
        seeds = np.asarray(seeds, dtype=np.int64)
        hflip, vflip, op, param = self.draw_ops(seeds, size)
        return Draws(self.crops(seeds, sizes), hflip, vflip, op, param)

    def crops(self, seeds: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """int64 [B, 4] RandomResizedCrop boxes (fastloader.imaging.geometry.random_resized_boxes)."""
        return self.boxes(self.crop_uniforms(seeds), sizes)

    def crop_uniforms(self, seeds: np.ndarray) -> np.ndarray:
        """The crop's part of the draw that needs no size: float [B, CROP_UNIFORMS]. A worker draws
        them for its whole batch, then each box once the file's header gives the size."""
        return seeded_uniform(np.asarray(seeds, dtype=np.int64), _CROP_SALT, CROP_UNIFORMS)

    def boxes(self, uniforms: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """int64 [B, 4] boxes from crop_uniforms' rows and upright sizes [B, 2] (height, width)."""
        return random_resized_boxes(uniforms, sizes, self.scale, self.ratio)

    def draw_ops(self, seeds: np.ndarray, size: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                            np.ndarray]:
        """(hflip, vflip, op, param) of a batch: what does not depend on the image's size (but
        TrivialAugmentWide's whole-pixel translations on the output side, `size`)."""
        seeds = np.asarray(seeds, dtype=np.int64)
        flips = seeded_uniform(seeds, _FLIP_SALT, 2)
        hflip, vflip = flips[:, 0] < self.hflip, flips[:, 1] < self.vflip
        parts = []
        if self.policy is None:
            pass
        elif self.policy.family == "rand":
            parts.append(self._rand(seeds))
        elif self.policy.family == "auto":
            parts.append(self._auto(seeds))
        else:
            parts.append(self._trivial(seeds, size or self.size))
        if self.colour_jitter is not None:
            parts.append(self.colour_jitter.draw(seeds))
        parts += [self.extras.draw(seeds, name) for name in self.extras.slots]
        if not parts:
            return hflip, vflip, np.zeros((len(seeds), 0), np.int32), np.zeros((len(seeds), 0), np.float32)
        op = np.concatenate([part[0] for part in parts], axis=1)
        param = np.concatenate([part[1] for part in parts], axis=1)
        return hflip, vflip, op.astype(np.int32), param.astype(np.float32)

    def _levels(self, base: np.ndarray, u1: np.ndarray, u2: np.ndarray) -> np.ndarray:
        """timm's AugmentOp magnitude: normal noise (Box-Muller) of std mstd around the level, or
        uniform in [0, level] when mstd is infinite, clipped to [0, mmax]."""
        std = self.policy.magnitude_std
        if math.isinf(std):
            level = u1 * base
        elif std > 0:
            level = base + std * np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2 * math.pi * u2)
        else:
            level = np.broadcast_to(base, u1.shape).astype(np.float64)
        return np.clip(level, 0.0, self.policy.magnitude_max)

    def _apply(self, names: tuple[str, ...], choice: np.ndarray, level: np.ndarray, sign: np.ndarray,
               applied: np.ndarray, spare: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Kind ids and parameters of timm ops chosen by index into `names` (a loop over the op
        table, not over samples); identity where the op's coin said no. An op that draws its
        parameter (GaussianBlurRand's radius) takes the slot's spare uniform."""
        op = np.full(choice.shape, IDENTITY, np.int64)
        param = np.zeros(choice.shape, np.float64)
        for index, name in enumerate(names):
            chosen = (choice == index) & applied
            if chosen.any():
                policy_op = TIMM_OPS[name]
                op[chosen] = policy_op.kind_id
                param[chosen] = policy_op.params(level[chosen], (spare if policy_op.draws_uniform else sign)[chosen])
        return op, param

    def _rand(self, seeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """timm's RandAugment: each of n slots picks an op uniformly (with replacement), applies it
        with probability p, at the noisy magnitude, negated on a fair coin where the op is signed."""
        p = self.policy
        u = seeded_uniform(seeds, _OPS_SALT, p.layers * _PER_SLOT).reshape(len(seeds), p.layers, _PER_SLOT)
        choice = np.minimum(np.floor(u[..., 0] * len(p.ops)), len(p.ops) - 1).astype(np.int64)
        if p.weights is not None:  # timm: N ops without replacement, by weight (Gumbel top-N: the same law)
            keys = np.log(np.asarray(p.weights)) - np.log(-np.log1p(-seeded_uniform(seeds, _WEIGHTED_SALT,
                                                                                      len(p.ops))))
            choice = np.argsort(-keys, axis=1, kind="stable")[:, :p.layers]
        applied = u[..., 1] <= p.prob
        level = self._levels(np.float64(p.magnitude), u[..., 2], u[..., 3])
        sign = np.where(u[..., 4] > 0.5, -1.0, 1.0)
        return self._apply(p.ops, choice, level, sign, applied, u[..., 5])

    def _auto(self, seeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """timm's AutoAugment: one sub-policy uniformly, then each of its ops (two; one for 3a) with
        its own probability and level (plus the magnitude noise, when mstd is set)."""
        subs, layers = self.policy.sub_policies, self.policy.layers
        names = tuple(sorted({name for sub in subs for name, _, _ in sub}))
        table_op = np.array([[names.index(name) for name, _, _ in sub] for sub in subs])
        table_prob = np.array([[prob for _, prob, _ in sub] for sub in subs])
        table_level = np.array([[level for _, _, level in sub] for sub in subs], dtype=np.float64)
        u = seeded_uniform(seeds, _OPS_SALT, 1 + layers * _PER_SLOT)
        sub = np.minimum(np.floor(u[:, 0] * len(subs)), len(subs) - 1).astype(np.int64)
        u = u[:, 1:].reshape(len(seeds), layers, _PER_SLOT)
        applied = u[..., 1] <= table_prob[sub]
        level = self._levels(table_level[sub], u[..., 2], u[..., 3])
        sign = np.where(u[..., 4] > 0.5, -1.0, 1.0)
        return self._apply(names, table_op[sub], level, sign, applied, u[..., 5])

    def _trivial(self, seeds: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        """torchvision's TrivialAugmentWide: one op uniformly, one of 31 magnitude bins uniformly,
        negated when a coin is <= 0.5 where the op is signed."""
        u = seeded_uniform(seeds, _OPS_SALT, 3)
        choice = np.minimum(np.floor(u[:, 0] * len(TRIVIAL_OPS)), len(TRIVIAL_OPS) - 1).astype(np.int64)
        bins = np.minimum(np.floor(u[:, 1] * TRIVIAL_BINS), TRIVIAL_BINS - 1).astype(np.int64)
        op = np.full(len(seeds), IDENTITY, np.int64)
        param = np.zeros(len(seeds), np.float64)
        for index, trivial in enumerate(TRIVIAL_OPS):
            chosen = choice == index
            if not chosen.any() or trivial.magnitudes is None:
                op[chosen] = trivial.kind_id
                continue
            magnitude = trivial.magnitudes[bins[chosen]]
            if trivial.signed:
                magnitude = np.where(u[chosen, 2] <= 0.5, -magnitude, magnitude)
            kind = KINDS[trivial.kind_id]
            op[chosen] = trivial.kind_id
            param[chosen] = np.clip(trivial.to_param(magnitude, size), kind.low, kind.high)
        return op[:, None], param[:, None]
