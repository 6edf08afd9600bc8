"""Bad input on both backends: odd files decode to correct RGB, broken ones are skipped (listed with
their reason) or stop the run naming them, never a crash from inside a loader or a hang."""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DEVICES, REALPHOTOS, base_config, write_solid_dataset
from oddfiles import BROKEN, DECODABLE, ODD_FILES, Odd, running_as_root, write_odd_files
from PIL import Image

from fastloader import build_loader
from fastloader.errors import BadImageError

BACKENDS = ["torch", "dali"]
SKIP_AS_ROOT = "root reads a file whatever its permissions"


def one_per_class(root: Path, odd: list[Odd], good: int = 2) -> Path:
    """root/val/<name>/<file>: every file its own class, so each delivered label names its file.
    Good files are photos-like JPEGs (noise) in classes good_00 ..., sorted before the odd ones."""
    rng = np.random.default_rng(0)
    for i in range(good):
        folder = root / "val" / f"good_{i:02d}"
        folder.mkdir(parents=True)
        Image.fromarray(rng.integers(0, 255, (60, 80, 3), dtype=np.uint8)).save(folder / "photo.JPEG", quality=90)
    for item in odd:
        write_odd_files(root / "val" / f"odd_{item.name}", only=(item.name,))
    return root


def delivered(loader) -> tuple[list[int], dict[int, torch.Tensor]]:
    """Labels of one epoch, in order, and one image per label."""
    labels, images = [], {}
    for batch, batch_labels in loader:
        for image, label in zip(batch, batch_labels.tolist()):
            labels.append(label)
            images[label] = image.float().cpu()
    return labels, images


def centre_colour(image: torch.Tensor) -> np.ndarray:
    """The RGB (0..255) at the centre of a normalized [3, H, W] image."""
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    h, w = image.shape[1:]
    return (image[:, h // 2, w // 2].numpy() * std + mean) * 255


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("odd", ODD_FILES, ids=[o.name for o in ODD_FILES])
def test_each_odd_file_is_decoded_to_rgb_or_skipped_with_its_reason(tmp_path, backend, odd):
    if odd.name == "unreadable.JPEG" and running_as_root():
        pytest.skip(SKIP_AS_ROOT)
    root = one_per_class(tmp_path / "data", [odd])
    loader = build_loader(base_config(root, backend=backend), "val")
    label = loader.classes.index(f"odd_{odd.name}")
    path = str(root / "val" / f"odd_{odd.name}" / odd.name)
    if odd.name == "deleted_later.JPEG":
        os.remove(path)
    labels, images = delivered(loader)
    if odd.colour is not None or odd.name == "garbage_scan.JPEG":
        assert sorted(labels) == [0, 1, label] and loader.bad_samples == []
        if odd.colour is not None:
            assert np.abs(centre_colour(images[label]) - odd.colour).max() <= 6, odd.name
    else:
        assert sorted(labels) == [0, 1]
        assert [p for p, _ in loader.bad_samples] == [path]
        assert re.search(odd.reason, loader.bad_samples[0][1].lower()), loader.bad_samples


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_file_failing_only_at_decode_time_stops_the_run_naming_it_under_raise(tmp_path, backend):
    lossless = next(o for o in ODD_FILES if o.name == "lossless.JPEG")  # passes the header check
    root = one_per_class(tmp_path / "data", [lossless])
    loader = build_loader(base_config(root, backend=backend, dataset={"on_bad_image": "raise"}), "val")
    with pytest.raises(BadImageError, match=r"cannot use image '.*odd_lossless.JPEG/lossless.JPEG': .*"
                                            r"Set dataset.on_bad_image: skip"):
        delivered(loader)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bombs_are_refused_from_the_header_at_the_configured_limit(tmp_path, backend):
    root = one_per_class(tmp_path / "data", [], good=3)  # 80 x 60 = 4800 pixels each
    Image.new("RGB", (40, 30)).save(root / "val" / "good_01" / "photo.JPEG")  # 1200 pixels
    loader = build_loader(base_config(root, backend=backend, dataset={"max_pixels": 2000}), "val")
    labels, _ = delivered(loader)
    assert labels == [1]
    assert [reason for _, reason in loader.bad_samples] == ["decompression bomb: 80x60 = 4,800 pixels, above "
                                                             "dataset.max_pixels (2,000)"] * 2


def test_bombs_are_refused_at_decode_time_when_screening_is_off(tmp_path):
    root = one_per_class(tmp_path / "data", [], good=1)
    loader = build_loader(base_config(root, dataset={"max_pixels": 2000, "screen": False}, val={"batch_size": 1}),
                          "val")
    Image.new("RGB", (40, 30)).save(root / "val" / "good_00" / "more.JPEG")  # not indexed: stays out
    with pytest.raises(BadImageError, match=r"no sample could be read \(1 sample failed so far, the first "
                                            r".*photo\.JPEG: .*above dataset\.max_pixels \(2,000\)\)"):
        delivered(loader)  # the split's one file refused: an epoch of nothing is an error, not empty batches
    assert "above dataset.max_pixels (2,000)" in loader.bad_samples[0][1]


def good_photos(folder: Path, count: int) -> list[Path]:
    """`count` real photos (symbolic links to ../shared/data/realphotos) when present, else noise JPEGs."""
    real = sorted(REALPHOTOS.glob("train/*/*.JPEG"))[:count] if REALPHOTOS.is_dir() else []
    paths = []
    rng = np.random.default_rng(5)
    for i in range(count):
        target = folder / f"good_{i:02d}" / "photo.JPEG"
        target.parent.mkdir(parents=True)
        if i < len(real):
            target.symlink_to(real[i])
        else:
            Image.fromarray(rng.integers(0, 255, (120, 160, 3), dtype=np.uint8)).save(target, quality=90)
        paths.append(target)
    return paths


@pytest.fixture
def mixed_root(tmp_path) -> Path:
    """20 good photos and every odd file, each in its own class folder of split val."""
    root = tmp_path / "mixed"
    good_photos(root / "val", 20)
    for odd in ODD_FILES:
        if not (odd.name == "unreadable.JPEG" and running_as_root()):
            write_odd_files(root / "val" / f"odd_{odd.name}", only=(odd.name,))
    return root


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_folder_mixing_good_photos_and_every_odd_file(mixed_root, backend, device):
    """On the GPU, DALI decodes with nvJPEG ("mixed") and probes a failed batch with it too."""
    config = base_config(mixed_root, backend=backend, workers={"num_workers": 2}, val={"batch_size": 8},
                         output={"device": device})
    loader = build_loader(config, "val")
    assert loader.device.type == device
    classes = list(loader.classes)
    os.remove(mixed_root / "val" / "odd_deleted_later.JPEG" / "deleted_later.JPEG")
    expected_good = {classes.index(c) for c in classes if c.startswith("good_")}
    expected_good |= {classes.index(f"odd_{o.name}") for o in DECODABLE}
    expected_good.add(classes.index("odd_garbage_scan.JPEG"))  # libjpeg-turbo conceals the damage
    broken = {f"odd_{o.name}" for o in BROKEN} - {"odd_garbage_scan.JPEG"} & set(classes)
    for epoch in range(2):
        labels, images = delivered(loader)
        assert sorted(labels) == sorted(expected_good), f"epoch {epoch}: each good file once"
        listed = {os.path.basename(os.path.dirname(path)) for path, _ in loader.bad_samples}
        assert listed == broken and len(loader.bad_samples) == len(broken)
        assert len(labels) + len(loader.bad_samples) == len(classes)
    for odd in DECODABLE:
        colour = centre_colour(images[classes.index(f"odd_{odd.name}")])
        assert np.abs(colour - odd.colour).max() <= 6, (odd.name, colour)
    reasons = {os.path.basename(path): reason.lower() for path, reason in loader.bad_samples}
    for odd in BROKEN:
        if odd.name in reasons:
            assert re.search(odd.reason, reasons[odd.name]), (odd.name, reasons[odd.name])


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_mixed_folder_under_raise_names_the_first_broken_file(mixed_root, backend):
    config = base_config(mixed_root, backend=backend, dataset={"on_bad_image": "raise"})
    with pytest.raises(BadImageError) as failure:
        build_loader(config, "val")
    first = mixed_root / "val" / "odd_bomb.JPEG" / "bomb.JPEG"  # the first broken file in index order
    assert str(failure.value).startswith(f"cannot use image '{first}': decompression bomb")
    assert "more files fail the same check" in str(failure.value)


def test_screening_results_are_cached_per_dataset(mixed_root, caplog):
    config = base_config(mixed_root)
    with caplog.at_level(logging.INFO, logger="fastloader"):
        build_loader(config, "val")
        first = [r.message for r in caplog.records if r.message.startswith("screened")]
        caplog.clear()
        again = build_loader(config, "val")
    assert len(first) == 1 and not [r for r in caplog.records if r.message.startswith("screened")]
    found_by_header = ({o.name for o in BROKEN} - {"garbage_scan.JPEG", "lossless.JPEG", "deleted_later.JPEG"}
                       - ({"unreadable.JPEG"} if running_as_root() else set()))
    assert sorted(os.path.basename(path) for path, _ in again.bad_samples) == sorted(found_by_header)


def test_a_decoders_reason_never_shows_the_repr_of_an_in_memory_file(tmp_path, caplog):
    """Unscreened on the torch backend, Pillow's reason for a file that is no image read
    "cannot identify image file <_io.BytesIO object at 0x7f...>" (issue 41.16)."""
    root = write_solid_dataset(tmp_path / "data", per_class=2, splits=("val",))
    (root / "val" / "a_red" / "img_00.png").write_bytes(b"no image at all, " * 40)
    config = base_config(root, dataset={"root": str(root), "screen": False, "on_bad_image": "skip"})
    loader = build_loader(config, "val")
    assert len([label for _, labels in loader for label in labels.tolist()]) == 5
    (path, reason), = loader.bad_samples
    assert path.endswith("img_00.png") and reason.startswith("UnidentifiedImageError: cannot identify image file")
    assert "object at 0x" not in reason and "object at 0x" not in caplog.text


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_jpeg_pillow_refuses_and_libjpeg_turbo_conceals_is_delivered_at_every_size(tmp_path, backend):
    """Random bytes with markers in a JPEG's scan data: Pillow refuses it, nvImageCodec and DALI
    decode it. The torch backend used Pillow's draft for crops of 2x the output or more, so it
    skipped at small sizes what DALI delivers: now the same samples on both, at every size."""
    import io

    from oddfiles import marker_in_scan_data

    data = marker_in_scan_data()
    with pytest.raises(OSError, match="broken data stream"):
        Image.open(io.BytesIO(data)).load()
    root = one_per_class(tmp_path / "data", [])
    (root / "val" / "odd").mkdir()
    (root / "val" / "odd" / "scan.JPEG").write_bytes(data)
    for size in (8, 16, 64):
        config = base_config(root, backend=backend, val={"batch_size": 4, "transform": {"size": size}})
        with build_loader(config, "val") as loader:
            labels, _ = delivered(loader)
            assert sorted(labels) == [0, 1, 2] and loader.bad_samples == [], (size, loader.bad_samples)
