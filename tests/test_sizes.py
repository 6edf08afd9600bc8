"""Size schedules (fastloader/resolution.py, issue 37): progressive resolution and a size per batch,
drawn on the main side from (seed, epoch, step), carried with each planned batch to both backends:
the same shapes per epoch and per batch on every rank and both backends, pixels within the backends'
tolerance, an exact replay after a resume inside a low-resolution epoch, and the keys' bad values
refused at load. Device: CPU (DALI's CPU flavour; the GPU flavour is the same graph, devices switched).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import base_config, write_textured_dataset

from fastloader import build_loader, load_config
from fastloader.errors import ConfigError
from fastloader.order import EpochOrder
from fastloader.resolution import Resolution, ramp_size

BACKENDS = ["torch", pytest.param("dali", marks=pytest.mark.skipif(
    __import__("importlib").util.find_spec("nvidia.dali") is None, reason="NVIDIA DALI is not installed"))]
PARITY_MEAN_BOUND, PARITY_IMAGE_BOUND = 0.05, 0.15
"""The backends' train parity (tests/test_dali.py): mean absolute difference, normalized units."""
RAMP = {"min_size": 16, "start_epoch": 0, "end_epoch": 2, "multiple": 8}
"""16 px in epoch 0, 24 in epoch 1, 32 from epoch 2 (transform.size 32)."""


def schedule(**keys) -> Resolution:
    transform = load_config({"dataset": {"root": "x"}, "train": {"transform": keys}}).split("train").transform
    return Resolution(transform, seed=7)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_textured_dataset(tmp_path_factory.mktemp("sizes") / "data", per_class=6)


def shapes(loader, epochs=range(3)) -> list[list[int]]:
    out = []
    for epoch in epochs:
        loader.set_epoch(epoch)
        out.append([images.shape[-1] for images, _ in loader])
    return out


# -- the schedule --------------------------------------------------------------------------------

def test_the_ramp_is_ffcvs_from_min_size_to_size_rounded_down_to_the_multiple():
    """FFCV's ResNet-50 (88 epochs): 160 px through epoch 65, 192 px from epoch 76, linear between,
    here rounded down to multiples of 32 (FFCV rounds to the nearest: docs/semantics.md)."""
    ffcv = [ramp_size(epoch, 160, 192, 65, 76, 32) for epoch in range(88)]
    assert ffcv[:66] == [160] * 66 and ffcv[76:] == [192] * 12 and set(ffcv) == {160, 192}
    assert ffcv.index(192) == 76  # rounded down: 192 is reached where the ramp ends
    fine = [ramp_size(epoch, 160, 224, 2, 10, 16) for epoch in range(12)]
    assert fine == [160, 160, 160, 160, 176, 176, 192, 192, 208, 208, 224, 224]
    assert all(b >= a for a, b in zip(fine, fine[1:])) and all(size % 16 == 0 for size in fine)


def test_a_size_per_batch_is_the_same_on_every_rank_and_after_a_resume():
    """The size of a global step is drawn once from (seed, epoch, step): every rank's batch j of an
    epoch has the same size (DDP shapes agree), a resume k steps in gets the sizes of steps k.., and
    every listed size occurs."""
    resolution = schedule(size=224, sizes=[160, 192, 224])
    orders = [EpochOrder(200, 4, mode="train", shuffle=True, drop_last=True, seed=7, rank=rank, world_size=4,
                         resolution=resolution) for rank in range(4)]
    per_rank = [[int(b[0, 2]) for b in order.batches(1)] for order in orders]
    assert all(sizes == per_rank[0] for sizes in per_rank) and set(per_rank[0]) == {160, 192, 224}
    assert all(len(set(b[:, 2].tolist())) == 1 for b in orders[1].batches(1))
    resumed = [int(b[0, 2]) for b in orders[2].batches(1, position=5 * 4 * 4)]
    assert resumed == per_rank[0][5:]
    assert [int(b[0, 2]) for b in orders[0].batches(2)] != per_rank[0]  # another epoch, other draws
    plain = EpochOrder(200, 4, mode="train", shuffle=True, drop_last=True, seed=7)
    assert plain.batches(3)[0].shape == (4, 2)  # no schedule: the batches are as they were


# -- both backends ---------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_each_epoch_and_each_batch_has_its_planned_size_on_either_backend(root, backend):
    """Progressive: every batch of an epoch at the epoch's size, loader.size and repr saying it; a
    size per batch: each batch at the size its plan carries. With workers (the torch backend's pool
    buffers sized for the largest, smaller batches in the front of them) and erasing + mixing,
    which work at every size; the DALI pipeline is the same object throughout (nothing rebuilt)."""
    workers = {"num_workers": 1}
    ramp = base_config(root, backend=backend, workers=workers, train={"transform": {"size": 32, "progressive": RAMP}})
    with build_loader(ramp, "train") as loader:
        assert shapes(loader) == [[16] * 4, [24] * 4, [32] * 4]
        loader.set_epoch(1)
        assert loader.size == 24 and "size=24" in repr(loader)
    mixed = {"size": 32, "sizes": [16, 24, 32], "erase_prob": 0.5}
    config = base_config(root, backend=backend, workers=workers,
                         train={"transform": mixed, "mixup": {"mixup_alpha": 0.8, "cutmix_alpha": 1.0}})
    with build_loader(config, "train") as loader:
        pipe = getattr(loader, "_pipe", None)
        planned = [[int(b[0, 2]) for b in loader.order.batches(epoch)] for epoch in range(3)]
        got = []
        for epoch in range(3):
            loader.set_epoch(epoch)
            for images, targets in loader:
                got.append(images.shape[-1])
                assert images.shape[-2] == images.shape[-1] and targets.shape == (4, 3)
                assert torch.allclose(targets.sum(dim=1), torch.ones(4))
        assert got == sum(planned, []) and len(set(got)) == 3
        assert getattr(loader, "_pipe", None) is pipe
        assert "sizes=(16, 24, 32)" in repr(loader) and loader.size == 32


def test_both_backends_give_the_same_pixels_at_every_size(root):
    """The same crops, flips and ops at each batch's size (the warps and TrivialAugment's whole-pixel
    translations use the batch's side): the backends' train parity at every size."""
    for transform in ({"sizes": [16, 24, 32]}, {"sizes": [16, 24, 32], "auto_augment": "rand-m9-mstd0.5-inc1"},
                      {"progressive": RAMP, "auto_augment": "ta_wide"}):
        config = base_config(root, train={"batch_size": 6, "transform": {"size": 32, **transform}})
        pytest.importorskip("nvidia.dali")
        out = {}
        for backend in ("torch", "dali"):
            with build_loader({**config, "backend": backend}, "train") as loader:
                out[backend] = shapes_and_images(loader, (0, 1))
        assert [x.shape for x in out["torch"]] == [x.shape for x in out["dali"]]
        per_image = torch.cat([(a - b).abs().mean(dim=(1, 2, 3)) for a, b in zip(out["torch"], out["dali"])])
        assert per_image.mean() < PARITY_MEAN_BOUND and per_image.max() < PARITY_IMAGE_BOUND, (transform, per_image)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("keys", [{"progressive": RAMP}, {"sizes": [16, 24, 32]}])
def test_a_resume_inside_a_low_resolution_epoch_replays_exactly(root, backend, keys):
    """Saved 2 batches into epoch 1 (24 px under the ramp), resumed in a new loader: the rest of
    epoch 1 and epoch 2 are the uninterrupted run's, pixel for pixel, shapes included."""
    config = base_config(root, backend=backend, train={"transform": {"size": 32, "auto_augment": "3a", **keys}})
    with build_loader(config, "train") as loader:
        reference = shapes_and_images(loader, (1, 2))
    with build_loader(config, "train") as loader:
        loader.set_epoch(1)
        for step, _ in enumerate(loader):
            if step == 1:
                state = loader.state_dict()
                break
    with build_loader(config, "train") as resumed:
        resumed.load_state_dict(state)
        assert resumed.size == (24 if "progressive" in keys else 32)
        rest = [x for x, _ in resumed]
        resumed.set_epoch(2)
        rest += [x for x, _ in resumed]
    assert [x.shape for x in rest] == [x.shape for x in reference[2:]]
    assert all(torch.equal(a, b) for a, b in zip(rest, reference[2:], strict=True))
    if "progressive" in keys:
        assert {x.shape[-1] for x in rest[:2]} == {24}


def shapes_and_images(loader, epochs) -> list[torch.Tensor]:
    out = []
    for epoch in epochs:
        loader.set_epoch(epoch)
        out += [x for x, _ in loader]
    return out


def test_a_state_saved_under_another_size_schedule_is_refused_naming_the_keys(root):
    config = base_config(root, train={"transform": {"size": 32, "progressive": RAMP}})
    with build_loader(config, "train") as loader:
        state = loader.state_dict()
    other = base_config(root, train={"transform": {"size": 32, "sizes": [16, 32]}})
    with build_loader(other, "train") as loader, pytest.raises(ValueError, match="size schedule.*set it back"):
        loader.load_state_dict(state)
    fixed = base_config(root, train={"transform": {"size": 24}})  # a fixed size may change: same samples
    with build_loader(fixed, "train") as loader:
        loader.load_state_dict({**state, "sizes": "size 32"})


def test_the_epoch_line_says_the_size(root, caplog):
    config = base_config(root, train={"transform": {"size": 32, "progressive": RAMP}})
    with build_loader(config, "train") as loader, caplog.at_level("INFO", logger="fastloader"):
        loader.set_epoch(1)
        list(loader)
    line = next(r.getMessage() for r in caplog.records if "split 'train', epoch 1" in r.getMessage())
    assert "size 24 px; progressive 16 px up to epoch 0, 32 px from epoch 2" in line


# -- bad input ------------------------------------------------------------------------------------

@pytest.mark.parametrize("transform, message", [
    ({"size": 160, "progressive": {"min_size": 192, "start_epoch": 0, "end_epoch": 5}},
     r"train.transform.progressive.min_size: 192 is above train.transform.size 160.*set min_size <= size"),
    ({"progressive": {"min_size": 160, "start_epoch": 8, "end_epoch": 8}},
     r"train.transform.progressive.end_epoch: 8 is not after start_epoch 8.*set end_epoch > start_epoch"),
    ({"progressive": {"min_size": 160, "end_epoch": 8}}, r"train.transform.progressive.start_epoch: missing"),
    ({"sizes": [160, 0, 224]}, r"train.transform.sizes: must be null or a list of 1 to 64 sizes"),
    ({"sizes": [160, 192.5]}, r"train.transform.sizes\[1\]: expected an integer"),
    ({"sizes": []}, r"train.transform.sizes: must be null or a list of 1 to 64 sizes"),
    ({"sizes": [160, 224], "progressive": {"min_size": 160, "start_epoch": 0, "end_epoch": 4}},
     r"train.transform.sizes: a size per batch and train.transform.progressive are two schedules.*keep one"),
])
def test_a_bad_size_schedule_fails_at_load_naming_the_key_and_the_fix(transform, message):
    with pytest.raises(ConfigError, match=message):
        load_config({"dataset": {"root": "x"}, "train": {"transform": transform}})


def test_size_schedules_are_train_keys():
    with pytest.raises(ConfigError, match="val.transform.sizes: applies only to train mode"):
        load_config({"dataset": {"root": "x"}, "val": {"transform": {"sizes": [160, 224]}}})


def test_every_batch_has_one_size_so_every_mixing_mode_has_equal_shapes(root):
    """Mixing pairs samples within a batch, and a batch has one size: elem and pair modes too."""
    for mode in ("elem", "pair"):
        config = base_config(root, train={"transform": {"size": 32, "sizes": [16, 32]},
                                          "mixup": {"mixup_alpha": 1.0, "cutmix_alpha": 1.0, "mode": mode}})
        with build_loader(config, "train") as loader:
            assert all(x.shape[1:] == (3, x.shape[-1], x.shape[-1]) for x, _ in loader)


def test_resolution_describes_itself():
    assert schedule(size=32).fixed and schedule(size=32).largest == 32
    sizes = schedule(size=224, sizes=[128, 160])
    assert sizes.per_batch and sizes.largest == 160 and sizes.key() == "sizes 128,160"
    assert np.array_equal(sizes.step_sizes(0, np.arange(4)), sizes.step_sizes(0, np.arange(4)))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("backend", BACKENDS)
def test_on_the_gpu_each_batch_has_its_size_and_the_dali_graph_is_not_rebuilt(root, backend):
    """The GPU flavour (DALI: the same graph, mixed decoders and GPU ops fed `out_size` as a CPU
    argument input; torch: fresh uint8 batches through the CUDA prefetcher, finished on its stream)."""
    config = base_config(root, backend=backend, output={"device": "cuda"},
                         train={"transform": {"size": 32, "sizes": [16, 24, 32], "auto_augment": "3a"},
                                "mixup": {"mixup_alpha": 0.8, "cutmix_alpha": 1.0}})
    with build_loader(config, "train") as loader:
        pipe = getattr(loader, "_pipe", None)
        planned = [int(b[0, 2]) for b in loader.order.batches(0)]
        got = [images.shape[-1] for images, _ in loader]
        assert got == planned and all(images.is_cuda for images, _ in loader)
        assert getattr(loader, "_pipe", None) is pipe


def test_show_takes_samples_across_batches_of_different_sizes(root):
    """`fastloader show` joins the first samples of several batches: with a size per batch, the
    smaller ones are shown at the largest size (nearest), not refused by torch.cat."""
    from fastloader.commands.show import first_samples
    config = base_config(root, train={"batch_size": 2, "transform": {"size": 32, "sizes": [16, 32]}})
    with build_loader(config, "train") as loader:
        assert len({int(b[0, 2]) for b in loader.order.batches(0)[:6]}) == 2
        images, labels = first_samples(loader, 12)
    assert images.shape == (12, 3, 32, 32) and len(labels) == 12


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_uint8_cache_gives_each_batch_its_planned_size(root, tmp_path, backend):
    """Crops from the cache's stored images (the DALI pixel graph, the torch workers' from_pixels)
    at each batch's size, with the same samples as from the files."""
    from fastloader.cache_write import build_split_cache
    from fastloader.sources.formats import build_index
    plain = load_config(base_config(root))
    build_split_cache(plain, plain.split("train"), build_index(plain, plain.split("train")), str(tmp_path / "cache"),
                      40, workers=1)
    config = base_config(root, backend=backend, train={"transform": {"size": 32, "sizes": [16, 24, 32]}})
    cached = {**config, "dataset": {**config["dataset"], "cache": str(tmp_path / "cache")}}
    with build_loader(cached, "train") as loader, build_loader(config, "train") as files:
        assert loader.pixels_from != files.pixels_from
        got = [(x.shape[-1], y.tolist()) for x, y in loader]
        assert got == [(x.shape[-1], y.tolist()) for x, y in files]
        assert len({side for side, _ in got}) > 1
