"""The torch backend against the contract: pixels, labels, orders, dtypes, layouts, epochs, edge cases."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import COLOURS, REPO, base_config, cpu_only_env, normalized, write_solid_dataset
from PIL import Image
from test_resume import BACKENDS

from fastloader import build_loader
from fastloader.errors import BadImageError


def collect(loader):
    images, labels = [], []
    for x, y in loader:
        images.append(x.float())
        labels.append(y)
    if not labels:
        return torch.empty(0), torch.empty(0, dtype=torch.int64)
    return torch.cat(images), torch.cat(labels)


def test_contract_attributes_shapes_and_exact_normalized_pixels(solid_root):
    with build_loader(base_config(solid_root), split="val") as loader:
        assert loader.backend == "torch" and loader.device == torch.device("cpu")
        assert (loader.batch_size, loader.num_samples, len(loader)) == (4, 15, 4)
        assert loader.classes == tuple(COLOURS)
        batches = list(loader)
    assert [tuple(x.shape) for x, _ in batches] == [(4, 3, 32, 32)] * 3 + [(3, 3, 32, 32)]
    for images, labels in batches:
        assert images.dtype == torch.float32 and labels.dtype == torch.int64
        for image, label in zip(images, labels):
            expected = normalized(COLOURS[loader.classes[label]])
            per_channel = image.mean(dim=(1, 2)).numpy()
            assert np.allclose(per_channel, expected, atol=1e-5), (per_channel, expected)
            assert float(image.std(dim=(1, 2)).max()) < 1e-5  # a solid colour stays solid


def test_eval_yields_each_sample_once_in_index_order_with_workers(solid_root):
    with build_loader(base_config(solid_root, workers={"num_workers": 2}), split="val") as loader:
        _, labels = collect(loader)
    assert labels.tolist() == [0] * 5 + [1] * 5 + [2] * 5


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_dtypes_and_channels_last_are_honoured(textured_root, dtype):
    reference = build_loader(base_config(textured_root), split="val")
    config = base_config(textured_root, output={"dtype": dtype, "channels_last": True})
    with build_loader(config, split="val") as loader, reference:
        for (x, _), (ref, _) in zip(loader, reference):
            assert x.dtype == getattr(torch, dtype)
            assert x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
            assert torch.allclose(x.float(), ref, atol=0.02 * ref.abs().max().item())
            assert ref.is_contiguous()


def test_same_seed_same_batches_other_epoch_other_order_and_crops(textured_root):
    config = base_config(textured_root)
    first, second = build_loader(config), build_loader(config)
    a0, la0 = collect(first)
    b0, lb0 = collect(second)
    assert torch.equal(a0, b0) and torch.equal(la0, lb0)
    a1, la1 = collect(first)  # a new loop is the next epoch
    assert not torch.equal(la0, la1)
    assert not torch.equal(a0, a1)
    second.set_epoch(1)
    b1, _ = collect(second)
    assert torch.equal(a1, b1)
    other_seed, _ = collect(build_loader({**config, "seed": 8}))
    assert not torch.equal(a0, other_seed)


def test_crops_do_not_depend_on_the_number_of_workers(textured_root):
    single, _ = collect(build_loader(base_config(textured_root, workers={"num_workers": 0})))
    with build_loader(base_config(textured_root, workers={"num_workers": 2})) as loader:
        multi, _ = collect(loader)
    assert torch.equal(single, multi)


def test_break_then_new_epoch_and_close(textured_root):
    loader = build_loader(base_config(textured_root, workers={"num_workers": 2}))
    for _ in loader:
        break
    assert sum(1 for _ in loader) == len(loader) == 6  # 24 samples // 4, the next epoch in full
    full_epoch_2 = collect(build_loader(base_config(textured_root), split="train"))
    loader.close()
    loader.close()  # idempotent
    with pytest.raises(RuntimeError, match="loader for split 'train' is closed; build a new one"):
        iter(loader)
    assert len(full_epoch_2[1]) == 24


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("backend", BACKENDS)
def test_next_on_a_loop_after_close_says_the_loader_is_closed(textured_root, backend, workers):
    """Device: CPU. The torch loader's loop used to say "a newer loop ... started" (DALI's: closed)."""
    loader = build_loader(base_config(textured_root, backend=backend, workers={"num_workers": workers}))
    batches = iter(loader)
    next(batches)
    loader.close()
    with pytest.raises(RuntimeError, match=rf"this {backend} loader for split 'train' is closed; build a new one"):
        next(batches)


def test_dataset_smaller_than_one_batch(solid_root, caplog):
    big_batch = {"batch_size": 64}
    with caplog.at_level(logging.WARNING, logger="fastloader"):
        dropping = build_loader(base_config(solid_root, train=big_batch))
    assert len(dropping) == 0 and list(dropping) == []
    assert any("yields no batch per epoch" in r.message and "train.drop_last: false" in r.message
               for r in caplog.records)
    keeping = build_loader(base_config(solid_root, train={**big_batch, "drop_last": False}))
    images, labels = collect(keeping)
    assert len(keeping) == 1 and images.shape == (15, 3, 32, 32)
    assert sorted(labels.tolist()) == [0] * 5 + [1] * 5 + [2] * 5


def test_train_crops_flip_rate_and_area_follow_the_config():
    from fastloader import load_config
    from fastloader.draws import Augmenter
    transform = load_config({"dataset": {"root": "x"}, "train": {"transform": {
        "scale": [0.25, 0.5], "hflip": 0.3}}}).split("train").transform
    seeds = np.arange(3000) * 7919
    draws = Augmenter(transform, (0.5, 0.5, 0.5)).draw(seeds, np.tile([[300, 400]], (3000, 1)))
    left, top, right, bottom = draws.crop.T
    w, h = right - left, bottom - top
    areas = w * h / (400 * 300)
    assert (0 <= left).all() and (left < right).all() and (right <= 400).all()
    assert (0 <= top).all() and (top < bottom).all() and (bottom <= 300).all()
    assert (0.74 <= w / h).all() and (w / h <= 1.34).all()
    assert 0.27 < draws.hflip.mean() < 0.33 and not draws.vflip.any()
    assert 0.24 <= areas.min() and areas.max() <= 0.51 and 0.35 < areas.mean() < 0.40


def test_eval_crop_matches_torchvision_resize_then_center_crop(tmp_path):
    import torchvision.transforms as T

    from fastloader import load_config
    from torch_loader.loader import sample_transform
    rng = np.random.default_rng(1)
    y, x = np.mgrid[0:375, 0:500]
    pixels = np.stack([x * 255 // 500, y * 255 // 375, (x + y) % 256], -1) + rng.integers(0, 20, (375, 500, 3))
    path = tmp_path / "photo.png"
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path)
    split = load_config({"dataset": {"root": "x"}, "val": {"transform": {"size": 224}}}).split("val")
    ours = sample_transform(split)(str(path), 0).permute(1, 2, 0).numpy().astype(float)
    theirs = np.asarray(T.Compose([T.Resize(256), T.CenterCrop(224)])(Image.open(path).convert("RGB"))).astype(float)
    assert ours.shape == theirs.shape == (224, 224, 3)
    assert np.abs(ours - theirs).mean() < 2.0  # one resize of the box vs. resize then crop


def test_jpeg_draft_decode_stays_close_to_a_full_decode(tmp_path):
    from fastloader import load_config
    from torch_loader.loader import sample_transform
    y, x = np.mgrid[0:1200, 0:1600]
    pixels = np.stack([x * 255 // 1600, y * 255 // 1200, ((x // 40 + y // 40) % 2) * 200], -1).astype(np.uint8)
    path = tmp_path / "big.jpg"
    Image.fromarray(pixels).save(path, quality=95)
    split = load_config({"dataset": {"root": "x"}, "val": {"transform": {"size": 224}}}).split("val")
    drafted = sample_transform(split, use_draft=True)(str(path), 0).float()
    full = sample_transform(split, use_draft=False)(str(path), 0).float()
    assert (drafted - full).abs().mean() < 3.0


@pytest.mark.parametrize("mode", ["L", "CMYK", "P", "RGBA", "I;16", "LA", "1"])
def test_any_image_mode_is_decoded_to_correct_rgb(tmp_path, mode):
    folder = tmp_path / "val" / "only"
    folder.mkdir(parents=True)
    colour = (60, 150, 210)
    base = Image.new("RGB", (40, 30), colour)
    if mode == "L":
        image, expected, name = base.convert("L"), (base.convert("L").getpixel((0, 0)),) * 3, "x.jpg"
    elif mode == "CMYK":
        image, expected, name = base.convert("CMYK"), colour, "x.jpg"
    elif mode == "P":
        image, expected, name = base.convert("P", palette=Image.Palette.ADAPTIVE), colour, "x.png"
    elif mode == "RGBA":
        image, expected, name = base.convert("RGBA"), colour, "x.png"
    elif mode == "LA":
        image, expected, name = base.convert("LA"), (base.convert("L").getpixel((0, 0)),) * 3, "x.png"
    elif mode == "1":
        image, expected, name = Image.new("1", (40, 30), 1), (255, 255, 255), "x.png"
    else:  # 16-bit greyscale: 0x8080 must become 128, not clip to white
        image = Image.fromarray(np.full((30, 40), 0x8080, dtype=np.uint16))
        expected, name = (128, 128, 128), "x.png"
    image.save(folder / name, quality=95) if name.endswith(".jpg") else image.save(folder / name)
    loader = build_loader(base_config(tmp_path), split="val")
    images, _ = collect(loader)
    pixel = images[0].mean(dim=(1, 2)).numpy()
    assert np.allclose(pixel, normalized(expected), atol=3 / 255 / 0.224), (mode, pixel, normalized(expected))


def test_exif_orientation_is_applied_unless_disabled(tmp_path):
    folder = tmp_path / "val" / "only"
    folder.mkdir(parents=True)
    pixels = np.zeros((40, 80, 3), dtype=np.uint8)
    pixels[:, :40] = (255, 0, 0)   # stored left half red
    pixels[:, 40:] = (0, 0, 255)   # stored right half blue
    image = Image.fromarray(pixels)
    exif = image.getexif()
    exif[0x0112] = 6  # displayed rotated 90 degrees clockwise: stored left becomes the top
    image.save(folder / "rotated.jpg", quality=95, exif=exif.tobytes())
    config = base_config(tmp_path, val={"transform": {"size": 32, "crop_pct": 1.0}})
    upright, _ = collect(build_loader(config, split="val"))
    red = normalized((255, 0, 0))[0]
    assert upright[0, 0, :8].mean() > red - 0.3 and upright[0, 0, -8:].mean() < 0  # red on top, not below
    config["dataset"]["exif_orientation"] = False
    stored, _ = collect(build_loader(config, split="val"))
    assert stored[0, 0, :, :8].mean() > red - 0.3 and stored[0, 0, :, -8:].mean() < 0  # red on the left


@pytest.mark.parametrize("workers", [0, 2])
def test_a_file_failing_in_a_worker_is_named_under_raise(tmp_path, workers):
    folder = tmp_path / "val" / "only"
    folder.mkdir(parents=True)
    (folder / "broken.jpg").write_bytes(b"this is not a jpeg")
    config = base_config(tmp_path, workers={"num_workers": workers}, dataset={"on_bad_image": "raise", "screen": False})
    with pytest.raises(BadImageError, match=r"cannot use image '.*broken.jpg': UnidentifiedImageError: .*"
                                            r"Set dataset.on_bad_image: skip"):
        list(build_loader(config, split="val"))


def test_builtin_demo_dataset_is_generated_on_first_use(caplog):
    with caplog.at_level(logging.WARNING, logger="fastloader"):
        loader = build_loader(REPO / "configs" / "sample.yaml", "val", {"workers.num_workers": 0})
    images, labels = collect(loader)
    assert loader.classes == ("circle", "cross", "square", "stripes", "triangle")
    assert images.shape == (60, 3, 128, 128) and labels.bincount().tolist() == [12] * 5
    assert loader.num_samples == 60


def test_resume_mid_epoch_yields_exactly_the_remaining_batches_then_the_next_epochs(textured_root):
    config = base_config(textured_root, workers={"num_workers": 2})
    with build_loader(config) as reference:
        epoch0 = [(x, y) for x, y in reference]
        epoch1 = [(x, y) for x, y in reference]
    with build_loader(config) as interrupted:
        for step, _ in enumerate(interrupted):
            if step == 2:
                state = interrupted.state_dict()
                break
    assert (state["epoch"], state["position"], state["version"]) == (0, 12, 1)  # 3 batches of 4 consumed
    state = json.loads(json.dumps(state))  # plain data: saveable as JSON or with torch.save
    with build_loader(config) as resumed:
        resumed.load_state_dict(state)
        rest = list(resumed)
        after = list(resumed)
    assert len(rest) == len(epoch0) - 3
    for (x, y), (rx, ry) in zip(epoch0[3:] + epoch1, rest + after):
        assert torch.equal(x, rx) and torch.equal(y, ry)


def test_resume_state_of_another_split_dataset_seed_or_order_is_refused(textured_root, solid_root):
    state = build_loader(base_config(textured_root)).state_dict()
    with pytest.raises(ValueError, match=r"saved for another dataset: 24 samples \(fingerprint \w+\) then, "
                                         r"15 samples \(fingerprint \w+\) in .*solid/train now"):
        build_loader(base_config(solid_root)).load_state_dict(state)
    os.rename(textured_root / "train" / "a_red" / "t_00.png", textured_root / "train" / "a_red" / "t_99.png")
    with pytest.raises(ValueError, match="files were added, removed or relabelled"):  # same count, other files
        build_loader(base_config(textured_root)).load_state_dict(state)
    os.rename(textured_root / "train" / "a_red" / "t_99.png", textured_root / "train" / "a_red" / "t_00.png")
    with pytest.raises(ValueError, match="names backend 'jax', not one of dali, torch"):
        build_loader(base_config(textured_root)).load_state_dict({**state, "backend": "jax"})
    with pytest.raises(ValueError, match="saved for split 'train', this loader reads split 'val'"):
        build_loader(base_config(textured_root), "val").load_state_dict(state)
    with pytest.raises(ValueError, match="saved with seed: 7, this loader has seed: 8"):
        build_loader(base_config(textured_root, seed=8)).load_state_dict(state)
    with pytest.raises(ValueError, match="saved with train.shuffle: True, this loader has train.shuffle: False"):
        build_loader(base_config(textured_root, train={"shuffle": False})).load_state_dict(state)
    with pytest.raises(ValueError, match="loader state version 0 is not 1"):
        build_loader(base_config(textured_root)).load_state_dict({**state, "version": 0})


def test_demo_dataset_generated_by_concurrent_processes_is_complete(tmp_path):
    import multiprocessing

    from fastloader.demo import generate_sample
    target = tmp_path / "sample"
    processes = [multiprocessing.get_context("fork").Process(target=generate_sample, args=(target,))
                 for _ in range(3)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(60)
    assert [p.exitcode for p in processes] == [0, 0, 0]
    assert len(list(target.glob("*/*/*.jpg"))) == 300 and (target / "COMPLETE").exists()
    assert not list(tmp_path.glob(".sample-*"))  # no temporary copy left behind


def test_one_worker_stream_across_epochs_yields_what_fresh_loaders_yield(textured_root):
    """The workers go on with the next epoch's first batches while a loop ends; whatever the next
    loop asks for (the next epoch, a set_epoch back, a resume, after a break), it gets exactly the
    batches a fresh loader gives, and the in-flight ones that it did not want are dropped."""
    config = base_config(textured_root, workers={"num_workers": 2, "prefetch_factor": 2})

    def fresh(epoch, state=None):
        with build_loader(config) as loader:
            loader.load_state_dict(state) if state else loader.set_epoch(epoch)
            return collect(loader)

    with build_loader(config) as loader:
        epoch0 = collect(loader)
        in_flight = list(loader._feed.sent)  # 4 batches: the next epoch's first ones
        assert len(in_flight) == 4 and all(np.array_equal(a, b) for a, b in zip(in_flight, loader.order.batches(1)))
        epoch1 = collect(loader)
        loader.set_epoch(0)
        again0 = collect(loader)
        for step, _ in enumerate(loader):  # epoch 1, left after two batches
            if step == 1:
                state = loader.state_dict()
                break
        epoch2 = collect(loader)  # a new loop after a break: the next epoch in full
        loader.load_state_dict(state)
        rest1 = collect(loader)
    for got, expected in ((epoch0, fresh(0)), (epoch1, fresh(1)), (again0, epoch0), (epoch2, fresh(2)),
                          (rest1, fresh(1, state))):
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert len(rest1[1]) == 24 - 2 * 4 and torch.equal(rest1[1], epoch1[1][8:])


def test_workers_reuse_dropped_batches_and_never_overwrite_kept_ones(textured_root):
    """CPU output: a worker writes into the shared memory of a batch the main process dropped, never
    into one the trainer still holds (every kept batch equals the single-process loader's)."""
    config = base_config(textured_root, workers={"num_workers": 2, "prefetch_factor": 2})
    with build_loader(base_config(textured_root)) as single:  # no workers: no shared buffers
        expected = [collect(single) for _ in range(3)]
    with build_loader(config) as loader:
        slots = []  # the buffers the workers wrote the batches into, as the main process receives them
        handed = loader._pool.batch
        loader._pool.batch = lambda slot, count, side=None: (slots.append(slot), handed(slot, count, side))[1]
        for _ in range(2):
            for images, labels in loader:  # each batch dropped at the next one
                pass
        # 12 batches, nearly all in the workers' own buffers (2 workers x 4), each reused once dropped
        assert 10 <= len(slots) <= 12 and len(set(slots)) <= 2 * 4 and len(set(slots)) < len(slots)
        loader.set_epoch(0)
        kept = [list(loader) for _ in range(3)]  # 18 batches held at once, then more loops run
        for _ in range(2):
            for images, labels in loader:
                pass
    for epoch, batches in enumerate(kept):
        assert torch.equal(torch.cat([x for x, _ in batches]), expected[epoch][0])
        assert torch.equal(torch.cat([y for _, y in batches]), expected[epoch][1])


def test_repr_names_backend_workers_device_samples_batches_and_pixels(solid_root):
    loader = build_loader(base_config(solid_root, output={"device": "cpu"}), "val")
    assert repr(loader) == ("TorchLoader(split='val', backend='torch', workers=0 (normalizing on the training thread), "
                            "device='cpu', size=32, samples=15, batches=4 of 4, rank=0/1, pixels from the image files)")
    assert loader.prefetch_depth == 0  # no workers: nothing is prepared ahead
    loader.close()
    assert repr(loader).endswith("pixels from the image files, closed)")


@pytest.mark.parametrize("dtype, channels_last", [("float32", False), ("bfloat16", False), ("float32", True)])
def test_normalizing_a_resized_hwc_image_into_its_batch_slot_is_exact(dtype, channels_last):
    """Resized crops arrive as HWC memory seen as [3, H, W]; the slot gets x * (1 / 255 std) - mean / std,
    bit for bit what the arithmetic on the planar float image gives, in every output format (CPU)."""
    from fastloader.config import load_config
    from torch_loader.loader import normalizer_of
    config = load_config({"dataset": {"root": "unused"}, "output": {"dtype": dtype, "channels_last": channels_last}})
    normalizer = normalizer_of(config, torch.device("cpu"))
    image = torch.randint(0, 256, (37, 53, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    image = image.permute(2, 0, 1)  # HWC memory, as the resize leaves it
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    batch = torch.empty((2, 3, 37, 53), dtype=getattr(torch, dtype)).contiguous(memory_format=memory_format)
    normalizer.into(batch[1], image)
    expected = image.contiguous().float().mul_(normalizer.scale).add_(normalizer.bias).to(batch.dtype)
    assert torch.equal(batch[1], expected)
    mean, std = torch.tensor(config.normalize.mean).view(3, 1, 1), torch.tensor(config.normalize.std).view(3, 1, 1)
    tolerance = 1e-2 if dtype != "float32" else 1e-5
    assert torch.allclose(batch[1].float(), (image.float() / 255 - mean) / std, atol=tolerance)


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "nearest"])
def test_resize_gives_torchvisions_pixels_and_memory_format(interpolation):
    """The transform calls torch's uint8 kernel itself; for any box of HWC memory, contiguous or a view,
    at any output size, it must give what torchvision's resize gives, bit for bit and stride for stride (CPU)."""
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2 import functional as F

    from torch_loader.transforms import resize_uint8
    mode = InterpolationMode(interpolation)
    generator = torch.Generator().manual_seed(1)
    compared = 0
    for _ in range(40):
        height, width = torch.randint(1, 160, (2,), generator=generator).tolist()
        image = torch.randint(0, 256, (height, width, 3), dtype=torch.uint8, generator=generator)
        top, left = (torch.randint(0, end, (), generator=generator).item() for end in (height, width))
        bottom = torch.randint(top + 1, height + 1, (), generator=generator).item()
        right = torch.randint(left + 1, width + 1, (), generator=generator).item()
        planar = image.permute(2, 0, 1).contiguous()
        for chw in (image[top:bottom, left:right].permute(2, 0, 1), image.permute(2, 0, 1),
                    image[top:bottom, left:right].contiguous().permute(2, 0, 1), planar[:, top:bottom, left:right]):
            for size in (1, 24, 64):
                expected = F.resize(chw, [size, size], interpolation=mode, antialias=interpolation != "nearest")
                resized = resize_uint8(chw, size, interpolation)
                assert torch.equal(resized, expected) and resized.stride() == expected.stride(), (chw.shape, size)
                compared += 1
    assert compared == 40 * 4 * 3



FRESH_PROCESS_READS = ("import json, sys\nimport fastloader\nconfig, splits = json.loads(sys.argv[1])\n"
                       "for split in splits:\n"
                       "    print(sum(len(labels) for _, labels in fastloader.build_loader(config, split=split)))\n"
                       "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torchvision')[:3])\n")
"""A script: the samples each split's loader gives, one line a split, then the torchvision modules
the process imported (the first three)."""


def read_in_a_fresh_process(config: dict, splits: tuple[str, ...], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", FRESH_PROCESS_READS, json.dumps([config, splits])],
                          capture_output=True, text=True, timeout=120, env=env)


def test_a_torch_loader_runs_without_importing_torchvision(tmp_path):
    """Importing torchvision takes about 2 s (its models and ops import torch._dynamo), a third of a
    CLI command's or a rank's start: a fresh process builds a torch loader, trains an epoch with
    colour jitter on 2 workers and evaluates, bicubic and bilinear, without it (CPU)."""
    root = write_solid_dataset(tmp_path / "data", per_class=2, fmt="JPEG")
    config = base_config(root, train={"batch_size": 4, "transform": {"size": 16, "interpolation": "bicubic",
                                                                     "color_jitter": 0.4}},
                         val={"batch_size": 4, "transform": {"size": 16, "interpolation": "bilinear"}},
                         workers={"num_workers": 2})
    run = read_in_a_fresh_process(config, ("train", "val"), cpu_only_env(tmp_path / "cache"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["4", "6", "[]"], run.stdout  # 6 images a split; train drops its short batch


def test_a_torchvision_that_does_not_import_stops_only_the_interpolations_that_need_it(tmp_path):
    """A real broken package: a `torchvision` folder first on sys.path whose import fails as a
    mismatched build's does. bicubic runs on torch's own kernel, without it; nearest resizes
    through torchvision, so the build stops naming the key and the fix, not each worker failing
    every file as undecodable (persistent workers: nothing is left for the exit to stop; CPU)."""
    shadow = tmp_path / "shadow" / "torchvision"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('libtorchvision.so: undefined symbol: _ZN3c10')\n")
    root = write_solid_dataset(tmp_path / "data", per_class=2, fmt="JPEG")
    env = cpu_only_env(tmp_path / "cache", PYTHONPATH=f"{shadow.parent}{os.pathsep}{REPO}")
    outcomes = {interpolation: read_in_a_fresh_process(
        base_config(root, val={"transform": {"size": 16, "interpolation": interpolation}},
                    workers={"num_workers": 2, "persistent": True}), ("val",), env)
        for interpolation in ("bicubic", "nearest")}
    assert outcomes["bicubic"].returncode == 0 and outcomes["bicubic"].stdout.split() == ["6", "[]"], \
        outcomes["bicubic"].stderr[-3000:]
    nearest = outcomes["nearest"]
    assert nearest.returncode == 1 and nearest.stdout == "", nearest.stdout
    assert ("ConfigError: val.transform.interpolation: nearest resizes through torchvision on this machine (torch "
            "has no uint8 kernel for it here), and torchvision does not import (libtorchvision.so: undefined symbol: "
            "_ZN3c10): reinstall it (pip install --force-reinstall torchvision), or set interpolation: bicubic"
            ) in nearest.stderr, nearest.stderr[-3000:]
    assert "skipped" not in nearest.stderr and "at exit failed" not in nearest.stderr, nearest.stderr[-3000:]


# -- the producer thread (torch_loader/ahead.py; issue 55) ------------------------------------------

def producers(split: str = "train") -> list:
    import threading
    return [t for t in threading.enumerate() if t.name == f"fastloader-torch-{split}" and t.is_alive()]


def test_a_loop_with_workers_is_made_on_one_producer_thread_that_ends_with_it(textured_root):
    """The trainer's thread only takes finished batches (device: CPU): one producer a loop, gone at
    the loop's end or when a newer loop starts after a `break`; the batches are those of the loader
    without a producer (no workers), in order."""
    config = base_config(textured_root, workers={"num_workers": 2})
    expected = [y for _, y in build_loader(base_config(textured_root), "train")]
    with build_loader(config, "train") as loader:
        labels, alive = [], []
        for images, batch_labels in loader:
            labels.append(batch_labels)
            alive.append(len(producers()))
        # alive until it has handed over the last batch: after that it may end before the trainer looks
        assert alive[:-1] == [1] * (len(alive) - 1) and alive[-1] in (0, 1) and len(alive) > 2
        assert [y.tolist() for y in labels] == [y.tolist() for y in expected]
        for thread in producers():
            thread.join(5)  # it puts the loop's end, then ends
        assert producers() == []
        for _ in loader:
            break
        first = next(iter(loader))  # the next loop: the epoch after, in full
        assert len(producers()) == 1 and len(first[1]) == 4
    assert producers() == []


@pytest.mark.parametrize("backend, workers", [("torch", 0), ("torch", 2), ("dali", 0)])
def test_a_paused_loop_resumed_after_a_newer_one_started_says_so(textured_root, backend, workers):
    """Two loops never read the workers' batches in turn (each would get the other's batches): the
    older one, resumed, raises an error that says what happened. DALI's ended silently, short of
    len(loader) batches (a callback's next(iter(loader)) during an epoch)."""
    config = base_config(textured_root, backend=backend, workers={"num_workers": workers})
    with build_loader(config, "val") as loader:
        older = iter(loader)
        next(older)
        newer = iter(loader)
        assert len(next(newer)[1]) == 4
        with pytest.raises(RuntimeError, match=f"a newer loop over the {backend} loader for split 'val' started while "
                                               f"this one was paused"):
            next(older)
        assert sum(len(y) for _, y in newer) + 4 == loader.num_samples  # the newer one goes on, whole
