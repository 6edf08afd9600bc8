"""The DALI backend's eval box, computed on the host: the sizes it is computed from are the ones
DALI decodes to, and the result is torchvision's Resize + CenterCrop."""
from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is installed on Linux x86_64 / aarch64 only")

from conftest import REALPHOTOS, base_config, requires_realphotos  # noqa: E402
from nvidia.dali import fn, pipeline_def, types  # noqa: E402

from fastloader import build_loader  # noqa: E402
from fastloader.decoding.sizes import upright_size  # noqa: E402
from fastloader.imaging.jpeg_header import HEAD_BYTES  # noqa: E402

TORCHVISION_BOUND = 0.005
"""Mean |DALI - torchvision| (normalized units) over the eval images; measured 0.0028 on the real photos."""
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)



def _tiff_exif(orientation: int) -> bytes:
    """A little-endian EXIF block (Pillow writes big-endian) whose Orientation is the second tag."""
    entries = struct.pack("<HHII", 0x010F, 2, 4, 0x61) + struct.pack("<HHIHH", 0x0112, 3, 1, orientation, 0)
    return b"Exif\x00\x00II*\x00" + struct.pack("<IH", 8, 2) + entries + b"\x00" * 4


def odd_files(folder) -> list[str]:
    """Stored 64 wide x 48 high, in the layouts a header reader can get wrong."""
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8))
    turned = Image.Exif()
    turned[0x0112] = 6
    files = {f"o{o}.jpg": {"exif": _exif(o)} for o in range(1, 9)}
    files.update({"little_endian_exif.jpg": {"exif": _tiff_exif(5)},
                  "long_comment.jpg": {"exif": turned, "comment": b"x" * (3 * HEAD_BYTES)},
                  "progressive.jpg": {"exif": turned, "progressive": True},
                  "plain.png": {}, "turned.png": {"exif": turned}, "turned.webp": {"exif": turned},
                  "turned.tiff": {"exif": turned}})
    for name, options in files.items():
        image.save(folder / name, **options)
    image.convert("L").save(folder / "grey.jpg", exif=turned)
    image.convert("CMYK").save(folder / "cmyk.jpg", exif=turned)
    return sorted(str(path) for path in folder.iterdir())


def _exif(orientation: int) -> Image.Exif:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif


@pytest.mark.parametrize("adjust", [True, False])
def test_sizes_from_the_header_are_those_dali_decodes_to(tmp_path, adjust):
    @pipeline_def(batch_size=1, num_threads=1, device_id=None, prefetch_queue_depth=1)
    def peek():
        encoded = fn.io.file.read(fn.external_source(name="path", dtype=types.UINT8))
        return fn.peek_image_shape(encoded, adjust_orientation=adjust)

    pipe = peek()
    pipe.build()
    swapped = 0
    for path in odd_files(tmp_path):
        pipe.feed_input("path", [np.frombuffer(path.encode(), dtype=np.uint8)])
        dali = tuple(np.array(pipe.run()[0][0]).tolist()[:2])
        assert upright_size(path, adjust) == dali, path
        swapped += dali == (64, 48)
    assert swapped == (12 if adjust else 0)  # o5-o8, little-endian o5 and seven turned files


def test_a_file_gone_before_its_header_is_read_has_no_size(tmp_path):
    assert upright_size(str(tmp_path / "missing.jpg"), True) is None


def torchvision_eval(path: str, size: int) -> torch.Tensor:
    transform = T.Compose([T.Resize(int(size / 0.875)), T.CenterCrop(size), T.ToTensor(), T.Normalize(MEAN, STD)])
    with Image.open(path) as image:
        return transform(image.convert("RGB"))


def dali_eval(config: dict) -> tuple[torch.Tensor, list[str]]:
    with build_loader({**config, "backend": "dali", "output": {"device": "cpu"}}, "val") as loader:
        assert loader.backend == "dali"
        images = torch.cat([x for x, _ in loader])
        return images, [loader.index.path(i) for i in range(len(loader.index))]


def write_odd_sizes(root) -> dict:
    """val/<class>/*.png of sizes whose boxes round differently; the config that reads them at 64 px."""
    rng = np.random.default_rng(3)
    for i, (w, h) in enumerate([(150, 113), (113, 150), (131, 97), (97, 131), (200, 73), (74, 74), (257, 256)]):
        folder = root / "val" / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        y, x = np.mgrid[0:h, 0:w]
        pixels = np.stack([x * 255 // w, y * 255 // h, (x * 7 + y * 3) % 256], -1) + rng.integers(0, 30, (h, w, 3))
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(folder / f"i{i}.png")
    return base_config(root, val={"batch_size": 3, "transform": {"size": 64}})


def test_dali_eval_is_torchvisions_resize_and_centre_crop_on_odd_sizes(tmp_path):
    images, paths = dali_eval(write_odd_sizes(tmp_path))
    reference = torch.stack([torchvision_eval(path, 64) for path in paths])
    per_image = (images - reference).abs().mean(dim=(1, 2, 3))
    assert images.shape == (7, 3, 64, 64) and per_image.mean() <= TORCHVISION_BOUND, per_image


@requires_realphotos
def test_dali_eval_is_torchvisions_resize_and_centre_crop_on_the_real_photos():
    config = {"dataset": {"root": str(REALPHOTOS)}, "workers": {"num_workers": 2},
              "val": {"batch_size": 32, "transform": {"size": 224}}}
    images, paths = dali_eval(config)
    reference = torch.stack([torchvision_eval(path, 224) for path in paths])
    per_image = (images - reference).abs().mean(dim=(1, 2, 3))
    assert len(paths) == 100 and per_image.mean() <= TORCHVISION_BOUND, per_image


def test_dali_eval_from_the_cache_is_torchvisions_box_of_the_cached_pixels(tmp_path):
    from fastloader import load_config
    from fastloader.cache import open_split_cache
    from fastloader.cache_write import build_split_cache
    from fastloader.sources.formats import build_index
    config = write_odd_sizes(tmp_path)
    config["dataset"]["cache"] = str(tmp_path / "cache")
    loaded = load_config(config)
    index = build_index(loaded, loaded.split("val"))
    build_split_cache(loaded, loaded.split("val"), index, str(tmp_path / "cache"), 80, workers=0)
    images, _ = dali_eval(config)
    pixels = open_split_cache(loaded, loaded.split("val"), index).pixels
    transform = T.Compose([T.ToPILImage(), T.Resize(73), T.CenterCrop(64), T.ToTensor(), T.Normalize(MEAN, STD)])
    reference = torch.stack([transform(pixels.image(i)) for i in range(len(index))])
    per_image = (images - reference).abs().mean(dim=(1, 2, 3))
    assert images.shape == (7, 3, 64, 64) and per_image.mean() <= TORCHVISION_BOUND, per_image


def test_centre_boxes_of_a_batch_are_torchvisions_arithmetic_image_by_image():
    """The vectorized box is Resize(floor(size / crop_pct)) + CenterCrop(size) as torchvision rounds
    them (the long side truncated, the offset rounded half to even), on every size, bit for bit."""
    from fastloader.imaging.boxes import centre_boxes

    def torchvision_box(width, height, size, crop_pct):
        short = int(size / crop_pct)
        resized_w, resized_h = (short, int(short * height / width)) if width <= height else \
            (int(short * width / height), short)
        left, top = int(round((resized_w - size) / 2.0)), int(round((resized_h - size) / 2.0))
        sx, sy = width / resized_w, height / resized_h
        return [left * sx, top * sy, (left + size) * sx, (top + size) * sy]

    rng = np.random.default_rng(0)
    widths, heights = rng.integers(1, 4000, 3000), rng.integers(1, 4000, 3000)
    widths[:40], heights[:40] = np.arange(1, 41), 1  # long thin images, offsets of .5 that round to even
    for size, crop_pct in ((224, 0.875), (32, 1.0), (7, 0.5), (288, 0.95)):
        expected = [torchvision_box(w, h, size, crop_pct) for w, h in zip(widths.tolist(), heights.tolist())]
        assert centre_boxes(widths, heights, size, crop_pct).tolist() == expected


def test_screening_keeps_each_files_size_as_dali_decodes_it(tmp_path):
    """The sizes the DALI feed computes its boxes from come from screening, cached with its result:
    for every odd layout (EXIF turns, TIFF, PNG, CMYK) the size DALI's header read gives."""
    from fastloader import load_config
    from fastloader.decoding.sizes import upright
    from fastloader.screening import screen_index
    from fastloader.sources.formats import build_index

    folder = tmp_path / "data" / "val" / "odd"
    folder.mkdir(parents=True)
    odd_files(folder)
    config = load_config(base_config(tmp_path / "data"))
    index = build_index(config, config.split("val"))
    fresh = screen_index(index, config.on_bad_image, config.dataset.max_pixels, "val").sizes
    cached = screen_index(index, config.on_bad_image, config.dataset.max_pixels, "val").sizes  # from its cache
    assert np.array_equal(fresh, cached) and len(fresh) == len(index) == 17
    for adjust in (True, False):
        expected = [upright_size(index.path(i), adjust) for i in range(len(index))]
        assert upright(cached, adjust).tolist() == [list(size) for size in expected]
    assert sum(upright(cached, True)[:, 0] == 64) == 12  # stored 64 x 48: the twelve turned ones
    assert sum(upright(cached, False)[:, 0] == 64) == 0


def test_eval_without_screening_reads_sizes_itself_and_gives_the_same_batches(tmp_path):
    config = write_odd_sizes(tmp_path)
    screened, _ = dali_eval(config)
    unscreened, _ = dali_eval({**config, "dataset": {**config["dataset"], "screen": False}})
    assert torch.equal(screened, unscreened)


def test_a_file_resized_after_screening_is_named_and_its_box_drawn_for_its_size(tmp_path, caplog):
    """A file rewritten at another size while a loader runs (after it was screened): the feed reads
    the size of the bytes it feeds, names the file, and gives it the box of its new size from that
    epoch on, the very pixels a loader without screening gives."""
    import logging
    config = write_odd_sizes(tmp_path)
    changed = sorted((tmp_path / "val").rglob("i2.png"))[0]
    with build_loader({**config, "backend": "dali"}, "val") as loader:  # screened
        Image.open(changed).resize((61, 170)).save(changed)
        with caplog.at_level(logging.WARNING, logger="fastloader"):
            first = torch.cat([x for x, _ in loader])
        second = torch.cat([x for x, _ in loader])
    assert f"{changed} changed since it was screened: it is 170x61 (height x width) now, the screening " \
           "result said 97x131" in caplog.text
    reference, _ = dali_eval({**config, "dataset": {**config["dataset"], "screen": False}})
    assert torch.equal(first, reference) and torch.equal(second, reference)

