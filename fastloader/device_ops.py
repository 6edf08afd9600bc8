"""Batch-level stages that both backends apply to the normalized batch, on its device: the user's
batch hook (fastloader/hooks.py), random erasing, then mixing (fastloader/mixing.py), composed by
BatchFinisher.

Where they run is the backend's choice, off the training thread where it can be: the DALI backend's
driver thread (dali_loader/driver.py), the torch backend's workers for CPU output (in the collate,
right after the normalize); for GPU output, its CUDA prefetcher launches it onto a side stream from
the loader's producer thread (torch_loader/ahead.py), not the training thread. Every draw comes
from the samples' seeds, so the place does not change a pixel.

Random erasing follows timm's RandomErasing (Zhong et al.): with probability `erase_prob` an image
gets between erase_count[0] and erase_count[1] boxes, each of area uniform(erase_area) x image area /
count and aspect ratio (height / width) log-uniform in erase_ratio, placed uniformly where it fits
(10 tries, else that box is skipped); a box is filled with zeros, one normal colour, or normal noise
per pixel. timm loops over the images of a batch in Python; here the box parameters of the whole
batch come from the samples' seeds in one vectorized draw (so they replay exactly, whatever the
backend or the number of workers), and the boxes become one mask per box slot. A box's colour or
noise is a counter-based function of its sample's seed (box_noise): one generator for the batch,
seeded with its first sample's, gave a sample other noise in another batch (a resume at another
batch, another batch size) and on another device (issue 68).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .hooks import Hook
from .mixing import BatchMixer
from .order import derived_seeds, seeded_uniform
from .schema import SplitConfig, TransformConfig
from .transfer import to_device

_ATTEMPTS = 10
_ERASE_SALT = 0xE7A5E


def erasing_enabled(transform: TransformConfig, mode: str) -> bool:
    """Random erasing runs in train mode only, when its probability is above zero."""
    return mode == "train" and transform.erase_prob > 0


def erase_boxes(seeds: np.ndarray, height: int, width: int, transform: TransformConfig) -> np.ndarray:
    """int64 [B, max_count, 4] boxes (top, left, height, width); height 0 where no box is erased."""
    t = transform
    lo, hi = t.erase_count
    batch = len(seeds)
    draws = seeded_uniform(seeds, _ERASE_SALT, 2 + hi * _ATTEMPTS * 4)
    erase = draws[:, 0] < t.erase_prob
    count = lo + np.minimum(np.floor(draws[:, 1] * (hi - lo + 1)), hi - lo).astype(np.int64)
    tries = draws[:, 2:].reshape(batch, hi, _ATTEMPTS, 4)
    area = height * width * (t.erase_area[0] + (t.erase_area[1] - t.erase_area[0]) * tries[..., 0])
    area /= count[:, None, None]
    log_lo, log_hi = math.log(t.erase_ratio[0]), math.log(t.erase_ratio[1])
    aspect = np.exp(log_lo + (log_hi - log_lo) * tries[..., 1])
    box_h = np.rint(np.sqrt(area * aspect)).astype(np.int64)
    box_w = np.rint(np.sqrt(area / aspect)).astype(np.int64)
    fits = (box_h < height) & (box_w < width) & (box_h > 0) & (box_w > 0)
    first = np.argmax(fits, axis=2)[..., None]  # the first try that fits, as timm's loop takes
    pick = lambda a: np.take_along_axis(a, first, axis=2)[..., 0]  # noqa: E731
    box_h, box_w = pick(box_h), pick(box_w)
    top = np.floor(pick(tries[..., 2]) * (height - box_h + 1)).astype(np.int64)
    left = np.floor(pick(tries[..., 3]) * (width - box_w + 1)).astype(np.int64)
    used = erase[:, None] & fits.any(axis=2) & (np.arange(hi)[None, :] < count[:, None])
    box_h = np.where(used, box_h, 0)
    return np.stack([top, left, box_h, box_w], axis=-1)


def random_erasing(images: torch.Tensor, seeds: np.ndarray, transform: TransformConfig) -> torch.Tensor:
    """Erase boxes in a normalized batch [B, C, H, W] in place (any dtype, memory format, device)."""
    _, channels, height, width = images.shape
    seeds = np.asarray(seeds, dtype=np.int64)
    boxes = erase_boxes(seeds, height, width, transform)
    if not boxes[..., 2].any():
        return images
    device = images.device
    box = to_device(torch.from_numpy(boxes), device)
    rows = torch.arange(height, device=device).view(1, 1, height, 1)
    cols = torch.arange(width, device=device).view(1, 1, 1, width)
    top, left, box_h, box_w = (box[..., i].view(*box.shape[:2], 1, 1) for i in range(4))
    inside = (rows >= top) & (rows < top + box_h) & (cols >= left) & (cols < left + box_w)  # [B, K, H, W]
    if transform.erase_mode == "const":
        for slot in range(boxes.shape[1]):
            images.masked_fill_(inside[:, slot:slot + 1], 0)
        return images
    per_box = channels if transform.erase_mode == "rand" else channels * boxes[..., 2] * boxes[..., 3]  # [B, K]
    keys = derived_seeds(seeds, _ERASE_SALT, boxes.shape[1]).T & _LOW_32  # [B, K]: each box's own
    for slot in range(boxes.shape[1]):
        erased = np.flatnonzero(boxes[:, slot, 2])
        if not len(erased):
            continue
        sizes = np.broadcast_to(per_box, boxes.shape[:2])[erased, slot]
        fill = box_noise(keys[erased, slot], sizes, device).to(images.dtype)
        mask = inside[:, slot:slot + 1]
        if transform.erase_mode == "rand":  # one colour a box
            colours = torch.zeros(len(images), channels, 1, 1, dtype=images.dtype, device=device)
            colours[to_device(torch.from_numpy(erased), device)] = fill.view(len(erased), channels, 1, 1)
            torch.where(mask, colours, images, out=images)
        else:  # the boxes' pixels, in the order masked_scatter_ visits the mask's: sample by sample, (C, H, W)
            images.masked_scatter_(mask, fill)
    return images


_LOW_32 = 0xFFFFFFFF
_NORMAL_LEVELS = 1 << 16
_NORMAL_TABLES: dict[torch.device, torch.Tensor] = {}


def box_noise(keys: np.ndarray, sizes: np.ndarray, device: torch.device) -> torch.Tensor:
    """float32 [sum(sizes)]: `sizes[i]` normal(0, 1) values for box i, a pure function of its key
    (from its sample's seed and its slot) and the value's place in the box, counter-based: the same
    integer arithmetic on any device and in any batch, so a sample's noise is its own, after a
    resume, on the CPU or a GPU (one generator for the batch, seeded with its first sample's, gave
    a sample other noise in another batch and on another device: issue 68). The 32-bit hash of
    (key, place) picks one of 65,536 normal quantiles from a table (exact on every device; finer
    than bfloat16 or float16 output tells apart). Only the boxes' values are made, on the device."""
    sizes = np.ascontiguousarray(sizes, dtype=np.int64)
    total = int(sizes.sum())
    counts, starts, keys = (to_device(torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)), device)
                            for a in (sizes, np.cumsum(sizes) - sizes, keys))
    box = torch.repeat_interleave(torch.arange(len(sizes), device=device), counts, output_size=total)
    place = torch.arange(total, device=device) - starts[box]
    bits = _hash32((keys[box] + _hash32(place & _LOW_32)) & _LOW_32)
    return _normal_table(device)[bits >> 16]


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (Mueller's) of int64 values in [0, 2**32): no product leaves int64."""
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & _LOW_32
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & _LOW_32
    return x ^ (x >> 16)


def _normal_table(device: torch.device) -> torch.Tensor:
    """The normal distribution's quantiles at (i + 1/2) / 65,536, float32, made on the CPU once and
    kept on each device."""
    table = _NORMAL_TABLES.get(device)
    if table is None:
        levels = (torch.arange(_NORMAL_LEVELS, dtype=torch.float64) + 0.5) / _NORMAL_LEVELS
        table = _NORMAL_TABLES[device] = (torch.erfinv(levels * 2 - 1) * math.sqrt(2)).float().to(device)
    return table


class BatchFinisher:
    """A split's batch stages, in order: the user's batch hook (fastloader.hooks), random erasing,
    then mixup / cutmix with the soft targets they imply (or label smoothing alone)."""

    def __init__(self, transform: TransformConfig, erasing: bool, mixer: BatchMixer | None, hook: Hook | None = None):
        self.transform, self.erasing, self.mixer, self.hook = transform, erasing, mixer, hook

    @classmethod
    def for_split(cls, split: SplitConfig, num_classes: int, hook: Hook | None = None) -> "BatchFinisher | None":
        """The split's finisher; None where it would do nothing (eval without a batch hook, or
        nothing configured)."""
        erasing, mixer = erasing_enabled(split.transform, split.mode), BatchMixer.for_split(split, num_classes)
        return cls(split.transform, erasing, mixer, hook) if erasing or mixer is not None or hook else None

    def start_epoch(self, planned: list[np.ndarray]) -> None:
        """Before an epoch's first batch: what can be drawn for all of its batches at once."""
        if self.mixer is not None:
            self.mixer.start_epoch(planned)

    def pixels(self, images: torch.Tensor, seeds: np.ndarray) -> np.ndarray | float | None:
        """Erase and mix a normalized batch in place; what `labels` needs of the mixing (its lam)."""
        if self.erasing:
            random_erasing(images, seeds, self.transform)
        return self.mixer.mix_images(images, seeds) if self.mixer is not None else None

    def labels(self, labels: torch.Tensor, lam: np.ndarray | float | None) -> torch.Tensor:
        """int64 labels [B] as they are, or float32 soft targets [B, num_classes] (mixing, smoothing)."""
        return self.mixer.targets(labels, lam) if self.mixer is not None else labels

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, seeds: np.ndarray,
                 borrowed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The finished batch: possibly new tensors (the hook's), erased and mixed in place.

        The batch hook may keep what it is given (a memory bank, "mix with the previous batch"),
        on every backend: `borrowed` images (in a buffer the loader reuses for a later batch, the
        torch workers') reach it as a copy of its own, and what it returns is laid out as the
        batch it was given (a channels_last or expanded tensor made dense, so that the trainer's
        in-place ops work) and, where erasing or mixing follow in place, never the memory it was
        given (it may have kept it)."""
        if self.hook is not None:
            given = images.clone() if borrowed else images
            out, labels = self.hook.on_batch(given, labels, seeds)
            in_place_next = self.erasing or self.mixer is not None
            images = laid_out_like(out, images, copy=in_place_next and shares_memory(out, given))
        return images, self.labels(labels, self.pixels(images, seeds))


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def laid_out_like(out: torch.Tensor, given: torch.Tensor, copy: bool = False) -> torch.Tensor:
    """`out` in `given`'s memory format (channels_last or contiguous), as a tensor of its own where
    `copy` or where it is not dense in that format (an expanded or permuted view)."""
    channels_last = given.dim() == 4 and not given.is_contiguous() and given.is_contiguous(
        memory_format=torch.channels_last)
    form = torch.channels_last if channels_last else torch.contiguous_format
    if copy:
        return out.clone(memory_format=form)
    return out.contiguous(memory_format=form)
