"""The DALI backend in its CPU flavour (what runs without a GPU), held to the torch backend's contract."""
from __future__ import annotations

import collections
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is installed on Linux x86_64 / aarch64 only")

from conftest import (  # noqa: E402
    COLOURS,
    REPO,
    base_config,
    crop_extent,
    normalized,
    write_gradient_dataset,
    write_textured_dataset,
)
from test_packaging import HIDE_DALI  # noqa: E402

from fastloader import build_loader  # noqa: E402
from fastloader.errors import BadImageError, ConfigError, LoaderError  # noqa: E402

# Mean absolute difference (normalized units) between the backends on the same eval images, bilinear.
# Measured: mean 0.032 (worst image 0.038) on the textured images below and mean 0.032 (worst 0.101)
# on ../shared/data/realphotos. The torch backend resizes the centre box rounded to whole pixels;
# DALI resizes the exact fractional box, within 0.003 of torchvision's Resize + CenterCrop.
PARITY_MEAN_BOUND = 0.05
PARITY_IMAGE_BOUND = 0.15


def both(config: dict, split: str = "val"):
    """The same config on each backend: (torch loader, dali loader)."""
    return (build_loader({**config, "backend": "torch"}, split), build_loader({**config, "backend": "dali"}, split))


def epoch(loader) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    batches = list(loader)
    return torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches]), [len(y) for _, y in batches]


def test_eval_matches_the_torch_backend_sample_for_sample(textured_root):
    config = base_config(textured_root, val={"batch_size": 7, "transform": {"size": 40}})
    torch_loader, dali_loader = both(config)
    assert dali_loader.backend == "dali" and dali_loader.flavour == "cpu" and dali_loader.device.type == "cpu"
    assert len(dali_loader) == len(torch_loader) == 4 and dali_loader.num_samples == 24
    x_torch, y_torch, sizes_torch = epoch(torch_loader)
    x_dali, y_dali, sizes_dali = epoch(dali_loader)
    assert sizes_dali == sizes_torch == [7, 7, 7, 3]  # eval: partial last batch, nothing repeated
    assert y_dali.dtype == torch.int64 and torch.equal(y_dali, y_torch)
    assert x_dali.shape == x_torch.shape == (24, 3, 40, 40) and x_dali.dtype == torch.float32
    per_image = (x_dali - x_torch).abs().mean(dim=(1, 2, 3))
    assert per_image.mean() < PARITY_MEAN_BOUND and per_image.max() < PARITY_IMAGE_BOUND, per_image


@pytest.mark.parametrize("split", ["train", "val"])
def test_solid_colours_come_out_normalized_exactly(solid_root, split):
    loader = build_loader(base_config(solid_root, backend="dali"), split)
    for images, labels in loader:
        for image, label in zip(images, labels):
            expected = torch.tensor(normalized(list(COLOURS.values())[int(label)]), dtype=torch.float32)
            assert torch.allclose(image.mean(dim=(1, 2)), expected, atol=0.02), (image.mean(dim=(1, 2)), expected)
            assert float(image.std(dim=(1, 2)).max()) < 0.02


@pytest.mark.parametrize("dtype,channels_last", [("float16", False), ("bfloat16", True), ("float32", True)])
def test_output_dtype_and_memory_format(textured_root, dtype, channels_last):
    config = base_config(textured_root, backend="dali")
    reference, _, _ = epoch(build_loader(config, "val"))
    loader = build_loader(base_config(textured_root, backend="dali",
                                      output={"dtype": dtype, "channels_last": channels_last}), "val")
    images, labels = next(iter(loader))
    assert images.dtype == getattr(torch, dtype) and images.shape == (4, 3, 32, 32)
    assert images.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    assert torch.allclose(images.float(), reference[:4], atol=0.05)


def test_train_order_is_the_shared_samplers(textured_root):
    config = base_config(textured_root, train={"batch_size": 5})
    torch_loader, dali_loader = both(config, "train")
    assert len(dali_loader) == len(torch_loader) == 4  # 24 samples, drop_last
    orders = []
    for _ in range(2):
        _, y_torch, _ = epoch(torch_loader)
        _, y_dali, sizes = epoch(dali_loader)
        assert torch.equal(y_dali, y_torch) and sizes == [5] * 4
        orders.append(y_dali)
    assert not torch.equal(orders[0], orders[1])  # a new permutation each epoch


def test_train_crops_flips_and_ops_replay_on_resume_and_after_skipping_epochs(textured_root):
    """DALI draws nothing: every random choice comes from the samples' seeds through the feed, so
    a loader that skips to an epoch, or resumes mid-epoch, gives the uninterrupted run's pixels."""
    config = base_config(textured_root, backend="dali", train={
        "batch_size": 6, "transform": {"size": 32, "auto_augment": "rand-m9-mstd0.5-inc1", "vflip": 0.3}})
    with build_loader({**config, "dali": {"threads": 1}}) as loader:
        two_epochs = [x for _ in range(2) for x, _ in loader]
    with build_loader({**config, "dali": {"threads": 2}}) as loader:
        loader.set_epoch(1)
        skipped_to = [x for x, _ in loader]
    assert all(torch.equal(a, b) for a, b in zip(skipped_to, two_epochs[4:], strict=True))
    with build_loader(config) as loader:
        for step, _ in enumerate(loader):
            if step == 1:
                state = loader.state_dict()
                break
    with build_loader(config) as loader:
        loader.load_state_dict(state)
        rest = [x for x, _ in loader]
    assert all(torch.equal(a, b) for a, b in zip(rest, two_epochs[2:4], strict=True))


def test_train_pixels_match_the_torch_backend_sample_for_sample(textured_root):
    """The same crop box, flips and ops reach both backends (fastloader.augment's draws): their train
    batches differ only as their resize and op implementations do (docs/semantics.md)."""
    for transform in ({}, {"auto_augment": "rand-m9-mstd0.5-inc1", "vflip": 0.5}, {"color_jitter": 0.4}):
        config = base_config(textured_root, train={"batch_size": 6, "transform": {"size": 32, **transform}})
        torch_loader, dali_loader = both(config, "train")
        x_torch, y_torch, _ = epoch(torch_loader)
        x_dali, y_dali, _ = epoch(dali_loader)
        per_image = (x_torch - x_dali).abs().mean(dim=(1, 2, 3))
        assert torch.equal(y_torch, y_dali)
        assert per_image.mean() < PARITY_MEAN_BOUND and per_image.max() < PARITY_IMAGE_BOUND, (transform, per_image)


@pytest.mark.parametrize("backend", ["torch", "dali"])
def test_train_crops_follow_scale_ratio_and_flip_probability(tmp_path, backend):
    root = write_gradient_dataset(tmp_path / "gradient", per_class=200)
    config = base_config(root, backend=backend,
                         train={"batch_size": 50, "transform": {"size": 64, "scale": [0.25, 0.5], "hflip": 0.3}})
    config.pop("val")
    crops = np.array([crop_extent(image) for images, _ in build_loader(config, "train") for image in images])
    area, aspect, flipped = crops[:, 0], crops[:, 1], crops[:, 2]
    assert len(crops) == 400
    # measured on both backends: areas 0.252-0.501, aspects 0.750-1.336 (box edges blur by < 1 px)
    assert 0.24 < area.min() < 0.28 and 0.47 < area.max() < 0.51, (area.min(), area.max())
    assert 0.74 < aspect.min() < 0.8 and 1.28 < aspect.max() < 1.345, (aspect.min(), aspect.max())
    assert abs(flipped.mean() - 0.3) < 0.07, flipped.mean()


def test_a_loop_left_with_break_does_not_disturb_the_next(textured_root):
    config = base_config(textured_root, backend="dali")
    reference = build_loader(config, "val")
    expected, labels, _ = epoch(reference)
    loader = build_loader(config, "val")
    for step, _ in enumerate(loader):
        if step == 1:
            break
    images, again, _ = epoch(loader)  # the next epoch (same order in eval), complete
    assert torch.equal(again, labels) and torch.equal(images, expected)
    abandoned = iter(loader)
    next(abandoned)
    images, _, _ = epoch(loader)  # a new loop takes the pipeline over from a still-referenced one
    assert torch.equal(images, expected)
    with pytest.raises(RuntimeError, match="a newer loop over the dali loader for split 'val' started while this one "
                                           "was paused"):
        next(abandoned)  # it ended silently, short of len(loader) batches; the torch backend said so


def test_batches_stay_valid_while_the_trainer_holds_them(textured_root):
    loader = build_loader(base_config(textured_root, backend="dali"), "val")
    held = list(loader) + list(loader)  # DALI's buffers must not be reused under these tensors
    copies = [x.clone() for x, _ in build_loader(base_config(textured_root, backend="dali"), "val")]
    for (images, _), copy in zip(held, copies + copies):
        assert torch.equal(images, copy)


def test_resume_mid_epoch_yields_exactly_the_remaining_batches(textured_root):
    config = base_config(textured_root, backend="dali", val={"batch_size": 5})
    reference = [x for x, _ in build_loader(config, "val")]
    loader = build_loader(config, "val")
    for step, _ in enumerate(loader):
        if step == 1:
            state = loader.state_dict()
            break
    assert state["backend"] == "dali" and state["position"] == 10
    resumed = build_loader(config, "val")
    resumed.load_state_dict(state)
    rest = [x for x, _ in resumed]
    assert len(rest) == len(reference) - 2 and all(torch.equal(a, b) for a, b in zip(rest, reference[2:]))
    on_torch = build_loader({**config, "backend": "torch"}, "val")  # the other backend: the same batches
    on_torch.load_state_dict(state)
    rest_torch = [x for x, _ in on_torch]
    assert len(rest_torch) == len(rest)
    assert all((a - b).abs().mean() < PARITY_MEAN_BOUND for a, b in zip(rest, rest_torch))


def test_eval_shards_cover_every_sample_once_across_ranks(textured_root):
    seen = []
    for rank in range(3):
        config = base_config(textured_root, distributed={"rank": rank, "world_size": 3},
                             val={"batch_size": 3})
        torch_loader, dali_loader = both(config)
        _, y_torch, _ = epoch(torch_loader)
        _, y_dali, _ = epoch(dali_loader)
        assert torch.equal(y_dali, y_torch) and len(dali_loader) == 3
        seen.append(len(y_dali))
    assert sum(seen) == 24


def test_close_frees_the_pipeline(textured_root):
    with build_loader(base_config(textured_root, backend="dali"), "val") as loader:
        next(iter(loader))
    assert loader._pipeline.pipe is None
    with pytest.raises(LoaderError, match="dali loader for split 'val' is closed"):
        next(iter(loader))


def test_random_erasing_draws_the_same_boxes_on_both_backends(solid_root):
    config = base_config(solid_root, train={"batch_size": 5, "transform": {"erase_prob": 1.0, "hflip": 0.0}})
    torch_loader, dali_loader = both(config, "train")
    for (x_torch, y_torch), (x_dali, y_dali) in zip(torch_loader, dali_loader):
        assert torch.equal(y_torch, y_dali)
        erased_torch, erased_dali = (x_torch == 0).all(dim=1), (x_dali == 0).all(dim=1)
        assert torch.equal(erased_torch, erased_dali)
        fractions = erased_dali.float().mean(dim=(1, 2))
        assert ((fractions > 0.01) & (fractions < 0.36)).all(), fractions


def cpu_flavour_record(root, output_device: str, caplog):
    """backend: dali with this output.device: the loader, and the one log record of its CPU flavour."""
    with caplog.at_level(logging.INFO, logger="fastloader"):
        loader = build_loader(base_config(root, backend="dali", output={"device": output_device}), "val")
    assert loader.backend == "dali" and loader.flavour == "cpu"
    [record] = [r for r in caplog.records if "so DALI runs its CPU flavour" in r.message]
    return loader, record


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_backend_dali_without_a_gpu_runs_the_cpu_flavour_and_warns_once_a_process(solid_root, caplog, monkeypatch):
    """A WARNING for the first loader; the next one (the val split's, a notebook's next run) says the
    same at INFO: it repeated for every loader built."""
    import fastloader.factory

    monkeypatch.setattr(fastloader.factory, "_SAID", set())
    loader, record = cpu_flavour_record(solid_root, "auto", caplog)
    assert record.levelno == logging.WARNING and "no CUDA GPU is available" in record.message
    assert "flavour='cpu'" in repr(loader) and "threads=1" in repr(loader)
    caplog.clear()
    _, again = cpu_flavour_record(solid_root, "auto", caplog)
    assert again.levelno == logging.INFO and again.message == record.message


def test_backend_dali_with_output_on_the_cpu_runs_the_cpu_flavour_as_asked(solid_root, caplog):
    _, record = cpu_flavour_record(solid_root, "cpu", caplog)
    assert record.levelno == logging.INFO and "output.device: cpu (<dict>)" in record.message


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto picks DALI where a GPU is present")
def test_auto_without_a_gpu_picks_torch_and_says_why(solid_root, caplog):
    with caplog.at_level(logging.INFO, logger="fastloader"):
        loader = build_loader(base_config(solid_root, backend="auto"), "val")
    assert loader.backend == "torch" and "backend: auto and no CUDA GPU is available" in caplog.text


def test_backend_dali_where_dali_is_missing_says_how_to_install_it(solid_root):
    script = HIDE_DALI + textwrap.dedent(f"""
        import fastloader
        try:
            fastloader.build_loader({base_config(solid_root, backend='dali')!r}, "val")
        except fastloader.config.ConfigError as error:
            print(error)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert "backend: dali (from <dict>), but NVIDIA DALI does not import: No module named 'nvidia'" in result.stdout
    assert "pip install nvidia-dali-cuda130" in result.stdout and "or set backend: torch" in result.stdout


def test_config_errors_reach_the_dali_backend_unchanged(solid_root):
    with pytest.raises(ConfigError, match="val.transform.erase_prob: applies only to train mode"):
        build_loader(base_config(solid_root, backend="dali", val={"transform": {"erase_prob": 0.5}}), "val")


def test_a_file_gone_after_indexing_stops_the_run_naming_it_under_raise(textured_root):
    loader = build_loader(base_config(textured_root, backend="dali", dataset={"on_bad_image": "raise"}), "val")
    gone = loader.index.path(9)  # in the third batch of 4
    os.remove(gone)
    delivered = []
    with pytest.raises(BadImageError) as failure:
        for _, labels in loader:
            delivered.append(len(labels))
    message = str(failure.value)
    assert delivered == [4, 4] and f"cannot use image {gone!r}: missing (no such file)" in message
    assert "dataset.on_bad_image: skip" in message
    with pytest.raises(RuntimeError, match="cannot use image"):  # the pipeline is gone for good
        next(iter(loader))


def test_a_file_gone_after_indexing_is_skipped_and_the_pipeline_rebuilt(textured_root):
    loader = build_loader(base_config(textured_root, backend="dali"), "val")
    gone = loader.index.path(9)
    os.remove(gone)
    for epoch in range(2):
        labels = [label for _, batch in loader for label in batch.tolist()]
        expected = [loader.index.label(i) for i in range(len(loader.index)) if i != 9]
        assert labels == expected, epoch
    assert loader.bad_samples == [(gone, "missing (no such file)")]


def test_after_a_decode_failure_the_new_pipeline_is_fed_from_memory_the_failed_one_never_had(tmp_path):
    """Device: CPU. A file that passes the feed's checks and that DALI cannot decode (a lossless JPEG)
    fails the pipeline, which is rebuilt without it. DALI reads the fed bytes in place, and the failed
    pipeline's threads may still read its batches while it goes: the new pipeline's batches are read
    into new arenas, never into those the failed one was given; the epoch is every other sample."""
    from oddfiles import ODD_FILES
    root = write_textured_dataset(tmp_path / "d", per_class=4, splits=("val",))
    loader = build_loader(base_config(root, backend="dali", val={"batch_size": 2}), "val")
    broken = int(loader.order.batches(0)[2][0, 0])
    next(odd for odd in ODD_FILES if odd.name == "lossless.JPEG").write(Path(loader.index.path(broken)))
    given = list(loader._feed.arenas)
    labels = [label for _, batch in loader for label in batch.tolist()]
    assert labels == [loader.index.label(i) for i in range(len(loader.index)) if i != broken]
    assert broken in loader._reader.bad
    assert not {id(arena) for arena in given} & {id(arena) for arena in loader._feed.arenas}
    loader.close()


@pytest.mark.parametrize("processes", [0, 2])
def test_a_file_shrunk_after_screening_is_named_and_cropped_for_its_size_now(textured_root, caplog, processes):
    """Device: CPU. A file rewritten smaller after it was screened would get a crop beyond its new
    bounds from the screened size. The feed reads each file's size from the bytes it feeds, names
    the file, and draws its crop for the size it has: the epoch loses nothing, and gives the pixels
    a loader without screening gives; alike where worker processes read the files (dali.feed_processes)."""
    from PIL import Image
    config = base_config(textured_root, backend="dali", train={"batch_size": 4, "transform": {"size": 16}},
                         dali={"feed_processes": processes})
    with caplog.at_level(logging.INFO, logger="fastloader"), build_loader(config) as loader:  # screened now
        for path in sorted((textured_root / "train").rglob("*.png")):  # every file: one crop surely falls out
            Image.open(path).resize((9, 7)).save(path)
        images, labels, _ = epoch(loader)
    assert "changed since it was screened: it is 7x9 (height x width) now, the screening result said" in caplog.text
    assert "the DALI pipeline failed" not in caplog.text
    fresh = {**config, "dataset": {**config["dataset"], "screen": False}}
    with build_loader(fresh) as loader:
        reference, reference_labels, _ = epoch(loader)
    assert torch.equal(labels, reference_labels) and len(labels) == 24
    assert torch.equal(images, reference)


# -- the feed's reused memory (issue 42) ----------------------------------------------------------


def _spans(arrays) -> list[tuple[int, int]]:
    """(first, past-the-last) addresses of each array's memory."""
    return [(array.ctypes.data, array.ctypes.data + array.nbytes) for array in arrays]


@pytest.mark.parametrize("prefetch", [1, 3])
def test_the_feed_hands_dali_each_files_own_bytes_in_memory_no_batch_in_flight_holds(tmp_path, prefetch):
    """Device: CPU. DALI reads the feed's arrays in place (no_copy) until a batch's outputs are out,
    `workers.prefetch_factor` calls later. Every call returns each planned file's bytes, exactly,
    batch after batch, read into reused arenas (one chunk each, no fresh buffer per sample; a file
    larger than a quarter chunk in memory of its own), and never into memory that one of the
    `prefetch` batches fed before it still holds; a whole epoch through DALI gives the pixels of
    an epoch read into fresh buffers."""
    from PIL import Image

    from fastloader.locations import ReadArena
    root = write_textured_dataset(tmp_path / "d", per_class=6, splits=("val",))
    big = root / "val" / sorted(p.name for p in (root / "val").iterdir())[0] / "big.png"
    noise = np.random.default_rng(1).integers(0, 256, (1200, 1100, 3), dtype=np.uint8)  # > CHUNK / 4
    Image.fromarray(noise).save(big)
    assert big.stat().st_size > ReadArena.CHUNK // 4
    config = base_config(root, backend="dali", val={"batch_size": 2, "transform": {"size": 32}},
                         workers={"prefetch_factor": prefetch})
    with build_loader(config, "val") as loader:
        feed = loader._feed
        feed.start(loader.order.batches(0))
        fed, spans = [], []
        while True:
            try:
                data = feed()
            except StopIteration:
                break
            for earlier in spans[-prefetch:]:  # the batches DALI may still be reading
                assert not any(a < d and c < b for a, b in _spans(data[0]) for c, d in earlier)
            spans.append(_spans(data[0]))
            fed.append([bytes(array) for array in data[0]])
        assert len(fed) > prefetch + 2
        assert len(feed.arenas) == prefetch + 1 and all(len(arena.chunks) == 1 for arena in feed.arenas)
        assert len({first for batch in spans for first, _ in batch[:1]}) <= prefetch + 2  # reused, not fresh
        planned = [int(sample) for batch in loader.order.batches(0) for sample in batch[:, 0]]
        expected = [open(loader.index.path(sample), "rb").read() for sample in planned]
        assert [data for batch in fed for data in batch] == expected
        reused = torch.cat([x for x, _ in loader])
    fresh = build_loader(config, "val")
    fresh._feed.arenas = collections.deque([type("Fresh", (), {
        "reset": lambda self: None, "view": lambda self, size: memoryview(bytearray(size))})()])
    assert torch.equal(torch.cat([x for x, _ in fresh]), reused)
    fresh.close()
