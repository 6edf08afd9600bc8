"""fastloader.timm.create_loader: timm's create_loader arguments by timm's own names, each mapped to
the fastloader key that means the same or refused by name, over timm's own dataset, with what
timm's train.py uses of its loader (len, sampler.set_epoch, mixup_enabled, dataset). CPU."""
from __future__ import annotations

import inspect
from collections import Counter

import pytest
import torch
from conftest import write_textured_dataset

timm_data = pytest.importorskip("timm.data")
from timm.data.mixup import FastCollateMixup  # noqa: E402

from fastloader.errors import ConfigError  # noqa: E402
from fastloader.timm import create_loader  # noqa: E402


@pytest.fixture(scope="module")
def timm_dataset(tmp_path_factory):
    root = write_textured_dataset(tmp_path_factory.mktemp("tex"), per_class=4)
    return timm_data.create_dataset("", root=str(root / "train")), root


def small(**options):
    return {"input_size": (3, 32, 32), "batch_size": 4, "num_workers": 0, "device": torch.device("cpu"),
            "overrides": {"backend": "torch"}, **options}


def test_every_argument_of_timms_create_loader_is_taken_by_its_name():
    """timm's signature, read from the installed timm: each of its parameters is one of ours, with
    timm's default (so a call written for timm means the same here)."""
    theirs = inspect.signature(timm_data.create_loader).parameters
    ours = inspect.signature(create_loader).parameters
    assert [name for name in theirs if name not in ours] == []
    different = {name: (p.default, ours[name].default) for name, p in theirs.items()
                 if p.default is not inspect.Parameter.empty and str(p.default) != str(ours[name].default)}
    assert different == {}


def test_train_pys_flags_become_the_keys_that_mean_the_same(timm_dataset):
    dataset, _ = timm_dataset
    mixup = FastCollateMixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=3, mode="pair")
    loader = create_loader(dataset, **small(is_training=True, re_prob=0.25, re_mode="pixel", re_count=2,
                                            scale=(0.2, 1.0), ratio=(0.5, 2.0), hflip=0.3, vflip=0.1,
                                            auto_augment="rand-m9-mstd0.5-inc1", num_aug_repeats=3,
                                            interpolation="bicubic", mean=(0.5, 0.5, 0.5), std=(0.2, 0.2, 0.2),
                                            collate_fn=mixup, img_dtype=torch.bfloat16))
    config = loader.config
    train, t = config.split("train"), config.split("train").transform
    assert (t.size, t.scale, t.ratio, t.hflip, t.vflip, t.auto_augment, t.interpolation) == (
        32, (0.2, 1.0), (0.5, 2.0), 0.3, 0.1, "rand-m9-mstd0.5-inc1", "bicubic")
    assert (t.erase_prob, t.erase_mode, t.erase_count) == (0.25, "pixel", (1, 2))
    assert (train.aug_repeats, train.label_smoothing) == (3, 0.1)
    assert (train.mixup.mixup_alpha, train.mixup.cutmix_alpha, train.mixup.mode) == (0.8, 1.0, "pair")
    assert config.normalize.mean == (0.5, 0.5, 0.5) and config.output.dtype == "bfloat16"
    images, targets = next(iter(loader))
    assert images.dtype == torch.bfloat16 and images.shape == (4, 3, 32, 32) and targets.shape == (4, 3)
    assert loader.mixup_enabled and len(loader) == 12 // 4  # repeats keep the epoch's length, as timm's sampler
    loader.close()


def test_the_class_order_is_timms_and_eval_reads_every_image_once(tmp_path):
    """timm sorts class folders naturally (c2 before c10); fastloader takes timm's order from its
    dataset, so every label means what timm's does."""
    root = write_textured_dataset(tmp_path / "tex", per_class=2, splits=("val",))
    (root / "val" / "a_red").rename(root / "val" / "c10")
    (root / "val" / "b_green").rename(root / "val" / "c2")
    dataset = timm_data.create_dataset("", root=str(root / "val"))
    loader = create_loader(dataset, **small())
    assert loader.classes == ("c2", "c10", "c_blue") == tuple(sorted(dataset.reader.class_to_idx,
                                                                      key=dataset.reader.class_to_idx.get))
    labels = [label for _, batch in loader for label in batch.tolist()]
    assert Counter(labels) == Counter(target for _, target in dataset.reader.samples)
    assert loader.dataset is dataset
    by_path = create_loader(str(root / "val"), **small())  # the folder's path: the same labels (it sorted c10 first)
    assert by_path.classes == loader.classes
    assert [batch.tolist() for _, batch in by_path] == [batch.tolist() for _, batch in loader]


def test_an_image_dtype_fastloader_does_not_give_is_refused_not_changed(timm_dataset):
    dataset, _ = timm_dataset
    with pytest.raises(ConfigError, match=r"img_dtype=torch\.float64: fastloader gives float32, float16 or "
                                          r"bfloat16 batches"):
        create_loader(dataset, **small(), img_dtype=torch.float64)
    with create_loader(dataset, **small(), img_dtype=torch.bfloat16).loader as loader:
        assert next(iter(loader))[0].dtype == torch.bfloat16


def test_set_epoch_and_mixup_off_epoch_as_train_py_uses_them(timm_dataset):
    dataset, _ = timm_dataset
    mixup = FastCollateMixup(mixup_alpha=1.0, label_smoothing=0.1, num_classes=3)
    loader = create_loader(dataset, **small(is_training=True, collate_fn=mixup))
    loader.sampler.set_epoch(0)
    first = [targets for _, targets in loader]
    loader.mixup_enabled = False  # timm's --mixup-off-epoch, before the next epoch
    assert not loader.mixup_enabled
    second = [targets for _, targets in loader]
    assert loader.epoch == 1 and len(second) == len(first) == 3
    smoothed = torch.cat(second)  # one-hot, smoothed: 1 - 0.1 + 0.1 / 3 on the label, no blend
    assert torch.allclose(smoothed.max(dim=1).values, torch.full((12,), 0.9 + 0.1 / 3))
    assert not torch.allclose(torch.cat(first).max(dim=1).values, torch.full((12,), 0.9 + 0.1 / 3))
    with pytest.raises(ValueError, match="cannot be turned back on"):
        loader.mixup_enabled = True
    loader.close()


@pytest.mark.parametrize("options, message", [
    ({"re_split": True}, "re_split=True: fastloader does not do AugMix's split random erasing; leave re_split off"),
    ({"num_aug_splits": 3}, "num_aug_splits=3: fastloader does not do AugMix's augmentation splits"),
    ({"no_aug": True, "is_training": True}, "no_aug=True: a train split always crops and flips"),
    ({"train_crop_mode": "rkrr"}, "train_crop_mode='rkrr': fastloader crops train images with RandomResizedCrop"),
    ({"input_size": (3, 32, 24)}, "input_size=(3, 32, 24): fastloader gives square RGB images"),
    ({"interpolation": "random"}, "interpolation='random': use bilinear, bicubic or nearest"),
    ({"collate_fn": torch.utils.data.default_collate}, "collate_fn='function': fastloader collates itself"),
    ({"tf_preprocessing": True}, "tf_preprocessing=True: fastloader does not do TensorFlow's preprocessing"),
    ({"batch_size_choices": [2, 4]}, "batch_size_choices=[2, 4]: timm pairs each with an input size: give "
                                     "input_size_choices of the same length"),
    ({"batch_choice_weights": [1, 2]}, "batch_choice_weights=[1, 2]: fastloader does not do weights of the batch"),
    ({"input_size_choices": [16, 32]}, "input_size_choices=[16, 32]: sizes per batch are a training loader's"),
])
def test_what_fastloader_does_not_do_is_refused_by_timms_name(timm_dataset, options, message):
    dataset, _ = timm_dataset
    with pytest.raises(ConfigError, match="fastloader.timm.create_loader: " + message.replace("(", r"\(")
                       .replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        create_loader(dataset, **{**small(), **options})


def test_the_timm_example_runs_train_pys_loop_with_mixup_off_after_an_epoch(timm_dataset, monkeypatch, capsys):
    """examples/timm_train.py, in this process as `python examples/timm_train.py DATA ...` would run:
    timm's dataset, model, FastCollateMixup and soft-target loss on fastloader's loaders."""
    import runpy
    import sys

    from conftest import REPO
    _, root = timm_dataset
    monkeypatch.setattr(sys, "argv", ["timm_train.py", str(root), "--epochs", "2", "--batch-size", "4",
                                      "--img-size", "32", "--workers", "0", "--mixup", "0.8", "--mixup-off-epoch", "1",
                                      "--backend", "torch"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the test's device: CPU
    with pytest.raises(SystemExit) as stopped:
        runpy.run_path(str(REPO / "examples" / "timm_train.py"), run_name="__main__")
    assert stopped.value.code == 0
    out = capsys.readouterr().out
    assert "epoch 0: loss" in out and "mixing on, val accuracy" in out and "on 12 images" in out
    assert "epoch 1: loss" in out and "mixing off, val accuracy" in out
