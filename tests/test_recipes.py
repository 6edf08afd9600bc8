"""configs/recipes/: each recipe loads, names its source, and trains a few steps of examples/train.py
with its mixing and repeats on a tiny dataset written here (CPU, torch backend, small sizes)."""
from __future__ import annotations

import logging
import re
import runpy
import sys

import pytest
import torch
from conftest import REPO, write_solid_dataset

from fastloader.config import load_config

RECIPES = {  # file: (aug_repeats, mixup_alpha, cutmix_alpha, label_smoothing, auto_augment, the source it names)
    "deit.yaml": (3, 0.8, 1.0, 0.1, "rand-m9-mstd0.5-inc1", "facebookresearch/deit"),
    "rsb-a2.yaml": (3, 0.1, 1.0, 0.0, "rand-m7-mstd0.5-inc1", "arXiv 2110.00476"),
    "torchvision.yaml": (4, 0.2, 1.0, 0.1, "ta_wide", "references/classification"),
}


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_recipe_names_its_source_and_trains_with_soft_targets_and_repeats(tmp_path, recipe, monkeypatch, capsys,
                                                                          caplog):
    repeats, mixup, cutmix, smoothing, policy, source = RECIPES[recipe]
    path = REPO / "configs" / "recipes" / recipe
    header = path.read_text().split("\nbackend:")[0]
    assert "Source:" in header and source in header
    train = load_config(path).split("train")
    assert (train.aug_repeats, train.mixup.mixup_alpha, train.mixup.cutmix_alpha, train.label_smoothing,
            train.transform.auto_augment) == (repeats, mixup, cutmix, smoothing, policy)

    root = write_solid_dataset(tmp_path / "data", per_class=6)  # 18 train images: one epoch of 2 steps
    small = [f"--set={key}={value}" for key, value in {
        "dataset.root": root, "backend": "torch", "output.device": "cpu", "workers.num_workers": 0,
        "train.batch_size": 8, "val.batch_size": 8, "train.transform.size": 32, "val.transform.size": 32}.items()]
    # in this process, as `python examples/train.py ...` would run (no torchrun: one process)
    monkeypatch.setattr(sys, "argv", ["train.py", str(path), *small, "--epochs", "1", "--log-every", "1"])
    with caplog.at_level(logging.INFO, logger="fastloader"):
        with pytest.raises(SystemExit) as stopped:  # train.py ends with sys.exit(main())
            runpy.run_path(str(REPO / "examples" / "train.py"), run_name="__main__")
    assert stopped.value.code == 0
    out = capsys.readouterr().out
    assert "targets: soft, float [B, num_classes]: soft-target cross entropy" in out
    losses = [float(x) for x in re.findall(r"epoch 0 step \d loss (\d+\.\d+)", out)]
    assert len(losses) == 2, out  # 18 positions with repeats (fewer than 256 samples) in batches of 8
    assert re.search(r"epoch 0 done: loss \d+\.\d+, val accuracy \d\.\d+ on 18 images", out)
    epoch_line = next(r.getMessage() for r in caplog.records if "split 'train', epoch 0, rank 0:" in r.getMessage())
    assert f"mixup {mixup:g} + cutmix {cutmix:g} (mode batch, prob 1, switch 0.5)" in epoch_line
    assert f"repeated augmentation x{repeats} (18 positions per epoch over 1 rank)" in epoch_line


SCHEDULE_RECIPES = {  # file: (train size, progressive (min, start, end) or None, val size, policy, smoothing, source)
    "ffcv-rn50.yaml": (192, (160, 65, 76), 256, None, 0.1, "libffcv/ffcv-imagenet"),
    "deit3.yaml": (192, None, 224, "three_augment", 0.0, "facebookresearch/deit"),
}


@pytest.mark.parametrize("recipe", SCHEDULE_RECIPES)
def test_a_size_recipe_names_its_source_and_trains_logging_the_size_per_epoch(tmp_path, recipe, monkeypatch, capsys):
    """ffcv-rn50 (progressive resolution) and deit3 (3-Augment, low-resolution training): their keys
    as the source sets them; examples/train.py runs 2 epochs of each, scaled down (the ramp moved to
    epochs 0-1, 16 to 32 px), and says each epoch's train size."""
    size, ramp, val_size, policy, smoothing, source = SCHEDULE_RECIPES[recipe]
    path = REPO / "configs" / "recipes" / recipe
    header = path.read_text().split("\nbackend:")[0]
    assert "Source:" in header and source in header
    config = load_config(path)
    train = config.split("train")
    progressive = train.transform.progressive
    assert train.transform.size == size and config.split("val").transform.size == val_size
    if ramp:
        assert (progressive.min_size, progressive.start_epoch, progressive.end_epoch) == ramp
    else:
        assert progressive is None
    assert train.transform.auto_augment == policy and train.label_smoothing == smoothing

    root = write_solid_dataset(tmp_path / "data", per_class=6)
    small = {"dataset.root": root, "backend": "torch", "output.device": "cpu", "workers.num_workers": 0,
             "train.batch_size": 8, "val.batch_size": 8, "train.transform.size": 32, "val.transform.size": 32,
             "train.aug_repeats": 1}
    if ramp:
        small.update({"train.transform.progressive.min_size": 16, "train.transform.progressive.start_epoch": 0,
                      "train.transform.progressive.end_epoch": 1, "train.transform.progressive.multiple": 16})
    argv = [f"--set={key}={value}" for key, value in small.items()]
    monkeypatch.setattr(sys, "argv", ["train.py", str(path), *argv, "--epochs", "2", "--log-every", "1"])
    with pytest.raises(SystemExit) as stopped:  # train.py ends with sys.exit(main())
        runpy.run_path(str(REPO / "examples" / "train.py"), run_name="__main__")
    assert stopped.value.code == 0
    out = capsys.readouterr().out
    sizes = [int(s) for s in re.findall(r"epoch \d done: .*train size (\d+) px", out)]
    assert sizes == ([16, 32] if ramp else [32, 32]), out


def test_the_dinov2_recipe_names_its_source_and_the_views_example_trains_on_it(monkeypatch, capsys):
    """configs/recipes/dinov2.yaml: DINOv2's crops and per-view ops as its source sets them;
    examples/views.py runs 2 DINO steps on it over the embedded demo (torch backend, CPU, batch 4)."""
    path = REPO / "configs" / "recipes" / "dinov2.yaml"
    header = path.read_text().split("\nbackend:")[0]
    assert "Source:" in header and "facebookresearch/dinov2" in header
    train = load_config(path).split("train")
    groups = {view.name: view for view in train.views}
    assert [(v.count, v.transform.size, v.transform.scale) for v in train.views] == [
        (1, 224, (0.32, 1.0)), (1, 224, (0.32, 1.0)), (8, 96, (0.05, 0.32))]
    assert [(v.transform.gaussian_blur_prob, v.transform.solarize_prob) for v in train.views] == [
        (1.0, 0.0), (0.1, 0.2), (0.5, 0.0)]
    assert all(v.transform.color_jitter == (0.4, 0.4, 0.2, 0.1) and v.transform.color_jitter_prob == 0.8
               and v.transform.grayscale_prob == 0.2 and v.transform.interpolation == "bicubic"
               and v.transform.hflip == 0.5 for v in groups.values())
    # --quick, the docs' way to see it work on a CPU: 4 images a batch (not the demo's 16), a small CNN
    args = ["views.py", "--quick", "--steps", "2", "--out-dim", "32", "--set", "backend=torch", "--set",
            "output.device=cpu", "--set", "workers.num_workers=0"]
    monkeypatch.setattr(sys, "argv", args)
    threads = torch.get_num_threads()
    try:
        with pytest.raises(SystemExit) as stopped:
            runpy.run_path(str(REPO / "examples" / "views.py"), run_name="__main__")
    finally:
        torch.set_num_threads(threads)  # --quick's one thread, not the rest of the session's
    assert stopped.value.code == 0
    out = capsys.readouterr().out
    losses = re.findall(r"step \d: loss (\d+\.\d+), 10 views of 4 images \(1x224px, 1x224px, 8x96px\)", out)
    assert len(losses) == 2 and all(float(loss) > 0 for loss in losses), out
