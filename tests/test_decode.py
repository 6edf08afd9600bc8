"""Decoding: each path (nvImageCodec region, decode_jpeg, Pillow draft, Pillow) gives the pixels that
the torch backend gave before region decoding, and each says which one ran."""
from __future__ import annotations

import io
import logging
import random

import numpy as np
import pytest
import torch
from conftest import REALPHOTOS, base_config, requires_realphotos
from PIL import Image

from fastloader import build_loader
from fastloader.decoding.decode import (
    DECODER_ENV,
    DRAFT,
    PILLOW,
    REGION,
    WHOLE,
    _pillow_pixels,
    decoder_choice,
    describe,
    jpeg_decoder,
    load_region,
    region_decoder,
)
from fastloader.imaging.geometry import Crop

requires_nvimgcodec = pytest.mark.skipif(region_decoder() is None, reason="nvImageCodec is not installed here "
                                         "(pip install nvidia-nvimgcodec-cu13, Linux only)")
VARIED_SIZES = [(17, 9), (120, 90), (333, 251), (251, 333), (500, 375)]


def photo_like(width: int, height: int, seed: int = 0) -> Image.Image:
    """Gradients, a checkerboard and noise: every region of it differs, as in a photo."""
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 255 // width, y * 255 // height, ((x // 16 + y // 16) % 2) * 180], -1)
    noise = np.random.default_rng(seed).integers(0, 40, (height, width, 3))
    return Image.fromarray(np.clip(pixels + noise, 0, 255).astype(np.uint8))


def varied_jpegs(folder, sizes=VARIED_SIZES) -> list[str]:
    """JPEGs as datasets hold them, per size: 4:4:4, 4:2:2 and 4:2:0 subsampling, greyscale,
    progressive, EXIF-rotated (orientation 6) and CMYK."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for i, (width, height) in enumerate(sizes):
        image = photo_like(width, height, seed=i)
        rotated = Image.Exif()
        rotated[0x0112] = 6
        variants = {"444": dict(subsampling=0), "422": dict(subsampling=1), "420": dict(subsampling=2),
                    "progressive": dict(progressive=True), "exif6": dict(exif=rotated)}
        for name, options in variants.items():
            image.save(folder / f"{i}_{name}.jpg", quality=90, **options)
        image.convert("L").save(folder / f"{i}_grey.jpg", quality=90)
        image.convert("CMYK").save(folder / f"{i}_cmyk.jpg", quality=90)
        written += sorted(str(p) for p in folder.glob(f"{i}_*.jpg"))
    return written


def whole(width, height):
    return Crop(0, 0, width, height)


def test_whole_file_path_matches_pillow(tmp_path, monkeypatch):
    monkeypatch.setenv(DECODER_ENV, "whole")
    name, decode = jpeg_decoder()
    assert name != "pillow" and decode is not None  # the fast path exists where nvImageCodec or torchvision is
    path = tmp_path / "x.jpg"
    photo_like(500, 375).save(path, quality=90)
    pixels, crop, decoder = load_region(str(path), whole, size=224)
    assert pixels.shape == (375, 500, 3) and pixels.dtype == torch.uint8 and crop == whole(500, 375)
    assert decoder == WHOLE
    assert torch.equal(pixels, _pillow_pixels(Image.open(path)))


@requires_nvimgcodec
def test_region_decode_is_the_whole_decode_cropped_pixel_for_pixel(tmp_path):
    """nvImageCodec's region against decode_jpeg's whole image, cropped: 30 random boxes per file."""
    rng = random.Random(0)
    compared = 0
    for path in varied_jpegs(tmp_path):
        data = bytearray(open(path, "rb").read())
        if Image.open(path).mode not in ("RGB", "L"):
            continue  # CMYK stays with Pillow
        reference = decode_jpeg_whole(path)
        height, width = reference.shape[:2]
        for _ in range(30):
            left, top = rng.randrange(width), rng.randrange(height)
            box = (left, top, rng.randint(left + 1, width), rng.randint(top + 1, height))
            region = region_decoder()(data, box)
            assert region is not None and torch.equal(region, reference[box[1]:box[3], box[0]:box[2]]), (path, box)
            compared += 1
    assert compared == 30 * 6 * 5  # 4:4:4, 4:2:2, 4:2:0, progressive, EXIF-tagged (as stored), grey; 5 sizes


@requires_nvimgcodec
def test_each_image_goes_to_the_decoder_its_header_and_crop_call_for(tmp_path, monkeypatch):
    big = tmp_path / "big.jpg"
    photo_like(1600, 1200).save(big, quality=90)
    pixels, crop, decoder = load_region(str(big), lambda w, h: Crop(100.4, 99.6, 500.2, 400.7, True), size=224)
    assert decoder == REGION and pixels.shape == (301, 400, 3) and crop == Crop(0, 0, 400, 301, True)
    full = decode_jpeg_whole(big)
    assert torch.equal(pixels, full[100:401, 100:500])
    drafted = load_region(str(big), lambda w, h: Crop(100, 100, 1300, 1100), size=224)
    assert drafted.decoder == DRAFT and drafted.pixels.shape == (300, 400, 3)  # 1/4: the box stays >= 224 px
    assert drafted.crop == Crop(25, 25, 325, 275)
    undrafted = load_region(str(big), lambda w, h: Crop(100, 100, 1300, 1100), size=224, use_draft=False)
    assert undrafted.decoder == REGION and torch.equal(undrafted.pixels, full[100:1100, 100:1300])
    files = {p.rsplit("_", 1)[1]: p for p in varied_jpegs(tmp_path / "v", sizes=[(120, 90)])}
    assert load_region(files["cmyk.jpg"], whole, 224).decoder == PILLOW
    assert load_region(files["exif6.jpg"], whole, 224).decoder == PILLOW
    assert load_region(files["grey.jpg"], whole, 224).decoder == REGION
    monkeypatch.setenv(DECODER_ENV, "whole")
    assert load_region(str(big), lambda w, h: Crop(100, 100, 500, 400), 224).decoder == WHOLE
    monkeypatch.setenv(DECODER_ENV, "decode_jpeg")  # the old name of the choice, still taken
    assert load_region(str(big), lambda w, h: Crop(100, 100, 500, 400), 224).decoder == WHOLE
    monkeypatch.setenv(DECODER_ENV, "pillow")
    assert load_region(str(big), lambda w, h: Crop(100, 100, 500, 400), 224).decoder == PILLOW
    assert load_region(str(big), lambda w, h: Crop(100, 100, 1300, 1100), 224).decoder == DRAFT


def decode_jpeg_whole(path) -> torch.Tensor:
    """torchvision's decode_jpeg of the whole file: the pixels the torch backend gave before nvImageCodec."""
    from torchvision.io import ImageReadMode, decode_jpeg
    data = bytearray(open(path, "rb").read())
    return decode_jpeg(torch.frombuffer(data, dtype=torch.uint8), mode=ImageReadMode.RGB).permute(1, 2, 0)


def loader_pixels(root, split: str, choice: str, monkeypatch, workers: int = 0):
    monkeypatch.setenv(DECODER_ENV, choice)
    config = base_config(root, output={"device": "cpu"}, workers={"num_workers": workers}, seed=11,
                         train={"batch_size": 5, "transform": {"size": 112}},
                         val={"batch_size": 5, "transform": {"size": 112}})
    with build_loader(config, split=split) as loader:
        loader.set_epoch(3)
        batches = list(loader)
    return torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])


def test_the_torch_backend_gives_the_same_pixels_with_each_decoder_for_the_same_seed(tmp_path, monkeypatch):
    """Region decode (auto), the whole file (nvImageCodec, or decode_jpeg where it is absent) and
    Pillow alone give the same batches, bit for bit, over varied JPEGs, in train and val."""
    root = tmp_path / "data"
    for split in ("train", "val"):
        for label, sizes in enumerate((VARIED_SIZES[:3], VARIED_SIZES[3:])):
            varied_jpegs(root / split / f"class_{label}", sizes)
    for split in ("train", "val"):
        images, labels = loader_pixels(root, split, "whole", monkeypatch)
        assert len(labels) == 35 - (split == "train") * (35 % 5)
        for choice, workers in (("auto", 2), ("pillow", 0)):
            other, other_labels = loader_pixels(root, split, choice, monkeypatch, workers)
            assert torch.equal(other_labels, labels) and torch.equal(other, images), (split, choice)
    if region_decoder() is not None:  # the comparison covered region decode, and the other paths
        monkeypatch.setenv(DECODER_ENV, "auto")
        used = {load_region(str(p), lambda w, h: Crop(w * 0.1, h * 0.2, w * 0.7, h * 0.9), 112).decoder
                for p in (root / "train").rglob("*.jpg")}
        assert used == {REGION, DRAFT, PILLOW}


@requires_realphotos
@requires_nvimgcodec
def test_realphotos_transforms_are_unchanged_by_region_decode_and_the_header_walk(monkeypatch):
    """Every real photo, train and val crops: region decode (auto, headers read by the marker walk)
    against the whole-file decode, and against Pillow alone (Pillow's header, Pillow's decode:
    the torch backend before either)."""
    from fastloader import load_config
    from torch_loader.loader import sample_transform
    config = load_config({"dataset": {"root": str(REALPHOTOS)}, "train": {}, "val": {}})
    for split in ("train", "val"):
        transform = sample_transform(config.split(split))
        paths = sorted(str(p) for p in (REALPHOTOS / split).rglob("*.JPEG"))
        monkeypatch.setenv(DECODER_ENV, "pillow")
        before = [transform(path, seed) for seed, path in enumerate(paths)]
        for choice in ("whole", "auto"):
            monkeypatch.setenv(DECODER_ENV, choice)
            for seed, path in enumerate(paths):
                assert torch.equal(transform(path, seed), before[seed]), (choice, path)


def test_an_unknown_decoder_choice_names_the_variable_and_the_choices(monkeypatch):
    monkeypatch.setenv(DECODER_ENV, "turbo")
    with pytest.raises(ValueError, match=f"{DECODER_ENV}='turbo' is not a decoder choice: set it to auto, "
                                         "whole, pillow"):
        decoder_choice()


@requires_nvimgcodec
def test_describe_and_the_loader_log_name_the_decoders(tmp_path, monkeypatch, caplog):
    assert describe().startswith("JPEG crops: nvImageCodec ") and "region decode" in describe()
    varied_jpegs(tmp_path / "data" / "val" / "only", sizes=[(64, 48)])
    with caplog.at_level(logging.INFO, logger="fastloader"):
        build_loader(base_config(tmp_path / "data"), split="val").close()
    assert any("decoders: JPEG crops: nvImageCodec" in r.getMessage() for r in caplog.records)
    monkeypatch.setenv(DECODER_ENV, "pillow")
    assert describe().startswith(f"JPEG crops: Pillow ({DECODER_ENV}=pillow)")


@requires_nvimgcodec
def test_a_jpeg_nvimgcodec_refuses_falls_back_per_file_and_fails_with_pillows_reason(tmp_path, caplog):
    """A lossless JPEG (SOF3) passes Pillow's header; no decoder we use can decode it."""
    path = tmp_path / "lossless.jpg"
    buffer = io.BytesIO()
    photo_like(64, 48).save(buffer, format="JPEG", quality=90)
    data = bytearray(buffer.getvalue())
    data[data.index(b"\xff\xc0") + 1] = 0xC3
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="fastloader"), pytest.raises(OSError, match="broken data stream"):
        load_region(str(path), lambda w, h: Crop(0, 0, 32, 32), size=32)
    assert any(str(path) in r.getMessage() and "nvImageCodec could not decode" in r.getMessage()
               for r in caplog.records)


def test_exif_rotated_photo_is_upright_before_the_crop_is_chosen(tmp_path):
    image = photo_like(80, 40)
    exif = image.getexif()
    exif[0x0112] = 8
    image.save(tmp_path / "r.jpg", exif=exif.tobytes())
    sizes = []
    pixels, _, _ = load_region(str(tmp_path / "r.jpg"), lambda w, h: sizes.append((w, h)) or whole(w, h), 32)
    assert sizes == [(40, 80)] and pixels.shape == (80, 40, 3)
    pixels, _, _ = load_region(str(tmp_path / "r.jpg"), whole, 32, exif_orientation=False)
    assert pixels.shape == (40, 80, 3)


def test_truncated_jpeg_fails_with_pillows_reason(tmp_path):
    path = tmp_path / "cut.jpg"
    photo_like(300, 200).save(path, quality=90)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(OSError, match="truncated"):
        load_region(str(path), whole, size=64)


@requires_nvimgcodec
def test_the_whole_file_decoder_is_nvimagecodec_with_decode_jpegs_pixels(tmp_path, monkeypatch):
    """torchvision 0.29 deprecates decode_jpeg (issue 41.19): the whole-file decode is nvImageCodec's,
    and gives decode_jpeg's pixels bit for bit on every kind of JPEG the fast path takes (4:2:0,
    4:2:2, 4:4:4, greyscale, progressive, odd sizes), and on the real photos where they are here."""
    monkeypatch.setenv(DECODER_ENV, "whole")
    name, decode = jpeg_decoder()
    assert name.startswith("nvImageCodec ")
    paths = [p for p in varied_jpegs(tmp_path / "v", sizes=VARIED_SIZES) if not p.endswith(("cmyk.jpg", "exif6.jpg"))]
    for subsampling in (0, 1, 2):
        for progressive in (False, True):
            path = tmp_path / f"s{subsampling}{progressive}.jpg"
            photo_like(333, 251).save(path, quality=87, subsampling=subsampling, progressive=progressive)
            paths.append(str(path))
    if REALPHOTOS.is_dir():
        paths += sorted(str(p) for p in REALPHOTOS.rglob("*.JPEG"))[:100]
    for path in paths:
        assert torch.equal(decode(bytearray(open(path, "rb").read())), decode_jpeg_whole(path)), path
