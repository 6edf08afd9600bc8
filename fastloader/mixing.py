"""Mixup and CutMix of a normalized batch on its device, and the soft targets that go with them.

The semantics are timm's `Mixup` (timm/data/mixup.py): with probability `prob` a batch (mode batch),
a pair (pair) or a sample (elem) is mixed; with both alphas on, cutmix is chosen with probability
`switch_prob`; lam ~ Beta(alpha, alpha). Mixup makes an image lam x itself + (1 - lam) x its partner;
CutMix pastes its partner's pixels into a box of area about (1 - lam) (`rand_bbox`, or `rand_bbox_minmax`
with `cutmix_minmax`), and lam becomes 1 - box area / image area (`correct_lam`). The partner of
sample i is sample B-1-i (the batch flipped). Targets are timm's `mixup_target`: one-hot rows smoothed
to (1 - smoothing + smoothing / C) on the label and smoothing / C elsewhere, then lam x own row +
(1 - lam) x partner's row: float32 [B, C], every row summing to 1.

What differs from timm, and why:
- Every draw comes from the samples' seeds (`seeded_uniform`), vectorized: a batch is mixed the same
  way on both backends, on any number of workers, and after a resume. Batch mode draws from the
  batch's first seed, pair mode from each pair's first seed, elem mode from each sample's own.
  Beta(a, a) is X / (X + Y) with X, Y ~ Gamma(a) by Marsaglia and Tsang's method (boosted through
  Gamma(a + 1) x U^(1/a)) from a fixed number of uniforms: 8 tries each, accepted with probability
  > 0.95 each, so all 8 fail less than once in 10^10 draws (and then Marsaglia and Tsang's d,
  next to the gamma's mode, is taken).
- Any batch size: timm asserts an even batch. In an odd batch (a short last batch with drop_last:
  false, or one a skipped file shortened) the middle sample's partner is itself: it is left as it is,
  with its own smoothed one-hot target.
- Mixing runs after random erasing, as in DeiT's and torchvision's recipes, where erasing is part of
  each sample's transform.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import torch

from .order import seeded_uniform
from .schema import MixupConfig, SplitConfig
from .transfer import to_device

_MIX_SALT = 0x31C_5EED
_GAMMA_TRIES = 8
_GAMMA_UNIFORMS = 3 * _GAMMA_TRIES + 1  # per try: two for a normal (Box-Muller), one to accept; one boost
_COLUMNS = 2 + 2 * _GAMMA_UNIFORMS + 4  # apply?, cutmix?, the two gammas, the box


def mixing_enabled(split: SplitConfig) -> bool:
    """Mixup or cutmix is configured (train mode only: eval splits refuse the keys when loaded)."""
    mix = split.mixup
    return split.mode == "train" and (mix.mixup_alpha > 0 or mix.cutmix_alpha > 0 or mix.cutmix_minmax is not None)


def soft_targets_enabled(split: SplitConfig) -> bool:
    """Labels become float soft targets [B, num_classes]: with mixing or label smoothing on."""
    return mixing_enabled(split) or (split.mode == "train" and split.label_smoothing > 0)


def gamma_log(alpha: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """log of one Gamma(alpha, 1) variate per row from _GAMMA_UNIFORMS uniforms in [0, 1) per row.

    Marsaglia and Tsang (2000) on alpha + 1 >= 1, times U^(1 / alpha) (their boost for any alpha > 0),
    in logs so that small alphas (U^10 for alpha 0.1) neither underflow nor lose precision."""
    rows = len(alpha)
    d = alpha + 1.0 - 1.0 / 3.0
    c = 1.0 / np.sqrt(9.0 * d)
    tries = uniforms[:, :3 * _GAMMA_TRIES].reshape(rows, _GAMMA_TRIES, 3)
    normal = np.sqrt(-2.0 * np.log1p(-tries[..., 0])) * np.cos(2.0 * math.pi * tries[..., 1])
    v = (1.0 + c[:, None] * normal) ** 3
    positive = v > 0
    log_v = np.log(np.where(positive, v, 1.0))
    accept = positive & (np.log1p(-tries[..., 2]) < 0.5 * normal ** 2 + d[:, None] * (1.0 - v + log_v))
    first = np.argmax(accept, axis=1)
    chosen = np.where(accept.any(axis=1), log_v[np.arange(rows), first], 0.0)
    return np.log(d) + chosen + np.log1p(-uniforms[:, -1]) / alpha


def beta_symmetric(alpha: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """One Beta(alpha, alpha) variate per row from 2 x _GAMMA_UNIFORMS uniforms per row: X / (X + Y)."""
    x = gamma_log(alpha, uniforms[:, :_GAMMA_UNIFORMS])
    y = gamma_log(alpha, uniforms[:, _GAMMA_UNIFORMS:2 * _GAMMA_UNIFORMS])
    return np.exp(x - np.logaddexp(x, y))  # in logs: lam near 0 keeps its tiny value, nothing overflows


@dataclass(frozen=True)
class MixPlan:
    """How one batch is mixed, decided on the host from its samples' seeds."""

    lam: np.ndarray
    """float64 [B]: the weight of each sample's own image and label (1: not mixed), after correction."""
    cutmix: np.ndarray
    """bool [B]: the sample gets its partner's box (else, where lam < 1, a mixup blend)."""
    boxes: np.ndarray
    """int64 [B, 4]: (top, bottom, left, right) of the pasted box; empty (0, 0, 0, 0) without cutmix."""
    whole_batch: bool
    """Mode batch: one lam, one choice and one box for every sample."""

    @property
    def mixed(self) -> bool:
        return bool((self.lam < 1).any() | (self.cutmix & (self.boxes[:, 1] > self.boxes[:, 0])).any())


def _draw(seeds: np.ndarray, height: int, width: int, mix: MixupConfig):
    """(lam, cutmix, boxes) for each seed: timm's _params_per_elem and cutmix_bbox_and_lam, vectorized."""
    rows = len(seeds)
    u = seeded_uniform(seeds, _MIX_SALT, _COLUMNS)
    cutmix_alpha = 1.0 if mix.cutmix_minmax is not None else mix.cutmix_alpha  # as timm forces it
    if mix.mixup_alpha > 0 and cutmix_alpha > 0:
        use_cutmix = u[:, 1] < mix.switch_prob
    else:
        use_cutmix = np.full(rows, cutmix_alpha > 0)
    applied = u[:, 0] < mix.prob
    alpha = np.where(use_cutmix, cutmix_alpha, mix.mixup_alpha)
    lam = np.where(applied, beta_symmetric(alpha, u[:, 2:2 + 2 * _GAMMA_UNIFORMS]), 1.0)
    cutmix = applied & use_cutmix
    b = u[:, -4:]
    if mix.cutmix_minmax is not None:  # rand_bbox_minmax: sides uniform in [min, max) of the image's
        low_h, high_h = int(height * mix.cutmix_minmax[0]), int(height * mix.cutmix_minmax[1])
        low_w, high_w = int(width * mix.cutmix_minmax[0]), int(width * mix.cutmix_minmax[1])
        cut_h = low_h + np.floor(b[:, 0] * (high_h - low_h)).astype(np.int64)
        cut_w = low_w + np.floor(b[:, 1] * (high_w - low_w)).astype(np.int64)
        top = np.floor(b[:, 2] * (height - cut_h + 1)).astype(np.int64)
        left = np.floor(b[:, 3] * (width - cut_w + 1)).astype(np.int64)
        bottom, right = top + cut_h, left + cut_w
    else:  # rand_bbox: a box of side sqrt(1 - lam) around a uniform centre, clipped to the image
        ratio = np.sqrt(1.0 - lam)
        cut_h, cut_w = (height * ratio).astype(np.int64), (width * ratio).astype(np.int64)
        cy = np.floor(b[:, 0] * height).astype(np.int64)
        cx = np.floor(b[:, 1] * width).astype(np.int64)
        top, bottom = np.clip(cy - cut_h // 2, 0, height), np.clip(cy + (cut_h + 1) // 2, 0, height)
        left, right = np.clip(cx - cut_w // 2, 0, width), np.clip(cx + (cut_w + 1) // 2, 0, width)
    boxes = np.where(cutmix[:, None], np.stack([top, bottom, left, right], axis=1), 0)
    if mix.correct_lam or mix.cutmix_minmax is not None:
        area = (boxes[:, 1] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 2])
        lam = np.where(cutmix, 1.0 - area / float(height * width), lam)
    return lam, cutmix, boxes


def plan_mixing(seeds: np.ndarray, height: int, width: int, mix: MixupConfig,
                 batch_draw: tuple | None = None) -> MixPlan:
    """Draw the mixing of a batch of `len(seeds)` samples of height x width pixels. `batch_draw`: the
    (lam, cutmix, box) that _draw gave the batch's first seed, when drawn ahead (mode batch)."""
    seeds = np.asarray(seeds, dtype=np.int64)
    size = len(seeds)
    half = size // 2
    if mix.mode == "batch":
        lam, cutmix, box = batch_draw or (a[0] for a in _draw(seeds[:1], height, width, mix))
        lam, cutmix, boxes = np.full(size, lam), np.full(size, cutmix), np.tile(box, (size, 1))
    elif mix.mode == "pair":  # pair (i, B-1-i) shares the draws of its first sample
        first = _draw(seeds[:half], height, width, mix)
        lam, cutmix, boxes = np.ones(size), np.zeros(size, dtype=bool), np.zeros((size, 4), dtype=np.int64)
        for whole, part in zip((lam, cutmix, boxes), first):
            whole[:half], whole[size - half:] = part, part[::-1]
    else:
        lam, cutmix, boxes = _draw(seeds, height, width, mix)
    if size % 2:  # the middle sample of an odd batch mixes with itself: it stays as it is
        lam[half], cutmix[half], boxes[half] = 1.0, False, 0
    return MixPlan(lam, cutmix, boxes, whole_batch=mix.mode == "batch")


def mix_images(images: torch.Tensor, plan: MixPlan, pairwise: bool | None = None) -> torch.Tensor:
    """Mix a normalized batch [B, C, H, W] in place as planned (any float dtype, memory format, device).

    Two ways to the same pixels: on a GPU, a few whole-batch kernels against the flipped batch (few
    launches); on the CPU (`pairwise`), pair by pair through a one-image buffer, where a flipped copy
    of the batch would cost 6x the blend itself (fresh pages for 150 MB at 256 x 224 px) and a pair
    stays in the cache."""
    if not plan.mixed:
        return images
    if images.device.type == "cpu" if pairwise is None else pairwise:
        return _mix_pairs(images, plan)
    if plan.whole_batch:
        return _mix_whole_batch(images, float(plan.lam[0]), bool(plan.cutmix[0]), plan.boxes[0].tolist())
    height, width = images.shape[-2:]
    device = images.device
    blend = torch.from_numpy(np.where(plan.cutmix, 0.0, 1.0 - plan.lam).astype(np.float32))
    box = torch.from_numpy(plan.boxes)
    blend, box = to_device(blend, device), to_device(box, device)
    rows = torch.arange(height, device=device).view(1, 1, height, 1)
    cols = torch.arange(width, device=device).view(1, 1, 1, width)
    top, bottom, left, right = (box[:, i].view(-1, 1, 1, 1) for i in range(4))
    inside = (rows >= top) & (rows < bottom) & (cols >= left) & (cols < right)  # [B, 1, H, W]
    weight = torch.where(inside, 1.0, blend.view(-1, 1, 1, 1)).to(images.dtype)  # the partner's share per pixel
    return images.lerp_(images.flip(0), weight)


def _mix_whole_batch(images: torch.Tensor, lam: float, cutmix: bool, box: list[int]) -> torch.Tensor:
    """Mode batch: one lam, one box: a box's flip and copy or one scalar blend, two kernels. The odd
    middle sample takes from itself: it stays as it is."""
    if cutmix:
        top, bottom, left, right = box
        images[:, :, top:bottom, left:right] = images[:, :, top:bottom, left:right].flip(0)
    elif lam < 1:
        images.lerp_(images.flip(0), 1.0 - lam)
    return images


def _mix_pairs(images: torch.Tensor, plan: MixPlan) -> torch.Tensor:
    """mix_images pair by pair: sample i takes from B-1-i as it was, and B-1-i from a copy of i."""
    size = len(images)
    spare = torch.empty_like(images[0])
    for i in range(size // 2):
        j = size - 1 - i
        if not (_takes(plan, i) or _takes(plan, j)):
            continue
        if _takes(plan, j):  # keep what j takes of i: its box (cutmix) or all of it (mixup)
            top, bottom, left, right = (int(v) for v in plan.boxes[j]) if plan.cutmix[j] else (0, None, 0, None)
            spare[:, top:bottom, left:right].copy_(images[i][:, top:bottom, left:right])
        _take(images[i], images[j], plan, i)
        _take(images[j], spare, plan, j)
    return images


@contextlib.contextmanager
def _one_thread(on_cpu: bool):
    """Mix on one intra-op thread on the CPU: an image (or a target row) is too small a job to share,
    and where the decoding workers keep the other cores busy OpenMP's waiting threads spin: mixing
    256 x 224 px took 790 ms of the calling thread's CPU time on 2 threads of a busy 2-core machine,
    13 ms on one."""
    threads = torch.get_num_threads()
    if on_cpu and threads > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def _takes(plan: MixPlan, row: int) -> bool:
    return bool(plan.cutmix[row] or plan.lam[row] < 1)


def _take(image: torch.Tensor, partner: torch.Tensor, plan: MixPlan, row: int) -> None:
    """Row `row`'s image takes its share of its partner's: the box (cutmix), or 1 - lam (mixup)."""
    if plan.cutmix[row]:
        top, bottom, left, right = (int(v) for v in plan.boxes[row])
        image[:, top:bottom, left:right] = partner[:, top:bottom, left:right]
    elif plan.lam[row] < 1:
        image.lerp_(partner, float(1.0 - plan.lam[row]))


def soft_targets(labels: torch.Tensor, lam: np.ndarray | float | None, num_classes: int,
                 smoothing: float) -> torch.Tensor:
    """timm's mixup_target: float32 [B, num_classes] on the labels' device, rows summing to 1.

    `lam`: per sample (an array), or one for the whole batch (a float: the smoothed rows blended with
    the flipped ones by one lerp, with no copy from the host; the odd middle row blends with itself)."""
    off = smoothing / num_classes
    targets = torch.full((len(labels), num_classes), off, dtype=torch.float32, device=labels.device)
    if lam is None or np.all(lam == 1):
        return targets.scatter_(1, labels.view(-1, 1), 1.0 - smoothing + off)
    if isinstance(lam, float):
        targets.scatter_(1, labels.view(-1, 1), 1.0 - smoothing + off)
        return torch.lerp(targets.flip(0), targets, lam)
    shares = np.stack([lam, 1.0 - lam], axis=1) * (1.0 - smoothing)
    columns = torch.stack([labels, labels.flip(0)], dim=1)
    return targets.scatter_add_(1, columns, torch.from_numpy(shares.astype(np.float32)).to(labels.device))


class BatchMixer:
    """What a train split does to each delivered batch after erasing: mixing and soft targets.

    In mode batch the draws of an epoch's batches are made at its start, in one vectorized call
    (`start_epoch`), so that a batch costs the training thread a lookup, not a dozen numpy calls; a
    batch whose first sample was skipped (a file that failed to decode) is drawn when it arrives."""

    def __init__(self, split: SplitConfig, num_classes: int):
        self.mix = split.mixup if mixing_enabled(split) else None
        self.smoothing = split.label_smoothing
        self.num_classes = num_classes
        self.size = split.transform.size
        self._ahead: dict[int, tuple] = {}  # a batch's first seed -> its (lam, cutmix, box), mode batch

    @classmethod
    def for_split(cls, split: SplitConfig, num_classes: int) -> "BatchMixer | None":
        return cls(split, num_classes) if soft_targets_enabled(split) else None

    def start_epoch(self, batches: list[np.ndarray]) -> None:
        """Draw ahead for the epoch's planned batches of (sample, seed) rows (mode batch)."""
        self._ahead = {}
        if self.mix is None or self.mix.mode != "batch" or not batches:
            return
        firsts = np.array([batch[0, 1] for batch in batches if len(batch)], dtype=np.int64)
        draws = _draw(firsts, self.size, self.size, self.mix)
        self._ahead = dict(zip(firsts.tolist(), zip(*(a.tolist() for a in draws))))

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, seeds: np.ndarray
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """(images mixed in place, float32 soft targets [B, num_classes]) of a batch from its seeds."""
        return images, self.targets(labels, self.mix_images(images, seeds))

    def mix_images(self, images: torch.Tensor, seeds: np.ndarray) -> np.ndarray | float | None:
        """Mix a batch's pixels in place from its seeds; the lam its targets need (targets): one for
        the whole batch, one per sample, or None where nothing is mixed. Apart from targets, so that
        a torch worker can mix the pixels it has just written and the main process the labels."""
        if self.mix is None or not len(seeds):
            return None
        on_cpu = images.device.type == "cpu"
        with _one_thread(on_cpu):
            ahead = self._ahead_draw(seeds, images)
            if ahead is not None and not on_cpu:  # mode batch on a GPU: scalars, no arrays (13 -> 2 us)
                lam, cutmix, box = ahead
                _mix_whole_batch(images, lam, cutmix, box)
                return lam
            plan = plan_mixing(seeds, images.shape[-2], images.shape[-1], self.mix, ahead)
            mix_images(images, plan)
            return float(plan.lam[0]) if plan.whole_batch and not on_cpu else plan.lam

    def targets(self, labels: torch.Tensor, lam: np.ndarray | float | None) -> torch.Tensor:
        """The batch's float32 soft targets [B, num_classes] for mix_images' lam."""
        with _one_thread(labels.device.type == "cpu"):
            return soft_targets(labels, lam, self.num_classes, self.smoothing)

    def _ahead_draw(self, seeds: np.ndarray, images: torch.Tensor) -> tuple | None:
        """(lam, cutmix, box) drawn at the epoch's start for this batch (mode batch), else None."""
        if images.shape[-2:] != (self.size, self.size):
            return None
        return self._ahead.get(int(seeds[0]))

    def plan(self, seeds: np.ndarray, height: int, width: int) -> MixPlan:
        """The batch's draws: made ahead at the epoch's start where they could be (mode batch)."""
        ahead = self._ahead.get(int(seeds[0])) if (height, width) == (self.size, self.size) else None
        return plan_mixing(seeds, height, width, self.mix, ahead)

    def describe(self) -> str:
        """The settings in words, for the epoch's log line."""
        parts = []
        if self.mix is not None:
            m = self.mix
            kinds = [f"mixup {m.mixup_alpha:g}" if m.mixup_alpha > 0 else "",
                     f"cutmix {m.cutmix_minmax}" if m.cutmix_minmax else
                     (f"cutmix {m.cutmix_alpha:g}" if m.cutmix_alpha > 0 else "")]
            parts.append(f"{' + '.join(k for k in kinds if k)} (mode {m.mode}, prob {m.prob:g}"
                         f"{f', switch {m.switch_prob:g}' if all(kinds) else ''})")
        if self.smoothing:
            parts.append(f"label smoothing {self.smoothing:g}")
        return ", ".join(parts)
