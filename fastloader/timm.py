"""timm's `create_loader`, answered by fastloader: `from fastloader.timm import create_loader` in
timm's train.py is the one line to change (docs/timm.md).

It takes timm.data.create_loader's arguments by their names (a test holds the list to timm's own),
turns each into the fastloader key that means the same (RandomResizedCrop's scale and ratio, flips,
colour jitter, `auto_augment` in timm's own grammar, random erasing, repeated augmentation, the
mean and std, workers, the device and dtype of timm's prefetcher, FastCollateMixup's mixing and
smoothing), and refuses by name what fastloader does not do. The loader it gives has what train.py
uses of timm's: `len()`, `sampler.set_epoch`, `mixup_enabled` (setting it False, timm's
`--mixup-off-epoch`, builds the loader again without mixing from the next epoch) and `dataset`.
"""
from __future__ import annotations

import inspect
import logging
import os
import re
from typing import Any, Iterator, Mapping, Optional, Sequence

import torch
from timm.data.mixup import FastCollateMixup

from . import build_loader
from .contract import Loader
from .errors import ConfigError

log = logging.getLogger("fastloader")

_NOT_DONE = {  # timm's argument: (the value that means "off", why fastloader refuses another, the fix)
    "re_split": (False, "AugMix's split random erasing", "leave re_split off"),
    "num_aug_splits": (0, "AugMix's augmentation splits", "train without --aug-splits"),
    "crop_border_pixels": (None, "a border cropped off every eval image", "leave it unset"),
    "tf_preprocessing": (False, "TensorFlow's preprocessing", "leave --tf-preprocessing off"),
    "batch_choice_weights": (None, "weights of the batch size choices", "leave it unset"),
    "batch_schedule_epochs": (None, "a batch size schedule", "leave it unset"),
    "num_batches": (None, "a fixed number of batches of an iterable dataset", "leave it unset"),
}
_IGNORED = ("distributed", "use_multi_epochs_loader", "worker_seeding", "batch_choice_seed", "batch_choice_schedule",
            "batch_schedule_spread", "batch_schedule_random_mix")
"""Arguments that change nothing here: fastloader shards for torch.distributed by itself, its workers
persist, and its draws come from the samples' seeds, not from the workers' generators."""


def create_loader(
        dataset: Any,
        input_size: int | tuple[int, int] | tuple[int, int, int],
        batch_size: int,
        is_training: bool = False,
        no_aug: bool = False,
        re_prob: float = 0.0,
        re_mode: str = "const",
        re_count: int = 1,
        re_split: bool = False,
        train_crop_mode: Optional[str] = None,
        scale: Optional[tuple[float, float]] = None,
        ratio: Optional[tuple[float, float]] = None,
        hflip: float = 0.5,
        vflip: float = 0.0,
        color_jitter: float | Sequence[float] = 0.4,
        color_jitter_prob: Optional[float] = None,
        grayscale_prob: float = 0.0,
        gaussian_blur_prob: float = 0.0,
        auto_augment: Optional[str] = None,
        num_aug_repeats: int = 0,
        num_aug_splits: int = 0,
        interpolation: str = "bilinear",
        mean: tuple[float, ...] = (0.485, 0.456, 0.406),
        std: tuple[float, ...] = (0.229, 0.224, 0.225),
        num_workers: int = 1,
        distributed: bool = False,
        crop_pct: Optional[float] = None,
        crop_mode: Optional[str] = None,
        crop_border_pixels: Optional[int] = None,
        collate_fn: Any = None,
        pin_memory: bool = False,
        fp16: bool = False,
        img_dtype: torch.dtype = torch.float32,
        device: torch.device | str = torch.device("cuda"),
        use_prefetcher: bool = True,
        use_multi_epochs_loader: bool = False,
        persistent_workers: bool = True,
        worker_seeding: str = "all",
        tf_preprocessing: bool = False,
        input_size_choices: Optional[Sequence[Any]] = None,
        batch_size_choices: Optional[Sequence[int]] = None,
        batch_choice_weights: Optional[Sequence[float]] = None,
        batch_choice_seed: int = 0,
        batch_choice_schedule: str = "constant",
        batch_schedule_epochs: Optional[int] = None,
        batch_schedule_spread: float = 0.65,
        batch_schedule_random_mix: float = 0.1,
        num_batches: Optional[int] = None,
        *, overrides: Mapping[str, Any] | None = None) -> "TimmLoader":
    """timm.data.create_loader's contract on fastloader: `dataset` is what timm's create_dataset
    gave (a folder of class folders; its class order is kept) or that folder's path. `overrides`:
    fastloader keys beyond timm's (backend, seed, dataset.screen, ...)."""
    given = locals()
    for name, (off, what, fix) in _NOT_DONE.items():
        if given[name] != off:
            _refuse(name, given[name], f"fastloader does not do {what}; {fix}")
    if input_size_choices is not None and not is_training:
        _refuse("input_size_choices", input_size_choices, "sizes per batch are a training loader's, as timm's: "
                                                          "leave it unset with is_training=False")
    if batch_size_choices is not None and not input_size_choices:
        _refuse("batch_size_choices", batch_size_choices, "timm pairs each with an input size: give "
                                                          "input_size_choices of the same length")
    if no_aug and is_training:
        _refuse("no_aug", no_aug, "a train split always crops and flips; for timm's no_aug use is_training=False (an "
                                  "eval split's resize and centre crop)")
    if train_crop_mode not in (None, "rrc"):
        _refuse("train_crop_mode", train_crop_mode, "fastloader crops train images with RandomResizedCrop (rrc) only")
    if crop_mode not in (None, "center"):
        _refuse("crop_mode", crop_mode, "fastloader's eval crop is the centre crop (center) only")
    if interpolation not in ("bilinear", "bicubic", "nearest"):
        _refuse("interpolation", interpolation, "use bilinear, bicubic or nearest (timm's random is not drawn "
                                                "from a seed)")
    if collate_fn is not None and not isinstance(collate_fn, FastCollateMixup):
        _refuse("collate_fn", type(collate_fn).__name__, "fastloader collates itself; timm's FastCollateMixup is "
                                                         "read for its mixing and label smoothing")
    if len(mean) != 3 or len(std) != 3:
        _refuse("mean", mean, "three channels' mean and std (RGB)")
    if img_dtype not in _DTYPES:
        _refuse("img_dtype", img_dtype, "fastloader gives float32, float16 or bfloat16 batches (output.dtype)")
    root, classes = _folder_of(dataset)
    split = "train" if is_training else "val"
    config = {"dataset": {"root": os.path.dirname(root), "classes": classes},
              "normalize": {"mean": list(mean), "std": list(std)},
              "output": {"device": str(device), "dtype": _DTYPES[torch.float16 if fp16 else img_dtype]},
              "workers": {"num_workers": num_workers, "pin_memory": pin_memory, "persistent": persistent_workers},
              split: _split(split, os.path.basename(root), _side(input_size, "input_size"), batch_size, given)}
    built = build_loader(config, split, overrides=dict(overrides or {}))
    for name in _IGNORED:
        if given[name] != _DEFAULTS[name]:
            log.debug("fastloader.timm.create_loader: %s=%r changes nothing here (%s)", name, given[name],
                      "fastloader shards, persists its workers and draws from the samples' seeds itself")
    return TimmLoader(built, dataset, config, split, overrides)


def _split(split: str, folder: str, side: int, batch_size: int, given: dict) -> dict:
    """The split section: train's crop, flips, ops, erasing, repeats, mixing; eval's centre crop."""
    if split != "train":
        return {"folder": folder, "batch_size": batch_size,
                "transform": {"size": side, "interpolation": given["interpolation"],
                              "crop_pct": 0.875 if given["crop_pct"] is None else given["crop_pct"]}}
    jitter = given["color_jitter"]
    transform = {"size": side, "scale": list(given["scale"] or (0.08, 1.0)),
                 "ratio": list(given["ratio"] or (3 / 4, 4 / 3)), "hflip": given["hflip"], "vflip": given["vflip"],
                 "color_jitter": (list(jitter) if isinstance(jitter, (list, tuple)) else jitter) or None,
                 "color_jitter_prob": 1.0 if given["color_jitter_prob"] is None else given["color_jitter_prob"],
                 "grayscale_prob": given["grayscale_prob"], "gaussian_blur_prob": given["gaussian_blur_prob"],
                 "auto_augment": given["auto_augment"], "interpolation": given["interpolation"],
                 "erase_prob": given["re_prob"], "erase_mode": given["re_mode"],
                 "erase_count": [1, max(1, given["re_count"])]}
    section = {"folder": folder, "batch_size": batch_size, "aug_repeats": max(1, given["num_aug_repeats"]),
               "transform": transform}
    if given["input_size_choices"]:
        transform["sizes"] = [_side(choice, "input_size_choices") for choice in given["input_size_choices"]]
    if given["batch_size_choices"]:  # timm's scheduled batching: a batch size per input size, same order
        section["batch_sizes"] = [int(choice) for choice in given["batch_size_choices"]]
        section["batch_size"] = max(section["batch_sizes"])
    mixup = given["collate_fn"]
    if mixup is not None:
        section["label_smoothing"] = mixup.label_smoothing
        section["mixup"] = {"mixup_alpha": mixup.mixup_alpha, "cutmix_alpha": mixup.cutmix_alpha,
                            "cutmix_minmax": list(mixup.cutmix_minmax) if mixup.cutmix_minmax else None,
                            "prob": mixup.mix_prob, "switch_prob": mixup.switch_prob, "mode": mixup.mode,
                            "correct_lam": mixup.correct_lam}
    return section


def _side(size: Any, name: str) -> int:
    """timm's input_size (an int, (H, W) or (C, H, W)) as one side: fastloader's outputs are square."""
    sides = (size,) if isinstance(size, int) else tuple(size)[-2:]
    if len(set(sides)) != 1 or (not isinstance(size, int) and len(size) == 3 and size[0] != 3):
        _refuse(name, size, "fastloader gives square RGB images: (3, S, S)")
    return int(sides[0])


_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _folder_of(dataset: Any) -> tuple[str, list[str] | None]:
    """(the split's folder, its class names in timm's label order) of timm's dataset, or of a path:
    its class folders in timm's natural order ('2' before '10'), as timm's own dataset of that
    folder labels them, so that an image gets one label however the folder is passed."""
    if isinstance(dataset, (str, os.PathLike)):
        root = os.path.abspath(os.fspath(dataset))
        if not os.path.isdir(root):
            _refuse("dataset", os.fspath(dataset), "no such folder; give a folder of class folders or timm's dataset")
        folders = [entry.name for entry in os.scandir(root) if entry.is_dir() and not entry.name.startswith(".")]
        return root, sorted(folders, key=_natural_key) or None
    reader = getattr(dataset, "reader", None)
    root, class_to_idx = getattr(reader, "root", None), getattr(reader, "class_to_idx", None)
    if root is None or not class_to_idx or not os.path.isdir(root):
        _refuse("dataset", type(dataset).__name__, "give timm's ImageDataset of a folder of class folders "
                                                   "(create_dataset('', root=...)) or the folder's path; for tar "
                                                   "shards or other sources build fastloader's loader itself")
    return os.path.abspath(root), [name for name, _ in sorted(class_to_idx.items(), key=lambda item: item[1])]


def _natural_key(name: str) -> list:
    """timm's natural_key (timm.data.readers.class_map): digit runs compared as numbers, case ignored."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name.lower())]


def _refuse(name: str, value: Any, why: str) -> None:
    raise ConfigError(f"fastloader.timm.create_loader: {name}={value!r}: {why}")


_DEFAULTS = {name: parameter.default for name, parameter in inspect.signature(create_loader).parameters.items()}


class TimmLoader:
    """fastloader's loader with the attributes timm's train.py uses of timm's."""

    def __init__(self, loader: Loader, dataset: Any, config: dict, split: str, overrides: Mapping | None):
        self.loader, self.dataset = loader, dataset
        self._config, self._split, self._overrides = config, split, overrides
        self.sampler = self  # train.py: loader.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator:
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    @property
    def mixup_enabled(self) -> bool:
        mixer = getattr(self.loader.finisher, "mixer", None)
        return mixer is not None and mixer.mix is not None

    @mixup_enabled.setter
    def mixup_enabled(self, enabled: bool) -> None:
        """False (timm's --mixup-off-epoch): from the next epoch, the same loader without mixing (the
        label smoothing stays, as FastCollateMixup's does); True again is refused."""
        if enabled == self.mixup_enabled:
            return
        if enabled:
            raise ValueError("fastloader.timm: mixing cannot be turned back on; build a new loader")
        old = self.loader
        epoch = old.next_epoch
        split = dict(self._config[self._split])
        split["mixup"] = {**split.get("mixup", {}), "mixup_alpha": 0.0, "cutmix_alpha": 0.0, "cutmix_minmax": None}
        self._config = {**self._config, self._split: split}
        self.loader = build_loader(self._config, self._split, overrides=dict(self._overrides or {}))
        self.loader.set_epoch(epoch)
        old.close()
        log.info("split '%s': mixing off from epoch %d (timm's mixup_enabled = False)", self._split, epoch)
